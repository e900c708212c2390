"""Who is calling: API tokens (``Authorization: Bearer jo_…``) and session cookies.

The contract other parts of the service (the JSON API, the dashboard) build on:

- :func:`require_read` / :func:`require_admin` (and :func:`require_own_session`, for
  sign-out: any scope, CSRF checked) are FastAPI dependencies that return the
  caller's :class:`Principal` or raise a 401 (no or bad credentials) / 403 (a read token on
  an action, or a cookie POST without its CSRF token) problem. Every state change takes
  ``require_admin``; read-only tokens see everything and change nothing.
- A request carries either a bearer token (looked up and checked on every request) or the
  session cookie ``justonce_session`` that :meth:`Auth.start_session` sets after a sign-in
  with a token (``POST /api/v1/session`` or the dashboard's own form). The cookie is
  HttpOnly, SameSite=Strict, Secure when served over https, signed (HMAC-SHA256) with the
  server key (``--secret-key`` / ``$JUSTONCE_SECRET_KEY``, else random per process, which
  signs everyone out on restart), holds the token id and expires after
  :data:`SESSION_SECONDS`; the token is re-checked against revocation on every request.
- CSRF: a request authenticated by the cookie that is not GET/HEAD/OPTIONS must carry the
  session's CSRF token in the ``X-CSRF-Token`` header or a ``csrf`` form field. The token
  is an HMAC of the session's random nonce (nothing to store server-side); it is returned by
  the sign-in, readable by scripts in the (non-HttpOnly) ``justonce_csrf`` cookie, and by
  templates as ``principal.csrf``. Bearer requests need none: a browser never adds a bearer
  header on its own, so a forged cross-site request cannot carry one.
- :func:`audit` writes an action to the audit trail with the principal as its actor, on
  the action's own transaction: every route that changes something runs the change and
  its audit row in one ``app.backend.transaction()`` (or passes :func:`audit` as the
  hook of an action that commits in steps), so a crash, or an audit row the database
  refuses, leaves both or neither.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from ..app import App
from ..models import TokenInfo
from .problems import Problem

SESSION_COOKIE = "justonce_session"
CSRF_COOKIE = "justonce_csrf"
CSRF_HEADER = "X-CSRF-Token"
SESSION_SECONDS = 12 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: the token it authenticated with, and how (``bearer`` or ``cookie``)."""

    token_id: int
    name: str
    scope: str
    via: str
    csrf: str | None = None
    """The session's CSRF token (cookie sessions only): put it in forms and headers."""

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"


def secret_key(given: str | None = None) -> bytes:
    """The key that signs session cookies: the one given, ``$JUSTONCE_SECRET_KEY``, or a
    random one for this process."""
    key = given or os.environ.get("JUSTONCE_SECRET_KEY")
    return key.encode() if key else secrets.token_bytes(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Auth:
    """Token and session checks for one service (kept in ``fastapi_app.state.auth``)."""

    def __init__(self, app: App, key: bytes) -> None:
        self.app = app
        self._key = key

    # -- session cookies ----------------------------------------------------------------
    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def csrf_token(self, nonce: str) -> str:
        return self._sign(f"csrf:{nonce}")

    def start_session(self, request: Request, response: Response, info: TokenInfo) -> str:
        """Set the session cookie for ``info`` (an active token) on ``response``; return
        the session's CSRF token."""
        nonce = secrets.token_urlsafe(16)
        payload = f"{info.id}.{int(time.time())}.{nonce}"
        secure = request.url.scheme == "https"
        response.set_cookie(SESSION_COOKIE, f"{payload}.{self._sign(payload)}",
                            max_age=SESSION_SECONDS, httponly=True, samesite="strict",
                            secure=secure, path="/")
        csrf = self.csrf_token(nonce)
        response.set_cookie(CSRF_COOKIE, csrf, max_age=SESSION_SECONDS, httponly=False,
                            samesite="strict", secure=secure, path="/")
        return csrf

    def end_session(self, response: Response) -> None:
        response.delete_cookie(SESSION_COOKIE, path="/")
        response.delete_cookie(CSRF_COOKIE, path="/")

    def _session(self, value: str) -> tuple[int, str] | None:
        """(token id, nonce) of a cookie this server signed and that has not expired."""
        parts = value.split(".")
        if len(parts) != 4:
            return None
        token_id, issued, nonce, sig = parts
        # Bytes: compare_digest refuses str with non-ASCII characters (a TypeError).
        if not hmac.compare_digest(sig.encode(), self._sign(f"{token_id}.{issued}.{nonce}").encode()):
            return None
        try:
            tid, at = int(token_id), int(issued)
        except ValueError:
            return None
        if not 0 <= time.time() - at <= SESSION_SECONDS:
            return None
        return tid, nonce

    # -- who is calling -----------------------------------------------------------------
    def principal(self, request: Request) -> Principal | None:
        """The caller, or None when the request carries no valid credentials."""
        header = request.headers.get("authorization")
        if header is not None:
            if not header.lower().startswith(_BEARER):
                return None
            info = self.app.tokens.verify(header[len(_BEARER):].strip())
            return None if info is None else Principal(info.id, info.name, info.scope, "bearer")
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie is None:
            return None
        session = self._session(cookie)
        if session is None:
            return None
        info = self.app.tokens.active(session[0])
        if info is None:
            return None
        return Principal(info.id, info.name, info.scope, "cookie", self.csrf_token(session[1]))


def _auth(request: Request) -> Auth:
    return request.app.state.auth


async def require_read(request: Request) -> Principal:
    """Any valid token (read or admin scope), by bearer header or session cookie."""
    # The token look-up is a database read: off the event loop, like the routes themselves.
    principal = await run_in_threadpool(_auth(request).principal, request)
    if principal is None:
        raise Problem(401, "Unauthorized",
                      "send Authorization: Bearer <token> (justonce tokens create), or sign in",
                      headers={"WWW-Authenticate": 'Bearer realm="justonce"'})
    return principal


async def require_admin(request: Request) -> Principal:
    """An admin token; a cookie session must also prove the request is its own (CSRF)."""
    principal = await require_read(request)
    if not principal.is_admin:
        raise Problem(403, "Forbidden", f"token {principal.name!r} has read scope: this action "
                      "needs an admin token")
    await _check_csrf(request, principal)
    return principal


async def require_own_session(request: Request) -> Principal:
    """Any valid token; a cookie session must prove the request is its own (CSRF), so a
    forged cross-site form cannot sign anyone out."""
    principal = await require_read(request)
    await _check_csrf(request, principal)
    return principal


async def _check_csrf(request: Request, principal: Principal) -> None:
    if principal.via == "cookie" and request.method not in SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER)
        if sent is None and request.headers.get("content-type", "").lower().startswith(
                "application/x-www-form-urlencoded"):
            sent = await _form_field(request, "csrf")
        if not sent or not hmac.compare_digest(sent.encode(), (principal.csrf or "").encode()):
            raise Problem(403, "CsrfFailed", f"missing or wrong CSRF token (send it in "
                          f"{CSRF_HEADER} or the csrf field of a urlencoded form)")


