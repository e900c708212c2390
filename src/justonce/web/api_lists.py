"""``/api/v1/lists``: pre-loaded lists handed out in O(1) (justonce.lists), thin routes
over ``app.lists``.

Reads take a read token; every call that changes a list takes an admin token and is
written to the audit trail in the change's own transaction, like every other action of
the service. Reservation tokens
travel in request bodies, never in URLs (URLs end up in proxy logs), and the audit keeps
a reservation's id, never its secret.

Two answers have no body: ``POST /lists/{name}/reserve`` and ``POST /lists/{name}/next``
answer 204 when nothing can be handed out now (every position done, buried, or held by
someone else), as ``POST /session/end`` does when there is nothing to say.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from ..app import App
from ..lists import LOAD_CHUNK, MAX_ITEMS, ListRun, parse_token
from ..models import ListInfo, Reservation
from . import list_schemas as S
from .auth import Principal, audit, require_admin, require_read
from .media import JsonRoute, media_type
from .problems import ERRORS, Problem
from .schemas import BIGINT, QUERY_INT

router = APIRouter(route_class=JsonRoute, responses=ERRORS, tags=["lists"])
Reader = Annotated[Principal, Depends(require_read)]
Admin = Annotated[Principal, Depends(require_admin)]
Name = Annotated[str, Path(min_length=1, max_length=63, description="The list's name.")]
NOTHING: dict[int | str, dict[str, Any]] = {204: {"description": "Nothing can be handed out now (no body)."}}
ANSWER_ITEM_BYTES = 16 * 1024 * 1024
"""Item text (UTF-8 bytes) one answer carries at most (twice the default body limit): a
reservation of 10,000 items of 256 KiB would otherwise be a 2.5 GiB answer held in the
server's memory. The database stops reading at it (list_items)."""
ITEMS_PAGE = 64
"""Positions read in the first query of an answer's items; later pages are sized from the
items seen so far. The byte budget bounds what a page returns whatever its size: the page
only bounds how many item lengths one query sums."""
NDJSON = ("application/x-ndjson", "application/jsonl", "application/json-lines")


def _app(request: Request) -> App:
    return request.app.state.justonce


def _out(info: ListInfo) -> S.ListOut:
    return S.ListOut.model_validate(info)


def _reservation_id(token: str) -> int:
    return parse_token(token)[0]


def _items(app: App, name: str, ranges: tuple[tuple[int, int], ...],
           budget: int = ANSWER_ITEM_BYTES) -> tuple[list[S.ItemOut], bool]:
    """The items at ``ranges`` in position order, as long as their text adds up to at most
    ``budget`` bytes; (items, truncated)."""
    out: list[S.ItemOut] = []
    pending = [r for r in ranges if r[1] > r[0]]
    page, used = ITEMS_PAGE, 0
    while pending:
        take: list[tuple[int, int]] = []
        n = 0
        while pending and n < page:
            lo, hi = pending[0]
            cut = min(hi, lo + page - n)
            take.append((lo, cut))
            n += cut - lo
            pending[0] = (cut, hi)
            if cut == hi:
                pending.pop(0)
        found = app.backend.lists.items(name, tuple(take), budget - used)
        for position, text in found:
            out.append(S.ItemOut(position=position, item=json.loads(text)))
            used += len(text.encode())
        if len(found) < n:  # the next item would pass the budget
            return out, True
        average = max(used // max(len(out), 1), 1)
        page = max(1, min(2000, (budget - used) // average))
    return out, False


def _reservation(app: App, res: Reservation, with_items: bool) -> S.ReservationOut:
    items, truncated = _items(app, res.list, res.ranges) if with_items else (None, False)
    return S.ReservationOut(list=res.list, token=res.token, ranges=list(res.ranges), count=res.count,
                            expires_at=res.expires_at, attempt=res.attempt, ttr=res.ttr,
                            request_id=res.request_id, items=items, items_truncated=truncated)


async def _item_body(request: Request) -> list[Any]:
    """The items of an append: a JSON array, or JSON lines (``application/x-ndjson``, one
    item per line, blank lines skipped). The body is already bounded by BodyLimit, and its
    media type checked by the route (media.JsonRoute: those of _APPEND_BODY)."""
    body = await request.body()
    kind = media_type(request.headers.get("content-type") or "")[0]
    if kind in NDJSON:
        items = []
        for number, line in enumerate(body.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except (ValueError, RecursionError):
                raise Problem(400, "MalformedJson", f"line {number} is not JSON") from None
    else:  # application/json, or no body at all
        try:
            items = json.loads(body)
        except (ValueError, RecursionError):
            raise Problem(400, "MalformedJson", "the request body is not valid JSON") from None
        if not isinstance(items, list):
            raise Problem(422, "RequestValidation", "the body must be a JSON array of items",
                          errors=[{"loc": ["body"], "msg": "expected an array"}])
    if not 1 <= len(items) <= LOAD_CHUNK:
        raise Problem(422, "RequestValidation", f"send 1 to {LOAD_CHUNK} items per call, not {len(items)}",
                      errors=[{"loc": ["body"], "msg": f"1 to {LOAD_CHUNK} items"}])
    return items


_APPEND_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"type": "array", "items": {}, "minItems": 1, "maxItems": LOAD_CHUNK}},
    **{kind: {"schema": {"type": "string", "description": "One JSON item per line."}} for kind in NDJSON},
}}}


