"""SQLite backend: the embedded default. Several processes share one file safely.

WAL mode lets readers run beside the one writer; every write transaction starts with
``BEGIN IMMEDIATE`` so it takes the write lock up front (a deferred transaction that
upgrades later can fail with "database is locked" past the busy timeout), and a bounded
retry covers SQLITE_BUSY beyond the busy timeout.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from ...errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidOption,
    KeyConflict,
    LockTimeout,
    SchemaError,
)
from ...models import (
    ClaimedJob,
    Completion,
    Failure,
    HousekeepingReport,
    Job,
    JobFilter,
    MetricsSnapshot,
    NewJob,
    QueueCount,
    QueueStats,
)
from ...partitions import register_sqlite_functions
from ...types import BatchState, JobState
from ..base import (
    Partitioning,
    decode_arguments,
    job_from_insert,
    job_from_row,
    load_queries,
    migration_files,
)
from ..batchstore import Flip, Key
from ..dashstore import DashboardStore
from ..servicestore import ServiceStore

HERE = Path(__file__).parent
NOW_SQL = "((julianday('now') - 2440587.5) * 86400.0)"
Q = load_queries(HERE / "queries.sql", {"NOW()": NOW_SQL})
MIGRATIONS = migration_files(HERE / "migrations")
LATEST = MIGRATIONS[-1][0]
SQLITE_BUSY_MS = 5  # SQLite's own wait; the fair retry loop in _write does the rest
SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}
T = TypeVar("T")


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///relative.db`` or ``sqlite:////absolute.db`` → (path, options)."""
    rest = url.split("://", 1)[1]
    if not rest.startswith("/"):
        raise ConfigurationError(
            f"malformed SQLite URL {url!r}: use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db"
        )
    path, _, query = rest[1:].partition("?")
    if not path or path == ":memory:":
        raise ConfigurationError(
            f"SQLite URL {url!r} names no file: justonce needs a file that several "
            "processes can share"
        )
    return path, dict(parse_qsl(query))


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _epoch_dt(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    return value.timestamp()


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for col in ("args", "kwargs", "errors", "result"):
        if row.get(col) is not None:
            row[col] = json.loads(row[col])
    for col in ("run_at", "created_at", "started_at", "finished_at", "lease_expires_at"):
        row[col] = _ts(row.get(col))
    return row


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


class SQLiteBackend(DashboardStore, ServiceStore):
    name = "sqlite"

    def __init__(self, url: str) -> None:
        self.url = url
        path, options = parse_sqlite_url(url)
        self.path = path
        sync = options.pop("synchronous", "FULL").upper()
        if sync not in SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={sync!r} in SQLite URL {url!r}: use one of {sorted(SYNCHRONOUS)}"
            )
        self.synchronous = sync
        try:
            self.busy_timeout = float(options.pop("busy_timeout", "30000")) / 1000.0
        except ValueError:
            raise ConfigurationError(f"busy_timeout in {url!r} must be milliseconds") from None
        if options:
            raise ConfigurationError(f"unknown SQLite URL options {sorted(options)} in {url!r}")
        parent = Path(path).expanduser().resolve().parent
        if not parent.is_dir():
            raise ConfigurationError(f"SQLite database folder {str(parent)!r} does not exist")
        self._local = threading.local()
        self._all: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._lock = threading.Lock()
        self._schema_ok = False

    # -- connections ------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self.path, timeout=SQLITE_BUSY_MS / 1000, isolation_level=None,
                    check_same_thread=False,
                )
                register_sqlite_functions(conn)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
                conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            except sqlite3.Error as exc:
                raise DatabaseUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
            with self._lock:
                self._all.append((threading.current_thread(), conn))
        return conn

    def _ensure_schema(self) -> None:
        if self._schema_ok:
            return
        version = self.schema_version()
        if version > LATEST:
            raise SchemaError(
                f"database schema v{version} is newer than this justonce (v{LATEST}); upgrade"
            )
        if version < LATEST:
            self.migrate()  # the embedded database migrates itself on first use
        self._schema_ok = True

    def _write(self, fn: Callable[[sqlite3.Connection], T], *, schema: bool = True,
               timeout: float | None = None) -> T:
        """Run ``fn`` in one BEGIN IMMEDIATE transaction (see _immediate)."""
        with self._immediate(schema=schema, timeout=timeout) as conn:
            return fn(conn)

    @contextmanager
    def _immediate(self, *, schema: bool = True,
                   timeout: float | None = None) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction, committed when the block ends.

        SQLite's own busy handler is unfair: a waiter backs off to 100 ms sleeps while
        newcomers retry every millisecond, so under load an old waiter (a lease renewal!)
        can starve for seconds. The connection's busy timeout is therefore tiny and this
        loop retries with short random sleeps until ``busy_timeout`` has passed, which
        gives every waiter about the same chance."""
        if schema:
            self._ensure_schema()
        conn = self._conn()
        self._busy_retry(lambda: conn.execute("BEGIN IMMEDIATE"), "SQLite write lock not available",
                         timeout)
        try:
            yield conn
        except sqlite3.OperationalError as exc:  # disk full, I/O error, lock trouble
            conn.execute("ROLLBACK")
            raise DatabaseUnavailable(f"SQLite: {exc}") from exc
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            conn.execute("ROLLBACK")
            raise DatabaseUnavailable(f"SQLite commit failed: {exc}") from exc

    def _read(self, sql: str, params: dict[str, Any] | Sequence[Any] = ()) -> list[sqlite3.Row]:
        self._ensure_schema()
        return self._busy_retry(lambda: self._conn().execute(sql, params).fetchall(),
                                "SQLite read failed")

    def _busy_retry(self, op: Callable[[], T], what: str, timeout: float | None = None) -> T:
        """Retry ``op`` while SQLite says busy, with short random sleeps, until
        ``busy_timeout`` has passed (see _write for why not SQLite's own handler)."""
        start = time.monotonic()
        deadline = start + (self.busy_timeout if timeout is None else timeout)
        while True:
            try:
                return op()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise DatabaseUnavailable(f"{what}: {exc}") from exc
                if time.monotonic() > deadline:
                    raise LockTimeout(f"{what}: {exc} (waited {deadline - start:g}s)") from exc
                time.sleep(random.uniform(0.00005, 0.0005))

    # -- schema -----------------------------------------------------------------------
    def schema_version(self) -> int:
        conn = self._conn()
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='justonce_migrations'"
        ).fetchone()
        if not exists:
            return 0
        row = conn.execute("SELECT max(version) FROM justonce_migrations").fetchone()
        return row[0] or 0

    def migrate(self) -> list[str]:
        def apply(conn: sqlite3.Connection) -> list[str]:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS justonce_migrations ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM justonce_migrations")}
            applied = []
            for version, name, sql in MIGRATIONS:
                if version in done:
                    continue
                for statement in _split_statements(sql):
                    conn.execute(statement)
                conn.execute(
                    f"INSERT INTO justonce_migrations VALUES (?, ?, {NOW_SQL})", (version, name)
                )
                applied.append(name)
            return applied

        applied = self._write(apply, schema=False)
        self._schema_ok = True
        return applied

    # -- producer side ------------------------------------------------------------------
    @staticmethod
    def _job_params(job: NewJob) -> dict[str, Any]:
        return {
            "queue": job.queue, "task": job.task, "args": job.args_json,
            "kwargs": job.kwargs_json, "priority": job.priority, "delay": job.delay,
            "run_at": _epoch(job.run_at), "max_attempts": job.max_attempts,
            "timeout": job.timeout, "key": job.key, "partition_key": job.partition_key,
            "batch_item": job.batch_item, "partition_hash": job.partition_hash,
        }

    def _insert_one(self, conn: Any, job: NewJob) -> Job:
        params = self._job_params(job)
        for _ in range(5):
            cur = conn.cursor()
            cur.execute(Q["job_insert"], params)
            row = cur.fetchone()
            if row is not None:
                return job_from_insert(job, row[0], row[1], _epoch_dt(row[2]), _epoch_dt(row[3]))
            cur.execute(Q["job_live_by_key"], {"key": job.key})
            row = cur.fetchone()
            if row is not None:
                return job_from_row(_decode(_row_dict(cur, row)), duplicate=True)
            # The holder finished between our insert and our look-up: insert again.
        raise DatabaseUnavailable(f"could not settle key {job.key!r}")  # pragma: no cover

    def _on(self, conn: Any, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the caller's connection, inside the caller's transaction, or in a
        write transaction of our own."""
        if conn is not None:
            return fn(self._caller_connection(conn))
        return self._write(fn)

    def _caller_connection(self, conn: Any) -> sqlite3.Connection:
        if not isinstance(conn, sqlite3.Connection):
            raise InvalidOption(
                f"conn must be an open sqlite3.Connection to this database, not {type(conn).__name__}"
            )
        self._ensure_schema()
        return conn

    def job_insert(self, job: NewJob, conn: Any = None) -> Job:
        return self._on(conn, lambda c: self._insert_one(c, job))

    def _insert_many(self, conn: Any, jobs: Sequence[NewJob]) -> list[int]:
        first = jobs[0]
        if all(first.same_options(j) for j in jobs):
            args_doc = "[" + ",".join(j.args_json for j in jobs) + "]"
            kwargs_doc = "[" + ",".join(j.kwargs_json for j in jobs) + "]"
            return self._insert_batch(conn, first, args_doc, kwargs_doc)
        ids = []
        cur = conn.cursor()
        for job in jobs:
            cur.execute(Q["job_insert_id"], self._job_params(job))
            row = cur.fetchone()
            if row is None:
                ids.append(self._insert_one(conn, job).id)
            else:
                ids.append(row[0])
        return ids

    def job_insert_many(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]:
        if not jobs:
            return []
        return self._on(conn, lambda c: self._insert_many(c, jobs))

    def _insert_batch(self, conn: Any, j: NewJob, args_doc: str, kwargs_doc: str,
                      item_prefix: str | None = None) -> list[int]:
        params = self._job_params(j)
        params["item_prefix"] = item_prefix
        pairs = zip(json.loads(args_doc), json.loads(kwargs_doc), strict=True)
        params["rows"] = json.dumps([[a, k] for a, k in pairs], separators=(",", ":"))
        del params["key"], params["args"], params["kwargs"]
        return sorted(r[0] for r in conn.execute(Q["job_insert_batch"], params).fetchall())

    def job_insert_batch(
        self, template: NewJob, args_doc: str, kwargs_doc: str, conn: Any = None
    ) -> list[int]:
        return self._on(conn, lambda c: self._insert_batch(c, template, args_doc, kwargs_doc))

    def job_get(self, job_id: int) -> Job | None:
        rows = self._read(Q["job_get"], {"id": job_id})
        return job_from_row(_decode(dict(rows[0]))) if rows else None

    def _one_job(self, name: str, job_id: int) -> Job | None:
        def run(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(Q[name], {"id": job_id}).fetchone()
            return job_from_row(_decode(dict(row))) if row else None

        return self._write(run)

    def job_cancel(self, job_id: int) -> Job | None:
        def run(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(Q["job_cancel"], {"id": job_id}).fetchone()
            if row is None:
                return None
            job = job_from_row(_decode(dict(row)))
            self._resolve_job_items(conn, [job.batch_item], "cancelled")
            return job

        return self._write(run)

    def job_retry(self, job_id: int) -> Job | None:
        try:
            return self._one_job("job_retry", job_id)
        except sqlite3.IntegrityError as exc:
            raise KeyConflict(
                f"job {job_id} cannot be retried: another live job holds its key"
            ) from exc

    def queue_counts(self) -> list[QueueCount]:
        return [QueueCount(r[0], JobState(r[1]), r[2]) for r in self._read(Q["queue_counts"])]

    def metrics_snapshot(self) -> MetricsSnapshot:
        rows = self._read(Q["metrics_snapshot"])
        return MetricsSnapshot(
            oldest_ready={r[0]: max(0.0, float(r[1])) for r in rows if r[0] is not None},
            batches_open=int(next((r[1] for r in rows if r[0] is None), 0)))

    def job_page(self, where: JobFilter, cursor: int | None, limit: int) -> list[Job]:
        params = {**self._filter_params(where), "cursor": cursor, "limit": limit}
        return [job_from_row(_decode(dict(r))) for r in self._read(Q["job_page"], params)]

    def queue_stats(self, exact_below: int) -> list[QueueStats]:
        # Always exact: the embedded database has no cheap estimate, and its tables stay
        # small enough (one machine) that a grouped count is a few hundred ms at worst.
        counts: dict[str, dict[str, int]] = {}
        for queue, state, n in self._read(Q["queue_counts"]):
            counts.setdefault(queue, {})[state] = n
        heads: dict[str, float | None] = {
            r[0]: r[1] for r in self._read(Q["queue_heads"], {"queues": json.dumps(sorted(counts))})}
        return [QueueStats(q, c, None if (h := heads.get(q)) is None else max(0.0, h))
                for q, c in sorted(counts.items())]

    # -- worker side ----------------------------------------------------------------------
    @staticmethod
    def _claim_query(queue: str, limit: int, owner: str, lease: float,
                     partitions: Partitioning | None) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"queue": queue, "limit": limit, "owner": owner, "lease": lease}
        if partitions is None:
            return Q["job_claim"], params
        params.update(set=partitions.set_name, n=partitions.n,
                      slots=json.dumps([list(pair) for pair in partitions.slots]))
        return Q["job_claim_partitioned"], params

    def job_claim(self, queue: str, limit: int, owner: str, lease: float,
                  partitions: Partitioning | None = None) -> list[ClaimedJob]:
        if partitions is not None and not partitions.slots:
            return []
        sql, params = self._claim_query(queue, limit, owner, lease, partitions)
        # A read first: an empty claim would otherwise take the one write lock for nothing,
        # and idle workers wake on every commit (see SQLiteWaiter).
        if partitions is None and not self._read(Q["job_any_ready"], {"queue": queue}):
            return []
        rows = self._write(lambda c: c.execute(sql, params).fetchall())
        return _claimed(rows)

    def _complete(self, conn: sqlite3.Connection, done: Sequence[Completion]) -> set[int]:
        """Complete the jobs, and ack the batch items of those accepted (same transaction)."""
        rows = json.dumps([[c.id, c.lease_token, c.result_json, c.note] for c in done])
        accepted = {r[0] for r in conn.execute(Q["job_complete_many"], {"rows": rows})}
        self._resolve_job_items(conn, [c.batch_item for c in done if c.id in accepted], None)
        return accepted

    def job_complete_many(self, done: Sequence[Completion]) -> set[int]:
        if not done:
            return set()
        return self._write(lambda c: self._complete(c, done))

    def job_complete_and_claim(
        self, done: Sequence[Completion], queue: str, limit: int, owner: str, lease: float,
        partitions: Partitioning | None = None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        if not done:
            return set(), self.job_claim(queue, limit, owner, lease, partitions)
        if partitions is not None and not partitions.slots:
            return self.job_complete_many(done), []
        sql, params = self._claim_query(queue, limit, owner, lease, partitions)

        def run(conn: sqlite3.Connection) -> tuple[set[int], list[sqlite3.Row]]:
            return self._complete(conn, done), conn.execute(sql, params).fetchall()

        accepted, rows = self._write(run)
        return accepted, _claimed(rows)

    def job_fail(self, failure: Failure, kind: str = "error") -> JobState | None:
        params = {
            "id": failure.id, "token": failure.lease_token, "error": failure.error,
            "retry_in": failure.retry_in, "kind": kind,
        }

        def run(conn: sqlite3.Connection) -> JobState | None:
            row = conn.execute(Q["job_fail"], params).fetchone()
            if row is None:
                return None
            if row[0] == JobState.DEAD:
                self._resolve_job_items(conn, [failure.batch_item], failure.error)
            return JobState(row[0])

        return self._write(run)

    def _fenced_many(self, name: str, held: Sequence[tuple[int, int]], **extra: Any) -> set[int]:
        if not held:
            return set()
        params = {"pairs": json.dumps(held), **extra}
        return self._write(lambda c: {r[0] for r in c.execute(Q[name], params)})

    def job_heartbeat(self, held: Sequence[tuple[int, int]], lease: float) -> set[int]:
        return self._fenced_many("job_heartbeat", held, lease=lease)

    def job_release(self, held: Sequence[tuple[int, int]], refund: bool) -> set[int]:
        return self._fenced_many("job_release", held, refund=int(refund))

    # -- housekeeping -------------------------------------------------------------------
    def maintenance_try(self, name: str, interval: float, owner: str) -> bool:
        params = {"name": name, "interval": interval, "owner": owner}
        return self._write(lambda c: c.execute(Q["maintenance_try"], params).fetchone()) is not None

    def jobs_promote(self, limit: int = 5000) -> int:
        return self._write(lambda c: c.execute(Q["jobs_promote"], {"limit": limit}).rowcount)

    def jobs_rescue(self, limit: int = 5000) -> HousekeepingReport:
        if not self._read(Q["jobs_any_expired"]):
            return HousekeepingReport()

        def run(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            rows = conn.execute(Q["jobs_rescue"], {"limit": limit}).fetchall()
            self._resolve_job_items(conn, [r[1] for r in rows if r[0] == "dead"],
                                    "lease expired on the last attempt")
            return rows

        rows = self._write(run)
        dead = sum(1 for r in rows if r[0] == "dead")
        return HousekeepingReport(rescued=len(rows) - dead, dead=dead)

    def jobs_prune(self, keep_succeeded: float, keep_dead: float, limit: int = 10000) -> int:
        params = {"keep_succeeded": keep_succeeded, "keep_dead": keep_dead, "limit": limit}
        return self._write(lambda c: c.execute(Q["jobs_prune"], params).rowcount)

    # -- the primitives of the shared batch algorithm (BatchStore) -----------------------
    def _b_tx(self, conn: Any, fn: Callable[[sqlite3.Connection], T],
              timeout: float | None = None) -> T:
        if conn is None:
            return self._write(fn, timeout=timeout)
        c = self._caller_connection(conn)
        # Inside the caller's transaction (opened here if the connection has none, as
        # sqlite3 itself would before a write), under a savepoint so that a refused call
        # leaves the caller's own writes alone. A connection in autocommit mode
        # (isolation_level None, or autocommit=True on Python 3.12+) gets a transaction of
        # its own, committed here.
        own = not c.in_transaction and (
            c.isolation_level is None or getattr(c, "autocommit", None) is True)
        if not c.in_transaction:
            self._caller_begin(c, timeout)
        c.execute("SAVEPOINT justonce")
        try:
            result = fn(c)
        except BaseException as exc:
            c.execute("ROLLBACK TO justonce")
            c.execute("RELEASE justonce")
            if own:
                c.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                # A read transaction of the caller's that another writer overtook cannot
                # become a write transaction: the caller must roll back and try again.
                raise LockTimeout(f"SQLite: {exc} (start a write transaction with BEGIN IMMEDIATE "
                                  "before calling justonce on your connection)") from exc
            raise
        c.execute("RELEASE justonce")
        if own:
            c.execute("COMMIT")
        return result

    def _b_rows(self, c: sqlite3.Connection, name: str, params: dict[str, Any]) -> list[Any]:
        return c.execute(Q[name], params).fetchall()

    def _b_many(self, c: sqlite3.Connection, name: str, seq: Sequence[dict[str, Any]]) -> None:
        if seq:
            c.executemany(Q[name], seq)

    def _b_flip(self, c: sqlite3.Connection, positions: dict[Key, set[int]]) -> dict[Key, Flip]:
        # SQLite has no bit operations on blobs: read the chunks (the write transaction
        # already excludes every other writer), set the bits here, write them back.
        rows = c.execute(Q["batch_chunks_lock"], {"keys": json.dumps(sorted(positions))}).fetchall()
        out: dict[Key, Flip] = {}
        writes = []
        for batch_id, group_id, chunk, size, pending, blob, state in rows:
            key = (batch_id, group_id, chunk)
            if state == BatchState.EXPIRED:
                out[key] = Flip(size, state, pending, None, frozenset())
                continue
            bits, left, was_set = bytearray(blob), pending, set()
            for pos in positions[key]:
                if pos >= size:
                    continue
                byte, mask = pos >> 3, 1 << (pos & 7)
                if bits[byte] & mask:
                    was_set.add(pos)
                else:
                    bits[byte] |= mask
                    left -= 1
            out[key] = Flip(size, state, pending, left if left != pending else None, frozenset(was_set))
            if left != pending:
                writes.append((batch_id, group_id, chunk, bytes(bits), left))
        c.executemany(Q["batch_chunk_update"], writes)
        return out

    def _b_read(self, name: str, params: dict[str, Any]) -> list[Any]:
        return self._read(Q[name], params)

    def _b_locked_tx(self, conn: Any, lock_timeout: float,
                     fn: Callable[[sqlite3.Connection], T]) -> T:
        # The write lock is the row lock: wait for it at most lock_timeout.
        return self._b_tx(conn, fn, timeout=lock_timeout)

    def row_lock(self, conn: Any, table: str, column: str, value: Any, timeout: float) -> bool:
        c = self._caller_connection(conn)
        if not c.in_transaction:
            # Opened here and left open: the lock lasts until the caller commits.
            self._caller_begin(c, timeout)
        # SQLite locks the whole database for a writer: a no-op UPDATE takes that lock
        # (upgrading a read transaction) and says whether the row exists.
        t, col = _quoted(table), _quoted(column)
        with _busy_wait(c, 0):
            cur = self._busy_retry(
                lambda: c.execute(f"UPDATE {t} SET {col} = {col} WHERE {col} = ?", (value,)),
                f"lock on {table}", timeout)
        return cur.rowcount > 0

    def _caller_begin(self, c: sqlite3.Connection, timeout: float | None) -> None:
        """BEGIN IMMEDIATE on the caller's connection, waiting at most ``timeout`` (the
        connection's own busy timeout is set aside meanwhile: ours decides)."""
        with _busy_wait(c, 0):
            self._busy_retry(lambda: c.execute("BEGIN IMMEDIATE"), "SQLite write lock not available",
                             timeout)

    def _b_fence_connection(self, conn: Any) -> sqlite3.Connection:
        c = self._caller_connection(conn)
        if not c.in_transaction:
            raise InvalidOption("fence() needs your open transaction on conn (BEGIN IMMEDIATE "
                                "first, then fence, then your writes, then COMMIT)")
        return c

    def _b_time(self, value: Any) -> datetime | None:
        return _ts(value)

    def _b_at(self, value: datetime | None) -> Any:
        return _epoch(value)

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._immediate()

    def _b_insert_jobs(self, c: sqlite3.Connection, jobs: Sequence[NewJob]) -> list[int]:
        return self._insert_many(c, jobs)

    def _b_insert_calls(self, c: sqlite3.Connection, template: NewJob, args_doc: str,
                        kwargs_doc: str, item_prefix: str) -> list[int]:
        return self._insert_batch(c, template, args_doc, kwargs_doc, item_prefix)

    def waiter(self, queues: Sequence[str], listen: bool = True) -> SQLiteWaiter:
        return SQLiteWaiter(self)

    def now(self) -> datetime:
        value = self._conn().execute(Q["db_now"]).fetchone()[0]
        return datetime.fromtimestamp(value, UTC)

    def close(self) -> None:
        """Close this thread's connection and those of threads that have ended. A thread
        that is still running keeps its connection (closing a sqlite3 connection under a
        thread that is using it crashes the process); it is closed when that thread ends."""
        me = threading.current_thread()
        with self._lock:
            mine = [(t, c) for t, c in self._all if t is me or not t.is_alive()]
            self._all = [(t, c) for t, c in self._all if (t, c) not in mine]
        for _, conn in mine:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
        self._schema_ok = False


class SQLiteWaiter:
    """SQLite has no notifications between processes, but ``PRAGMA data_version`` changes
    whenever another connection commits; reading it is cheap (no table access), so idle
    workers check it every few milliseconds and claim only when something changed.

    Used by one thread; ``close`` may come from any thread and only sets a flag."""

    CHECK_EVERY = 0.005

    def __init__(self, backend: SQLiteBackend) -> None:
        self.backend = backend
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._stop = threading.Event()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self.backend.path, check_same_thread=False)
                self._version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            while not self._stop.is_set() and time.monotonic() < deadline:
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
                if version != self._version:
                    self._version = version
                    return
                time.sleep(self.CHECK_EVERY)
        except sqlite3.Error:
            self._stop.wait(max(0.0, deadline - time.monotonic()))
        if self._stop.is_set() and self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._stop.set()


