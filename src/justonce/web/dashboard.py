"""The dashboard at ``/``: server-rendered pages over the App, refreshed in place.

Every page needs a signed-in session (a token pasted on /signin; see web/session.py);
every action is a POST form with a CSRF field and needs the admin scope, and is written to
the audit trail. The live part of each page is re-rendered from the shared snapshot
(web/snapshot.py) every 2 s by a few lines of JavaScript: any number of open dashboards
cost the database one refresh per interval per server process. Everything from the
database goes through Jinja's autoescaping.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool

from ..app import App
from ..backends.dashstore import Count
from ..errors import (
    CountChanged,
    DatabaseUnavailable,
    InvalidOption,
    InvalidTransition,
    JustonceError,
    KeyConflict,
    ValidationError,
)
from ..validate import plain_int, shown
from . import errorpage, session
from .auth import FormError, Principal, audit, parse_form
from .media import JsonRoute, PageRoute
from .problems import status_of
from .snapshot import STATES, Snapshots

HERE = Path(__file__).parent
NAV = (("/", "Overview"), ("/jobs", "Jobs"), ("/batches", "Batches"), ("/lists", "Lists"),
       ("/partitions", "Partitions"), ("/effects", "Effects"))
LIST_LIMIT = 100
LISTS_SHOWN = 50
"""Lists on the Lists page (by name): each costs two small queries per refresh."""
MESSAGES = {
    "retried": "Job {id} is ready again.", "cancelled": "Job {id} was cancelled.",
    "applied_cancel": "Cancelled {n} jobs.", "applied_retry": "Retried {n} jobs.",
    "resolved": "Effect resolved.", "kicked": "Kicked {n} buried positions: they are ready again.",
    "queue_paused": "The queue is paused: no worker claims its jobs until it is resumed.",
    "queue_resumed": "The queue is resumed: its ready jobs are claimed again.",
    "queue_already_paused": "The queue was paused already: nothing changed.",
    "queue_not_paused": "The queue was not paused: nothing changed.",
}
ERRORS = {
    "count_changed": "The number of matching jobs changed since the preview: nothing was "
                     "changed. Preview again and confirm the new count.",
    "key_conflict": "Another live job holds this job's key: it cannot be retried while that "
                    "one is live.",
    "not_allowed": "This job is no longer in a state that allows it (it moved on since the "
                   "page was shown).",
    "invalid": "The request was not valid (a filter or a value the library refused).",
    "unavailable": "The database did not answer in time: try again.",
    "failed": "The action failed.",
}
"""What ``?err=`` may say: a code from this table, never text from the URL."""


def mount_dashboard(web: FastAPI, app: App, *, interval: float = 1.0) -> Snapshots:
    """Add the dashboard's pages, its static files and its snapshot to ``web``."""
    snapshots = Snapshots(app, interval=interval)
    web.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    web.include_router(dashboard_router(app, snapshots))
    web.add_exception_handler(SignInFirst, _sign_in_first)  # type: ignore[arg-type]
    web.add_exception_handler(PageError, _page_error)  # type: ignore[arg-type]
    web.state.error_page = errorpage.render  # (problems.answer: errors of pages as pages)
    return snapshots


class SignInFirst(Exception):
    """A page was asked for without a session."""


class PageError(Exception):
    """A page cannot be shown (unknown id, malformed filter), or an action was refused: a
    short HTML answer with its 4xx status and a link back."""

    def __init__(self, status: int, message: str, back: str = "/", error: str | None = None) -> None:
        super().__init__(message)
        self.status, self.back = status, back
        self.error = error or HTTPStatus(status).phrase.title().replace(" ", "")
        """The error's name on the page (the library's error class, when it is one)."""


async def _sign_in_first(request: Request, exc: SignInFirst) -> Response:
    if request.url.path.startswith("/live/") or request.url.path.startswith("/dashboard/"):
        return Response(status_code=401)
    return RedirectResponse("/signin?" + urlencode({"next": request.url.path}), 303)


async def _page_error(request: Request, exc: PageError) -> Response:
    return errorpage.render(request, exc.status, exc.error, str(exc), back=_safe_next(exc.back))


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.globals.update(states=STATES, nav=NAV, count=fmt_count, ranges=fmt_ranges)
    return env


