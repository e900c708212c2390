"""The dashboard's sessions: a signed, HttpOnly, SameSite=Strict cookie naming the API
token a browser signed in with, and a CSRF field derived from it.

The cookie holds ``<token id>.<issued at>.<HMAC>``, never the token's secret. The token is
looked up again (at most every few seconds per process) so a revoked token ends its
sessions. The CSRF field of a session is an HMAC of the cookie: a page of another site can
neither read it nor forge it, and SameSite=Strict keeps the cookie off its requests anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from typing import TYPE_CHECKING

from fastapi import Request, Response

from ..models import TokenInfo

if TYPE_CHECKING:
    from ..app import App

COOKIE = "justonce_session"
MAX_AGE = 12 * 3600
RECHECK = 5.0
"""Seconds a token's look-up is trusted (revocation takes effect within this)."""


class Sessions:
    def __init__(self, app: App, secret: bytes | None = None) -> None:
        self.app = app
        env = os.environ.get("JUSTONCE_SESSION_SECRET")
        # Without a configured secret, sessions last as long as the server process.
        self._secret = secret or (env.encode() if env else secrets.token_bytes(32))
        self._cache: dict[int, tuple[float, TokenInfo | None]] = {}
        self._lock = threading.Lock()

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    def start(self, response: Response, token: TokenInfo, secure: bool = False) -> None:
        body = f"{token.id}.{int(time.time())}"
        response.set_cookie(COOKIE, f"{body}.{self._sign(body)}", max_age=MAX_AGE, httponly=True,
                            samesite="strict", secure=secure, path="/")

    def end(self, response: Response) -> None:
        response.delete_cookie(COOKIE, path="/")

    def _token_id(self, request: Request) -> int | None:
        raw = request.cookies.get(COOKIE, "")
        parts = raw.split(".")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            return None
        if not hmac.compare_digest(self._sign(f"{parts[0]}.{parts[1]}"), parts[2]):
            return None
        if time.time() - int(parts[1]) > MAX_AGE:
            return None
        return int(parts[0])

    def viewer(self, request: Request) -> TokenInfo | None:
        """The active token of this request's session, or None."""
        token_id = self._token_id(request)
        if token_id is None:
            return None
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(token_id)
        if hit is not None and now - hit[0] < RECHECK:
            return hit[1]
        info = self.app.tokens.active(token_id)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[token_id] = (now, info)
        return info

    def csrf(self, request: Request) -> str:
        return self._sign("csrf:" + request.cookies.get(COOKIE, ""))[:40]

    def csrf_ok(self, request: Request, value: str | None) -> bool:
        return bool(value) and bool(request.cookies.get(COOKIE)) and hmac.compare_digest(
            self.csrf(request), value or "")
