"""The one Store: every Backend operation written once, over a dialect's primitives.

A backend is a ``Store`` with its ``Dialect`` (postgres/, sqlite/, mysql/). The job
operations are here; batches, partition leases, paused queues, the effect ledger, the
service's and the dashboard's operations are parts the Store is composed of (batchstore.py,
leasestore.py, queuestore.py, effectstore.py, servicestore.py, dashstore.py), each over
the same dialect. A backend
subclass may replace an operation with a measured fast path of its dialect (and says so,
with the figure).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from ..errors import DatabaseUnavailable, KeyConflict
from ..items import ItemGroup, ItemRef
from ..models import (
    AckResult,
    AuditEntry,
    BatchInfo,
    BatchPruneReport,
    ClaimedJob,
    Completion,
    EffectInfo,
    Failure,
    HousekeepingReport,
    ItemFailure,
    Job,
    JobFilter,
    MetricsSnapshot,
    NewJob,
    QueueCount,
    QueuePause,
    QueueStats,
    SealResult,
    SettledJob,
    SlotInfo,
    TokenInfo,
)
from ..types import JobState
from .base import Partitioning, Waiter, decode_arguments, job_from_insert, job_from_row
from .batchstore import BatchOps
from .dashstore import Count, DashOps, JobLine
from .dialect import Dialect
from .effectstore import EffectOps
from .leasestore import LeaseOps
from .liststore import ListOps
from .queuestore import QueueOps
from .servicestore import ServiceOps

KEY_ROUNDS = 5
"""A bulk insert whose keys' holders finish while it looks them up tries again, this often."""


def claimed_jobs(rows: list[Any]) -> list[ClaimedJob]:
    """Rows of (id, queue, task, args text, kwargs text, attempts, max_attempts, timeout,
    lease_token, priority, batch_item, partition_hash, queue_wait), in claim order."""
    rows = sorted(rows, key=lambda r: (r[9], r[0]))
    decoded = decode_arguments([(r[3], r[4]) for r in rows])
    return [
        ClaimedJob(int(r[0]), r[1], r[2], a, k, int(r[5]), int(r[6]), float(r[7]), int(r[8]),
                   r[10], None if r[11] is None else int(r[11]),
                   None if r[12] is None else float(r[12]), undecodable=bad)
        for r, (a, k, bad) in zip(rows, decoded, strict=True)
    ]


