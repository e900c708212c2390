"""Batches: learn exactly once when a fan-out is finished.

A producer ``open``s a batch, ``add``s groups of items (or enqueues jobs into it, one item
per job), and ``seal``s it when no more items will come. Consumers ``ack`` items by id (or
``fail`` them). Whichever of the seal or the last ack comes last completes the batch, and
the completion callback job is enqueued in that same transaction: it runs once, even when
acks arrive twice, items are retried, and the producer is still adding while consumers ack.
See ``backends/batchstore.py`` for how the storage keeps that promise.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import failpoints, validate
from .backends.batchstore import callback_spec
from .errors import BatchNotFound, InvalidOption
from .items import MAX_GROUP_ITEMS, ItemGroup, parse_item_ids
from .models import AckResult, BatchInfo, BatchPruneReport, ItemFailure, SealResult
from .tasks import Enqueue, Task, call_template
from .types import BatchState

if TYPE_CHECKING:
    from .app import App

DEFAULT_EXPIRE_AFTER = 7 * 86400.0
"""An open batch with no add or ack for this long expires (an orphan)."""
DEFAULT_RETENTION = 7 * 86400.0
"""Completed and expired batches are removed this long after they finished."""
MAX_DESCRIPTION = 1000
MAX_REASON = 4000
MAX_ACK_IDS = 100_000
Callback = str | Task | Enqueue


class Batch:
    """A handle on one batch (no database access until a method is called)."""

    def __init__(self, batches: Batches, batch_id: int) -> None:
        self._batches = batches
        self.id = batch_id

    def add(self, count: int, conn: Any = None) -> ItemGroup:
        return self._batches.add(self.id, count, conn=conn)

    def enqueue(self, requests: Iterable[Enqueue], conn: Any = None) -> tuple[ItemGroup, list[int]]:
        return self._batches.enqueue(self.id, requests, conn=conn)

    def enqueue_calls(self, task: str | Task, calls: Iterable[Sequence[Any] | dict[str, Any]], *,
                      conn: Any = None, **options: Any) -> tuple[ItemGroup, list[int]]:
        return self._batches.enqueue_calls(self.id, task, calls, conn=conn, **options)

    def seal(self, conn: Any = None) -> SealResult:
        return self._batches.seal(self.id, conn=conn)

    def info(self) -> BatchInfo:
        return self._batches.get(self.id)

    def __repr__(self) -> str:
        return f"Batch({self.id})"


class Batches:
    """The batch API of an :class:`~justonce.App` (``app.batches``)."""

    def __init__(self, app: App) -> None:
        self.app = app

    def open(
        self, description: str | None = None, *, on_complete: Callback | None = None,
        on_success: Callback | None = None,
        expire_after: float | timedelta = DEFAULT_EXPIRE_AFTER, conn: Any = None,
    ) -> Batch:
        """Open a batch.

        ``on_complete``: a task (name, Task or :class:`Enqueue` with arguments and options)
        enqueued once when the batch completes, failed items or not. ``on_success``: one
        enqueued only when it completes with no failed item. Each is called with its own
        arguments plus the keyword argument ``batch``: a dict with ``id``, ``description``,
        ``total``, ``acked``, ``failed`` and ``succeeded``.
        ``expire_after``: seconds without an add or ack after which housekeeping expires
        the batch if it is still open (an orphan: its callbacks never run). A sealed
        batch does not expire.
        """
        if description is not None:
            description = validate.text(description, "description", MAX_DESCRIPTION)
        callbacks = {}
        for which, cb in (("complete", on_complete), ("success", on_success)):
            if cb is not None:
                callbacks[which] = self._callback(which, cb)
        seconds = validate.bounded(expire_after, "expire_after", 0.001, validate.MAX_DELAY_SECONDS)
        batch_id = self.app.backend.batch_open(description, callbacks, seconds, conn=conn)
        return Batch(self, batch_id)

    def batch(self, batch_id: int) -> Batch:
        """A handle on an existing batch."""
        return Batch(self, validate.batch_id(batch_id))

    def add(self, batch_id: int, count: int, conn: Any = None) -> ItemGroup:
        """Add a group of ``count`` items to an open batch. Build the item ids from the
        group (``group.item_ids()``, or ``f"{batch_id}:{group_id}:{index}"``)."""
        count = validate.count(count, "count", MAX_GROUP_ITEMS)
        return self.app.backend.batch_add(validate.batch_id(batch_id), count, conn=conn)

    def enqueue(self, batch_id: int, requests: Iterable[Enqueue],
                conn: Any = None) -> tuple[ItemGroup, list[int]]:
        """Add one item per job and enqueue the jobs, in one transaction. A job that
        succeeds acks its item in the transaction that records its success; a job that
        ends dead or is cancelled marks its item failed. Returns the group and the job
        ids (job ``i`` is item ``i`` of the group)."""
        rows = self.app.build_many(requests)
        _check_jobs(len(rows), any(r.key is not None for r in rows))
        return self.app.backend.batch_enqueue(validate.batch_id(batch_id), rows, conn=conn)

    def enqueue_calls(self, batch_id: int, task: str | Task,
                      calls: Iterable[Sequence[Any] | dict[str, Any]], *, conn: Any = None,
                      **options: Any) -> tuple[ItemGroup, list[int]]:
        """Like :meth:`App.enqueue_calls`, one job per call, each job an item of a new
        group of the batch (the fast path for a large fan-out)."""
        template = self.app.build(call_template(task, options), bind=False)
        calls = validate.call_list(calls)
        _check_jobs(len(calls), template.key is not None)
        args_doc, kwargs_doc = validate.batch_arguments(calls)
        self.app._check_calls(task, calls)
        return self.app.backend.batch_enqueue_calls(
            validate.batch_id(batch_id), template, args_doc, kwargs_doc, len(calls), conn=conn)

    def seal(self, batch_id: int, conn: Any = None) -> SealResult:
        """No more items: from now on the last ack completes the batch; when nothing is
        pending (or the batch is empty) the seal itself completes it. Sealing again is
        harmless (``already_sealed``)."""
        failpoints.hit("batch.before_seal")
        return self.app.backend.batch_seal(validate.batch_id(batch_id), conn=conn)

    def ack(self, item_ids: str | Iterable[str], conn: Any = None) -> AckResult:
        """Ack one item id or many, atomically. Acking an item again changes nothing and
        is reported in ``already``; an id that names no item fails the whole call."""
        refs = parse_item_ids(item_ids, MAX_ACK_IDS)
        failpoints.hit("batch.before_ack")
        return self.app.backend.batch_resolve(refs, None, conn=conn)

    def fail(self, item_ids: str | Iterable[str], reason: str, conn: Any = None) -> AckResult:
        """Mark items failed (they will not be acked: the batch completes with failures,
        and only ``on_complete`` runs). An item already acked or failed stays as it is."""
        refs = parse_item_ids(item_ids, MAX_ACK_IDS)
        reason = validate.text(reason, "reason", MAX_REASON)
        if not reason.strip():
            raise InvalidOption("reason must say why the items failed")
        return self.app.backend.batch_resolve(refs, reason, conn=conn)

    def get(self, batch_id: int) -> BatchInfo:
        info = self.app.backend.batch_get(validate.batch_id(batch_id))
        if info is None:
            raise BatchNotFound(f"no batch {batch_id}")
        return info

    def list(self, state: str | BatchState | None = None, limit: int = 50) -> list[BatchInfo]:
        """Newest first."""
        st = validate.optional_state(state, BatchState)
        return self.app.backend.batch_list(st, validate.count(limit, "limit", 10_000))

    def failures(self, batch_id: int, limit: int = 100) -> builtins.list[ItemFailure]:
        """The failed items of a batch, with their reasons."""
        self.get(batch_id)
        return self.app.backend.batch_failures(batch_id, validate.count(limit, "limit", 100_000))

    def prune(self, retention: float | timedelta = DEFAULT_RETENTION) -> BatchPruneReport:
        """Expire orphans (open batches idle past their ``expire_after``) and
        remove completed and expired batches finished more than ``retention`` s ago.
        Workers do this in their housekeeping; this runs it now."""
        seconds = validate.bounded(retention, "retention", 0, validate.MAX_DELAY_SECONDS)
        total = BatchPruneReport()
        while True:
            report = self.app.backend.batches_prune(seconds)
            total = BatchPruneReport(total.expired + report.expired, total.removed + report.removed)
            if not report.expired and not report.removed:
                return total

    def _callback(self, which: str, cb: Callback) -> dict[str, Any]:
        req = cb if isinstance(cb, Enqueue) else Enqueue(cb) if isinstance(cb, (str, Task)) else None
        if req is None:
            raise InvalidOption(
                f"on_{which} must be a task name, a Task or an Enqueue, not {validate.shown(cb)}")
        if req.key is not None or req.delay is not None or req.run_at is not None:
            raise InvalidOption(f"on_{which} cannot have a key, a delay or run_at: it runs on completion")
        if req.kwargs and "batch" in req.kwargs:
            raise InvalidOption(
                f"on_{which} cannot take a keyword argument named 'batch': the batch summary "
                "is passed under that name"
            )
        return callback_spec(self.app.build(req, passed=("batch",)))


def _check_jobs(n: int, keyed: bool) -> None:
    if n == 0:
        raise InvalidOption("nothing to enqueue: a batch group needs at least one job")
    if n > MAX_GROUP_ITEMS:
        raise InvalidOption(f"at most {MAX_GROUP_ITEMS} jobs per group, not {n}")
    if keyed:
        raise InvalidOption(
            "jobs enqueued into a batch cannot carry a key: a duplicate would return another "
            "job, and the item would never be acked"
        )
