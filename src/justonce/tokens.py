"""API tokens of the service, and its audit trail.

A token's secret looks like ``jo_<prefix>_<random>``: ``prefix`` is 8 hex characters shown
in lists (so an operator can tell tokens apart without seeing a secret), ``random`` 32
bytes from :mod:`secrets`. Only the SHA-256 of the whole secret is stored.

Why SHA-256 and not bcrypt/argon2: a slow hash protects *low-entropy* secrets (passwords)
from offline guessing after a database leak. A 256-bit random secret cannot be guessed
however fast the hash is, so a slow hash would only add tens of milliseconds to every API
request. Why a look-up by hash and then ``hmac.compare_digest``: the look-up (a unique
index) finds the row by the hash of what the client sent, so the client never gets to
compare its input with a stored secret byte by byte; the constant-time comparison of the
two hashes afterwards makes the check independent of where a near-miss would differ, even
if a backend's look-up were ever to match loosely (collations, trailing spaces).

Scopes: ``read`` sees everything and changes nothing; ``admin`` may also act (enqueue,
cancel, retry, ack, resolve…). Every action taken through the service is written to the
audit trail (:class:`Audit`) with the token's id and name.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import re
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from . import validate
from .errors import InvalidOption, TokenNotFound
from .models import AuditEntry, TokenInfo

if TYPE_CHECKING:
    from .app import App

SCOPES = ("read", "admin")
TOKEN_PREFIX = "jo_"
_SECRET = re.compile(r"^jo_([0-9a-f]{8})_([A-Za-z0-9_-]{43})\Z")
_NAME = re.compile(r"^[\w.:@/ -]{1,100}\Z")
TOUCH_EVERY = 60.0
"""Seconds between two writes of a token's ``last_used_at`` (per process, and in SQL)."""


def hash_secret(secret: str) -> str:
    """The stored form of a secret: SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


class Tokens:
    """``app.tokens``: create, verify, list and revoke API tokens."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._touched: dict[int, float] = {}
        self._lock = threading.Lock()

    def create(self, name: str, scope: str) -> tuple[TokenInfo, str]:
        """A new token and its secret. The secret is shown once: only its hash is kept."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidOption(
                f"token name {validate.shown(name)} must be 1-100 letters, digits, spaces or _ . : @ / -")
        if scope not in SCOPES:
            raise InvalidOption(f"scope must be one of {SCOPES}, not {validate.shown(scope)}")
        prefix = secrets.token_hex(4)
        secret = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
        info = self.app.backend.token_create(name, scope, hash_secret(secret), prefix)
        return info, secret

    def verify(self, secret: Any) -> TokenInfo | None:
        """The active token whose secret this is, or None (malformed, unknown, revoked).
        Records the use (at most once a minute)."""
        if not isinstance(secret, str) or not _SECRET.match(secret):
            return None  # refused before any database work: no hashing of huge inputs
        digest = hash_secret(secret)
        found = self.app.backend.token_find_by_hash(digest)
        if found is None:
            return None
        info, stored = found
        if not hmac.compare_digest(stored.encode(), digest.encode()) or not info.active:
            return None
        self._touch(info.id)
        return info

    def get(self, token_id: int) -> TokenInfo:
        info = self.app.backend.token_get(validate.job_id(token_id, "token id"))
        if info is None:
            raise TokenNotFound(f"no API token {token_id}")
        return info

    def active(self, token_id: int) -> TokenInfo | None:
        """The token if it exists and is not revoked (a session cookie is checked so on
        every request), recording the use."""
        info = self.app.backend.token_get(validate.job_id(token_id, "token id"))
        if info is None or not info.active:
            return None
        self._touch(info.id)
        return info

    def list(self) -> builtins.list[TokenInfo]:
        return self.app.backend.token_list()

    def revoke(self, token_id: int) -> TokenInfo:
        """Revoke a token: from now on it authenticates nothing (sessions signed in with it
        included). Revoking a revoked token is harmless."""
        info = self.get(token_id)
        self.app.backend.token_revoke(info.id)
        return self.get(token_id)

    def _touch(self, token_id: int) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._touched.get(token_id)
            if last is not None and now - last < TOUCH_EVERY:
                return
            self._touched[token_id] = now
        self.app.backend.token_touch(token_id)


class Audit:
    """``app.audit``: the append-only trail of actions taken through the service."""

    def __init__(self, app: App) -> None:
        self.app = app

    def record(self, action: str, target: str | None = None, count: int | None = None,
               detail: dict[str, Any] | None = None, *, token_id: int | None = None,
               actor: str = "local", conn: Any = None) -> int:
        """Write one entry with the database's time: who (``token_id`` and its name as
        ``actor``), what (``action``, e.g. ``jobs.cancel``), on what (``target``), on how
        many (``count``), and anything else (``detail``, JSON). ``conn``: a connection from
        ``app.backend.transaction()``, so that the entry commits with the action."""
        action = validate.text(action, "action", 100)
        if token_id is not None:
            validate.job_id(token_id, "token id")
        if count is not None:
            validate.int64(count, "count")
        if detail is not None:
            validate.detail_json(detail)
        return self.app.backend.audit_record(
            token_id, validate.text(actor, "actor", 200), action,
            None if target is None else validate.text(target, "target", 1000),
            count, detail or {}, conn=conn)

    def list(self, cursor: int | None = None, limit: int = 100) -> builtins.list[AuditEntry]:
        """Newest first; ``cursor``: only entries with a smaller id (the next page)."""
        if cursor is not None:
            validate.job_id(cursor, "cursor")
        return self.app.backend.audit_list(cursor, validate.count(limit, "limit", 10_000))
