"""The media types a request body may have: one check for every route, before its body is
read (415 ``UnsupportedMediaType`` otherwise).

FastAPI reads a body whose ``Content-Type`` it does not take for JSON (``text/plain``, a
form, none at all, ``application/jsonx``) as bytes, and its validation then says "Input
should be a valid dictionary" (422), which blames the fields of a body that was never
read; ``application/json; charset=latin-1`` was even read as UTF-8. Here a route says
which media types it reads (:class:`JsonRoute`: ``application/json``, or those of its
OpenAPI ``requestBody``; :class:`PageRoute`, the dashboard's: urlencoded forms), its
OpenAPI document lists 415 with them, and a body of any other type is refused before
anything else of the request is looked at (credentials included: nothing of a body the
route cannot read is worth a database look-up, and a cross-site form, the one kind of body
a page elsewhere can make a browser send, stops here). A route that reads no body
(``POST /jobs/{id}/cancel``) ignores one as before: only a cookie session's CSRF field is
read from it (auth.py).

An empty body has no media type to check: ``curl -X POST`` sends none, ``curl -d ''`` an
empty form; both reach the route as a request without a body (a route that needs one
answers 422, as before).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Coroutine
from email.message import Message
from email.utils import collapse_rfc2231_value
from typing import Any, ClassVar

from fastapi import Request, Response
from fastapi.routing import APIRoute

from ..validate import shown
from .problems import Problem, documented

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
WITHOUT_BODY = frozenset({"GET", "HEAD", "OPTIONS"})


def media_type(value: str) -> tuple[str, str | None]:
    """(type/subtype in lower case, charset or None) of a ``Content-Type`` value; ("", None)
    for one that names no type. Parameters are parsed as RFC 9110 8.3.1 has them (quoted
    strings, any case), by the standard library's MIME parser."""
    message = Message()
    message["content-type"] = value
    kind = message.get_content_type() if "/" in value.split(";", 1)[0] else ""
    charset = message.get_param("charset")
    if charset is None:
        return kind, None
    # (an RFC 2231 value, charset*=utf-8''latin-1, comes as a tuple: its text is the charset)
    return kind, collapse_rfc2231_value(charset).strip().lower()


def has_body(request: Request) -> bool:
    """The request carries a body of one byte or more: as the service's body limit read it
    (a chunked body's length is known only once read, and an empty one is no body), else
    as its headers say."""
    size = request.scope.get("justonce.body_size")
    if size is not None:
        return bool(size)
    length = (request.headers.get("content-length") or "").strip(" \t")
    return (length.isdigit() and int(length) > 0) or "transfer-encoding" in request.headers


def _utf8(charset: str | None) -> bool:
    """No charset, or a name of UTF-8 (utf-8, utf8, UTF_8: the aliases Python knows)."""
    if charset is None:
        return True
    try:
        return codecs.lookup(charset).name == "utf-8"
    except LookupError:
        return False


def _accepts(kind: str, accepted: tuple[str, ...]) -> bool:
    """``kind`` is one of ``accepted``, or, where JSON is, a structured ``+json`` type
    (``application/vnd.api+json``, ``application/merge-patch+json``: RFC 6839 3.1), which
    FastAPI reads as JSON and clients send."""
    return kind in accepted or (JSON in accepted and kind.startswith("application/")
                                and kind.endswith("+json") and len(kind) > len("application/+json"))


def check(request: Request, accepted: tuple[str, ...]) -> None:
    """Raise 415 UnsupportedMediaType unless the request's body (if any) is of a type in
    ``accepted``, in UTF-8 (the only charset the service reads: RFC 8259 8.1 for JSON;
    a form's charset, when one is named, must be UTF-8 too)."""
    if request.method in WITHOUT_BODY or not has_body(request):
        return
    sent = request.headers.get("content-type")
    kind, charset = media_type(sent or "")
    if _accepts(kind, accepted) and _utf8(charset):
        return
    wanted = " or ".join(accepted)
    what = "no Content-Type" if sent is None else f"Content-Type {shown(sent)}"
    if _accepts(kind, accepted):
        what += " (bodies are read as UTF-8 only)"
    raise Problem(415, "UnsupportedMediaType", f"send the body as {wanted}, not with {what}",
                  headers={"Accept-Post": ", ".join(accepted)}, accepted=list(accepted))


class JsonRoute(APIRoute):
    """A route whose body, when it has one, must be ``application/json`` (or one of the
    media types its ``openapi_extra`` declares for its ``requestBody``, so that the
    document and the check cannot disagree)."""

    default_media_types: ClassVar[tuple[str, ...]] = (JSON,)
    html: ClassVar[bool | None] = False
    """Whether the route's errors are HTML pages (problems.wants_html): a route of the
    service's JSON answers in JSON whatever the Accept header says (the dashboard's
    snapshot, say); None would leave it to that header."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if self.media_types:
            self.responses = {**self.responses, **documented(415)}

    @property
    def media_types(self) -> tuple[str, ...]:
        """What the route's body may be; () for a route that reads no body (it ignores
        one, but for the csrf field of a urlencoded form: see auth.py)."""
        if not (self.methods or set()) - WITHOUT_BODY:
            return ()
        declared = ((self.openapi_extra or {}).get("requestBody") or {}).get("content")
        if declared:
            return tuple(declared)
        return self.default_media_types if self.reads_body else ()

    @property
    def reads_body(self) -> bool:
        """The route has a body parameter (a model, optional or not)."""
        return self.body_field is not None

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        accepted = self.media_types

        if not accepted:
            return handler

        async def checked(request: Request) -> Response:
            check(request, accepted)
            return await handler(request)

        return checked


class PageRoute(JsonRoute):
    """A dashboard route: its body, when it has one, is an urlencoded form (the only kind
    of body a browser's form sends here), and its errors are HTML pages."""

    default_media_types = (FORM,)
    html = True

    @property
    def reads_body(self) -> bool:
        return True  # (every POST of the dashboard reads its form itself: web/auth.parse_form)
