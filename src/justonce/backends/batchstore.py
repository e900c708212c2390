"""The batch operations, written once over every dialect (dialect.py).

Every dialect's ``queries.sql`` names the same statements (``batch_*``) with the same
parameters and result columns; list parameters travel as one JSON document.

Setting bits is the one primitive the dialects do their own way (``Dialect.flip``): on
Postgres the bits are a bit string and one statement locks the chunks, ORs a mask into each
and reports what was set before, so a chunk's lock is held for that statement and the commit
only; SQLite and MySQL read the chunks under lock, set the bits in Python and write them
back (SQLite's write transaction already excludes every other writer; MySQL locks the chunk
rows in key order).

Exactly-once completion: only a transaction that brings a chunk's pending count to 0 (or a
seal) can complete a batch. It then locks the batch row and, in a *later* statement (so on
Postgres under READ COMMITTED it reads a fresh snapshot, taken after the lock was granted),
checks that the batch is sealed and no chunk is pending. Whichever of these transactions
takes the batch lock last sees every other's chunks committed and completes the batch; the
state change ``sealed → completed`` is guarded, and the callback jobs are inserted in the same
transaction. On Postgres this needs READ COMMITTED: the pool's connections are set to it,
and a caller's connection in another level is refused. Lock order everywhere: jobs, then
chunks (sorted), then batches (sorted); ``add`` inserts its chunks and jobs before it takes
the batch row, so a large add does not hold up completing acks.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import BatchExpired, BatchNotFound, InvalidTransition, ItemNotFound
from ..items import CHUNK_BITS, ItemGroup, ItemRef, chunk_sizes, new_group_id, parse_item_id
from ..models import AckResult, BatchInfo, BatchPruneReport, ItemFailure, NewJob, SealResult
from ..types import BatchState
from ..validate import json_text
from .dialect import Dialect, Flip, Key

T = TypeVar("T")


_dumps = json_text  # (floats that come back floats from Postgres' jsonb too)


def callback_spec(job: NewJob) -> dict[str, Any]:
    """A validated callback job as stored in the batch row (inserted on completion)."""
    return {
        "task": job.task, "queue": job.queue, "args": json.loads(job.args_json),
        "kwargs": json.loads(job.kwargs_json), "priority": job.priority,
        "max_attempts": job.max_attempts, "timeout": job.timeout,
        "partition_key": job.partition_key, "partition_hash": job.partition_hash,
    }


def callback_job(spec: dict[str, Any], summary: dict[str, Any]) -> NewJob:
    """The callback job to insert: the stored call, with the batch summary passed as the
    keyword argument ``batch``."""
    kwargs = dict(spec["kwargs"], batch=summary)
    return NewJob(
        task=spec["task"], queue=spec["queue"], args_json=_dumps(spec["args"]),
        kwargs_json=_dumps(kwargs), priority=spec["priority"],
        max_attempts=spec["max_attempts"], timeout=spec["timeout"],
        partition_key=spec.get("partition_key"),
        partition_hash=_stored_hash(spec),
    )


def _stored_hash(spec: dict[str, Any]) -> int | None:
    """The callback's partition hash: stored with it (a callback without one would never
    be claimed by a partitioned worker, the only kind that runs jobs with a partition key).
    A spec stored before the hash was kept has only the key's text, an integer key stored
    as its digits: canonical digits of a 64-bit integer are taken for the integer they
    came from (a text key of such digits cannot be told apart, and goes to the integer's
    slot), any other text hashed as text (the rule of ``partitions.partition_hash``)."""
    if "partition_hash" in spec:
        return None if spec["partition_hash"] is None else int(spec["partition_hash"])
    key = spec.get("partition_key")
    if key is None:
        return None
    text = str(key)
    with contextlib.suppress(ValueError):
        if str(int(text)) == text and -(2**63) <= int(text) < 2**63:
            return int(text)
    return zlib.crc32(text.encode())


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class BatchOps:
    """The Backend protocol's ``batch_*`` operations over a dialect. Jobs bound to items
    are inserted through the Store's own inserts (``insert_jobs``, ``insert_calls``)."""

    def __init__(self, d: Dialect, insert_jobs: Callable[[Any, Sequence[NewJob]], list[int]],
                 insert_calls: Callable[[Any, NewJob, str, str, str], list[int]]) -> None:
        self.d = d
        self.insert_jobs = insert_jobs
        self.insert_calls = insert_calls

    # -- operations -----------------------------------------------------------------------
    def batch_open(self, description: str | None, callbacks: dict[str, Any],
                   expire_after: float, conn: Any = None) -> int:
        params = {"description": description, "callbacks": _dumps(callbacks),
                  "expire_after": expire_after}
        return int(self.d.tx(conn, lambda c: self.d.rows(c, "batch_open", params))[0][0])

    def batch_add(self, batch_id: int, count: int, conn: Any = None) -> ItemGroup:
        return self.d.tx(conn, lambda c: self._add_group(c, batch_id, count, lambda g: [])[0])

    def batch_enqueue(self, batch_id: int, jobs: Sequence[NewJob],
                      conn: Any = None) -> tuple[ItemGroup, list[int]]:
        def insert(c: Any, group: ItemGroup) -> list[int]:
            prefix = f"{batch_id}:{group.group_id}:"
            return self.insert_jobs(c, [j.bound_to(f"{prefix}{i}") for i, j in enumerate(jobs)])

        return self.d.tx(conn, lambda c: self._add_group(c, batch_id, len(jobs),
                                                          lambda g: insert(c, g)))

    def batch_enqueue_calls(self, batch_id: int, template: NewJob, args_doc: str,
                            kwargs_doc: str, count: int,
                            conn: Any = None) -> tuple[ItemGroup, list[int]]:
        def insert(c: Any, group: ItemGroup) -> list[int]:
            prefix = f"{batch_id}:{group.group_id}:"
            return self.insert_calls(c, template, args_doc, kwargs_doc, prefix)

        return self.d.tx(conn, lambda c: self._add_group(c, batch_id, count,
                                                          lambda g: insert(c, g)))

    def batch_seal(self, batch_id: int, conn: Any = None) -> SealResult:
        def run(c: Any) -> SealResult:
            if not self.d.rows(c, "batch_seal", {"id": batch_id}):
                state = self._state_or_raise(c, batch_id, "sealed")
                # Sealing again also re-checks completion: cheap, and it repairs a batch
                # whose completion was missed (it cannot complete it twice).
                if state is BatchState.SEALED and self._complete_if_done(c, [batch_id]):
                    return SealResult(batch_id, BatchState.COMPLETED, completed=True,
                                      already_sealed=True)
                return SealResult(batch_id, state, completed=False, already_sealed=True)
            done = self._complete_if_done(c, [batch_id])
            state = BatchState.COMPLETED if done else BatchState.SEALED
            return SealResult(batch_id, state, completed=bool(done))

        return self.d.tx(conn, run)

    def batch_resolve(self, refs: Sequence[ItemRef], reason: str | None,
                      conn: Any = None) -> AckResult:
        if not refs:
            return AckResult(0)
        was_set, completed = self.d.tx(conn, lambda c: self._resolve(c, refs, reason, strict=True))
        return self._ack_result(refs, was_set, completed)

    def batch_get(self, batch_id: int) -> BatchInfo | None:
        rows = self.d.read("batch_get", {"id": batch_id})
        return self._info(rows[0]) if rows else None

    def batch_list(self, state: str | None, limit: int) -> list[BatchInfo]:
        return [self._info(r) for r in self.d.read("batch_list", {"state": state, "limit": limit})]

    def batch_failures(self, batch_id: int, limit: int) -> list[ItemFailure]:
        rows = self.d.read("batch_failures", {"id": batch_id, "limit": limit})
        return [ItemFailure(r[0], r[1], self.d.time(r[2])) for r in rows]  # type: ignore[arg-type]

    def batches_prune(self, retention: float, limit: int = 1000) -> BatchPruneReport:
        # Two transactions, each in the lock order of acks (chunks before batches): the
        # removal deletes chunks first; the expiry touches batch rows only.
        def remove(c: Any) -> int:
            # Chosen oldest first, deleted in id order: the order in which an ack that
            # spans batches locks them (a late ack of a finished batch's item is possible).
            old = [{"id": i} for i in sorted(
                r[0] for r in self.d.rows(c, "batches_old", {"retention": retention, "limit": limit}))]
            for name in ("batch_delete_chunks", "batch_delete_failures", "batch_delete"):
                self.d.many(c, name, old)
            return len(old)

        removed = self.d.tx(None, remove)
        expired = len(self.d.tx(None, lambda c: self.d.rows(c, "batches_expire", {"limit": limit})))
        return BatchPruneReport(expired=expired, removed=removed)

    # -- for lists (liststore.py), in the caller's transaction -----------------------------
    def open_sealed(self, c: Any, description: str, callbacks: dict[str, Any],
                    count: int) -> tuple[int, str, bool]:
        """A batch of one group of ``count`` items, sealed at once: (batch id, group id,
        completed). An empty one completes here (its callbacks are inserted)."""
        params = {"description": description, "callbacks": _dumps(callbacks),
                  "expire_after": 0.0}
        batch_id = int(self.d.rows(c, "batch_open", params)[0][0])
        group, _ = self._add_group(c, batch_id, count, lambda g: [])
        self.d.rows(c, "batch_seal", {"id": batch_id})
        return batch_id, group.group_id, bool(self._complete_if_done(c, [batch_id]))

    def complete_if_done(self, c: Any, batch_ids: Sequence[int]) -> list[int]:
        return self._complete_if_done(c, batch_ids)

    def drop(self, c: Any, batch_id: int) -> None:
        """Delete a batch and its chunks and failures (a dropped list's)."""
        for name in ("batch_delete_chunks", "batch_delete_failures", "batch_delete"):
            self.d.many(c, name, [{"id": batch_id}])

    # -- the algorithm --------------------------------------------------------------------
    def _add_group(self, c: Any, batch_id: int, count: int,
                   then: Callable[[ItemGroup], list[int]]) -> tuple[ItemGroup, list[int]]:
        """Insert a group's chunks, run ``then`` (the group's jobs), and only then take the
        batch row's lock to count the group in, so that a large add does not hold up the
        acks that complete chunks of the same batch. A batch that is not open (or does not
        exist) raises, and the transaction rolls back what was inserted."""
        group = ItemGroup(batch_id, new_group_id(), count)
        self.d.many(c, "batch_chunks_insert", [{
            "id": batch_id, "group_id": group.group_id, "sizes": _dumps(chunk_sizes(count)),
        }])
        job_ids = then(group)
        if not self.d.rows(c, "batch_add", {"id": batch_id, "count": count}):
            state = self._state_or_raise(c, batch_id, "added to")
            raise InvalidTransition(
                f"batch {batch_id} is {state}: items can only be added to an open batch"
            )
        return group, job_ids

    def _state_or_raise(self, c: Any, batch_id: int, verb: str) -> BatchState:
        rows = self.d.rows(c, "batch_state", {"id": batch_id})
        if not rows:
            raise BatchNotFound(f"no batch {batch_id}")
        state = BatchState(rows[0][0])
        if state is BatchState.EXPIRED:
            raise BatchExpired(f"batch {batch_id} expired: it cannot be {verb}")
        return state

    def _resolve(self, c: Any, refs: Sequence[ItemRef], reason: str | None,
                 strict: bool) -> tuple[dict[Key, frozenset[int]], list[int]]:
        """Mark items acked (``reason`` None) or failed. ``strict``: any id that names no
        item, or an item of an expired batch, fails the whole call (the transaction is
        rolled back); otherwise (a job's own item, whose batch may have been removed) it
        is skipped. Returns, per chunk, the asked positions that were set before, and the
        batches this call completed."""
        by_chunk: dict[Key, set[int]] = defaultdict(set)
        for ref in refs:
            by_chunk[(ref.batch_id, ref.group_id, ref.chunk)].add(ref.bit)
        flips = self.d.flip(c, by_chunk)
        if strict and (len(flips) < len(by_chunk) or any(
                f.state == BatchState.EXPIRED or max(by_chunk[k]) >= f.size for k, f in flips.items())):
            self._check_refs(c, refs, flips)
        if reason is not None:
            failed = [{"batch_id": k[0], "item": f"{k[0]}:{k[1]}:{k[2] * CHUNK_BITS + pos}",
                       "reason": reason}
                      for k, f in flips.items() if f.pending_after is not None
                      for pos in sorted(by_chunk[k]) if pos < f.size and pos not in f.was_set]
            self.d.many(c, "batch_failure_insert", failed)
        emptied = sorted({k[0] for k, f in flips.items() if f.pending_after == 0})
        completed = self._complete_if_done(c, emptied) if emptied else []
        return {k: f.was_set for k, f in flips.items()}, completed

    @staticmethod
    def _ack_result(refs: Sequence[ItemRef], was_set: dict[Key, frozenset[int]],
                    completed: list[int]) -> AckResult:
        """Which of ``refs`` this call resolved, and which were resolved before (or are a
        repeat of an earlier id of the same call)."""
        already: list[str] = []
        seen: set[ItemRef] = set()
        for ref in refs:
            if ref in seen or ref.bit in was_set.get((ref.batch_id, ref.group_id, ref.chunk), ()):
                already.append(str(ref))
            else:
                seen.add(ref)
        return AckResult(len(refs) - len(already), tuple(already), tuple(completed))

    def _check_refs(self, c: Any, refs: Sequence[ItemRef], found: dict[Key, Flip]) -> None:
        """Raise the error for the first id that names no item (or an expired one)."""
        for ref in refs:
            flip = found.get((ref.batch_id, ref.group_id, ref.chunk))
            if flip is not None and flip.state == BatchState.EXPIRED:
                raise BatchExpired(f"batch {ref.batch_id} expired: item {ref} cannot be resolved")
            if flip is not None and ref.bit < flip.size:
                continue
            self._state_or_raise(c, ref.batch_id, "acked")
            size = self.d.rows(c, "batch_group_size", {"id": ref.batch_id, "group_id": ref.group_id})
            if not size or size[0][0] is None:
                raise ItemNotFound(f"batch {ref.batch_id} has no group {ref.group_id!r} (item {ref})")
            raise ItemNotFound(
                f"item {ref} is out of range: group {ref.group_id} has {size[0][0]} items "
                f"(indexes 0 to {size[0][0] - 1})"
            )

    def _complete_if_done(self, c: Any, batch_ids: Sequence[int]) -> list[int]:
        """Complete those of ``batch_ids`` that are sealed with nothing pending; insert
        their callback jobs. Returns the ids completed (see the module docstring)."""
        locked = self.d.rows(c, "batch_lock", {"ids": _dumps(sorted(batch_ids))})
        sealed = [r for r in locked if r[1] == BatchState.SEALED]
        if not sealed:
            return []
        ids = _dumps([r[0] for r in sealed])
        busy = {r[0] for r in self.d.rows(c, "batch_pending", {"ids": ids})}
        done = [r for r in sealed if r[0] not in busy]
        if not done:
            return []
        failed = {r[0]: r[1] for r in self.d.rows(c, "batch_failure_counts", {"ids": ids})}
        finals = []
        for batch_id, _, description, callbacks, total in done:
            n_failed = int(failed.get(batch_id, 0))
            finals.append({"id": batch_id, "acked": total - n_failed, "failed": n_failed})
            summary = {"id": batch_id, "description": description, "total": total,
                       "acked": total - n_failed, "failed": n_failed, "succeeded": n_failed == 0}
            specs = _json(callbacks)
            for which in ("complete", "success") if n_failed == 0 else ("complete",):
                if specs.get(which):
                    self.insert_jobs(c, [callback_job(specs[which], summary)])
        self.d.many(c, "batch_complete", finals)
        return [f["id"] for f in finals]

    def resolve_job_items(self, c: Any, items: Sequence[str | None], reason: str | None) -> None:
        """Resolve the batch items of finished jobs in the caller's transaction (lenient:
        an item whose batch is gone or expired is skipped)."""
        refs = [parse_item_id(i) for i in items if i]
        if refs:
            self._resolve(c, refs, reason, strict=False)

    def _info(self, r: Sequence[Any]) -> BatchInfo:
        (batch_id, state, description, callbacks, total, groups, expire_after, created_at,
         updated_at, sealed_at, finished_at, pending, failed) = r
        specs = _json(callbacks)
        failed = int(failed)
        return BatchInfo(
            id=batch_id, state=BatchState(state), description=description, total=int(total),
            acked=int(total) - int(pending) - failed, failed=failed, groups=groups,
            expire_after=float(expire_after), created_at=self.d.time(created_at),  # type: ignore[arg-type]
            updated_at=self.d.time(updated_at), sealed_at=self.d.time(sealed_at),  # type: ignore[arg-type]
            finished_at=self.d.time(finished_at),
            on_complete=(specs.get("complete") or {}).get("task"),
            on_success=(specs.get("success") or {}).get("task"),
        )
