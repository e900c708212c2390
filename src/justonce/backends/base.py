"""The storage boundary: the operations every backend offers, each with its contract.

All SQL of justonce lives behind this protocol, in ``<backend>/queries.sql`` and
``<backend>/migrations/``. Everything above it (App, worker, CLI) is backend-agnostic.
Time is always the database's clock: durations are passed in seconds and added to the
database's ``now()`` inside the statement.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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
    SlotFence,
    SlotInfo,
    TokenInfo,
)
from ..types import JobState
from .dashstore import Count, JobLine

if TYPE_CHECKING:
    from .liststore import ListOps

Partitioning = SlotFence
"""Claim only partitioned jobs whose slot (partition_hash mod n) is held with the given token."""


class Waiter(Protocol):
    """Blocks an idle worker until new work may be there."""

    def wait(self, timeout: float, idle_for: float = 0.0) -> None:
        """Return when a job became ready in one of the queues, or after ``timeout`` s.
        May return early (spurious wake-ups are harmless); never raises on a lost
        connection (it falls back to sleeping). ``idle_for``: how long the worker has
        claimed nothing (a waiter that polls may look less often once it is long)."""

    def close(self) -> None: ...


class Backend(Protocol):
    """One database. Thread-safe: any thread may call any operation."""

    url: str
    name: str
    lists: ListOps
    """The list operations (liststore.py): written once, over the backend's dialect."""

    # -- schema ---------------------------------------------------------------------
    def migrate(self) -> list[str]:
        """Apply missing migrations in order, atomically each; return their names.
        Safe to run from several processes at once (they serialise)."""

    def schema_version(self) -> int:
        """Highest applied migration, 0 for an empty database."""

    def schema_latest(self) -> int:
        """The schema version this justonce needs (its last migration)."""

    # -- producer side --------------------------------------------------------------
    def job_insert(self, job: NewJob, conn: Any = None) -> Job:
        """Insert one job, or return the live job that holds ``job.key`` (with
        ``duplicate=True``). Atomic; concurrent inserts of one key create one job (unique
        index). With ``conn`` (the caller's own psycopg / sqlite3 connection) the insert
        joins the caller's open transaction and is neither committed nor rolled back here.
        Ready jobs wake idle workers (on commit)."""

    def job_insert_many(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]:
        """Insert many jobs in one statement / transaction; return their ids in input
        order (the live job's id where a key was already held). Atomic as a whole."""

    def job_insert_many_counted(self, jobs: Sequence[NewJob], conn: Any = None) -> tuple[list[int], int]:
        """:meth:`job_insert_many`, and how many of the jobs were new (not a live job
        that held the key, nor an earlier job of the call with the same key)."""

    def job_insert_batch(
        self, template: NewJob, args_doc: str, kwargs_doc: str, conn: Any = None
    ) -> list[int]:
        """Insert one job per entry of the JSON arrays ``args_doc`` / ``kwargs_doc`` (same
        length), all with ``template``'s task and options (``template.key`` must be None).
        One statement; returns ids in input order."""

    def job_get(self, job_id: int, conn: Any = None) -> Job | None:
        """The job, or None."""

    def job_cancel(self, job_id: int, conn: Any = None) -> Job | None:
        """scheduled / ready / running → cancelled. None when the job is not live
        (the caller tells 'not found' from 'already finished'). A running job's worker
        is fenced out: its completion will be rejected. A job's batch item is marked
        failed in the same transaction (``conn``'s, when given: see :meth:`transaction`)."""

    def job_retry(self, job_id: int, conn: Any = None) -> Job | None:
        """dead / cancelled → ready with attempts reset. None when not in those states.
        Raises KeyConflict when another live job holds the key (with ``conn``, the caller's
        transaction is left as it was before the call)."""

    def queue_counts(self) -> list[QueueCount]: ...

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Oldest ready age per queue and open batches, in one statement whose cost does
        not grow with the backlog (see MetricsSnapshot)."""

    # -- worker side: every write is fenced by (id, lease_token, state='running') ----
    def job_claim(self, queue: str, limit: int, owner: str, lease: float,
                  partitions: Partitioning | None = None) -> list[ClaimedJob]:
        """Lease up to ``limit`` ready jobs of one queue in (priority, id) order for
        ``lease`` seconds; attempts += 1 and a new lease_token for each. Concurrent claims
        never return the same job. Jobs with a partition key are left out, unless
        ``partitions`` (a :class:`SlotFence`) is given: then only those jobs are claimed,
        those whose partition_hash mod n is a slot that the statement itself finds still
        held with the given token and not expired by the database's clock (no claim
        commits for a slot that changed hands, however late it commits: on Postgres the
        slot rows are held FOR SHARE until commit, so a takeover waits), in id order, and
        only while no earlier job of the same key is live (one job per key at a time, in
        enqueue order)."""

    def job_complete_many(self, done: Sequence[Completion]) -> set[int]:
        """Mark succeeded in one transaction; return the ids accepted. An id missing from
        the answer was rejected: its lease was lost (expired and re-offered, cancelled).
        The batch items of accepted jobs are acked in the same transaction."""

    def job_complete_and_claim(
        self, done: Sequence[Completion], queue: str, limit: int, owner: str, lease: float,
        partitions: Partitioning | None = None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        """``job_complete_many`` and ``job_claim`` in one transaction (one commit instead
        of two for a worker that finished a batch and wants the next)."""

    def job_fail(self, failure: Failure, kind: str = "error") -> JobState | None:
        """Record a failed attempt: retry after ``retry_in`` s (scheduled, or ready when 0),
        or dead when attempts are exhausted or ``retry_in`` is None. None = rejected. A
        job that ends dead marks its batch item failed in the same transaction."""

    def job_settled(self, held: Sequence[tuple[int, int]]) -> dict[int, SettledJob]:
        """Of ``(id, token)`` pairs, the jobs that still carry that lease token and are no
        longer running, by id (a plain read). A worker asks after a write of its own raised
        and its retry was refused: a reply lost after the COMMIT leaves the row settled
        under the worker's own token (tokens count a job's claims, so no later claim took
        it); a lease lost before it leaves another token, or the lease's expiry's error."""

    def job_heartbeat(self, held: Sequence[tuple[int, int]], lease: float) -> set[int]:
        """Extend the leases of (id, token) pairs to now() + lease; return those renewed."""

    def job_release(self, held: Sequence[tuple[int, int]], refund: bool) -> set[int]:
        """Give leased jobs back (state ready). ``refund``: they never started, so the
        attempt is not counted. Returns the ids released."""

    # -- housekeeping ---------------------------------------------------------------
    def maintenance_try(self, name: str, interval: float, owner: str) -> bool:
        """True for exactly one caller at a time per name (across processes), once its own
        ``interval`` s have passed since the last round by anyone: a caller with a long
        interval does not hold back one with a short one."""

    def jobs_promote(self, limit: int = 5000) -> int:
        """scheduled jobs whose run_at has come → ready. Returns how many."""

    def jobs_rescue(self, limit: int = 5000) -> HousekeepingReport:
        """running jobs whose lease expired → ready (or dead when attempts are spent, and
        then their batch items are marked failed)."""

    def jobs_prune(self, keep_succeeded: float, keep_dead: float, limit: int = 10000) -> int:
        """Delete finished jobs older than the retention (seconds). Returns how many."""

    # -- batches (one algorithm for every backend: batchstore.py) -------------------------
    # Every operation taking ``conn`` runs on the caller's connection, atomically, under a
    # savepoint: inside the caller's transaction (opened if none is, and left for the
    # caller to commit), or, on a connection in autocommit mode, in a transaction of its
    # own that it commits. On Postgres the connection must be READ COMMITTED.
    def batch_open(self, description: str | None, callbacks: dict[str, Any],
                   expire_after: float, conn: Any = None) -> int:
        """Create an open batch; ``callbacks`` maps "complete" / "success" to the stored
        callback job (batchstore.callback_spec). Returns its id."""

    def batch_add(self, batch_id: int, count: int, conn: Any = None) -> ItemGroup:
        """Add a group of ``count`` pending items. Atomic. Raises BatchNotFound,
        BatchExpired, or InvalidTransition when the batch is not open."""

    def batch_enqueue(self, batch_id: int, jobs: Sequence[NewJob],
                      conn: Any = None) -> tuple[ItemGroup, list[int]]:
        """``batch_add`` of len(jobs) items and the jobs bound to them (job i = item i),
        in one transaction. Jobs must carry no key."""

    def batch_enqueue_calls(self, batch_id: int, template: NewJob, args_doc: str,
                            kwargs_doc: str, count: int,
                            conn: Any = None) -> tuple[ItemGroup, list[int]]:
        """``batch_enqueue`` for jobs that differ only in their arguments (as in
        ``job_insert_batch``)."""

    def batch_seal(self, batch_id: int, conn: Any = None) -> SealResult:
        """open → sealed; in the same transaction, sealed → completed (with the callbacks
        enqueued) when nothing is pending. Sealing a sealed or completed batch changes
        nothing. Raises BatchNotFound / BatchExpired."""

    def batch_resolve(self, refs: Sequence[ItemRef], reason: str | None,
                      conn: Any = None) -> AckResult:
        """Ack (``reason`` None) or fail items, atomically: either every id names an item of
        a batch that is not expired and the call applies, or it raises (BatchNotFound,
        ItemNotFound, BatchExpired) and nothing changes. Completes every batch whose last
        pending item this was, exactly once (see batchstore.py)."""

    def batch_get(self, batch_id: int) -> BatchInfo | None: ...

    def batch_list(self, state: str | None, limit: int) -> list[BatchInfo]:
        """Newest first."""

    def batch_failures(self, batch_id: int, limit: int) -> list[ItemFailure]: ...

    def batches_prune(self, retention: float, limit: int = 1000) -> BatchPruneReport:
        """One round: expire up to ``limit`` idle open batches, and delete up to
        ``limit`` completed/expired batches finished more than ``retention`` s ago."""

    # -- partition leases (leasestore.py) ---------------------------------------------
    def lease_acquire(self, set_name: str, n: int, owner: str,
                      lease: float) -> tuple[int, int, datetime] | None:
        """Take the first free or expired slot of ``0..n-1``: (slot, token, expires_at), or
        None when all are held. The token is one more than the slot's last. Raises
        PartitionConflict when the set has another n and any slot is held."""

    def lease_renew(self, set_name: str, slot: int, token: int, lease: float) -> datetime | None:
        """Extend to now() + lease; None when the token is no longer the holder's."""

    def lease_release(self, set_name: str, slot: int, token: int) -> bool: ...

    def lease_fence(self, conn: Any, set_name: str, slot: int, token: int, lease: float) -> bool:
        """In the caller's open transaction on ``conn``: True when ``token`` still holds the
        slot, and no takeover can commit before that transaction ends (where the server can
        end an idle transaction, one left idle for longer than ``lease`` is ended)."""

    def lease_list(self, set_name: str | None) -> list[SlotInfo]: ...

    # -- the effect ledger (effectstore.py) ----------------------------------------------
    def effect_claim(self, scope: str, key: str, policy: str, owner: str, lease: float,
                     lock_timeout: float, conn: Any = None) -> tuple[str, int | None]:
        """Check state, change state, under the entry's row lock (LockTimeout after
        ``lock_timeout``): (what was found, the claim's token or None when the effect must
        not be done now)."""

    def effect_claim_many(self, scope: str, keys: Sequence[str], policy: str, owner: str,
                          lease: float, lock_timeout: float,
                          conn: Any = None) -> tuple[int, list[tuple[str, str, int | None]]]:
        """``effect_claim`` for a chunk of distinct keys in one transaction (entries made
        where missing, locked in key order, LockTimeout after ``lock_timeout``): the
        chunk's id and (key, found, token or None) per key, in key order. The claimed keys
        are held by the chunk and share its lease. An entry of another policy refuses the
        whole chunk (InvalidOption; nothing is claimed)."""

    def effect_finish_many(self, scope: str, chunk: int, done: Sequence[tuple[str, int, str | None]],
                           failed: Sequence[tuple[str, int, str]],
                           conn: Any = None, left: int = 0,
                           again: bool = False) -> tuple[set[str], set[str]]:
        """Atomically: chunk ``chunk``'s ``done`` claims (key, token, result JSON) running →
        done, its ``failed`` ones (key, token, error) running → pending, each fenced by its
        token and the chunk. (Keys marked done, keys released); a key in neither had its
        claim taken over. ``left`` keys of the chunk are neither: the chunk keeps them until
        its lease runs out (then they are in doubt). ``again``: a retry after a try whose
        reply was lost (it may have committed): a key already done (or released) with the
        claim's token counts as marked (or released) by this finish."""

    def effect_done(self, scope: str, key: str, token: int, result_json: str | None,
                    conn: Any = None, again: bool = False) -> bool:
        """running → done, fenced by the claim's token. ``again``: a retry after a try whose
        reply was lost: an entry already done with this token answers True."""

    def effect_release(self, scope: str, key: str, token: int, error: str,
                       conn: Any = None) -> bool:
        """running → pending (claimable again), fenced by the claim's token."""

    def effect_resolve(self, scope: str, key: str, state: str, note: str | None,
                       force: bool, conn: Any = None, lock_timeout: float = 5.0) -> bool:
        """An entry in doubt (or, with ``force``, running) → ``state`` (done / pending),
        its lock waited for at most ``lock_timeout`` (LockTimeout past it)."""

    def effect_resolve_many(self, scope: str, keys: Sequence[str], state: str, note: str | None,
                            force: bool, conn: Any = None, lock_timeout: float = 5.0) -> list[str]:
        """``effect_resolve`` for many distinct keys, locked in key order, in transactions
        of up to a few thousand keys each (not atomic as a whole; with ``conn``, all in the
        caller's transaction). Returns the keys
        resolved; a key not in the answer was not in doubt (or not running, with ``force``)
        or does not exist."""

    def effect_get(self, scope: str, key: str, conn: Any = None) -> EffectInfo | None:
        """The entry, or None (``conn``: as the caller's transaction sees it)."""

    def effects_in_doubt(self, scope: str | None, limit: int) -> list[EffectInfo]: ...

    def effects_list(self, scope: str, state: str | None, limit: int,
                     after: str | None = None) -> list[EffectInfo]:
        """Entries of a scope (state pending / running / done, or all), by key; with
        ``after``, only keys greater than it (keyset paging)."""

    def effects_count(self, scope: str) -> dict[str, int]: ...

    # -- the service (servicestore.py) ------------------------------------------------------
    def job_page(self, where: JobFilter, cursor: int | None, limit: int) -> list[Job]:
        """Jobs matching ``where`` with ``id < cursor`` (all when None), newest first: keyset
        paging by id, so a page costs the same however deep it is."""

    def jobs_count_matching(self, action: str, where: JobFilter) -> tuple[int, int | None]:
        """(how many jobs ``action`` ("cancel": live ones; "retry": dead or cancelled ones
        whose key no live job holds) would act on, the highest such id or None)."""

    def jobs_cancel_matching(self, where: JobFilter, limit: int, after: int = 0,
                             conn: Any = None) -> tuple[int, int]:
        """Cancel up to ``limit`` live jobs matching ``where`` with ids above ``after``
        (lowest ids first) in one transaction, marking their batch items failed in it;
        returns (how many, the highest id taken, or ``after``). Call again with that id
        until fewer than ``limit`` come back (a bounded chunk per transaction keeps locks
        short; each job is taken at most once)."""

    def jobs_retry_matching(self, where: JobFilter, limit: int, after: int = 0,
                            conn: Any = None) -> tuple[int, int]:
        """Make up to ``limit`` dead or cancelled jobs matching ``where`` with ids above
        ``after`` ready again, in one transaction (never two live jobs of one key: see
        ``match_retry``); returns as :meth:`jobs_cancel_matching` does."""

    def queue_stats(self, exact_below: int) -> list[QueueStats]:
        """Counts per queue and state, and each queue's next ready job's wait. Exact while
        the jobs table has fewer than ``exact_below`` rows; above, a backend may sample
        (``estimated=True``) instead of counting every row. Paused queues are listed
        (with their pause) whether they hold jobs or not."""

    def queue_pause(self, queue: str, actor: str | None, note: str | None,
                    conn: Any = None) -> QueuePause:
        """Pause ``queue`` (a no-op when it is paused: the first pause stays, and the answer
        says ``already``); the pause in force. Atomic: every claim that starts after this
        commits skips the queue."""

    def queue_resume(self, queue: str, conn: Any = None) -> bool:
        """Resume ``queue``; False when it was not paused. Atomic. Wakes workers that
        listen."""

    def queue_pauses(self) -> list[QueuePause]:
        """The paused queues, by name."""

    def token_create(self, name: str, scope: str, secret_hash: str, prefix: str) -> TokenInfo:
        """Store a new token (its hash only). Atomic."""

    def token_find_by_hash(self, secret_hash: str) -> tuple[TokenInfo, str] | None:
        """The token whose hash this is (revoked or not) and the stored hash, or None."""

    def token_get(self, token_id: int) -> TokenInfo | None: ...

    def token_list(self) -> list[TokenInfo]:
        """Every token, revoked ones too, by id."""

    def token_revoke(self, token_id: int) -> bool:
        """Revoke now; False when there is no such token or it was revoked already."""

    def token_touch(self, token_id: int) -> None:
        """Record a use (``last_used_at``); writes at most once a minute per token."""

    def audit_record(self, token_id: int | None, actor: str, action: str, target: str | None,
                     count: int | None, detail: dict[str, Any], conn: Any = None) -> int:
        """Append one entry with the database's time; returns its id. With ``conn`` (from
        :meth:`transaction`) it commits with the action it records, or not at all."""

    def audit_list(self, cursor: int | None, limit: int) -> list[AuditEntry]:
        """Newest first, entries with ``id < cursor``."""

    def transaction(self) -> AbstractContextManager[Any]:
        """One of this backend's own connections in an open write transaction (Postgres:
        READ COMMITTED; SQLite: BEGIN IMMEDIATE), committed when the block ends and rolled
        back if it raises. Pass it as ``conn`` to the operations that take one, so that
        they commit together: the service commits every action and its audit row so (a
        crash or a refused audit row leaves neither)."""

    def row_lock(self, conn: Any, table: str, column: str, value: Any, timeout: float) -> bool:
        """Lock the caller's row in its transaction on ``conn``; False: no such row."""

    def callers_savepoint(self, conn: Any, fn: Callable[[], Any]) -> Any:
        """``fn()`` under a savepoint of its own in the caller's open transaction on
        ``conn`` (rolled back to it when ``fn`` raises); as is outside a transaction."""

    def caller_in_transaction(self, conn: Any) -> bool:
        """Whether the caller's connection ``conn`` has a transaction open now (what a call
        made on it wrote is seen by nobody else until the caller commits)."""

    # -- the dashboard's reads (dashstore.py): bounded on a big table ---------------------
    def dash_counts(self) -> dict[tuple[str, str], Count]:
        """Jobs per (queue, state): exact on a small table, else estimated or capped."""

    def dash_finished_since(self, since: float) -> list[tuple[int, str, int]]:
        """(epoch second, 'succeeded' | 'dead', jobs) finished at or after ``since``."""

    def dash_clock(self) -> float:
        """The database's clock in epoch seconds."""

    def dash_running(self, limit: int) -> list[JobLine]: ...

    def dash_dead(self, limit: int) -> list[JobLine]: ...

    def waiter(self, queues: Sequence[str], listen: bool = True) -> Waiter:
        """A waiter for idle workers. ``listen=False``: poll only (e.g. behind PgBouncer in
        transaction mode, where LISTEN never fires)."""

    def now(self) -> datetime:
        """The database's clock."""

    def close(self) -> None: ...


