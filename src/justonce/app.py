"""App: the task registry and the facade over one backend.

Validation, logging and error translation happen here once, so the worker, the CLI and
user code all see the same behaviour.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, overload

from . import validate
from .backends import Backend, open_backend, resolve_url
from .batches import Batches
from .effects import Effects
from .errors import (
    CountChanged,
    InvalidArguments,
    InvalidOption,
    InvalidTransition,
    JobNotFound,
    UnknownTask,
)
from .events import Event, emit
from .lists import Lists
from .models import Job, JobFilter, MetricsSnapshot, NewJob, QueueCount, QueuePause, QueueStats
from .partitions import Partitions, partition_hash
from .retry import Backoff
from .tasks import Enqueue, Task, call_template
from .tokens import Audit, Tokens
from .types import JobState

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_TIMEOUT = 300.0
EXACT_COUNT_BELOW = 100_000
"""Jobs-table size below which queue counts are exact (see :meth:`App.queue_stats`)."""


class App:
    """Register tasks and enqueue work.

    ``database_url`` defaults to ``$JUSTONCE_DATABASE_URL``, else ``sqlite:///justonce.db``.
    With ``strict`` (the default) enqueueing a task name the app has not registered raises
    :class:`UnknownTask`; a client that only enqueues for workers elsewhere uses
    ``strict=False`` and a worker that does not know the task marks the job dead.
    """

    def __init__(self, database_url: str | None = None, *, strict: bool = True) -> None:
        self.database_url = resolve_url(database_url)
        # (1 or "no" for a flag is a mistake to name, not a truth value to guess.)
        self.strict = validate.flag(strict, "strict")
        self.tasks: dict[str, Task] = {}
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self.batches = Batches(self)
        """Batches: open, add, enqueue into, seal, ack; see :class:`~justonce.batches.Batches`."""
        self.partitions = Partitions(self)
        """Partition leases and scans; see :class:`~justonce.partitions.Partitions`."""
        self.effects = Effects(self)
        self.lists = Lists(self)
        """Lists: load, reserve, complete, run; see :class:`~justonce.lists.Lists`."""
        """The effect ledger; see :class:`~justonce.effects.Effects`."""
        self.tokens = Tokens(self)
        """API tokens of the service; see :class:`~justonce.tokens.Tokens`."""
        self.audit = Audit(self)
        """The service's audit trail; see :class:`~justonce.tokens.Audit`."""

    # -- wiring -------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    self._backend = open_backend(self.database_url)
        return self._backend

    def use_database(self, url: str) -> None:
        """Point the app at another database (the CLI's ``--database-url``)."""
        self.close()
        self.database_url = resolve_url(url)

    def migrate(self) -> list[str]:
        """Apply missing schema migrations; returns their names."""
        return self.backend.migrate()

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    # -- tasks --------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, queue: str = DEFAULT_QUEUE,
        priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float = DEFAULT_TIMEOUT, backoff: Backoff | Callable[[int], float] | None = None,
    ) -> Callable[[Callable[..., Any]], Task]: ...

    def task(
        self, fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
        queue: str = DEFAULT_QUEUE, priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float = DEFAULT_TIMEOUT, backoff: Backoff | Callable[[int], float] | None = None,
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a function as a task (``@app.task`` or ``@app.task(queue=…)``).

        ``timeout``: seconds one attempt may run before it counts as failed.
        ``backoff``: a :class:`Backoff` or ``f(attempt) -> seconds``.
        """

        def register(f: Callable[..., Any]) -> Task:
            if not callable(f):
                raise InvalidOption(f"a task is a function, not {validate.shown(f)}")
            default = f"{getattr(f, '__module__', None)}.{getattr(f, '__qualname__', None)}"
            task_name = validate.task_name(default if name is None else name)
            if task_name in self.tasks:
                raise InvalidOption(f"task {task_name!r} is registered twice")
            if backoff is not None and not (isinstance(backoff, Backoff) or callable(backoff)):
                raise InvalidOption("backoff must be a Backoff or a callable(attempt) -> seconds")
            t = Task(
                app=self, fn=f, name=task_name, queue=validate.queue_name(queue),
                priority=validate.priority(priority),
                max_attempts=validate.attempts(max_attempts),
                timeout=validate.timeout(timeout), backoff=backoff or Backoff(),
            )
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    def _resolve(self, task: str | Task) -> tuple[str, Task | None]:
        if isinstance(task, Task):
            return task.name, task
        name = validate.task_name(task)
        known = self.tasks.get(name)
        if known is None and self.strict:
            raise UnknownTask(
                f"unknown task {name!r}: register it with @app.task"
                + (f" (known: {', '.join(sorted(self.tasks))})" if self.tasks else "")
            )
        return name, known

    # -- enqueue ------------------------------------------------------------------------
    def build(self, req: Enqueue, *, bind: bool = True, passed: Sequence[str] = ()) -> NewJob:
        """Validate one request into the row to insert (no database access). A registered
        task's defaults were validated when it was registered and are not checked again.
        Its arguments must fit the task's function (``bind``; not for a template whose
        arguments come per call), given ``passed`` too (keyword arguments the job will be
        handed besides): a job that could never run is refused here, not dead later."""
        if not isinstance(req, Enqueue):
            raise InvalidOption(f"a request is an Enqueue, not {type(req).__name__}")
        name, t = self._resolve(req.task)
        args_json, kwargs_json = validate.arguments(req.args, req.kwargs)
        if bind and t is not None:
            why = t.argument_error(req.args, req.kwargs, passed)
            if why is not None:
                raise InvalidArguments(why)
        if req.delay is not None and req.run_at is not None:
            raise InvalidOption("give delay or run_at, not both")
        return NewJob(
            task=name,
            queue=_option(req.queue, t.queue if t else None, DEFAULT_QUEUE, validate.queue_name),
            args_json=args_json, kwargs_json=kwargs_json,
            priority=_option(req.priority, t.priority if t else None, 0, validate.priority),
            max_attempts=_option(req.max_attempts, t.max_attempts if t else None, DEFAULT_MAX_ATTEMPTS,
                                 validate.attempts),
            timeout=_option(req.timeout, t.timeout if t else None, DEFAULT_TIMEOUT, validate.timeout),
            delay=validate.delay(req.delay) if req.delay is not None else 0.0,
            run_at=validate.run_at(req.run_at) if req.run_at is not None else None,
            key=validate.optional_key(req.key) if req.key is not None else None,
            partition_key=(validate.optional_key(req.partition_key, "partition_key")
                           if req.partition_key is not None else None),
            partition_hash=(partition_hash(req.partition_key)
                            if req.partition_key is not None else None),
        )

    def enqueue(
        self, task: str | Task, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *,
        delay: float | timedelta | None = None, run_at: datetime | None = None,
        priority: int | None = None, queue: str | None = None, key: str | None = None,
        partition_key: str | int | None = None, max_attempts: int | None = None,
        timeout: float | None = None, conn: Any = None,
    ) -> Job:
        """Queue one job and return it.

        ``key``: while a live (scheduled, ready or running) job holds the key, enqueueing
        it again returns that job with ``duplicate=True`` instead of a second one.
        ``conn``: your own open psycopg or sqlite3 connection; the job is inserted in your
        transaction and exists only if you commit it.
        """
        new = self.build(Enqueue(
            task, args=args, kwargs=kwargs, delay=delay, run_at=run_at,  # type: ignore[arg-type]
            priority=priority, queue=queue, key=key, partition_key=partition_key,
            max_attempts=max_attempts, timeout=timeout,
        ))
        return self.backend.job_insert(new, conn=conn)

    def enqueue_many(self, requests: Iterable[Enqueue], conn: Any = None) -> list[int]:
        """Queue many jobs atomically in one round trip; returns ids in input order.
        Every request is validated before anything is written."""
        rows = self.build_many(requests)
        return self.backend.job_insert_many(rows, conn=conn) if rows else []

    def build_many(self, requests: Iterable[Enqueue]) -> list[NewJob]:
        """Validate many requests (all of them before anything is written)."""
        if isinstance(requests, (Enqueue, str, Task)) or not isinstance(requests, Iterable):
            raise InvalidOption("requests must be an iterable of Enqueue (one per job)")
        rows = []
        for r in requests:
            if not isinstance(r, Enqueue):
                raise InvalidOption(f"requests must be Enqueue objects, not {type(r).__name__}")
            rows.append(self.build(r))
        return rows

    def enqueue_calls(
        self, task: str | Task, calls: Iterable[Sequence[Any] | dict[str, Any]], *,
        conn: Any = None, **options: Any,
    ) -> list[int]:
        """Queue one job per call (a tuple of positional arguments or a dict of keyword
        arguments) with the same options, in one round trip. The options are validated
        once, not once per job."""
        template = self.build(call_template(task, options), bind=False)
        calls = validate.call_list(calls)
        if not calls:
            return []
        if template.key is not None:
            # Every call would carry the same key: the general path settles them.
            rows = [template.with_arguments(*validate.arguments(*_split(c))) for c in calls]
            self._check_calls(task, calls)
            return self.backend.job_insert_many(rows, conn=conn)
        args_doc, kwargs_doc = validate.batch_arguments(calls)
        self._check_calls(task, calls)  # (after: the calls are lists, tuples or dicts now)
        return self.backend.job_insert_batch(template, args_doc, kwargs_doc, conn=conn)

    def _check_calls(self, task: str | Task, calls: Sequence[Any], passed: Sequence[str] = ()) -> None:
        """Refuse (InvalidArguments, naming the call) the first call whose arguments do not
        fit a registered task's function; a task this App does not know is not checked."""
        _, t = self._resolve(task)
        if t is None:
            return
        fewest, most = t.positional_counts() if not passed else (1, 0)
        for i, call in enumerate(calls):
            if not isinstance(call, dict) and fewest <= len(call) <= most:
                continue  # (the common case, inline: a bulk enqueue checks many calls)
            args, kwargs = _split(call)
            why = t.argument_error(args, kwargs, passed)
            if why is not None:
                raise InvalidArguments(f"call {i}: {why}")

    # -- look-ups and operator actions --------------------------------------------------
    def get_job(self, job_id: int) -> Job:
        return self._get_job(job_id)

    def _get_job(self, job_id: int, conn: Any = None) -> Job:
        job = self.backend.job_get(_job_id(job_id), conn)
        if job is None:
            raise JobNotFound(f"no job {job_id}")
        return job

    def list_jobs(
        self, *, state: str | JobState | None = None, queue: str | None = None,
        task: str | None = None, limit: int = 50,
    ) -> list[Job]:
        where = self.job_filter(state=state, queue=queue, task=task)
        limit = validate.count(limit, "limit", 10000)
        return self.backend.job_page(where, None, limit)

    def cancel(self, job_id: int, *, conn: Any = None) -> Job:
        """Cancel a scheduled, ready or running job. A running job's worker can no longer
        complete it (its write is rejected). ``conn``: in your open transaction (as for
        :meth:`enqueue`), committed with it."""
        job = self.backend.job_cancel(_job_id(job_id), conn)
        if job is None:
            current = self._get_job(job_id, conn)
            raise InvalidTransition(f"job {job_id} is {current.state}: only live jobs can be cancelled")
        emit(Event.JOB_CANCELLED, "job cancelled", job_id=job.id)
        return job

    def retry(self, job_id: int, *, conn: Any = None) -> Job:
        """Make a dead or cancelled job ready again, with its attempts reset (``conn``: as
        for :meth:`cancel`)."""
        job = self.backend.job_retry(_job_id(job_id), conn)
        if job is None:
            current = self._get_job(job_id, conn)
            raise InvalidTransition(
                f"job {job_id} is {current.state}: only dead or cancelled jobs can be retried"
            )
        return job

    def queue_counts(self) -> list[QueueCount]:
        return self.backend.queue_counts()

    def pause_queue(self, queue: str, *, note: str | None = None, actor: str | None = None,
                    conn: Any = None) -> QueuePause:
        """Pause ``queue``: no worker claims a job of it until :meth:`resume_queue`. Every
        claim that starts after this returns skips the queue, on every worker and machine;
        running jobs finish, and a job a worker leased ahead starts only within 0.1 s of
        its claim, else it is given back unstarted (README, "Paused queues").
        Enqueueing goes on: the jobs wait, ready or scheduled. Pausing a paused queue
        changes nothing (the first pause, its time and note, stays; the answer has
        ``already`` set) and a queue need not hold jobs to be paused. Returns the pause in
        force. ``conn``: in your open transaction (the pause starts when it commits)."""
        queue = validate.queue_name(queue)
        if note is not None:
            note = validate.text(note, "note", 4000)
        if actor is not None:
            actor = validate.text(actor, "actor", 200)
        pause = self.backend.queue_pause(queue, actor, note, conn)
        if not pause.already:
            emit(Event.QUEUE_PAUSED, "queue paused", queue=queue)
        return pause

    def resume_queue(self, queue: str, *, conn: Any = None) -> bool:
        """Resume a paused queue: its ready jobs are claimed again (at once by workers that
        listen on Postgres; at their next poll elsewhere). False when it was not paused.
        ``conn``: in your open transaction."""
        queue = validate.queue_name(queue)
        resumed = self.backend.queue_resume(queue, conn)
        if resumed:
            emit(Event.QUEUE_RESUMED, "queue resumed", queue=queue)
        return resumed

    def paused_queues(self) -> list[QueuePause]:
        """The paused queues, by name."""
        return self.backend.queue_pauses()

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Per queue, the age of the longest-waiting ready job at the queue's head, and
        the batches not finished: one cheap statement (see MetricsSnapshot)."""
        return self.backend.metrics_snapshot()

    def queue_stats(self, exact_below: int = EXACT_COUNT_BELOW) -> list[QueueStats]:
        """Per queue: jobs by state and the wait of its next ready job. Counts are exact
        while the jobs table has fewer than ``exact_below`` rows; above that, Postgres
        counts a sample of the table (``estimated=True``) so that a dashboard refresh
        never costs a full scan."""
        return self.backend.queue_stats(validate.count(exact_below, "exact_below", 2**62))

    def job_filter(
        self, *, state: str | JobState | None = None, queue: str | None = None,
        task: str | None = None, created_after: datetime | None = None,
        created_before: datetime | None = None, max_id: int | None = None,
    ) -> JobFilter:
        """Validate a filter of jobs (every part optional)."""
        for t, what in ((created_after, "created_after"), (created_before, "created_before")):
            if t is not None and (not isinstance(t, datetime) or t.tzinfo is None):
                raise InvalidOption(f"{what} must be a timezone-aware datetime")
        return JobFilter(
            state=validate.optional_state(state, JobState),
            queue=validate.queue_name(queue) if queue is not None else None,
            task=validate.task_name(task) if task is not None else None,
            created_after=created_after, created_before=created_before,
            max_id=_job_id(max_id) if max_id is not None else None,
        )

    def _checked(self, where: Any) -> JobFilter:
        """``where`` validated part by part: a JobFilter can be built by hand, and its
        parts go to SQL as parameters."""
        if not isinstance(where, JobFilter):
            raise InvalidOption(f"where must be a JobFilter (app.job_filter), not {type(where).__name__}")
        return self.job_filter(state=where.state, queue=where.queue, task=where.task,
                               created_after=where.created_after,
                               created_before=where.created_before, max_id=where.max_id)

    def list_jobs_page(self, where: JobFilter | None = None, *, cursor: int | None = None,
                       limit: int = 50) -> tuple[list[Job], int | None]:
        """One page of jobs matching ``where``, newest first, and the cursor of the next
        page (None on the last one). Keyset paging by id: pages stay consistent while jobs
        are added (new ones never shift an old page)."""
        where = JobFilter() if where is None else self._checked(where)
        limit = validate.count(limit, "limit", 1000)
        if cursor is not None:
            _job_id(cursor)
        jobs = self.backend.job_page(where, cursor, limit + 1)
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return jobs, (jobs[-1].id if more else None)

    def count_matching(self, action: str, where: JobFilter) -> tuple[int, int | None]:
        """The preview of an action on all matching jobs: (how many jobs it would act
        on, the highest id among them, to pass to :meth:`apply_matching`)."""
        _action_states(action, self._checked(where))
        return self.backend.jobs_count_matching(action, where)

    def apply_matching(self, action: str, where: JobFilter, *, expected: int,
                       tolerance: int = 0, chunk: int = 1000,
                       on_chunk: Callable[[Any, int], None] | None = None) -> int:
        """Cancel (live jobs) or retry (dead or cancelled jobs) every job matching
        ``where``, in chunks of ``chunk`` jobs, one transaction each; returns how many.

        Pass the preview's ``max_id`` in ``where`` so that jobs created after the preview
        are never touched. Raises :class:`CountChanged` (and changes nothing) when more
        jobs match now than ``expected + tolerance``; fewer is fine (some finished). Each job
        is acted on at most once. An error in a later chunk leaves the earlier chunks done:
        the exception's ``applied`` says how many jobs they changed.

        ``on_chunk(conn, n)`` is called in the transaction of each chunk that changed jobs
        (``n`` of them), before it commits: what it writes on ``conn`` commits with the
        chunk or not at all (the service writes its audit rows so); if it raises, the
        chunk is rolled back."""
        _action_states(action, self._checked(where))
        expected, tolerance = (validate.int64(v, what) for v, what in
                               ((expected, "expected"), (tolerance, "tolerance")))
        chunk = validate.count(chunk, "chunk", 10_000)
        if on_chunk is not None and not callable(on_chunk):
            raise InvalidOption(f"on_chunk must be callable, not {validate.shown(on_chunk)}")
        now, _ = self.backend.jobs_count_matching(action, where)
        if now > expected + tolerance:
            raise CountChanged(
                f"{now} jobs match now, {expected} were previewed (tolerance "
                f"{tolerance}): preview again")
        op = self.backend.jobs_cancel_matching if action == "cancel" else self.backend.jobs_retry_matching
        done, after = 0, 0
        while True:
            # Each chunk after the last job the one before took: a job is acted on once,
            # even if a worker sends it back into the matching states meanwhile.
            try:
                if on_chunk is None:
                    n, after = op(where, chunk, after)
                else:
                    with self.backend.transaction() as conn:
                        n, after = op(where, chunk, after, conn=conn)
                        if n:
                            on_chunk(conn, n)
            except Exception as exc:
                # The chunks before this one are committed: say how many jobs they changed.
                exc.applied = done  # type: ignore[attr-defined]
                if done:
                    exc.add_note(f"{done} jobs were changed by the chunks before this error")
                raise
            done += n
            if n < chunk:
                return done

    def wait(self, job_id: int, timeout: float = 30.0, poll: float = 0.05) -> Job:
        """Poll until the job is finished (succeeded, dead or cancelled) or ``timeout``."""
        timeout = validate.bounded(timeout, "timeout", 0, 86400)
        poll = validate.bounded(poll, "poll", 0.001, 60)
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if not job.state.is_live or time.monotonic() >= deadline:
                return job
            time.sleep(poll)


_ACTION_STATES = {"cancel": ("scheduled", "ready", "running"), "retry": ("dead", "cancelled")}


def _action_states(action: str, where: JobFilter) -> None:
    states = _ACTION_STATES.get(action) if isinstance(action, str) else None
    if states is None:
        raise InvalidOption(f"action must be cancel or retry, not {validate.shown(action)}")
    if where.state is not None and where.state not in states:
        raise InvalidOption(f"{action} applies to jobs in states {', '.join(states)}, not {where.state}")


def _option(given: Any, task_default: Any, default: Any, check: Callable[[Any], Any]) -> Any:
    """The caller's value (validated), else the task's (validated at registration), else
    the library default."""
    if given is not None:
        return check(given)
    if task_default is not None:
        return task_default
    return default


def _split(call: Any) -> tuple[Any, Any]:
    """A call of ``enqueue_calls``: (positional arguments, keyword arguments)."""
    return ((), call) if isinstance(call, dict) else (call, None)


def _job_id(value: Any) -> int:
    return validate.job_id(value)