MAX_FORM = 16 * 1024
"""The largest urlencoded form read (the dashboard's forms are tiny)."""


class FormError(ValueError):
    """A form body too large (``status`` 413) or not urlencoded UTF-8 (400)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def parse_form(body: bytes) -> dict[str, str]:
    """A urlencoded body's fields (the first value of each), parsed here rather than by
    Starlette's form parser, which needs a package this service does not install (a form
    once made every cookie POST to the API a 500)."""
    if len(body) > MAX_FORM:
        raise FormError(413, f"a form body is limited to {MAX_FORM} bytes")
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        raise FormError(400, "the form body is not urlencoded UTF-8") from None
    return {k: v[0] for k, v in parsed.items()}


async def _form_field(request: Request, name: str) -> str | None:
    """One field of a urlencoded body (a multipart body is not read: its token goes in
    the header)."""
    try:
        return parse_form(await request.body()).get(name)
    except FormError as exc:
        raise Problem(exc.status, "FormTooLarge" if exc.status == 413 else "MalformedForm",
                      str(exc)) from None


AUDIT_LIST_MOST = 100
"""Entries of a list in an audit row's detail kept at most (an ack of 100,000 ids completes
as many batches: their ids would pass the detail's 64 KiB, refusing the ack itself)."""


def _bounded(detail: dict[str, Any]) -> dict[str, Any]:
    """``detail`` with each list cut to its first AUDIT_LIST_MOST entries; a cut list
    ``x`` is joined by ``x_total`` (its length) and ``x_cut: true``."""
    out: dict[str, Any] = {}
    for key, value in detail.items():
        if isinstance(value, (list, tuple)) and len(value) > AUDIT_LIST_MOST:
            out[key] = list(value[:AUDIT_LIST_MOST])
            out[f"{key}_total"] = len(value)
            out[f"{key}_cut"] = True
        else:
            out[key] = value
    return out


def audit(request: Request, principal: Principal, action: str, target: str | None = None,
          count: int | None = None, *, conn: Any, **detail: Any) -> None:
    """Write one action to the audit trail: who, what, on what, how many. ``conn`` is the
    action's transaction (from ``app.backend.transaction()``, or the one a step hook is
    given): the row commits with the action or not at all. Lists in ``detail`` are cut
    (see :data:`AUDIT_LIST_MOST`), so that a large call is never refused for the size of
    its audit row."""
    _auth(request).app.audit.record(action, target, count, _bounded(detail),
                                    token_id=principal.token_id, actor=principal.name, conn=conn)