_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.M)


_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


def load_queries(path: Path, macros: dict[str, str] | None = None) -> dict[str, str]:
    """Split a ``queries.sql`` file into its ``-- name: x`` blocks. ``macros`` replace
    constant tokens (never user input); ``{{other}}`` in a block includes the block named
    ``other``, so a statement composed of two others does not repeat their text."""
    text = path.read_text()
    for token, expansion in (macros or {}).items():
        text = text.replace(token, expansion)
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip()
    for name, body in queries.items():
        queries[name] = _INCLUDE.sub(lambda m: queries[m.group(1)], body)
    return queries


def decode_arguments(pairs: list[tuple[str, str]]) -> list[tuple[Any, Any, str | None]]:
    """Decode the (args, kwargs) JSON texts of a claimed batch: (args, kwargs, None), or
    ([], {}, why) for a row whose texts do not decode as a list and an object. One parser
    call for the whole batch when every row is sound (the usual case); when that call
    fails, or its answer is not one [list, object] pair per row, each row is decoded by
    itself, so one corrupt row (stored by hand, or by a session in other SQL modes) fails
    only its own job: it stopped the whole batch, claimed again and again until every job
    of it was dead unrun."""
    if not pairs:
        return []
    doc = ",".join(f"[{a},{k}]" for a, k in pairs)
    try:
        decoded = json.loads(f"[{doc}]")
    except ValueError:
        decoded = None
    if (isinstance(decoded, list) and len(decoded) == len(pairs)
            and all(type(p) is list and len(p) == 2 and type(p[0]) is list and type(p[1]) is dict
                    for p in decoded)):
        return [(p[0], p[1], None) for p in decoded]
    return [decode_pair(a, k) for a, k in pairs]


