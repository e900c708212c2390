"""``/api/v1`` batches (carlyle's shape), partitions, effects, the audit trail and the
sign-in session: thin routes over the App."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from ..app import App
from ..types import BatchState
from . import schemas as S
from .auth import Principal, audit, require_admin, require_own_session, require_read
from .media import JsonRoute
from .problems import ERRORS, Problem

router = APIRouter(route_class=JsonRoute, responses=ERRORS)
Reader = Annotated[Principal, Depends(require_read)]
Admin = Annotated[Principal, Depends(require_admin)]
BatchId = Annotated[int, Path(ge=1, le=S.BIGINT), S.PATH_ID]


def _app(request: Request) -> App:
    return request.app.state.justonce


# -- batches --------------------------------------------------------------------------
@router.post("/batches", response_model=S.BatchOut, status_code=201, tags=["batches"])
def open_batch(body: S.BatchOpenIn, request: Request, who: Admin) -> S.BatchOut:
    """Open a batch; add groups of items, then seal it."""
    app = _app(request)
    with app.backend.transaction() as conn:
        batch = app.batches.open(body.description, on_complete=body.on_complete,
                                 on_success=body.on_success, expire_after=body.expire_after,
                                 conn=conn)
        audit(request, who, "batch.open", f"batch:{batch.id}", conn=conn)
    return S.BatchOut.model_validate(batch.info())


@router.get("/batches", response_model=S.BatchList, tags=["batches"])
def list_batches(request: Request, who: Reader, state: BatchState | None = None,
                 limit: Annotated[int, Query(ge=1, le=1000), S.QUERY_INT] = 50) -> S.BatchList:
    """Newest first."""
    found = _app(request).batches.list(state, limit)
    return S.BatchList(batches=[S.BatchOut.model_validate(b) for b in found])


@router.get("/batches/{batch_id}", response_model=S.BatchOut, tags=["batches"])
def get_batch(batch_id: BatchId, request: Request, who: Reader) -> S.BatchOut:
    """Progress: total, acked, failed, pending, state."""
    return S.BatchOut.model_validate(_app(request).batches.get(batch_id))


@router.post("/batches/{batch_id}/groups", response_model=S.GroupOut, status_code=201,
             tags=["batches"])
def add_group(batch_id: BatchId, body: S.GroupIn, request: Request, who: Admin) -> S.GroupOut:
    """Add ``count`` pending items. Build their ids yourself: ``<batch>:<group>:<i>``."""
    app = _app(request)
    with app.backend.transaction() as conn:
        group = app.batches.add(batch_id, body.count, conn=conn)
        audit(request, who, "batch.add", f"batch:{batch_id}", group.count, conn=conn,
              group=group.group_id)
    return S.GroupOut(batch_id=group.batch_id, group=group.group_id, count=group.count,
                      first_id=f"{group.batch_id}:{group.group_id}:0")


@router.post("/batches/{batch_id}/seal", response_model=S.SealOut, tags=["batches"])
def seal(batch_id: BatchId, request: Request, who: Admin) -> S.SealOut:
    """No more items; completes the batch now when nothing is pending. Idempotent."""
    app = _app(request)
    with app.backend.transaction() as conn:
        result = app.batches.seal(batch_id, conn=conn)
        audit(request, who, "batch.seal", f"batch:{batch_id}", conn=conn, completed=result.completed)
    return S.SealOut.model_validate(result)


@router.post("/batches/acks", response_model=S.AckOut, tags=["batches"])
def ack(body: S.AckIn, request: Request, who: Admin) -> S.AckOut:
    """Ack up to 100,000 item ids, all or nothing: one malformed or unknown id refuses the
    call (4xx) and nothing changes. A second ack of an item is reported in ``already``."""
    app = _app(request)
    with app.backend.transaction() as conn:
        result = app.batches.ack(body.ids, conn=conn)
        audit(request, who, "batch.ack", None, result.resolved, conn=conn,
              completed=list(result.completed))
    return S.AckOut(resolved=result.resolved, already=list(result.already),
                    completed=list(result.completed))


@router.post("/batches/fails", response_model=S.AckOut, tags=["batches"])
def fail(body: S.FailIn, request: Request, who: Admin) -> S.AckOut:
    """Mark items failed (all or nothing, like acks); an item resolved before stays so."""
    app = _app(request)
    with app.backend.transaction() as conn:
        result = app.batches.fail(body.ids, body.reason, conn=conn)
        audit(request, who, "batch.fail", None, result.resolved, conn=conn,
              completed=list(result.completed))
    return S.AckOut(resolved=result.resolved, already=list(result.already),
                    completed=list(result.completed))


@router.get("/batches/{batch_id}/failures", response_model=S.FailuresOut, tags=["batches"])
def failures(batch_id: BatchId, request: Request, who: Reader,
             limit: Annotated[int, Query(ge=1, le=10_000), S.QUERY_INT] = 100) -> S.FailuresOut:
    found = _app(request).batches.failures(batch_id, limit)
    return S.FailuresOut(failures=[S.ItemFailureOut.model_validate(f) for f in found])


# -- partitions and effects -------------------------------------------------------------
@router.get("/partitions", response_model=S.PartitionsOut, tags=["partitions"])
def partitions(request: Request, who: Reader, set: str | None = None) -> S.PartitionsOut:
    """Partition sets, their slots, holders, fencing tokens and lease expiries."""
    sets: dict[str, S.PartitionSetOut] = {}
    for s in _app(request).partitions.list(set):
        entry = sets.setdefault(s.set_name, S.PartitionSetOut(set_name=s.set_name, n=s.n, held=0, slots=[]))
        entry.slots.append(S.SlotOut.model_validate(s))
        entry.held += s.held
    return S.PartitionsOut(sets=list(sets.values()))


@router.get("/effects/in-doubt", response_model=S.EffectsOut, tags=["effects"])
def in_doubt(request: Request, who: Reader, scope: str | None = None,
             limit: Annotated[int, Query(ge=1, le=10_000), S.QUERY_INT] = 100) -> S.EffectsOut:
    """Effects whose holder's lease expired mid-effect: an operator decides."""
    found = _app(request).effects.in_doubt(scope, limit)
    return S.EffectsOut(effects=[S.EffectOut.model_validate(e) for e in found])