def _claimed(rows: list[sqlite3.Row]) -> list[ClaimedJob]:
    rows.sort(key=lambda r: (r["priority"], r["id"]))
    decoded = decode_arguments([(r["args"], r["kwargs"]) for r in rows])
    return [
        ClaimedJob(r["id"], r["queue"], r["task"], a, k, r["attempts"], r["max_attempts"],
                   r["timeout"], r["lease_token"], r["batch_item"], r["partition_hash"],
                   r["queue_wait"])
        for r, (a, k) in zip(rows, decoded, strict=True)
    ]


@contextmanager
def _busy_wait(c: sqlite3.Connection, ms: int) -> Iterator[None]:
    """Set the connection's own busy timeout for a while (then put it back)."""
    old = c.execute("PRAGMA busy_timeout").fetchone()[0]
    c.execute(f"PRAGMA busy_timeout = {int(ms)}")
    try:
        yield
    finally:
        c.execute(f"PRAGMA busy_timeout = {int(old)}")


def _quoted(identifier: str) -> str:
    """A validated identifier (validate.sql_identifier), quoted part by part."""
    return ".".join(f'"{part}"' for part in identifier.split("."))


def _row_dict(cur: Any, row: Any) -> dict[str, Any]:
    names = [d[0] for d in cur.description]
    return dict(zip(names, tuple(row), strict=True))


def _split_statements(script: str) -> list[str]:
    statements, buf = [], ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--"):
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            statements.append(buf.strip())
            buf = ""
    if buf.strip():
        statements.append(buf.strip())
    return statements