class _Undecoded(str):
    """An args/kwargs text that did not decode (decode_column): job_from_row names it."""


def decode_pair(args: Any, kwargs: Any, decoded: bool = False) -> tuple[list[Any], dict[str, Any], str | None]:
    """One row's (args, kwargs), as JSON texts or (Postgres jsonb, or ``decoded``: a row
    decode_column went over) already decoded: (args, kwargs, None), or ([], {}, what is
    wrong) when they are not a list and an object. (Decoded values are not decoded again:
    a double-encoded '"[1,2]"' read as [1, 2] through get_job, yet failed its claim.)"""
    out: list[Any] = []
    for name, value, want in (("args", args, list), ("kwargs", kwargs, dict)):
        text = isinstance(value, _Undecoded) or (not decoded and isinstance(value, str | bytes))
        try:
            decoded_value = json.loads(value) if text else value
        except ValueError as exc:
            return [], {}, f"{name} does not decode as JSON ({exc}): {_start(value)}"
        if type(decoded_value) is not want:
            return [], {}, (f"{name} is not a JSON {'list' if want is list else 'object'}: "
                            f"{_start(value)}")
        out.append(decoded_value)
    return out[0], out[1], None


def decode_column(row: dict[str, Any], col: str) -> None:
    """Decode the JSON text of ``row[col]`` in place. A text that does not decode is not
    raised (one corrupt row made ``get_job`` and every listing with it fail): ``result``
    keeps the stored text, ``errors`` becomes [], ``args``/``kwargs`` are left for
    job_from_row to check, and ``row["undecodable"]`` says which and why."""
    value = row.get(col)
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if not isinstance(value, str):
        return
    try:
        row[col] = json.loads(value)
    except ValueError as exc:
        if col in ("args", "kwargs"):
            row[col] = _Undecoded(value)  # (job_from_row's check names it)
            return
        row[col] = value if col == "result" else []
        row.setdefault("undecodable", f"{col} does not decode as JSON ({exc}): {_start(value)}")


