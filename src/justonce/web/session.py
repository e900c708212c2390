"""The dashboard's view of web/auth.py: who is signed in, sign-in and sign-out, and the
CSRF check of its forms (the dashboard reads its forms itself: no multipart parser)."""

from __future__ import annotations

import hmac

from fastapi import Request, Response

from ..models import TokenInfo
from .auth import Auth, Principal


def _auth(request: Request) -> Auth:
    return request.app.state.auth


def viewer(request: Request) -> Principal | None:
    """The caller (session cookie, or a bearer token), or None."""
    return _auth(request).principal(request)


def start(request: Request, response: Response, token: TokenInfo) -> None:
    _auth(request).start_session(request, response, token)


def end(request: Request, response: Response) -> None:
    _auth(request).end_session(response)


def csrf_ok(principal: Principal, value: str | None) -> bool:
    """A form POST is the session's own: it carries the session's CSRF token. A bearer
    request needs none (a browser never adds a bearer header on its own)."""
    if principal.via != "cookie":
        return True
    # Bytes: compare_digest refuses str with non-ASCII characters (a TypeError).
    return bool(value) and hmac.compare_digest((value or "").encode(), (principal.csrf or "").encode())
