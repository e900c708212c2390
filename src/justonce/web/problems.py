"""Errors as RFC 9457 problem documents (``application/problem+json``).

Every error answer of the service is one JSON object::

    {"type": "/problems/JobNotFound", "title": "Not Found", "status": 404,
     "detail": "no job 7", "error": "JobNotFound"}

``error`` is the library's error class name (a :class:`~justonce.errors.JustonceError`
subclass) or one of the service's own (``Unauthorized``, ``Forbidden``, ``CsrfFailed``,
``MalformedJson``, ``BodyTooLarge``, ``RequestValidation``, ``UnsupportedMediaType``,
``NotFound``, ``MethodNotAllowed``, ``InternalError``); ``type`` is ``/problems/<error>``. Validation
failures add ``errors``: where and what (pydantic's ``loc`` and ``msg``). An unexpected
exception gives a 500 with no detail (it is logged server-side): never a stack trace.

A page a browser shows gets the same error as an HTML page instead (:func:`wants_html`):
a person who opens the dashboard while the database is away reads that it is away and
that the page comes back with it, not a JSON document. The JSON API always answers JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import errors as E

log = logging.getLogger("justonce.web")
MEDIA_TYPE = "application/problem+json"

# Most specific first: the first class an error is an instance of decides its status.
STATUS: list[tuple[type[BaseException], int]] = [
    (E.CountChanged, 409),
    # A list's reservation that no longer holds its positions, or a position it does not
    # hold: the caller's view of the reservation is out of date (retrying cannot help).
    (E.StaleReservation, 409),
    (E.PositionNotReserved, 409),
    (E.LockTimeout, 503),
    (E.DatabaseUnavailable, 503),
    (E.PayloadTooLarge, 413),
    (E.InvalidTransition, 409),  # KeyConflict, BatchExpired, PartitionConflict too
    (E.LeaseLost, 409),
    (E.NoFreeSlot, 503),
    (E.ValidationError, 422),  # InvalidName, InvalidOption, InvalidItemId, UnknownTask…
    (LookupError, 404),  # JobNotFound, BatchNotFound, ItemNotFound, TokenNotFound…
    (E.SchemaError, 503),
    (E.ConfigurationError, 500),
]


class ProblemDoc(BaseModel):
    """An RFC 9457 problem document."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str | None = None
    error: str


_SCHEMA = ProblemDoc.model_json_schema()


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for error answers: problem documents."""
    return {status: {"description": HTTPStatus(status).phrase,
                     "content": {MEDIA_TYPE: {"schema": _SCHEMA}}} for status in statuses}


ERRORS = documented(400, 401, 403, 404, 409, 413, 422, 500, 503)
"""Every route may answer with these (the auth, body-limit and library errors)."""


class Problem(Exception):
    """An error answer raised by the service itself (not by the library)."""

    def __init__(self, status: int, error: str, detail: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail or error)
        self.status, self.error, self.detail = status, error, detail
        self.headers = headers
        self.extra = extra


def problem_response(status: int, error: str, detail: str | None = None,
                     headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"/problems/{error}", "title": HTTPStatus(status).phrase, "status": status,
        "detail": detail, "error": error, **extra,
    }
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


RETRY_AFTER = 5
"""Seconds a 503 asks the client to wait before it tries again (and the dashboard's error
page to wait before it reloads itself)."""
JSON_PATHS = ("/api/", "/metrics", "/openapi.json", "/docs", "/redoc")
"""Paths that answer JSON (or text) to programs, whatever their Accept header says."""
ErrorPage = Callable[[Request, int, str, "str | None", "dict[str, str] | None"], Response]
"""``(request, status, error, detail, headers) -> HTML response``: what the dashboard
installs as ``fastapi_app.state.error_page``."""


def wants_html(request: Request) -> bool:
    """An error of this request is shown to a person: a page of the dashboard (a route
    that says so with ``html = True``), or any other path but the API's asked for by a
    browser (``Accept: text/html``, as a browser's navigation sends)."""
    if getattr(request.app.state, "error_page", None) is None:
        return False
    path = request.url.path
    if path.startswith(JSON_PATHS):
        return False
    route = request.scope.get("route")
    if route is not None and getattr(route, "html", None) is not None:
        return bool(route.html)
    return "text/html" in request.headers.get("accept", "").lower()


def answer(request: Request, status: int, error: str, detail: str | None = None,
           headers: dict[str, str] | None = None, **extra: Any) -> Response:
    """The error as the caller reads it: an HTML page for a person (:func:`wants_html`),
    else a problem document. A 503 says when to try again (``Retry-After``): the database
    that was away, or the lock that was held, may well be back by then."""
    if status == 503 and "Retry-After" not in (headers or {}):
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER)}
    if wants_html(request):
        page: ErrorPage = request.app.state.error_page
        return page(request, status, error, detail, headers)
    return problem_response(status, error, detail, headers, **extra)


def status_of(exc: BaseException) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 400


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into a problem document."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> Response:
        return answer(request, exc.status, exc.error, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(E.JustonceError)
    async def _library(request: Request, exc: E.JustonceError) -> Response:
        status = status_of(exc)
        if status >= 500 and not isinstance(exc, E.DatabaseUnavailable | E.SchemaError):
            log.error("request failed: %s: %s", type(exc).__name__, exc)
            return answer(request, status, type(exc).__name__)
        return answer(request, status, type(exc).__name__, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errs):
            return answer(request, 400, "MalformedJson", "the request body is not valid JSON")
        details = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
                   for e in errs[:20]]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        return answer(
            request, 422, "RequestValidation", f"{'.'.join(first['loc'])}: {first['msg']}", errors=details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a body its JSON parser raised on (other than JSONDecodeError: a
        # document nested past the recursion limit, bytes that are not text) with a bare
        # "error parsing the body": it is malformed JSON like any other.
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError | ValueError):
            deep = " (nested too deep)" if isinstance(exc.__cause__, RecursionError) else ""
            return answer(request, 400, "MalformedJson", f"the request body is not valid JSON{deep}")
        error = {404: "NotFound", 405: "MethodNotAllowed", 413: "BodyTooLarge",
                 400: "BadRequest"}.get(exc.status_code, "HttpError")
        detail = exc.detail if isinstance(exc.detail, str) else None
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        return answer(request, exc.status_code, error, detail, getattr(exc, "headers", None))

    # ValueError and TypeError get handlers of their own, not a branch of the catch-all
    # below: Starlette re-raises whatever reaches the catch-all to the server, which then
    # drops the client's keep-alive connection (its next request fails) and logs a trace.
    @app.exception_handler(ValueError)
    @app.exception_handler(TypeError)
    async def _refused(request: Request, exc: Exception) -> Response:
        # The library's validators raise its own errors; a bare ValueError here means
        # input we did not expect to reach a parser: the client's fault, still no trace.
        log.warning("request refused: %s: %s", type(exc).__name__, exc)
        return answer(request, 400, "BadRequest", str(exc)[:500])

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return answer(request, 500, "InternalError")