def _start(value: Any) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return repr(text[:200]) + ("..." if len(text) > 200 else "")


def migration_files(folder: Path) -> list[tuple[int, str, str]]:
    """(version, name, sql) for every ``NNNN_name.sql`` in order."""
    out = []
    for f in sorted(folder.glob("*.sql")):
        version = int(f.name.split("_", 1)[0])
        out.append((version, f.stem, f.read_text()))
    return out


def job_from_insert(new: NewJob, job_id: int, state: str, run_at: datetime,
                    created_at: datetime) -> Job:
    """The Job just inserted, from what was sent and the four columns the insert returns
    (returning every column cost about 8 % of a single enqueue)."""
    return Job(
        id=job_id, queue=new.queue, task=new.task, args=json.loads(new.args_json),
        kwargs=json.loads(new.kwargs_json), state=JobState(state), priority=new.priority,
        attempts=0, max_attempts=new.max_attempts, timeout=new.timeout, run_at=run_at,
        created_at=created_at, key=new.key, partition_key=new.partition_key,
        batch_item=new.batch_item,
    )


def job_from_row(row: dict[str, Any], duplicate: bool = False) -> Job:
    """Build a Job from a row mapping whose JSON and time columns are already decoded
    (args and kwargs may still be text that did not decode: see Job.undecodable)."""
    args, kwargs, bad = decode_pair(row["args"], row["kwargs"], decoded=True)
    return Job(
        id=row["id"],
        queue=row["queue"],
        task=row["task"],
        args=args,
        kwargs=kwargs,
        state=JobState(row["state"]),
        priority=row["priority"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        timeout=row["timeout"],
        run_at=row["run_at"],
        created_at=row["created_at"],
        key=row["key"],
        partition_key=row["partition_key"],
        batch_item=row["batch_item"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        last_error=row["last_error"],
        result=row["result"],
        errors=row["errors"],
        duplicate=duplicate,
        undecodable=bad or row.get("undecodable"),
    )