# -- loading ------------------------------------------------------------------------------
@router.post("/lists", response_model=S.ListOut, status_code=201)
def create_list(body: S.ListCreateIn, request: Request, who: Admin) -> S.ListOut:
    """Create a list, load ``items`` (at most 10,000 here: append more), and seal it unless
    ``seal`` is false. Every item is checked before anything is stored."""
    app = _app(request)
    with app.backend.transaction() as conn:  # the list, its items and its audit row
        info = app.lists.create(body.name, task=body.task, items=body.items, seal=body.seal,
                                ttr=body.ttr, max_attempts=body.max_attempts,
                                on_complete=body.on_complete, conn=conn)
        audit(request, who, "list.create", f"list:{info.name}", info.progress.total, conn=conn,
              sealed=body.seal)
    return _out(info)


@router.post("/lists/{name}/items", response_model=S.AppendOut, openapi_extra=_APPEND_BODY)
def append(name: Name, request: Request, who: Admin,
           items: Annotated[list[Any], Depends(_item_body)]) -> S.AppendOut:
    """Append 1 to 10,000 items to a list that is still loading, in one transaction: all
    of them or (a bad item, a sealed list) none. The body is a JSON array, or JSON lines
    with ``Content-Type: application/x-ndjson``."""
    app = _app(request)
    with app.backend.transaction() as conn:  # one chunk: every item is checked before it is stored
        n = app.lists.append(name, items, conn=conn)
        audit(request, who, "list.append", f"list:{name}", n, conn=conn)
    return S.AppendOut(appended=n, total=app.lists.progress(name).total)


@router.post("/lists/{name}/seal", response_model=S.ListOut)
def seal(name: Name, request: Request, who: Admin) -> S.ListOut:
    """No more items; positions can be reserved from now on. An empty list completes at
    once. Sealing a sealed list changes nothing."""
    app = _app(request)
    with app.backend.transaction() as conn:
        info = app.lists.seal(name, conn=conn)
        audit(request, who, "list.seal", f"list:{name}", info.progress.total, conn=conn)
    return _out(info)


# -- handing out --------------------------------------------------------------------------
@router.post("/lists/{name}/reserve", response_model=S.ReservationOut, responses=NOTHING)
def reserve(name: Name, body: S.ReserveIn, request: Request, who: Admin) -> Any:
    """Reserve up to ``k`` positions for ``ttr`` seconds: timed-out or released positions
    first, else fresh ones. 204 when nothing can be handed out now. With ``request_id``,
    asking again after a lost answer gets the same reservation."""
    app = _app(request)
    with app.backend.transaction() as conn:
        res = app.lists.reserve(name, body.k, ttr=body.ttr, request_id=body.request_id, conn=conn)
        if res is not None:
            audit(request, who, "list.reserve", f"list:{name}", res.count, conn=conn,
                  reservation=_reservation_id(res.token), request_id=body.request_id)
    if res is None:
        return Response(status_code=204)
    return _reservation(app, res, body.items)


@router.post("/lists/{name}/touch", response_model=S.TouchOut)
def touch(name: Name, body: S.TouchIn, request: Request, who: Admin) -> S.TouchOut:
    """Extend a reservation's time to run; 409 StaleReservation when it no longer holds
    its positions."""
    app = _app(request)
    with app.backend.transaction() as conn:
        expires = app.lists.touch(name, body.token, ttr=body.ttr, conn=conn)
        audit(request, who, "list.touch", f"list:{name}", None, conn=conn,
              reservation=_reservation_id(body.token))
    return S.TouchOut(expires_at=expires)


@router.post("/lists/{name}/complete", response_model=S.CompleteOut)
def complete(name: Name, body: S.CompleteIn, request: Request, who: Admin) -> S.CompleteOut:
    """Mark positions done (default: all the reservation holds). 409 StaleReservation for
    a token that no longer holds them, 409 PositionNotReserved for a position it does not
    hold; either way nothing changes."""
    app = _app(request)
    with app.backend.transaction() as conn:
        done = app.lists.complete(name, body.token, body.positions, conn=conn)
        audit(request, who, "list.complete", f"list:{name}", done.completed, conn=conn,
              reservation=_reservation_id(body.token), list_completed=done.list_completed)
    return S.CompleteOut(completed=done.completed, already=list(done.already),
                         list_completed=done.list_completed)


