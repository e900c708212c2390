"""``/api/v1/jobs`` and ``/api/v1/queues`` (with pause and resume): thin routes over the App."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from ..app import App
from ..models import JobFilter
from ..tasks import Enqueue
from ..types import JobState
from . import schemas as S
from .auth import Principal, audit, require_admin, require_read
from .media import JsonRoute
from .problems import ERRORS

router = APIRouter(route_class=JsonRoute, responses=ERRORS)
Reader = Annotated[Principal, Depends(require_read)]
Admin = Annotated[Principal, Depends(require_admin)]
JobId = Annotated[int, Path(ge=1, le=S.BIGINT), S.PATH_ID]
QueueName = Annotated[str, Path(min_length=1, max_length=63, description=(
    "The queue's name: 1-63 letters, digits, '_', '.', ':' or '-', starting with a letter or digit."))]


def _app(request: Request) -> App:
    return request.app.state.justonce


def _enqueue(e: S.EnqueueIn) -> Enqueue:
    return Enqueue(e.task, args=e.args, kwargs=e.kwargs, delay=e.delay, run_at=e.run_at,
                   priority=e.priority, queue=e.queue, key=e.key, partition_key=e.partition_key,
                   max_attempts=e.max_attempts, timeout=e.timeout)


def _filter(app: App, f: S.JobFilterIn, max_id: int | None = None) -> JobFilter:
    return app.job_filter(state=f.state, queue=f.queue, task=f.task,
                          created_after=f.created_after, created_before=f.created_before,
                          max_id=max_id)


@router.post("/jobs", response_model=S.JobOut, status_code=201, tags=["jobs"],
             responses={200: {"model": S.JobOut, "description": "Nothing enqueued: the live job "
                                                                 "that holds `key` (`duplicate: true`)"}})
def enqueue(body: S.EnqueueIn, request: Request, response: Response, who: Admin) -> S.JobOut:
    """Enqueue one job: 201. Or get the live job that holds ``key``, with ``duplicate:
    true``: 200 (nothing was created)."""
    app = _app(request)
    new = app.build(_enqueue(body))
    with app.backend.transaction() as conn:  # the job and its audit row commit together
        job = app.backend.job_insert(new, conn=conn)
        audit(request, who, "jobs.enqueue", f"job:{job.id}", 0 if job.duplicate else 1,
              conn=conn, task=job.task)
    if job.duplicate:
        response.status_code = 200
    return S.JobOut.model_validate(job)


@router.post("/jobs/bulk", response_model=S.BulkEnqueueOut, status_code=201, tags=["jobs"])
def enqueue_bulk(body: S.BulkEnqueueIn, request: Request, who: Admin) -> S.BulkEnqueueOut:
    """Enqueue up to 10,000 jobs atomically in one transaction (all validated first)."""
    app = _app(request)
    rows = app.build_many([_enqueue(e) for e in body.jobs])
    with app.backend.transaction() as conn:
        ids, new = app.backend.job_insert_many_counted(rows, conn=conn)
        audit(request, who, "jobs.enqueue_bulk", None, new, conn=conn)  # (duplicates: 0, as POST /jobs)
    return S.BulkEnqueueOut(ids=ids)


@router.get("/jobs", response_model=S.JobPage, tags=["jobs"])
def list_jobs(
    request: Request, who: Reader,
    state: JobState | None = None, queue: str | None = None, task: str | None = None,
    created_after: Annotated[S.AwareDatetime | None, Query()] = None,
    created_before: Annotated[S.AwareDatetime | None, Query()] = None,
    cursor: Annotated[int | None, Query(ge=1, le=S.BIGINT), S.QUERY_INT] = None,
    limit: Annotated[int, Query(ge=1, le=1000), S.QUERY_INT] = 50,
) -> S.JobPage:
    """Jobs newest first, filtered; follow ``next_cursor`` for older pages."""
    app = _app(request)
    where = _filter(app, S.JobFilterIn(state=state, queue=queue, task=task,
                                       created_after=created_after, created_before=created_before))
    jobs, nxt = app.list_jobs_page(where, cursor=cursor, limit=limit)
    return S.JobPage(jobs=[S.JobOut.model_validate(j) for j in jobs], next_cursor=nxt)


@router.get("/jobs/{job_id}", response_model=S.JobOut, tags=["jobs"])
def get_job(job_id: JobId, request: Request, who: Reader) -> S.JobOut:
    """One job with its history (``errors``: one entry per failed attempt)."""
    return S.JobOut.model_validate(_app(request).get_job(job_id))


@router.post("/jobs/{job_id}/cancel", response_model=S.JobOut, tags=["jobs"])
def cancel_job(job_id: JobId, request: Request, who: Admin) -> S.JobOut:
    """Cancel a scheduled, ready or running job (409 when it is finished)."""
    app = _app(request)
    with app.backend.transaction() as conn:  # the change and its audit row commit together
        job = app.cancel(job_id, conn=conn)
        audit(request, who, "job.cancel", f"job:{job_id}", 1, conn=conn)
    return S.JobOut.model_validate(job)


@router.post("/jobs/{job_id}/retry", response_model=S.JobOut, tags=["jobs"])
def retry_job(job_id: JobId, request: Request, who: Admin) -> S.JobOut:
    """Make a dead or cancelled job ready again (409 otherwise, or when its key is taken)."""
    app = _app(request)
    with app.backend.transaction() as conn:
        job = app.retry(job_id, conn=conn)
        audit(request, who, "job.retry", f"job:{job_id}", 1, conn=conn)
    return S.JobOut.model_validate(job)


@router.post("/jobs/actions/preview", response_model=S.PreviewOut, tags=["jobs"])
def preview(body: S.PreviewIn, request: Request, who: Reader) -> S.PreviewOut:
    """How many jobs "cancel all matching" (live jobs) or "retry all matching" (dead or
    cancelled jobs) would change now. Changes nothing, so a read token may ask."""
    app = _app(request)
    count, max_id = app.count_matching(body.action, _filter(app, body.filter))
    return S.PreviewOut(action=body.action, count=count, max_id=max_id)


@router.post("/jobs/actions/apply", response_model=S.ApplyOut, tags=["jobs"])
def apply(body: S.ApplyIn, request: Request, who: Admin) -> S.ApplyOut:
    """Apply the action to every matching job with ``id <= max_id`` (the preview's), in
    chunks of 1,000 (one transaction each, with its own audit row). 409 CountChanged, with
    nothing changed, when more jobs match than ``expected + tolerance``; fewer is fine
    (some finished)."""
    app = _app(request)
    where = _filter(app, body.filter, body.max_id)
    action = f"jobs.{body.action}_matching"
    shown = {"filter": body.filter.model_dump(mode="json", exclude_none=True), "max_id": body.max_id,
             "previewed": body.expected}
    chunks = 0

    def audit_chunk(conn: Any, n: int) -> None:
        nonlocal chunks
        chunks += 1
        audit(request, who, action, "jobs", n, conn=conn, **shown, chunk=chunks)

    applied = app.apply_matching(body.action, where, expected=body.expected,
                                 tolerance=body.tolerance, on_chunk=audit_chunk)
    if not applied:  # nothing changed: the call itself is still on the trail
        with app.backend.transaction() as conn:
            audit(request, who, action, "jobs", 0, conn=conn, **shown)
    return S.ApplyOut(action=body.action, previewed=body.expected, applied=applied)


@router.get("/queues", response_model=S.QueuesOut, tags=["queues"])
def queues(request: Request, who: Reader) -> S.QueuesOut:
    """Jobs per queue and state, and how long each queue's next ready job has waited.
    Past 100,000 jobs Postgres counts a sample (``estimated: true``)."""
    return S.QueuesOut(queues=[S.QueueOut.model_validate(q) for q in _app(request).queue_stats()])


@router.post("/queues/{queue}/pause", response_model=S.PauseOut, tags=["queues"])
def pause_queue(queue: QueueName, request: Request, who: Admin, body: S.PauseIn | None = None) -> S.PauseOut:
    """Pause a queue: no worker claims its jobs (on any machine) until it is resumed; jobs
    already running finish, and jobs can still be enqueued (they wait). Pausing a paused
    queue changes nothing: the answer is the pause in force, with ``already: true``."""
    app = _app(request)
    with app.backend.transaction() as conn:
        pause = app.pause_queue(queue, note=body.note if body else None, actor=who.name, conn=conn)
        audit(request, who, "queue.pause", f"queue:{queue}", None, conn=conn, already=pause.already)
    return S.PauseOut.model_validate(pause)


@router.post("/queues/{queue}/resume", response_model=S.ResumeOut, tags=["queues"])
def resume_queue(queue: QueueName, request: Request, who: Admin) -> S.ResumeOut:
    """Resume a paused queue (``resumed: false`` when it was not paused)."""
    app = _app(request)
    with app.backend.transaction() as conn:
        resumed = app.resume_queue(queue, conn=conn)
        audit(request, who, "queue.resume", f"queue:{queue}", None, conn=conn, resumed=resumed)
    return S.ResumeOut(queue=queue, resumed=resumed)