def fmt_ranges(ranges: Any, most: int = 8) -> str:
    """Half-open ranges as positions people read: ((0, 10), (15, 16)) → '0–9, 15'."""
    parts = [f"{lo}" if hi - lo == 1 else f"{lo}–{hi - 1}" for lo, hi in list(ranges)[:most]]
    return ", ".join(parts) + (" …" if len(ranges) > most else "")


def fmt_count(c: Count | None) -> str:
    """1,234 (exact), 10,000+ (capped), ≈1.2M (estimated)."""
    if c is None:
        return "0"
    if c.kind == "capped":
        return f"{c.n:,}+"
    if c.kind == "estimate":
        return "≈" + _short(c.n)
    return f"{c.n:,}"


def _short(n: int) -> str:
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + unit
    return str(n)


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    return value.timestamp() if isinstance(value, datetime) else float(value)


def relative(value: Any, now: float) -> str:
    """'3 s ago', '4 min ago', 'in 12 s'."""
    t = _epoch(value)
    if t is None:
        return ""
    d = now - t
    word = "{} ago" if d >= 0 else "in {}"
    d = abs(d)
    if d < 60:
        text = f"{d:.0f} s"
    elif d < 3600:
        text = f"{d / 60:.0f} min"
    elif d < 86400:
        text = f"{d / 3600:.1f} h"
    else:
        text = f"{d / 86400:.1f} d"
    return word.format(text)


def chart_svg(succeeded: list[int], failed: list[int], width: int = 600, height: int = 150) -> Markup:
    """Jobs per second as an inline SVG (numbers only go in: nothing to escape)."""
    n = max(len(succeeded), 1)
    top = max([*succeeded, *failed, 1])
    scale = 10 ** math.floor(math.log10(top)) if top >= 10 else 1
    top = math.ceil(top / scale) * scale
    pad_l, pad_t, pad_b = 36, 8, 16
    w, h = width - pad_l, height - pad_b - pad_t

    def y(v: float) -> float:
        return pad_t + h - v * h / top

    def pts(series: list[int]) -> str:
        return " ".join(f"{pad_l + i * w / max(n - 1, 1):.1f},{y(v):.1f}"
                        for i, v in enumerate(series))

    ok = pts(succeeded)
    area = f"{pad_l},{y(0):.1f} {ok} {pad_l + w},{y(0):.1f}"
    grid = "".join(
        f'<line x1="{pad_l}" x2="{width}" y1="{y(top * f):.1f}" y2="{y(top * f):.1f}" stroke="#eef0f3"/>'
        f'<text x="{pad_l - 4}" y="{y(top * f) + 4:.1f}" text-anchor="end" font-size="10" fill="#98a2b3">'
        f"{_short(round(top * f))}</text>"
        for f in (0, 0.5, 1))
    minutes = n // 60
    labels = (f'<text x="{pad_l}" y="{height - 2}" font-size="10" fill="#98a2b3">−{minutes} min</text>'
              f'<text x="{width}" y="{height - 2}" font-size="10" fill="#98a2b3" text-anchor="end">now</text>')
    return Markup(
        f'<svg class="chart" viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="jobs finished per second">{grid}'
        f'<polygon class="ok" points="{area}" stroke="none"/>'
        f'<polyline class="ok" points="{ok}" fill="none" stroke-width="1.5"/>'
        f'<polyline class="bad" points="{pts(failed)}" stroke-width="1.5"/>{labels}</svg>')


def _safe_next(value: str | None, default: str = "/") -> str:
    """A local path to go back to (never another site: no scheme, no //host, and no
    whitespace or control characters, which browsers drop from a URL: ``/\t/host``)."""
    if (not value or not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(c <= " " or c == "\x7f" for c in value)):
        return default
    return value


async def _form(request: Request) -> dict[str, str]:
    try:
        return parse_form(await request.body())
    except FormError as exc:
        raise HTTPException(exc.status, "form too large" if exc.status == 413 else "malformed form") from None


