"""The service's ASGI application: ``create_app(app)`` → a FastAPI app serving the JSON API
under ``/api/v1``, its OpenAPI document at ``/openapi.json`` (and ``/docs``).

``/metrics`` serves Prometheus's text format (justonce.metrics) to a read token. The
dashboard at ``/`` adds its router to the FastAPI app this returns and uses
``fastapi_app.state.justonce`` (the App) and ``fastapi_app.state.auth`` (see auth.py).

Request bodies are limited while they are read (:class:`BodyLimit`): a client that sends
more than ``max_body_bytes`` gets 413 before the rest is read, and a ``Content-Length``
over the limit is refused before anything is read.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..app import App
from ..metrics import service_metrics
from . import problems
from .api_jobs import router as jobs_router
from .api_lists import router as lists_router
from .api_more import router as more_router
from .auth import Auth, Principal, require_read, secret_key
from .dashboard import mount_dashboard

MAX_BODY_BYTES = 8 * 1024 * 1024
"""8 MiB: room for 100,000 batch item ids (~40 bytes each as JSON) or 10,000 jobs."""
API_PREFIX = "/api/v1"


class BodyLimit:
    """ASGI middleware: read the request body up to ``limit`` bytes, then hand it on;
    answer 413 as soon as it is over the limit."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or {}).get(b"content-length")
        if declared is not None:  # (a field value may carry spaces or tabs around it: RFC 9110 5.5)
            declared = declared.strip(b" \t")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(scope, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._refuse(scope, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False
        scope["justonce.body_size"] = size  # (read by media.has_body: a chunked body may be empty)

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        # (before routing: a browser's form gets a page by its Accept header alone)
        resp = problems.answer(
            Request(scope), 413, "BodyTooLarge", f"request bodies are limited to {self.limit} bytes",
            headers={"Connection": "close"})
        await resp({"type": "http"}, _nothing, send)


class HeadAsGet:
    """ASGI middleware: answer HEAD as GET without the body (RFC 9110 9.3.2: a server
    answers HEAD on every GET resource; the routes are declared for GET only, and HEAD got
    a 405). The headers, Content-Length included, are the GET's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


async def _nothing() -> Message:  # pragma: no cover - a response never reads
    return {"type": "http.disconnect"}


def from_environment() -> FastAPI:
    """The app factory of ``justonce serve --workers N`` (each worker process imports it):
    the parent passes its options in ``JUSTONCE_SERVE_*`` and ``JUSTONCE_SECRET_KEY``, so
    every worker signs cookies with the same key."""
    import os

    from ..cli import load_app
    from ..lifeline import end_with_parent

    # uvicorn's supervisor is the parent: killed with SIGKILL, it cannot stop us, and we
    # would go on serving (holding the port) with nobody to stop us. Its pid comes from
    # the environment: one killed while we were still starting is not our parent by now.
    raw = os.environ.get("JUSTONCE_SERVE_PARENT", "")
    end_with_parent(int(raw) if raw.isascii() and raw.isdigit() else os.getppid(),
                    name="justonce-serve-parent")
    app = load_app(os.environ.get("JUSTONCE_SERVE_APP") or None,
                   os.environ["JUSTONCE_SERVE_DATABASE_URL"], strict=False)
    return create_app(app, max_body_bytes=int(os.environ["JUSTONCE_SERVE_MAX_BODY_BYTES"]),
                      secret=os.environ["JUSTONCE_SECRET_KEY"])


async def _metrics(request: Request, _: Annotated[Principal, Depends(require_read)]) -> Response:
    """Prometheus text format: what the database knows (justonce.metrics.DatabaseCollector).
    Needs a read token, which Prometheus sends as a bearer token (``authorization:``)."""
    body, content_type = await run_in_threadpool(service_metrics, request.app.state.justonce)
    return Response(body, media_type=content_type)


def create_app(app: App, *, max_body_bytes: int = MAX_BODY_BYTES,
               secret: str | None = None, **fastapi_options: Any) -> FastAPI:
    """The service over ``app``. ``secret``: the key that signs session cookies (default
    ``$JUSTONCE_SECRET_KEY``, else random per process)."""
    api = FastAPI(
        title="justonce", version="1",
        description="Jobs, queues, batches, lists, partitions and effects of one justonce database. "
        "Every call needs `Authorization: Bearer <token>` (justonce tokens create) or a "
        "session cookie; actions need an admin token. Errors are RFC 9457 problem documents. "
        "A request body is `application/json` in UTF-8 (an append to a list also takes JSON "
        "lines): a body of another type, or without a `Content-Type`, is 415.",
        **fastapi_options,
    )
    api.state.justonce = app
    api.state.auth = Auth(app, secret_key(secret))
    problems.install(api)
    api.include_router(jobs_router, prefix=API_PREFIX)
    api.include_router(more_router, prefix=API_PREFIX)
    api.include_router(lists_router, prefix=API_PREFIX)
    api.add_api_route("/metrics", _metrics, methods=["GET"], include_in_schema=False)
    api.add_middleware(BodyLimit, limit=max_body_bytes)
    api.add_middleware(HeadAsGet)
    mount_dashboard(api, app)
    return api