class Store:
    """The Backend protocol (base.py) over one dialect."""

    def __init__(self, d: Dialect) -> None:
        self.d = d
        self.url = d.url
        self.name = d.name
        self.schema = d.schema
        self.batches = BatchOps(d, lambda c, jobs: self._insert_many(c, jobs)[0], self._insert_template)
        self.leases = LeaseOps(d)
        self.queues = QueueOps(d)
        self.effects = EffectOps(d)
        self.service = ServiceOps(d, self.batches)
        self.dash = DashOps(d)
        self.lists = ListOps(d, self.batches)

    # -- schema -------------------------------------------------------------------------------
    def migrate(self) -> list[str]:
        return self.d.migrate()

    def schema_version(self) -> int:
        return self.d.schema_version()

    def schema_latest(self) -> int:
        """The schema version this justonce needs."""
        return int(self.d.latest)

    # -- producer side ------------------------------------------------------------------------
    def job_params(self, job: NewJob) -> dict[str, Any]:
        return {
            "queue": job.queue, "task": job.task, "args": job.args_json,
            "kwargs": job.kwargs_json, "priority": job.priority, "delay": job.delay,
            "run_at": self.d.at(job.run_at), "max_attempts": job.max_attempts,
            "timeout": job.timeout, "key": job.key, "partition_key": job.partition_key,
            "batch_item": job.batch_item, "partition_hash": job.partition_hash,
            "channel": self.d.channel,
        }

    def _insert_one(self, c: Any, job: NewJob) -> Job:
        params = self.job_params(job)
        for _ in range(KEY_ROUNDS):
            rows = self.d.rows(c, "job_insert", params)
            if rows:
                r = rows[0]
                return job_from_insert(job, int(r[0]), r[1], self.d.time(r[2]),  # type: ignore[arg-type]
                                       self.d.time(r[3]))  # type: ignore[arg-type]
            held = self.d.live_key_holders(c, [job.key])
            if held:
                return job_from_row(held[0], duplicate=True)
            # The key's holder finished between our insert and our look-up: insert again.
        raise DatabaseUnavailable(f"could not settle key {job.key!r}")  # pragma: no cover

    def job_insert(self, job: NewJob, conn: Any = None) -> Job:
        # (one INSERT that changes rows: a second is sent only when the first changed none)
        return self.d.on(conn, lambda c: self._insert_one(c, job), single_write=True)

    def _insert_template(self, c: Any, template: NewJob, args_doc: str, kwargs_doc: str,
                         item_prefix: str | None = None) -> list[int]:
        params = self.job_params(template)
        params["item_prefix"] = item_prefix
        return self.d.insert_calls(c, params, args_doc, kwargs_doc)

    def _insert_many(self, c: Any, jobs: Sequence[NewJob]) -> tuple[list[int], int]:
        """Insert jobs; their ids in input order (the live job's where a key is held), and
        how many were new."""
        first = jobs[0]
        if all(first.same_options(j) for j in jobs):
            args_doc = "[" + ",".join(j.args_json for j in jobs) + "]"
            kwargs_doc = "[" + ",".join(j.kwargs_json for j in jobs) + "]"
            return self._insert_template(c, first, args_doc, kwargs_doc), len(jobs)
        ids: list[int | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        inserted = 0
        for _ in range(KEY_ROUNDS):
            got = self.d.insert_rows(c, [jobs[i] for i in pending], self.job_params)
            inserted += len({new for new in got if new is not None})  # (one key twice: one job)
            missing = [i for i, new in zip(pending, got, strict=True) if new is None]
            for i, new in zip(pending, got, strict=True):
                ids[i] = new
            if missing:
                held = self.d.live_key_holders(c, [jobs[i].key for i in missing])
                live = {h["key"]: int(h["id"]) for h in held}
                still = []
                for i in missing:
                    if jobs[i].key in live:
                        ids[i] = live[jobs[i].key]
                    else:
                        still.append(i)
                missing = still
            if not missing:
                return [i for i in ids if i is not None], inserted
            pending = missing
        raise DatabaseUnavailable("could not settle keys in bulk insert")  # pragma: no cover

    def job_insert_many(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]:
        return self.job_insert_many_counted(jobs, conn)[0]

    def job_insert_many_counted(self, jobs: Sequence[NewJob], conn: Any = None) -> tuple[list[int], int]:
        if not jobs:
            return [], 0
        return self.d.on(conn, lambda c: self._insert_many(c, jobs), atomic=True)

    def job_insert_batch(self, template: NewJob, args_doc: str, kwargs_doc: str,
                         conn: Any = None) -> list[int]:
        return self.d.on(conn, lambda c: self._insert_template(c, template, args_doc, kwargs_doc))

    def job_get(self, job_id: int, conn: Any = None) -> Job | None:
        rows = (self.d.read_dicts("job_get", {"id": job_id}) if conn is None
                else self.d.on(conn, lambda c: self.d.dicts(c, "job_get", {"id": job_id})))
        return job_from_row(rows[0]) if rows else None

    def job_cancel(self, job_id: int, conn: Any = None) -> Job | None:
        def run(c: Any) -> Job | None:
            rows = self.d.dicts(c, "job_cancel", {"id": job_id})
            if not rows:
                return None
            self.batches.resolve_job_items(c, [rows[0]["batch_item"]], "cancelled")
            return job_from_row(rows[0])

        return self.d.tx(conn, run)

    def job_retry(self, job_id: int, conn: Any = None) -> Job | None:
        params = {"id": job_id, "channel": self.d.channel}
        try:
            rows = (self.d.write_dicts("job_retry", params) if conn is None
                    else self.d.tx(conn, lambda c: self.d.dicts(c, "job_retry", params)))
        except Exception as exc:
            if self.d.is_unique_violation(exc):
                raise KeyConflict(
                    f"job {job_id} cannot be retried: another live job holds its key"
                ) from exc
            raise
        return job_from_row(rows[0]) if rows else None

    def job_page(self, where: JobFilter, cursor: int | None, limit: int) -> list[Job]:
        params = {**self.service.filter_params(where), "cursor": cursor, "limit": limit}
        return [job_from_row(r) for r in self.d.read_dicts("job_page", params)]

    def queue_counts(self) -> list[QueueCount]:
        return [QueueCount(q, JobState(s), int(n)) for q, s, n in self.d.read("queue_counts", {})]

    def queue_stats(self, exact_below: int) -> list[QueueStats]:
        rows, estimated = self.d.count_jobs(exact_below)
        counts: dict[str, dict[str, int]] = {}
        for queue, state, n in rows:
            counts.setdefault(queue, {})[state] = int(n)
        pauses = {p.queue: p for p in self.queue_pauses()}
        for queue in pauses:  # (a paused queue is listed, jobs or not: it can be resumed)
            counts.setdefault(queue, {})
        heads = {q: w for q, w in self.d.read("queue_heads", {"queues": sorted(counts)})}
        return [QueueStats(q, c, None if heads.get(q) is None else max(0.0, float(heads[q])),
                           estimated, pauses.get(q)) for q, c in sorted(counts.items())]

    # -- paused queues (queuestore.py) ------------------------------------------------------
    def queue_pause(self, queue: str, actor: str | None, note: str | None,
                    conn: Any = None) -> QueuePause:
        return self.queues.queue_pause(queue, actor, note, conn)

    def queue_resume(self, queue: str, conn: Any = None) -> bool:
        return self.queues.queue_resume(queue, conn)

    def queue_pauses(self) -> list[QueuePause]:
        return self.queues.queue_pauses()

    def metrics_snapshot(self) -> MetricsSnapshot:
        rows = self.d.read("metrics_snapshot", {})
        return MetricsSnapshot(
            oldest_ready={r[0]: max(0.0, float(r[1])) for r in rows if r[0] is not None},
            batches_open=int(next((r[1] for r in rows if r[0] is None), 0)))

    # -- worker side ----------------------------------------------------------------------------
    @staticmethod
    def claim_params(queue: str, limit: int, owner: str, lease: float,
                     partitions: Partitioning | None) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"queue": queue, "limit": limit, "owner": owner, "lease": lease}
        if partitions is None:
            return "job_claim", params
        params.update(set=partitions.set_name, n=partitions.n,
                      slots=[s for s, _ in partitions.slots],
                      tokens=[t for _, t in partitions.slots])
        return "job_claim_partitioned", params

    def job_claim(self, queue: str, limit: int, owner: str, lease: float,
                  partitions: Partitioning | None = None) -> list[ClaimedJob]:
        if partitions is not None and not partitions.slots:
            return []
        if (partitions is None and self.d.claim_precheck
                and not self.d.read("job_any_ready", {"queue": queue})):
            return []
        name, params = self.claim_params(queue, limit, owner, lease, partitions)
        if partitions is not None:
            # The claim holds its slots' rows until it commits: see Dialect.write_guarded.
            return claimed_jobs(self.d.write_guarded(name, params, lease))
        return claimed_jobs(self.d.write(name, params))

    def completion_params(self, done: Sequence[Completion]) -> dict[str, Any]:
        # Lists of ids go in id order everywhere: two transactions that lock the same rows
        # lock them in the same order (MySQL locks in list order), so they cannot deadlock.
        done = sorted(done, key=lambda x: x.id)
        return {
            "ids": [c.id for c in done], "tokens": [c.lease_token for c in done],
            "results": [c.result_json for c in done], "notes": [c.note for c in done],
            "channel": self.d.channel,
        }

    def complete_items(self, c: Any, done: Sequence[Completion]) -> set[int]:
        """Complete jobs and ack the batch items of those accepted, in ``c``'s transaction."""
        accepted = {int(r[0]) for r in self.d.rows(c, "job_complete_many",
                                                   self.completion_params(done))}
        self.batches.resolve_job_items(c, [x.batch_item for x in done if x.id in accepted], None)
        return accepted

    def job_complete_many(self, done: Sequence[Completion]) -> set[int]:
        if not done:
            return set()
        if any(x.batch_item for x in done):
            return self.d.tx(None, lambda c: self.complete_items(c, done))
        return {int(r[0]) for r in self.d.write("job_complete_many", self.completion_params(done))}

    def job_complete_and_claim(
        self, done: Sequence[Completion], queue: str, limit: int, owner: str, lease: float,
        partitions: Partitioning | None = None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        if not done:
            return set(), self.job_claim(queue, limit, owner, lease, partitions)
        if partitions is not None and not partitions.slots:
            return self.job_complete_many(done), []
        name, claim = self.claim_params(queue, limit, owner, lease, partitions)

        # One transaction: the claim must see the completions (the next job of a
        # partition key becomes claimable when the previous one is done).
        def run(c: Any) -> tuple[set[int], list[Any]]:
            if partitions is not None:
                self.d.guard_idle(c, lease)  # see Dialect.write_guarded
            return self.complete_items(c, done), self.d.rows(c, name, claim)

        accepted, rows = self.d.tx(None, run)
        return accepted, claimed_jobs(rows)

    def job_fail(self, failure: Failure, kind: str = "error") -> JobState | None:
        params = {
            "id": failure.id, "token": failure.lease_token, "error": failure.error,
            "retry_in": failure.retry_in, "kind": kind, "channel": self.d.channel,
        }
        if failure.batch_item is None:
            rows = self.d.write("job_fail", params)
            return JobState(rows[0][0]) if rows else None

        def run(c: Any) -> JobState | None:
            rows = self.d.rows(c, "job_fail", params)
            if not rows:
                return None
            if rows[0][0] == JobState.DEAD:
                self.batches.resolve_job_items(c, [failure.batch_item], failure.error)
            return JobState(rows[0][0])

        return self.d.tx(None, run)

    def job_settled(self, held: Sequence[tuple[int, int]]) -> dict[int, SettledJob]:
        if not held:
            return {}
        held = sorted(held)
        params = {"ids": [h[0] for h in held], "tokens": [h[1] for h in held]}
        return {int(r[0]): SettledJob(int(r[0]), JobState(r[1]), int(r[2]), r[3])
                for r in self.d.read("job_settled", params)}

    def job_heartbeat(self, held: Sequence[tuple[int, int]], lease: float) -> set[int]:
        if not held:
            return set()
        held = sorted(held)  # id order: see completion_params
        params = {"ids": [h[0] for h in held], "tokens": [h[1] for h in held], "lease": lease}
        return {int(r[0]) for r in self.d.write("job_heartbeat", params)}

    def job_release(self, held: Sequence[tuple[int, int]], refund: bool) -> set[int]:
        if not held:
            return set()
        held = sorted(held)  # id order: see completion_params
        params = {"ids": [h[0] for h in held], "tokens": [h[1] for h in held],
                  "refund": refund, "channel": self.d.channel}
        return {int(r[0]) for r in self.d.write("job_release", params)}

    # -- housekeeping -----------------------------------------------------------------------------
    def maintenance_try(self, name: str, interval: float, owner: str) -> bool:
        params = {"name": name, "interval": interval, "owner": owner}
        return bool(self.d.write("maintenance_try", params))

    def jobs_promote(self, limit: int = 5000) -> int:
        return len(self.d.write("jobs_promote", {"limit": limit, "channel": self.d.channel}))

    def jobs_rescue(self, limit: int = 5000) -> HousekeepingReport:
        if not self.d.read("jobs_any_expired", {}):
            return HousekeepingReport()

        def run(c: Any) -> list[Any]:
            rows = self.d.rows(c, "jobs_rescue", {"limit": limit, "channel": self.d.channel})
            self.batches.resolve_job_items(c, [r[1] for r in rows if r[0] == JobState.DEAD],
                                           "lease expired on the last attempt")
            return rows

        rows = self.d.tx(None, run)
        dead = sum(1 for r in rows if r[0] == JobState.DEAD)
        return HousekeepingReport(rescued=len(rows) - dead, dead=dead)

    def jobs_prune(self, keep_succeeded: float, keep_dead: float, limit: int = 10000) -> int:
        params = {"keep_succeeded": keep_succeeded, "keep_dead": keep_dead, "limit": limit}
        return self.d.write_count("jobs_prune", params)

    # -- connections, clock, waiting --------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[Any]:
        return self.d.transaction()

    def row_lock(self, conn: Any, table: str, column: str, value: Any, timeout: float) -> bool:
        return self.d.row_lock(conn, table, column, value, timeout)

    def callers_savepoint(self, conn: Any, fn: Callable[[], Any]) -> Any:
        return self.d.callers_savepoint(conn, fn)

    def caller_in_transaction(self, conn: Any) -> bool:
        return self.d.caller_in_transaction(conn)

    def waiter(self, queues: Sequence[str], listen: bool = True) -> Waiter:
        return self.d.waiter(queues, listen)

    def now(self) -> datetime:
        return self.d.now()

    def close(self) -> None:
        self.d.close()

    # -- the parts: batches ---------------------------------------------------------------------------
    def batch_open(self, description: str | None, callbacks: dict[str, Any],
                   expire_after: float, conn: Any = None) -> int:
        return self.batches.batch_open(description, callbacks, expire_after, conn)

    def batch_add(self, batch_id: int, count: int, conn: Any = None) -> ItemGroup:
        return self.batches.batch_add(batch_id, count, conn)

    def batch_enqueue(self, batch_id: int, jobs: Sequence[NewJob],
                      conn: Any = None) -> tuple[ItemGroup, list[int]]:
        return self.batches.batch_enqueue(batch_id, jobs, conn)

    def batch_enqueue_calls(self, batch_id: int, template: NewJob, args_doc: str,
                            kwargs_doc: str, count: int,
                            conn: Any = None) -> tuple[ItemGroup, list[int]]:
        return self.batches.batch_enqueue_calls(batch_id, template, args_doc, kwargs_doc,
                                                count, conn)

    def batch_seal(self, batch_id: int, conn: Any = None) -> SealResult:
        return self.batches.batch_seal(batch_id, conn)

    def batch_resolve(self, refs: Sequence[ItemRef], reason: str | None,
                      conn: Any = None) -> AckResult:
        return self.batches.batch_resolve(refs, reason, conn)

    def batch_get(self, batch_id: int) -> BatchInfo | None:
        return self.batches.batch_get(batch_id)

    def batch_list(self, state: str | None, limit: int) -> list[BatchInfo]:
        return self.batches.batch_list(state, limit)

    def batch_failures(self, batch_id: int, limit: int) -> list[ItemFailure]:
        return self.batches.batch_failures(batch_id, limit)

    def batches_prune(self, retention: float, limit: int = 1000) -> BatchPruneReport:
        return self.batches.batches_prune(retention, limit)

    # -- partition leases ------------------------------------------------------------------------------
    def lease_acquire(self, set_name: str, n: int, owner: str,
                      lease: float) -> tuple[int, int, datetime] | None:
        return self.leases.lease_acquire(set_name, n, owner, lease)

    def lease_renew(self, set_name: str, slot: int, token: int, lease: float) -> datetime | None:
        return self.leases.lease_renew(set_name, slot, token, lease)

    def lease_release(self, set_name: str, slot: int, token: int) -> bool:
        return self.leases.lease_release(set_name, slot, token)

    def lease_fence(self, conn: Any, set_name: str, slot: int, token: int, lease: float) -> bool:
        return self.leases.lease_fence(conn, set_name, slot, token, lease)

    def lease_list(self, set_name: str | None) -> list[SlotInfo]:
        return self.leases.lease_list(set_name)

    # -- the effect ledger ----------------------------------------------------------------------------
    def effect_claim(self, scope: str, key: str, policy: str, owner: str, lease: float,
                     lock_timeout: float, conn: Any = None) -> tuple[str, int | None]:
        return self.effects.effect_claim(scope, key, policy, owner, lease, lock_timeout, conn)

    def effect_claim_many(self, scope: str, keys: Sequence[str], policy: str, owner: str,
                          lease: float, lock_timeout: float,
                          conn: Any = None) -> tuple[int, list[tuple[str, str, int | None]]]:
        return self.effects.effect_claim_many(scope, keys, policy, owner, lease, lock_timeout, conn)

    def effect_finish_many(self, scope: str, chunk: int, done: Sequence[tuple[str, int, str | None]],
                           failed: Sequence[tuple[str, int, str]],
                           conn: Any = None, left: int = 0,
                           again: bool = False) -> tuple[set[str], set[str]]:
        return self.effects.effect_finish_many(scope, chunk, done, failed, conn, left, again)

    def effect_done(self, scope: str, key: str, token: int, result_json: str | None,
                    conn: Any = None, again: bool = False) -> bool:
        return self.effects.effect_done(scope, key, token, result_json, conn, again)

    def effect_release(self, scope: str, key: str, token: int, error: str,
                       conn: Any = None) -> bool:
        return self.effects.effect_release(scope, key, token, error, conn)

    def effect_resolve(self, scope: str, key: str, state: str, note: str | None,
                       force: bool, conn: Any = None, lock_timeout: float = 5.0) -> bool:
        return self.effects.effect_resolve(scope, key, state, note, force, conn, lock_timeout)

    def effect_resolve_many(self, scope: str, keys: Sequence[str], state: str, note: str | None,
                            force: bool, conn: Any = None, lock_timeout: float = 5.0) -> list[str]:
        return self.effects.effect_resolve_many(scope, keys, state, note, force, conn, lock_timeout)

    def effect_get(self, scope: str, key: str, conn: Any = None) -> EffectInfo | None:
        return self.effects.effect_get(scope, key, conn)

    def effects_in_doubt(self, scope: str | None, limit: int) -> list[EffectInfo]:
        return self.effects.effects_in_doubt(scope, limit)

    def effects_list(self, scope: str, state: str | None, limit: int,
                     after: str | None = None) -> list[EffectInfo]:
        return self.effects.effects_list(scope, state, limit, after)

    def effects_count(self, scope: str) -> dict[str, int]:
        return self.effects.effects_count(scope)

    # -- the service ------------------------------------------------------------------------------------
    def jobs_count_matching(self, action: str, where: JobFilter) -> tuple[int, int | None]:
        return self.service.jobs_count_matching(action, where)

    def jobs_cancel_matching(self, where: JobFilter, limit: int, after: int = 0,
                             conn: Any = None) -> tuple[int, int]:
        return self.service.jobs_cancel_matching(where, limit, after, conn)

    def jobs_retry_matching(self, where: JobFilter, limit: int, after: int = 0,
                            conn: Any = None) -> tuple[int, int]:
        return self.service.jobs_retry_matching(where, limit, after, conn)

    def token_create(self, name: str, scope: str, secret_hash: str, prefix: str) -> TokenInfo:
        return self.service.token_create(name, scope, secret_hash, prefix)

    def token_find_by_hash(self, secret_hash: str) -> tuple[TokenInfo, str] | None:
        return self.service.token_find_by_hash(secret_hash)

    def token_get(self, token_id: int) -> TokenInfo | None:
        return self.service.token_get(token_id)

    def token_list(self) -> list[TokenInfo]:
        return self.service.token_list()

    def token_revoke(self, token_id: int) -> bool:
        return self.service.token_revoke(token_id)

    def token_touch(self, token_id: int) -> None:
        self.service.token_touch(token_id)

    def audit_record(self, token_id: int | None, actor: str, action: str, target: str | None,
                     count: int | None, detail: dict[str, Any], conn: Any = None) -> int:
        return self.service.audit_record(token_id, actor, action, target, count, detail, conn)

    def audit_list(self, cursor: int | None, limit: int) -> list[AuditEntry]:
        return self.service.audit_list(cursor, limit)

    # -- the dashboard's reads ----------------------------------------------------------------------------
    def dash_counts(self) -> dict[tuple[str, str], Count]:
        return self.dash.dash_counts()

    def dash_finished_since(self, since: float) -> list[tuple[int, str, int]]:
        return self.dash.dash_finished_since(since)

    def dash_clock(self) -> float:
        return self.dash.dash_clock()

    def dash_running(self, limit: int) -> list[JobLine]:
        return self.dash.dash_running(limit)

    def dash_dead(self, limit: int) -> list[JobLine]:
        return self.dash.dash_dead(limit)