def dashboard_router(app: App, snapshots: Snapshots) -> APIRouter:
    env = _env()
    r = APIRouter(include_in_schema=False, route_class=PageRoute)

    def render(name: str, request: Request, viewer: Principal, **ctx: Any) -> HTMLResponse:
        snap_now = ctx.pop("now", None) or time.time()
        ctx.setdefault("section", "/" + request.url.path.strip("/").split("/")[0]
                       if request.url.path != "/" else "/")
        ctx["section"] = ctx["section"] if ctx["section"] in dict(NAV) else "/"
        msg = request.query_params.get("ok")
        flash = MESSAGES.get(msg or "", "").format(id=_digits(request.query_params.get("id")),
                                                   n=_digits(request.query_params.get("n")))
        err = ERRORS.get(request.query_params.get("err") or "")
        html = env.get_template(name).render(
            viewer=viewer, admin=viewer.is_admin, csrf=viewer.csrf or "",
            ago=lambda v: relative(v, snap_now), until=lambda v: relative(v, snap_now),
            ts=lambda v: v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if v else "",
            pretty=lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str),
            limit=LIST_LIMIT, flash=flash or (err or ""), flash_bad=bool(err), **{"title": name, **ctx})
        return HTMLResponse(html, headers=_NO_STORE)

    def signed_in(request: Request) -> Principal:
        v = session.viewer(request)
        if v is None:
            raise SignInFirst()
        return v

    Viewer = Depends(signed_in)

    async def admin_form(request: Request) -> tuple[Principal, dict[str, str]]:
        """A POST action: signed in, valid CSRF field, admin scope; else 403 (401 without
        a session)."""
        form = await _form(request)
        v = await run_in_threadpool(session.viewer, request)
        if v is None:
            raise HTTPException(401, "sign in first")
        if not session.csrf_ok(v, form.get("csrf")):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page")
        if not v.is_admin:
            raise HTTPException(403, "this token is read-only: actions need an admin token")
        return v, form

    # -- signing in ------------------------------------------------------------------
    @r.get("/signin")
    def signin_page(request: Request) -> HTMLResponse:
        nxt = _safe_next(request.query_params.get("next"))
        return HTMLResponse(env.get_template("signin.html").render(next=nxt, error=None),
                            headers=_NO_STORE)

    @r.post("/signin")
    async def signin(request: Request) -> Response:
        form = await _form(request)
        info = await run_in_threadpool(app.tokens.verify, form.get("token", "").strip())
        nxt = _safe_next(form.get("next"))
        if info is None:
            html = env.get_template("signin.html").render(
                next=nxt, error="That token is not valid (unknown, revoked or mistyped).")
            return HTMLResponse(html, status_code=401, headers=_NO_STORE)
        response = RedirectResponse(nxt, 303)
        session.start(request, response, info)
        return response

    @r.post("/signout")
    async def signout(request: Request) -> Response:
        """Any scope may sign out, but only with the session's CSRF token: a forged form
        cannot sign anyone out."""
        form = await _form(request)
        v = await run_in_threadpool(session.viewer, request)
        if v is None:
            raise HTTPException(401, "not signed in")
        if not session.csrf_ok(v, form.get("csrf")):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page")
        response = RedirectResponse("/signin", 303)
        session.end(request, response)
        return response

    # -- pages -------------------------------------------------------------------------
    def snapshot_page(path: str, live: str, template: str, title: str,
                      ctx: Callable[[], dict[str, Any]]) -> None:
        """A page and its live fragment (``live``, re-fetched by the page every refresh):
        the same context, read from the shared snapshot, in ``<template>.html`` and in
        its partial ``_<template>.html``."""
        def page(request: Request, viewer: Principal = Viewer) -> Response:
            return render(f"{template}.html", request, viewer, title=title, **ctx())

        def fragment(request: Request, viewer: Principal = Viewer) -> Response:
            return render(f"_{template}.html", request, viewer, **ctx())

        r.get(path, response_class=HTMLResponse, name=template)(page)
        r.get(live, response_class=HTMLResponse, name=f"live_{template}")(fragment)

    def overview_ctx() -> dict[str, Any]:
        snap = snapshots.get()
        ok = snap.succeeded
        return {"snap": snap, "now": snap.now, "chart": chart_svg(snap.succeeded, snap.failed),
                "rate_ok": ok[-1] if ok else 0, "rate_bad": snap.failed[-1] if snap.failed else 0,
                "peak": max([*ok, *snap.failed, 0]),
                "window_label": f"{len(ok) // 60} minutes"}

    snapshot_page("/", "/live/overview", "overview", "Overview", overview_ctx)

    def snapshot_json(request: Request, viewer: Principal = Viewer) -> Response:
        return JSONResponse(snapshots.get().as_json(), headers=_NO_STORE)

    # JSON for scripts: its errors are problem documents, not pages.
    r.add_api_route("/dashboard/snapshot", snapshot_json, methods=["GET"],
                    route_class_override=JsonRoute)

    def job_filter(q: dict[str, str]) -> dict[str, Any]:
        f = {k: (q.get(k) or "").strip() or None for k in ("queue", "state", "task")}
        return f

    def filter_view(f: dict[str, Any]) -> dict[str, Any]:
        hidden = {k: v for k, v in f.items() if v}
        return {**f, "hidden": hidden, "url": "/jobs" + ("?" + urlencode(hidden) if hidden else "")}

    @r.get("/jobs", response_class=HTMLResponse)
    def jobs(request: Request, viewer: Principal = Viewer) -> Response:
        f = job_filter(dict(request.query_params))
        before = request.query_params.get("before")
        cursor = _int(before) if before else None
        with _shown():
            rows, nxt = app.list_jobs_page(app.job_filter(**f), cursor=cursor, limit=LIST_LIMIT)
        view = filter_view(f)
        older = view["url"] + ("&" if view["hidden"] else "?") + urlencode({"before": nxt}) \
            if nxt is not None else None
        return render("jobs.html", request, viewer, title="Jobs", jobs=rows, f=view,
                      preview=None, now=app.backend.dash_clock(), older=older,
                      paged=cursor is not None)

    @r.post("/jobs/preview", response_class=HTMLResponse)
    async def jobs_preview(request: Request) -> Response:
        viewer, form = await admin_form(request)
        f = job_filter(form)
        action = form.get("action", "")

        def run() -> Response:
            where = app.job_filter(**f)
            count, max_id = app.count_matching(action, where)
            rows, _ = app.list_jobs_page(where, limit=LIST_LIMIT)
            what = ", ".join(f"{k} = {v}" for k, v in f.items() if v) or "every job"
            states = "live" if action == "cancel" else "dead or cancelled"
            preview = {"action": action, "count": count, "max_id": max_id,
                       "what": f"{states} jobs where {what}"}
            return render("jobs.html", request, viewer, title="Jobs", jobs=rows,
                          f=filter_view(f), preview=preview, now=app.backend.dash_clock(),
                          older=None, paged=False)

        return await run_in_threadpool(_guard(run, "/jobs"))

    @r.post("/jobs/apply")
    async def jobs_apply(request: Request) -> Response:
        viewer, form = await admin_form(request)
        f = job_filter(form)
        action = form.get("action", "")

        def run() -> Response:
            max_id = plain_int(form.get("max_id"), zero=True)
            expected = plain_int(form.get("expected"), zero=True)
            if max_id is None or expected is None:
                raise HTTPException(400, "max_id and expected must be integers in plain digits")
            if max_id == 0:
                # The preview found no job: none that existed then can match (without a
                # bound, jobs enqueued since would have been acted on). The action and the
                # filter are still checked, as the preview checked them (without a count).
                app.job_filter(**f)
                if action not in ("cancel", "retry"):
                    raise InvalidOption(f"action must be cancel or retry, not {action!r}")
                n = 0
            else:
                where = app.job_filter(**f, max_id=max_id)
                chunks = 0

                def audit_chunk(conn: Any, count: int) -> None:  # in the chunk's transaction
                    nonlocal chunks
                    chunks += 1
                    audit(request, viewer, f"jobs.{action}_matching", json.dumps(f), count, conn=conn,
                          expected=expected, max_id=max_id, chunk=chunks, via="dashboard")

                n = app.apply_matching(action, where, expected=expected, on_chunk=audit_chunk)
            if not n:  # nothing changed: the call itself is still on the trail
                with app.backend.transaction() as conn:
                    audit(request, viewer, f"jobs.{action}_matching", json.dumps(f), 0, conn=conn,
                          expected=expected, max_id=max_id, via="dashboard")
            back = {k: v for k, v in f.items() if v}
            return RedirectResponse("/jobs?" + urlencode({**back, "ok": f"applied_{action}", "n": n}), 303)

        return await run_in_threadpool(_guard(run, "/jobs"))

    @r.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(job_id: str, request: Request, viewer: Principal = Viewer) -> Response:
        with _shown():
            job = app.get_job(_int(job_id))
        return render("job.html", request, viewer, title=f"Job {job.id}", job=job,
                      section="/jobs", now=app.backend.dash_clock())

    def job_action(verb: str, fn: Callable[..., Any]) -> Any:
        async def handler(request: Request, job_id: str) -> Response:
            viewer, form = await admin_form(request)
            jid = _int(job_id)

            def run() -> Response:
                with app.backend.transaction() as conn:  # the change and its audit row
                    fn(jid, conn=conn)
                    audit(request, viewer, f"job.{verb}", f"job:{jid}", 1, conn=conn, via="dashboard")
                nxt = _safe_next(form.get("next"), request.headers.get("referer", "/"))
                done = "cancelled" if verb == "cancel" else "retried"
                return RedirectResponse(_with(nxt, ok=done, id=jid), 303)

            return await run_in_threadpool(_guard(run, f"/jobs/{jid}"))
        handler.__name__ = f"job_{verb}"
        return handler

    r.post("/jobs/{job_id}/retry")(job_action("retry", app.retry))
    r.post("/jobs/{job_id}/cancel")(job_action("cancel", app.cancel))

    @r.post("/queues/{queue}/{verb}")
    async def queue_action(queue: str, verb: str, request: Request) -> Response:
        """Pause or resume a queue (the overview's Queues panel)."""
        viewer, form = await admin_form(request)
        if verb not in ("pause", "resume"):
            raise HTTPException(404, "a queue can be paused or resumed")

        def run() -> Response:
            with app.backend.transaction() as conn:
                if verb == "pause":
                    changed = not app.pause_queue(queue, actor=viewer.name, conn=conn).already
                    detail = {"already": not changed}
                else:
                    changed = app.resume_queue(queue, conn=conn)
                    detail = {"resumed": changed}
                audit(request, viewer, f"queue.{verb}", f"queue:{queue}", None, conn=conn,
                      via="dashboard", **detail)
            snapshots.expire()
            unchanged = "queue_already_paused" if verb == "pause" else "queue_not_paused"
            return RedirectResponse(_with("/", ok=f"queue_{verb}d" if changed else unchanged), 303)

        return await run_in_threadpool(_guard(run, "/"))

    def batches_ctx() -> dict[str, Any]:
        snap = snapshots.get()
        return {"batches": snap.batches, "now": snap.now}

    snapshot_page("/batches", "/live/batches", "batches", "Batches", batches_ctx)

    # A batch's or a list's page is read at most once per interval per process (like the
    # snapshot), however many are open.
    cache: dict[Any, tuple[float, Any]] = {}

    def cached(key: Any, fn: Callable[[], Any]) -> Any:
        hit = cache.get(key)
        if hit is None or time.monotonic() - hit[0] >= snapshots.interval:
            value = fn()
            if len(cache) > 1000:
                cache.clear()
            hit = cache[key] = (time.monotonic(), value)
        return hit[1]

    def batch_ctx(batch_id: str) -> dict[str, Any]:
        bid = _int(batch_id)
        info, failures = cached(("batch", bid), lambda: (app.batches.get(bid),
                                                          app.backend.batch_failures(bid, 50)))
        return {"b": info, "failures": failures, "now": snapshots.get().now, "section": "/batches"}

    @r.get("/batches/{batch_id}", response_class=HTMLResponse)
    def batch_page(batch_id: str, request: Request, viewer: Principal = Viewer) -> Response:
        with _shown():
            ctx = batch_ctx(batch_id)
        return render("batch.html", request, viewer, title=f"Batch {ctx['b'].id}", **ctx)

    @r.get("/live/batches/{batch_id}", response_class=HTMLResponse)
    def live_batch(batch_id: str, request: Request, viewer: Principal = Viewer) -> Response:
        with _shown():
            ctx = batch_ctx(batch_id)
        return render("_batch.html", request, viewer, **ctx)

    # Lists are read for the Lists pages only (not in the shared snapshot, which the
    # overview pays for).

    def lists_ctx() -> dict[str, Any]:
        return {"lists": cached("lists", lambda: app.lists.list(LISTS_SHOWN)),
                "now": snapshots.get().now, "shown": LISTS_SHOWN}

    snapshot_page("/lists", "/live/lists", "lists", "Lists", lists_ctx)

    def list_ctx(name: str) -> dict[str, Any]:
        info, buried = cached(("list", name), lambda: (app.lists.get(name), app.lists.buried(name, 50)))
        return {"l": info, "buried": buried, "now": snapshots.get().now, "section": "/lists"}

    @r.get("/lists/{name}", response_class=HTMLResponse)
    def list_page(name: str, request: Request, viewer: Principal = Viewer) -> Response:
        with _shown():
            ctx = list_ctx(name)
        return render("list.html", request, viewer, title=f"List {name}", **ctx)

    @r.get("/live/lists/{name}", response_class=HTMLResponse)
    def live_list(name: str, request: Request, viewer: Principal = Viewer) -> Response:
        with _shown():
            ctx = list_ctx(name)
        return render("_list.html", request, viewer, **ctx)

    @r.post("/lists/{name}/kick")
    async def list_kick(name: str, request: Request) -> Response:
        """Revive a list's buried positions (like Retry of a dead job)."""
        viewer, form = await admin_form(request)

        def run() -> Response:
            with app.backend.transaction() as conn:
                n = app.lists.kick(name, conn=conn)
                audit(request, viewer, "list.kick", f"list:{name}", n, conn=conn, via="dashboard")
            cache.pop(("list", name), None)
            cache.pop("lists", None)
            return RedirectResponse(_with(f"/lists/{name}", ok="kicked", n=n), 303)

        return await run_in_threadpool(_guard(run, "/lists"))

    def slots_ctx() -> dict[str, Any]:
        snap = snapshots.get()
        return {"slots": snap.slots, "now": snap.now, "section": "/partitions"}

    snapshot_page("/partitions", "/live/partitions", "partitions", "Partitions", slots_ctx)

    def effects_ctx() -> dict[str, Any]:
        snap = snapshots.get()
        return {"effects": snap.in_doubt, "now": snap.now, "section": "/effects"}

    snapshot_page("/effects", "/live/effects", "effects", "Effects", effects_ctx)

    @r.post("/effects/resolve")
    async def effects_resolve(request: Request) -> Response:
        viewer, form = await admin_form(request)
        state = form.get("state")
        if state not in ("done", "redo"):
            raise HTTPException(400, "state must be done or redo")

        def run() -> Response:
            scope, key = form.get("scope", ""), form.get("key", "")
            with app.backend.transaction() as conn:
                app.effects.resolve(scope, key, done=state == "done", conn=conn)
                audit(request, viewer, f"effect.resolve_{state}", f"{scope}:{key}", 1, conn=conn,
                      via="dashboard")
            return RedirectResponse("/effects?ok=resolved", 303)

        return await run_in_threadpool(_guard(run, "/effects"))

    return r