@router.post("/lists/{name}/release", response_model=S.ReleaseOut)
def release(name: Name, body: S.ReleaseIn, request: Request, who: Admin) -> S.ReleaseOut:
    """Give positions back (default: all), handed out again after ``delay`` seconds."""
    app = _app(request)
    with app.backend.transaction() as conn:
        n = app.lists.release(name, body.token, delay=body.delay, positions=body.positions, conn=conn)
        audit(request, who, "list.release", f"list:{name}", n, conn=conn,
              reservation=_reservation_id(body.token), delay=body.delay)
    return S.ReleaseOut(released=n)


@router.post("/lists/{name}/bury", response_model=S.BuryOut)
def bury(name: Name, body: S.BuryIn, request: Request, who: Admin) -> S.BuryOut:
    """Park positions (default: all) until kicked; the list cannot complete meanwhile."""
    app = _app(request)
    with app.backend.transaction() as conn:
        n = app.lists.bury(name, body.token, positions=body.positions, reason=body.reason, conn=conn)
        audit(request, who, "list.bury", f"list:{name}", n, conn=conn,
              reservation=_reservation_id(body.token))
    return S.BuryOut(buried=n)


@router.post("/lists/{name}/kick", response_model=S.KickOut)
def kick(name: Name, request: Request, who: Admin, body: S.KickIn | None = None) -> S.KickOut:
    """Hand buried positions out again, oldest first, attempts counted afresh."""
    app = _app(request)
    with app.backend.transaction() as conn:
        n = app.lists.kick(name, body.limit if body else MAX_ITEMS, conn=conn)
        audit(request, who, "list.kick", f"list:{name}", n, conn=conn)
    return S.KickOut(kicked=n)


@router.post("/lists/{name}/next", response_model=S.ListRunOut, responses=NOTHING)
def run_next(name: Name, request: Request, who: Admin, body: S.NextIn | None = None) -> Any:
    """Reserve the next position, run the list's task on its item in this request,
    complete it, and answer with the result (``outcome``). The service must know the task
    (``justonce serve --app mod:app``). Parallel requests run in parallel. 204 when nothing
    can be handed out now. Two audit rows, each committed with its step: the reservation
    (``outcome: running``) before the task runs, and the run's end after it."""

    def audited(conn: Any, run: ListRun) -> None:
        audit(request, who, "list.next", f"list:{name}", 1, conn=conn, position=run.position,
              attempt=run.attempt, outcome=run.outcome, list_completed=run.list_completed)

    run = _app(request).lists.run_next(name, ttr=body.ttr if body else None, on_step=audited)
    if run is None:
        return Response(status_code=204)
    return S.ListRunOut(list=run.list, position=run.position, item=run.item, attempt=run.attempt,
                        outcome=run.outcome, result=run.result, error=run.error,  # type: ignore[arg-type]
                        list_completed=run.list_completed, note=run.note)


# -- reading ------------------------------------------------------------------------------
@router.get("/lists", response_model=S.ListsOut)
def list_lists(request: Request, who: Reader,
               limit: Annotated[int, Query(ge=1, le=10_000), QUERY_INT] = 100) -> S.ListsOut:
    """Lists by name, with their progress."""
    return S.ListsOut(lists=[_out(i) for i in _app(request).lists.list(limit)])


@router.get("/lists/{name}", response_model=S.ListOut)
def get_list(name: Name, request: Request, who: Reader) -> S.ListOut:
    """One list: state, settings and progress."""
    return _out(_app(request).lists.get(name))


@router.get("/lists/{name}/progress", response_model=S.ListProgressOut)
def progress(name: Name, request: Request, who: Reader) -> S.ListProgressOut:
    """Where the positions are: ready, reserved, done, buried (they add up to total)."""
    return S.ListProgressOut.model_validate(_app(request).lists.progress(name))


@router.get("/lists/{name}/buried", response_model=S.BuriedListOut)
def buried(name: Name, request: Request, who: Reader,
           limit: Annotated[int, Query(ge=1, le=10_000), QUERY_INT] = 100) -> S.BuriedListOut:
    """Buried positions, oldest first, with the reason given."""
    found = _app(request).lists.buried(name, limit)
    return S.BuriedListOut(buried=[S.BuriedOut(ranges=list(b.ranges), attempt=b.attempt, reason=b.reason,
                                               buried_at=b.buried_at) for b in found])


@router.get("/lists/{name}/items", response_model=S.ItemsOut)
def items(name: Name, request: Request, who: Reader,
                start: Annotated[int, Query(ge=0, le=BIGINT), QUERY_INT] = 0,
                limit: Annotated[int, Query(ge=1, le=LOAD_CHUNK), QUERY_INT] = 1000) -> S.ItemsOut:
    """Items by position (a list's items never change once sealed): ``limit`` from
    ``start``, or fewer when the answer reaches 16 MiB of item text; follow ``next``."""
    app = _app(request)
    total = app.lists.progress(name).total
    stop = min(start + limit, total)
    found, truncated = _items(app, name, ((start, stop),) if stop > start else ())
    last = (found[-1].position + 1 if found else start) if truncated else stop
    return S.ItemsOut(items=found, next=last if last < total else None)