@router.post("/effects/resolve", response_model=S.EffectOut, tags=["effects"])
def resolve(body: S.ResolveIn, request: Request, who: Admin) -> S.EffectOut:
    """Resolve an effect in doubt: ``done`` true (it happened) or false (redo it)."""
    app = _app(request)
    with app.backend.transaction() as conn:
        info = app.effects.resolve(body.scope, body.key, done=body.done, note=body.note,
                                   force=body.force, conn=conn)
        audit(request, who, "effect.resolve", f"effect:{info.scope}:{info.key}", 1, conn=conn,
              done=body.done, note=body.note)
    return S.EffectOut.model_validate(info)


# -- audit and session ------------------------------------------------------------------
@router.get("/audit", response_model=S.AuditPage, tags=["audit"])
def audit_list(request: Request, who: Reader,
               cursor: Annotated[int | None, Query(ge=1, le=S.BIGINT), S.QUERY_INT] = None,
               limit: Annotated[int, Query(ge=1, le=1000), S.QUERY_INT] = 100) -> S.AuditPage:
    """Every action taken through the service, newest first."""
    entries = _app(request).audit.list(cursor, limit + 1)
    more = len(entries) > limit
    entries = entries[:limit]
    return S.AuditPage(entries=[S.AuditOut.model_validate(e) for e in entries],
                       next_cursor=entries[-1].id if more else None)


@router.post("/session", response_model=S.SessionOut, tags=["session"])
def sign_in(body: S.SessionIn, request: Request, response: Response) -> S.SessionOut:
    """Sign in with a token: sets the HttpOnly session cookie; returns the CSRF token."""
    app = _app(request)
    info = app.tokens.verify(body.token)
    if info is None:
        raise Problem(401, "Unauthorized", "unknown, malformed or revoked token")
    csrf = request.app.state.auth.start_session(request, response, info)
    return S.SessionOut(token_id=info.id, name=info.name, scope=info.scope, csrf=csrf)


@router.get("/session", response_model=S.SessionOut, tags=["session"])
def whoami(who: Reader) -> S.SessionOut:
    """Who the credentials of this request belong to."""
    return S.SessionOut(token_id=who.token_id, name=who.name, scope=who.scope, csrf=who.csrf)


@router.post("/session/end", status_code=204, tags=["session"])
def sign_out(request: Request, response: Response,
             who: Annotated[Principal, Depends(require_own_session)]) -> Response:
    """Drop the session cookie (a bearer token stays valid: revoke it with the CLI). A
    cookie session must send its CSRF token, like every other cookie POST."""
    out = Response(status_code=204)
    request.app.state.auth.end_session(out)
    return out