_NO_STORE = {"Cache-Control": "no-store"}


def _int(value: str) -> int:
    """An id from the URL, in plain digits only (validate.plain_int: "1_5" is not 15)."""
    n = plain_int(value)
    if n is None:
        raise PageError(404, f"no such id: {shown(value)}")
    return n


def _digits(value: str | None) -> str:
    """A number from the URL for a flash message, or nothing (never free text)."""
    return value if value and value.isascii() and value.isdigit() and len(value) <= 20 else ""


def _with(url: str, **params: Any) -> str:
    """``url``'s local path (a Referer is a full URL) with ``params`` as its query."""
    return _safe_next(urlsplit(url).path) + "?" + urlencode(params)


@contextmanager
def _shown() -> Iterator[None]:
    """Library errors of a page as short HTML pages: unknown ids 404, bad filters 400."""
    try:
        yield
    except LookupError as exc:
        raise PageError(404, str(exc)) from None
    except ValidationError as exc:
        raise PageError(400, str(exc)) from None


def _error_code(exc: JustonceError) -> str:
    """The ERRORS code of a library error (the redirect carries the code, not the text)."""
    for cls, code in ((CountChanged, "count_changed"), (KeyConflict, "key_conflict"),
                      (InvalidTransition, "not_allowed"), (ValidationError, "invalid"),
                      (DatabaseUnavailable, "unavailable")):
        if isinstance(exc, cls):
            return code
    return "failed"


def _guard(fn: Callable[[], Response], back: str) -> Callable[[], Response]:
    """Run an action; a library error (a job that is no longer dead, a count that changed,
    a value it refused) is a 4xx page (the API's status for it) that says what happened
    and links back to ``back``: never a stack trace, never a success-looking redirect."""
    def run() -> Response:
        try:
            return fn()
        except LookupError as exc:
            raise PageError(404, str(exc)) from None
        except JustonceError as exc:
            raise PageError(status_of(exc), ERRORS[_error_code(exc)], back, type(exc).__name__) from None
    return run
