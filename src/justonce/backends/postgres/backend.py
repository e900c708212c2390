"""PostgreSQL backend: the production backend, shared by any number of worker hosts.

Claims use ``FOR UPDATE SKIP LOCKED``; idle workers wake on ``LISTEN/NOTIFY`` and poll
as a fallback. Only transaction-scoped locks and settings are used. Behind PgBouncer in
transaction mode, ``?pgbouncer=1`` turns off the three pieces of session state the direct
path keeps: psycopg's server-side prepared statements, the ``search_path`` startup option
that ``?schema=`` sets, and LISTEN (workers poll instead).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import secrets
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from ...errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidOption,
    LockTimeout,
    SchemaError,
)
from ...items import CHUNK_BITS
from ...models import ClaimedJob, Completion, ListCompletion, NewJob, Reservation
from ...validate import shown
from .. import check_escapes, pool_size, redact_url
from ..base import Partitioning, load_queries, migration_files
from ..dialect import Dialect, Flip, Key
from ..liststore import ListOps, each, parse_ranges, ranges_json, to_ranges, token_of
from ..store import Store, claimed_jobs

try:
    import psycopg
    from psycopg import sql
    from psycopg.rows import dict_row, tuple_row
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ConfigurationError(
        "the PostgreSQL backend needs psycopg 3: pip install 'justonce[postgres]'"
    ) from exc
try:  # (psycopg_pool's own names, 3.2 to 3.3: see _Pool)
    from psycopg_pool.pool import AddConnection, MaintenanceTask
except ImportError:  # pragma: no cover - a psycopg_pool that moved them: its own backoff then
    AddConnection = MaintenanceTask = None  # type: ignore[assignment,misc]


class _QuietPool(logging.Filter):
    """Drops psycopg_pool's "error connecting in 'justonce'" warnings: two raw lines a try,
    a few tries a second, before the one-line DatabaseUnavailable that says the same (a
    worker's claim.error event says it in its JSON log). Other pools' records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "error connecting in %r: %s" and record.args
                    and isinstance(record.args, tuple) and record.args[0] == "justonce")


logging.getLogger("psycopg.pool").addFilter(_QuietPool())

RECONNECT_DELAY = 1.0
"""The longest wait (seconds) between two tries of one of the pool's connections to reach
a server that refused it (see _Pool)."""


class _Pool(ConnectionPool):
    """psycopg_pool's pool with its wait between connection tries capped at RECONNECT_DELAY.

    The pool tries a failed connection again after ~1 s, then doubles the wait each time,
    without a limit: a pool that lost its server for T seconds waited up to T more after
    the server was back, every call meanwhile failing with DatabaseUnavailable after the
    pool's timeout (a 92 s outage: +24-28 s; the service answered 503 for 62 s after a 63 s
    one while a new process connected at once). A worker back late lost the results it
    held to another worker that had expired its leases meanwhile, and their jobs ran again.
    The pool has no setting for it; the one place every try is put off is schedule_task()
    with an AddConnection, so the wait is capped there. The cost: each of the pool's
    connections (pool_size) tries once a second while the server is away, a refused
    connection or the server's own quick refusal."""

    def schedule_task(self, task: MaintenanceTask, delay: float) -> None:
        if AddConnection is not None and isinstance(task, AddConnection):
            # The try's own delay keeps doubling (it reaches inf after ~1000 tries, harmless:
            # float overflow gives inf, not an error); only the wait it asks for is capped.
            delay = min(delay, RECONNECT_DELAY)
        super().schedule_task(task, delay)

HERE = Path(__file__).parent
Q = load_queries(HERE / "queries.sql")
MIGRATIONS = migration_files(HERE / "migrations")
LATEST = MIGRATIONS[-1][0]
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}\Z")
_OPEN = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)
T = TypeVar("T")
IDLE_CHECK = 30.0
"""A pooled connection idle longer than this (seconds) is checked with a round trip before
it is lent (see PostgresDialect._stale)."""
PLAN_MAX_AGE = 10.0
"""A pooled connection drops the statements psycopg prepared on it (DEALLOCATE ALL) when
it is lent this many seconds after it last did: no plan outlives the table sizes it was
made for by more than about this long (see PLANNED_EACH_TIME), whatever the statement. It
costs a round trip, and a few runs of each statement planned again, per connection every
ten seconds."""


def parse_postgres_url(url: str) -> tuple[str, str | None, dict[str, str]]:
    """Split justonce's own options (``schema``, ``pool_size``, ``pgbouncer``) from the
    libpq URL: (conninfo, schema, the other options as given)."""
    parts = urlsplit(url)
    if not parts.hostname and not parts.path.strip("/") and "host=" not in parts.query:
        raise ConfigurationError(f"malformed PostgreSQL URL {shown(redact_url(url))}: "
                                 "expected postgresql://user@host:port/dbname")
    check_escapes(url, "PostgreSQL")
    try:
        _ = parts.port
    except ValueError:
        raise ConfigurationError(f"malformed port in PostgreSQL URL {shown(redact_url(url))}") from None
    # '+' is a '+' to libpq (it decodes %-escapes only, as in a URL's path): read so here,
    # and written back with %20 for a space. parse_qsl and urlencode's default spell a space
    # '+': ?password=a%20b reached libpq as "a+b", and ?application_name=a+b as "a b".
    query = dict(parse_qsl(parts.query.replace("+", "%2B")))
    ours: dict[str, str] = {
        k: query.pop(k) for k in ("schema", "pool_size", "pgbouncer") if k in query
    }
    schema = ours.pop("schema", None)
    if schema is not None and not _SCHEMA.match(schema):
        raise ConfigurationError(f"schema {shown(schema)} must match {_SCHEMA.pattern}")
    if schema is not None and schema.startswith("pg_"):
        # (CREATE SCHEMA would fail with ReservedName, in the middle of a migration.)
        raise ConfigurationError(f"schema {shown(schema)}: PostgreSQL reserves names that "
                                 "start with pg_ for its system schemas")
    if "pgbouncer" in ours:
        pgbouncer_mode(ours)  # refuse a misspelt value at once
    conninfo = urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
    return conninfo, schema, ours


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def pgbouncer_mode(options: dict[str, str]) -> bool:
    """The ``pgbouncer`` URL option as a flag (absent = off)."""
    value = options.get("pgbouncer", "0").lower()
    if value not in _TRUE | _FALSE:
        raise ConfigurationError(f"pgbouncer must be 1 or 0 (true/false, yes/no), not {shown(value)}")
    return value in _TRUE


PLANNED_EACH_TIME = frozenset({
    # Claims and completions: up to the prefetch's jobs at once.
    "job_claim", "job_claim_partitioned", "job_complete_many", "job_complete_and_claim",
    # A worker's held jobs by (id, token): its lease renewals, its give-backs, and its look
    # at writes whose reply was lost.
    "job_heartbeat", "job_release", "job_settled",
    # The effect ledger's bulk statements: a chunk of keys.
    "effect_claim_new_many", "effect_lock_many", "effect_take_many", "effect_finish_many",
    "effect_resolve_lock", "effect_resolve_set", "effect_chunks_read", "effect_chunks_share",
    "effect_chunk_keys", "effect_chunk_held",
    # Batch acks: the batches an ack finishes, and which of them still wait.
    "batch_lock", "batch_pending",
    # The metrics scrape's queue heads; the retry and cancel of jobs by filter (each chunk
    # starts after an id: a generic plan made on a near-empty table walks every job).
    "metrics_snapshot", "jobs_count_retry", "jobs_retry_matching", "jobs_cancel_matching"})
"""Statements never prepared, so planned for the table as it is at each run: those whose
generic plan, made while a table holds a few rows, scans it whole where the same plan
made once it has grown goes by an index (tests/test_pg_plans.py finds them, for every
statement of this file). psycopg prepares a statement after five runs on a connection,
the server may then settle on the generic plan, and keeps it until something invalidates
it: an ANALYZE, which nothing runs with autovacuum off. The lookups by `id = ANY(...)`,
by a list of (id, token) or of chunk keys are the ones: on a near-empty table a scan that
tests every row against the list is cheapest. A connection that prepared
effect_finish_many during a Push's first few thousand entries made 945,504 users into
smtp-sink fall from ~6,000 to ~100 emails/s as the ledger grew past 780,000 entries
(`perf`: 76 % of the server's time in ExecEvalScalarArrayOp and tideq); a worker that
idled on an empty queue, then drained a batch of 100,000 jobs, claimed them at ~3,000
jobs/s against ~11,300 when the jobs came first; a worker of 20 slots that started on an
empty queue renewed its leases in 113 ms once the table held 1,000,000 jobs, against
0.5 ms (a sequential scan per heartbeat). Planning costs ~0.05-0.3 ms a run.

The other statements are prepared, and their plans last at most PLAN_MAX_AGE: a plan that
outlived its table's growth does so for seconds, not for the connection's life."""

PREPARED_ANYWAY = frozenset({"batch_flip", "list_reserve_fresh"})
"""Statements with the same trap, prepared all the same: planning them costs about as much
as running them. batch_flip: 0.27 of 0.58 ms a call planned, 0.31 ms on its prepared plan;
planned at each run, single acks fell from 3,300 to 1,850 a second (bench/batch_acks.py).
list_reserve_fresh: a reserve and complete of one position took 1.3 ms against 1.0. Their
plans made on near-empty tables (a hash of every chunk row; a scan of every reservation)
last PLAN_MAX_AGE: a batch ack on such a plan took 430 ms once there were 488,291 chunk
rows, against ~1 ms."""


PLANNER_LOCAL: dict[str, dict[str, str]] = {
    "effects_list": {"enable_sort": "off", "enable_bitmapscan": "off"},
}
"""Planner settings for one statement (its transaction alone), where no estimate can be
trusted to pick the plan. effects_list reads a page of a scope in key order: the primary
key walked from the page's first key, each entry's chunk looked up, stopped at the page's
size. A scope grown since the last ANALYZE (a run_many over a new Push's list: a new scope
is estimated at a few hundred rows) got a bitmap scan of every entry after the page's
first key and a sort of them all, for each page: 0.55 s a page of 20,000 in a scope of
1,000,000, listing it whole 27 s (the pages get cheaper towards the end), against 25-40
ms a page on the index. Without a sort or a bitmap scan, the index walk is the plan. (A
page of a state few entries are in walks the rest of the scope either way: ~0.9-1.5 s in
a scope of 1,000,000 done entries, against ~0.6-1.3 s for the bitmap scan.) Only read
and write run them (_fetch: a connection of its own, autocommit, the settings in the
statement's implicit transaction); rows, dicts, many and write_count refuse them."""


def _plain(name: str) -> str:
    """Statement ``name`` for a path that sends it alone, on a caller's transaction or
    through executemany: never one with PLANNER_LOCAL settings (only _fetch sends them)."""
    if name in PLANNER_LOCAL:
        raise AssertionError(f"{name} has planner settings of its own: run it with read() or write()")
    return Q[name]


def _prepare(name: str) -> bool | None:
    """psycopg's ``prepare`` for statement ``name``: never for PLANNED_EACH_TIME, else its
    default (prepared after a few runs)."""
    return False if name in PLANNED_EACH_TIME else None


KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
              "keepalives_count": 3, "tcp_user_timeout": 30_000}
"""libpq's TCP settings for every connection of ours (see PostgresDialect.__init__)."""


class PostgresDialect(Dialect):
    """psycopg 3 with a psycopg_pool pool; every connection READ COMMITTED."""

    name = "postgres"

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.queries = Q
        self.latest = LATEST
        self.conninfo, self.schema, extra = parse_postgres_url(url)
        self.pool_size = pool_size(extra)
        self.channel = "justonce" if self.schema is None else f"justonce.{self.schema}"
        self.connect_timeout = connect_timeout
        self.pgbouncer = pgbouncer_mode(extra)
        self._kwargs: dict[str, Any] = {"autocommit": True}
        # A server host that dies or drops off the network without a FIN or RST (a VM paused,
        # a failover) left every call waiting on its socket for the kernel's own limits:
        # ~15 min for data not acknowledged, over 2 h idle (tcp_keepalive_time). Keepalives
        # after 10 s of silence and a limit on unacknowledged data end such a wait in about
        # 30 s with an error (then DatabaseUnavailable, and a new connection); a live server
        # answers them from its kernel, however long its statement runs. Settings in the URL win.
        try:
            given = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        except psycopg.Error:  # (libpq refuses it: the first connection says why, in one line)
            given = {}
        self._kwargs.update({k: v for k, v in KEEPALIVES.items() if k not in given})
        # The schema of every transaction we run, when it cannot be the connection's own.
        self._local_schema: str | None = None
        if self.pgbouncer:
            # PgBouncer (transaction mode) gives each of our transactions whichever server
            # connection is free. A statement psycopg prepared (it does after 5 runs) lives
            # on one server connection: elsewhere it "does not exist", or another client's
            # "already exists". So nothing is prepared.
            self._kwargs["prepare_threshold"] = None
            # PgBouncer 1.18 refuses the `options` startup parameter (or, told to ignore it,
            # drops it: the tables would silently resolve in `public`). The schema is set
            # in each transaction instead (see _connection and _fetch).
            self._local_schema = self.schema
        elif self.schema:
            # Set once per connection at startup: no statement, no round trip.
            self._kwargs["options"] = f"-c search_path={self.schema} -c DateStyle=ISO"
        elif "options" not in given:
            self._kwargs["options"] = "-c DateStyle=ISO"
        # Our own sessions read and write as a caller's must (see database_mark): psycopg
        # parses timestamps in ISO only, and a database whose default DateStyle or
        # encoding is another (ALTER DATABASE … SET DateStyle = 'SQL, DMY', a LATIN1
        # database) broke every call after its write had landed. (Through PgBouncer,
        # which refuses `options`, the server's DateStyle must be ISO's, as by default.)
        if "client_encoding" not in given:
            self._kwargs["client_encoding"] = "UTF8"
        self._pool: ConnectionPool | None = None
        self._idle_since: weakref.WeakKeyDictionary[psycopg.Connection, float] = \
            weakref.WeakKeyDictionary()
        """When each pooled connection was last given back (see IDLE_CHECK)."""
        self._plans_since: weakref.WeakKeyDictionary[psycopg.Connection, float] = \
            weakref.WeakKeyDictionary()
        """When each pooled connection was first lent or last dropped its prepared
        statements (see PLAN_MAX_AGE)."""
        self.plan_max_age = PLAN_MAX_AGE
        self._plan_drops = itertools.count(1)
        """Numbers for the drops' texts (see _age_plans)."""
        self._own: set[int] = set()
        """ids of our pooled connections lent out by transaction(), in a READ COMMITTED
        transaction of ours."""
        self._lock = threading.Lock()
        self._schema_ok = False
        self._seen = threading.local()
        """``isolation``: the transaction_isolation the last check of a caller's
        connection read on this thread (database_mark), for tx."""

    # -- connections ------------------------------------------------------------------
    def _get_pool(self) -> ConnectionPool:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    first = self._first_connection()
                    # reconnect_timeout: a connection the pool failed to make for this long
                    # is dropped for good (the pool's size shrinks by one, and it grows back
                    # only when a call finds nothing to take). Never: a server away for
                    # hours is tried every RECONNECT_DELAY until it is back.
                    pool = _Pool(
                        self.conninfo, min_size=1, max_size=self.pool_size,
                        kwargs={**self._kwargs, "connect_timeout": int(self.connect_timeout)},
                        open=False, timeout=self.connect_timeout, reconnect_timeout=math.inf,
                        name="justonce", configure=_read_committed,
                    )
                    try:
                        pool.open(wait=True, timeout=self.connect_timeout)
                    except PoolTimeout as exc:
                        pool.close(timeout=0)
                        raise DatabaseUnavailable(
                            f"cannot connect to PostgreSQL at {redact_url(self.conninfo)} "
                            f"within {self.connect_timeout:g}s" + (f" (first: {first})" if first else "")
                        ) from exc
                    self._pool = pool
        return self._pool

    def _first_connection(self) -> str | None:
        """Connect once before the pool does. A definite refusal (no such database or
        role, a wrong password, an option libpq cannot take) is raised at once with the
        server's reason, where the pool would retry it for connect_timeout and log each
        try. A failure that may pass (nothing listening yet, the server starting up or
        shutting down, too many clients) is returned, and the pool waits as before."""
        try:
            kwargs = {**self._kwargs, "connect_timeout": int(self.connect_timeout)}
            psycopg.connect(self.conninfo, **kwargs).close()
        except psycopg.Error as exc:
            reason = _redact_reason(self.conninfo, " ".join(str(exc).split()) or type(exc).__name__)
            definite = (isinstance(exc, psycopg.ProgrammingError) or "connection is bad:" in reason
                        or ("FATAL:" in reason and not any(t in reason for t in _PASSING)))
            if definite:
                raise DatabaseUnavailable(
                    f"cannot connect to PostgreSQL at {redact_url(self.conninfo)}: {reason}") from None
            return reason
        return None

    def _stale(self, conn: psycopg.Connection) -> bool:
        """Whether a connection the pool lends is dead. After a server restart every pooled
        connection's socket is closed, and the first statement sent on each would fail. An
        idle connection has nothing to read: a readable socket (the server's goodbye, or
        end of file) means it is dead. The common case costs one non-blocking poll(), no
        round trip; a connection idle past IDLE_CHECK (a network may have dropped it
        silently) is checked with a round trip."""
        # A connection never lent yet has no idle time: the pool may have made it in the
        # background before a restart (it grows while callers wait), so it is polled too.
        since = self._idle_since.get(conn)
        try:
            if since is not None and time.monotonic() - since >= IDLE_CHECK:
                ConnectionPool.check_connection(conn)
                return False
            # poll(), not select(): a process may hold more than FD_SETSIZE descriptors.
            watch = select.poll()
            watch.register(conn.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
            readable = watch.poll(0)
        except (OSError, ValueError, psycopg.Error):
            return True
        return bool(readable)

    @contextmanager
    def _lend(self) -> Iterator[psycopg.Connection]:
        """A live connection of the pool: dead ones are thrown away (the pool replaces
        them) and, at the first, the pool's other idle connections are checked at once."""
        pool = self._get_pool()
        conn = pool.getconn()
        swept = False
        for _ in range(self.pool_size + 1):
            if not self._stale(conn):
                break
            conn.close()
            pool.putconn(conn)  # closed: discarded, and a new one made in the background
            if not swept:
                swept = True
                self._broken()
            conn = pool.getconn()
        self._age_plans(conn)
        try:
            with conn:
                yield conn
        finally:
            self._idle_since[conn] = time.monotonic()
            pool.putconn(conn)

    def _age_plans(self, conn: psycopg.Connection) -> None:
        """Drop the statements prepared on ``conn`` once they are PLAN_MAX_AGE old: they
        are prepared again, and planned for the tables as they are now, after a few runs.

        psycopg forgets its own names for them when it sees a DEALLOCATE ALL's result, but
        it looks at the result of a statement only the first time it runs that text on a
        connection (until its count of the text is cleared, which a drop of prepared names
        does): a DEALLOCATE ALL sent while nothing was prepared yet made every later one
        on that connection pass unseen, and the next prepared statement failed with
        "prepared statement _pg3_3 does not exist" (a Push's status poll, 10 s in). So
        every drop is a text of its own."""
        if self.pgbouncer:  # nothing is prepared
            return
        now = time.monotonic()
        since = self._plans_since.setdefault(conn, now)
        if now - since >= self.plan_max_age:
            try:
                conn.execute(f"DEALLOCATE ALL /* justonce plan drop {next(self._plan_drops)} */")
            except psycopg.Error:
                return  # a dead connection: the statement lent it will say so
            self._plans_since[conn] = now

    def _broken(self) -> None:
        """A statement failed on a dead connection (the server restarted, say): check the
        pool's other idle connections now, so that one call fails, not one per connection."""
        pool = self._pool
        if pool is not None:
            try:
                pool.check()
            except Exception:  # noqa: BLE001 - the pool reconnects in its own time
                pass

    @contextmanager
    def _connection(self, schema: bool = True, scoped: bool = True) -> Iterator[psycopg.Connection]:
        """A pooled connection. Behind PgBouncer with a schema (``scoped``), everything run
        on it is one transaction that starts by setting the schema for that transaction;
        ``scoped=False`` leaves that to the caller (_fetch does it in the same round trip
        as its statement)."""
        if schema:
            self._ensure_schema()
        try:
            with self._lend() as conn:
                if self._local_schema is None or not scoped:
                    yield conn
                    return
                # BEGIN and the schema in one round trip (psycopg's transaction() would
                # send its BEGIN alone); the block's own transaction() calls nest as
                # savepoints.
                with conn.pipeline():
                    conn.execute(Q["tx_begin"])
                    conn.execute(Q["search_path_local"], {"schema": self._local_schema})
                try:
                    yield conn
                except BaseException:
                    if conn.info.transaction_status in _OPEN:  # not on a broken connection
                        conn.rollback()
                    raise
                conn.commit()
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"no PostgreSQL connection available: {exc}") from exc
        except psycopg.errors.LockNotAvailable as exc:  # lock_timeout: the connection is fine
            raise LockTimeout(f"PostgreSQL: {str(exc).strip()}") from exc
        except psycopg.OperationalError as exc:
            # The pool throws broken connections away on return; the next call reconnects.
            self._broken()
            raise DatabaseUnavailable(f"PostgreSQL: {str(exc).strip()}") from exc

    def _fetch(self, name: str, params: dict[str, Any], *, dicts: bool = False) -> list[Any]:
        with self._connection(scoped=False) as conn:
            cur = conn.cursor(row_factory=dict_row if dicts else tuple_row)
            planner = PLANNER_LOCAL.get(name)
            if self._local_schema is None and planner is None:
                cur.execute(Q[name], params, prepare=_prepare(name))
                return cur.fetchall() if cur.description else []
            # Statements sent before one Sync share an implicit transaction: the schema
            # (and planner settings) set by the first hold for the second alone. Leaving
            # the pipeline sends the one Sync and reads every result (an explicit sync()
            # inside would be a second round trip).
            with conn.pipeline():
                if self._local_schema is not None:
                    conn.execute(Q["search_path_local"], {"schema": self._local_schema})
                if planner is not None:
                    conn.execute(Q["planner_local"], {"names": list(planner), "values": list(planner.values())})
                cur.execute(Q[name], params, prepare=_prepare(name))
            return cur.fetchall() if cur.description else []

    # -- schema -----------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._connection(schema=False) as conn:
            row = conn.execute("SELECT to_regclass('justonce_migrations') IS NOT NULL").fetchone()
            if not row or not row[0]:
                return 0
            try:
                top = conn.execute("SELECT coalesce(max(version), 0) FROM justonce_migrations").fetchone()
            except psycopg.errors.UndefinedColumn as exc:
                raise SchemaError(f"justonce_migrations here is not justonce's "
                                  f"({str(exc).splitlines()[0]}): use another schema or "
                                  "database") from None
            return int(top[0]) if top else 0

    def migrate(self) -> list[str]:
        applied: list[str] = []
        with self._connection(schema=False) as conn, conn.transaction():
            # Transaction-scoped lock: concurrent migrators serialise, and nothing leaks
            # behind a transaction-mode pooler.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('justonce_migrate'))")
            if self.schema:
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS justonce_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            try:
                done = {r[0] for r in conn.execute("SELECT version FROM justonce_migrations")}
            except psycopg.errors.UndefinedColumn as exc:
                raise SchemaError(f"justonce_migrations here is not justonce's "
                                  f"({str(exc).splitlines()[0]}): use another schema or "
                                  "database") from None
            for version, name, text in MIGRATIONS:
                if version in done:
                    continue
                try:
                    conn.execute(text)
                except (psycopg.errors.DuplicateTable, psycopg.errors.DuplicateObject,
                        psycopg.errors.UndefinedColumn, psycopg.errors.DuplicateFunction) as exc:
                    # Tables of another product under justonce's names (the transaction
                    # rolls back: nothing of this migration stays).
                    raise SchemaError(f"migration {name} failed: {str(exc).splitlines()[0]} (tables of "
                                      "something else here? use another schema or database)") from None
                conn.execute(
                    "INSERT INTO justonce_migrations (version, name) VALUES (%s, %s)", (version, name)
                )
                applied.append(name)
        self._schema_ok = True
        return applied

    # -- the dialect's primitives (dialect.py) ----------------------------------------
    def on(self, conn: Any, fn: Callable[[Any], T], atomic: bool = False,
           single_write: bool = False) -> T:
        if conn is not None:
            c = self._caller_connection(conn)
            with self._callers_errors(c):
                if (c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
                        and id(c) not in self._own):  # (ours: its whole transaction rolls back)
                    # (a connection without autocommit is in one now: the check began it)
                    return self._under_savepoint(c, fn)
                if atomic:  # autocommit, outside a transaction: the call's own transaction
                    with c.transaction():
                        return fn(c)
                return fn(c)
        with self._connection() as c:
            if not atomic or self._local_schema is not None:  # (there, c is in one already)
                return fn(c)
            with c.transaction():
                return fn(c)

    @staticmethod
    def _under_savepoint(c: psycopg.Connection, fn: Callable[[Any], T]) -> T:
        """``fn(c)`` inside the caller's open transaction, all or nothing: an error in
        PostgreSQL aborts the whole transaction, so a call that failed there (a lock
        timeout on a key another transaction holds) left the caller's COMMIT to roll back
        their own earlier writes, silently. Rolled back to the savepoint instead, the
        transaction and what the caller wrote before the call stay as they were. (Each call
        that writes takes a subtransaction id: PostgreSQL keeps 64 per transaction in shared
        memory before it must look them up, a cost only very long transactions feel.)"""
        c.execute("SAVEPOINT justonce_call")
        try:
            result = fn(c)
        except BaseException:
            # Nothing to go back to if the session ended, or if the server ended the whole
            # transaction (a deadlock, a serialization failure leave it INERROR: the
            # savepoint is still there, and rolling back to it is right then too).
            if not c.closed and c.info.transaction_status in _OPEN:
                try:
                    c.execute("ROLLBACK TO SAVEPOINT justonce_call")
                    c.execute("RELEASE SAVEPOINT justonce_call")
                except psycopg.Error as undo:
                    if c.closed or c.info.transaction_status not in _OPEN:
                        raise  # the session is gone (_callers_errors says so)
                    raise DatabaseUnavailable(
                        "PostgreSQL: this call failed and what it wrote in your transaction "
                        f"could not be undone ({str(undo).splitlines()[0]}): roll your "
                        "transaction back") from undo
            raise
        c.execute("RELEASE SAVEPOINT justonce_call")
        return result

    def database_mark(self, c: psycopg.Connection) -> Any:
        # The caller's session settings come with the mark: the same round trip.
        row = self.rows(c, "database_mark", {})[0]
        database, table, system, *session = row
        # (text comes back as bytes under client_encoding SQL_ASCII, refused here)
        datestyle, encoding, isolation = (v.decode("ascii", "replace") if isinstance(v, bytes)
                                          else str(v) for v in session)
        _check_session(datestyle, encoding)
        self._seen.isolation = isolation
        return database, table, system

    def own_mark(self) -> Any:
        return self.on(None, lambda c: tuple(self.rows(c, "database_mark", {})[0][:3]))

    def other_database(self, mine: Any, theirs: Any) -> str | None:
        database, table, system = theirs
        if table is None:
            return "does not see justonce's tables (no justonce_migrations on its search_path)"
        if (database, table) != mine[:2] or None not in (system, mine[2]) and system != mine[2]:
            return ("is a connection to another justonce database than this App's (its jobs, "
                    "ids and effects are not this App's)")
        return None

    def plain(self, c: psycopg.Connection, text: str) -> None:
        c.execute(text)

    def caller_in_transaction(self, conn: psycopg.Connection) -> bool:
        return conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS

    def _caller_connection(self, conn: Any) -> psycopg.Connection:
        if not isinstance(conn, psycopg.Connection):
            raise InvalidOption(
                f"conn must be an open psycopg.Connection to this database, not {type(conn).__name__}"
            )
        if conn.closed:
            raise InvalidOption("conn is closed")
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            raise InvalidOption("conn's transaction has failed (a statement in it raised): roll "
                                "it back before using the connection again")
        self._ensure_schema()
        if id(conn) not in self._own:
            with self._callers_errors():  # (the check's read is the first to find a lost session)
                self.same_database(conn, f" (with ?schema={self.schema}, the connection's "
                                         "search_path must find justonce's tables in that schema "
                                         "first)" if self.schema else "")
        return conn

    @contextmanager
    def _callers_errors(self, c: psycopg.Connection | None = None) -> Iterator[None]:
        """The server's errors on your connection, as justonce's. justonce's statements
        name its tables unqualified: on your connection, with ``?schema=``, they resolve
        through your search_path; one that cannot see them gets InvalidOption, not the
        server's "relation does not exist". A deadlock, or (REPEATABLE READ, SERIALIZABLE) a
        transaction that cannot be serialized with a concurrent one (a keyed insert whose
        key another transaction committed after your snapshot began), is a
        DatabaseUnavailable: the whole transaction must be run again. ``c``: the
        connection, read after the error to say whether your transaction survived it."""
        try:
            yield
        except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as exc:
            raise DatabaseUnavailable(
                f"PostgreSQL: {str(exc).splitlines()[0]} ({exc.sqlstate}): roll your transaction "
                "back and run it again from its start") from exc
        except psycopg.errors.LockNotAvailable as exc:
            raise LockTimeout(f"PostgreSQL: {str(exc).splitlines()[0]}") from exc
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise InvalidOption(
                "your transaction on conn is read-only (default_transaction_read_only, SET "
                "TRANSACTION READ ONLY, or a standby): justonce writes in it; use a read-write "
                f"transaction ({str(exc).splitlines()[0]})") from exc
        except psycopg.OperationalError as exc:
            # The session ended (the server shut it down, the network broke) or a statement
            # was cancelled (your statement_timeout, pg_cancel_backend): say what is left.
            what = f"PostgreSQL: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            status = None if c is None or c.closed else c.info.transaction_status
            if status == psycopg.pq.TransactionStatus.INTRANS:
                raise DatabaseUnavailable(
                    f"{what}: what this call wrote in your transaction was undone; your "
                    "transaction is still open, with your own writes, and usable") from exc
            if status == psycopg.pq.TransactionStatus.IDLE and c is not None and c.autocommit:
                raise DatabaseUnavailable(
                    f"{what}: this call ran in a transaction of its own on conn (autocommit), "
                    "which was rolled back: nothing of it was written") from exc
            raise DatabaseUnavailable(
                f"{what}: your transaction is gone: reconnect if the connection is closed, "
                "and run it again") from exc
        except psycopg.errors.UndefinedTable as exc:
            if self.schema is None:
                raise
            raise InvalidOption(
                f"your connection does not see justonce's tables in schema {self.schema!r} "
                f"({str(exc).splitlines()[0]}): connect with options='-c search_path={self.schema},public' "
                f"or run SELECT set_config('search_path', '{self.schema},public', true) in your "
                "transaction first") from None

    def tx(self, conn: Any, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        if conn is None:
            return self.on(None, fn, atomic=True)
        c = self._caller_connection(conn)
        level = "read committed" if id(c) in self._own else self._isolation(c)
        if level != "read committed":
            raise InvalidOption(
                "batch operations on your connection need READ COMMITTED isolation (each "
                f"statement must see what committed before it), not {level}: use another "
                "connection for them")
        with self._callers_errors(c):
            if c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                # Inside the caller's transaction (without autocommit, the check began one),
                # under a savepoint so that a refused call leaves the caller's writes alone.
                return self._under_savepoint(c, fn)
            with c.transaction():  # autocommit: a transaction of its own
                return fn(c)

    def _isolation(self, c: psycopg.Connection) -> str:
        """The isolation level a batch operation on the caller's connection ``c`` runs in.
        The check's read (database_mark) saw the transaction's own, or, on a connection in
        autocommit outside a transaction, the session's default: but the transaction
        ``tx`` then opens there begins in the connection's ``isolation_level`` when it is
        set (``BEGIN ISOLATION LEVEL REPEATABLE READ``); a batch acked in it never
        completed (each ack's snapshot missed the others')."""
        if (c.autocommit and c.isolation_level is not None
                and c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE):
            return c.isolation_level.name.lower().replace("_", " ")
        return str(getattr(self._seen, "isolation", "unknown"))

    def rows(self, c: psycopg.Connection, name: str, params: dict[str, Any]) -> list[Any]:
        # Every statement run here returns rows (in pipeline mode a cursor cannot tell
        # before it fetches); statements without results go through many().
        return c.cursor(row_factory=tuple_row).execute(_plain(name), params, prepare=_prepare(name)).fetchall()

    def dicts(self, c: psycopg.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return c.cursor(row_factory=dict_row).execute(_plain(name), params, prepare=_prepare(name)).fetchall()

    def many(self, c: psycopg.Connection, name: str, seq: Sequence[dict[str, Any]]) -> None:
        if name in PLANNED_EACH_TIME:
            raise AssertionError(f"{name} is planned at each run, and executemany prepares it")
        if seq:
            c.cursor().executemany(_plain(name), seq)

    def read(self, name: str, params: dict[str, Any]) -> list[Any]:
        return self._fetch(name, params)

    def read_dicts(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self._fetch(name, params, dicts=True)

    def write(self, name: str, params: dict[str, Any]) -> list[Any]:
        # One statement in autocommit mode is a transaction of its own: one round trip.
        return self._fetch(name, params)

    def write_guarded(self, name: str, params: dict[str, Any], idle_limit: float) -> list[Any]:
        # One statement in autocommit mode: it commits before its answer is sent, so a
        # client that freezes holds nothing.
        return self._fetch(name, params)

    def guard_fence(self, c: psycopg.Connection, idle_limit: float) -> None:
        c.execute(Q["fence_idle_local"], {"ms": _ms(idle_limit)})  # transaction-local

    def write_dicts(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self._fetch(name, params, dicts=True)

    def write_count(self, name: str, params: dict[str, Any]) -> int:
        with self._connection() as conn:
            return conn.execute(_plain(name), params, prepare=_prepare(name)).rowcount

    def flip(self, c: psycopg.Connection, positions: dict[Key, set[int]]) -> dict[Key, Flip]:
        chunks = [[*key, sorted(positions[key])] for key in sorted(positions)]
        rows = c.cursor(row_factory=tuple_row).execute(
            Q["batch_flip"], {"chunks": json.dumps(chunks, separators=(",", ":"))},
            prepare=_prepare("batch_flip")).fetchall()
        return {(r[0], r[1], r[2]): Flip(r[3], r[4], r[5], r[6], frozenset(r[7])) for r in rows}

    def locked_tx(self, conn: Any, lock_timeout: float, fn: Callable[[Any], T]) -> T:
        def own(c: psycopg.Connection) -> T:
            # Our own transaction ends here: SET LOCAL needs no undoing.
            c.execute("SELECT set_config('lock_timeout', %s, true)", (_ms(lock_timeout),))
            return fn(c)

        def callers(c: psycopg.Connection) -> T:
            with _lock_timeout(c, lock_timeout):
                return fn(c)

        try:
            return self.tx(conn, own if conn is None else callers)
        except psycopg.errors.LockNotAvailable as exc:
            raise LockTimeout(f"a ledger entry stayed locked for {lock_timeout:g}s") from exc

    def row_lock(self, conn: Any, table: str, column: str, value: Any, timeout: float) -> bool:
        c = self._caller_connection(conn)
        if c.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            raise InvalidOption("lock_row() needs your open transaction on conn (inside "
                                "`with conn.transaction():`, or a connection without "
                                "autocommit): a row lock outside one would hold nothing")
        query = sql.SQL("SELECT 1 FROM {} WHERE {} = %s FOR UPDATE").format(
            sql.Identifier(*table.split(".")), sql.Identifier(column))

        def lock(c: psycopg.Connection) -> bool:
            with _lock_timeout(c, timeout):
                return c.execute(query, (value,)).fetchone() is not None

        with self._callers_errors(c):
            try:
                # (the row lock stays with the transaction when the savepoint is released)
                return self._under_savepoint(c, lock)
            except psycopg.errors.LockNotAvailable as exc:
                raise LockTimeout(f"row {table}.{column} = {shown(value)} stayed locked for "
                                  f"{timeout:g}s") from exc
            except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn,
                    psycopg.errors.InvalidSchemaName) as exc:
                raise InvalidOption(f"lock_row(): {str(exc).splitlines()[0]} (on conn, "
                                    "through its search_path; name it schema.table)") from None

    def array(self, values: Sequence[str | int | None]) -> Any:
        """An array literal (``{"a",NULL,7}``) for a ``%(x)s::text[]`` / ``::bigint[]``
        parameter: psycopg dumps a Python list element by element in Python, which took a
        fifth of a Push sender's GIL time; one string is dumped at once."""
        parts = []
        for v in values:
            if v is None:
                parts.append("NULL")
            elif isinstance(v, int):
                parts.append(str(v))
            else:
                parts.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
        return "{" + ",".join(parts) + "}"

    def json(self, value: Any) -> Any:
        return value  # psycopg decodes jsonb itself

    def bits(self, value: Any) -> bytearray:
        # A bit string comes back as its text ('0101...', item n at index n).
        return bytearray(int(value[::-1] or "0", 2).to_bytes((len(value) + 7) // 8, "little"))

    def fence_connection(self, conn: Any) -> psycopg.Connection:
        c = self._caller_connection(conn)
        if c.autocommit and c.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            raise InvalidOption("fence() needs your open transaction on conn (inside "
                                "`with conn.transaction():`, or a connection without autocommit)")
        return c

    def time(self, value: Any) -> datetime | None:
        return value

    def at(self, value: datetime | None) -> Any:
        return value

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        with self._connection() as c:
            self._own.add(id(c))  # READ COMMITTED already: tx need not ask the server
            try:
                if self._local_schema is not None:  # (there, c is in one transaction already)
                    yield c
                    return
                with c.transaction():
                    yield c
            finally:
                self._own.discard(id(c))

    # -- bulk inserts -------------------------------------------------------------------------
    def insert_calls(self, c: psycopg.Connection, params: dict[str, Any], args_doc: str,
                     kwargs_doc: str) -> list[int]:
        cur = c.cursor(row_factory=tuple_row)
        cur.execute(Q["job_insert_batch"], {**params, "args": args_doc, "kwargs": kwargs_doc},
                    prepare=_prepare("job_insert_batch"))
        # Identity values are drawn in insert order (ORDER BY ord).
        return sorted(r[0] for r in cur.fetchall())

    def insert_rows(self, c: psycopg.Connection, jobs: Sequence[NewJob],
                    params: Callable[[NewJob], dict[str, Any]]) -> list[int | None]:
        # One statement for all rows (job_insert_many): 43,700 keyed jobs/s against 4,300
        # with the generic job_insert per job (x10, bench/fast_paths.py, 1,000 per call).
        cur = c.cursor(row_factory=tuple_row)
        rows_json = "[" + ",".join(_row_json(j) for j in jobs) + "]"
        cur.execute(Q["job_insert_many"], {"rows": rows_json, "channel": self.channel},
                    prepare=_prepare("job_insert_many"))
        rows = cur.fetchall()
        # Ids are drawn in input order (job_insert_many), so the unkeyed rows' ids sorted
        # ascending line up with the unkeyed jobs in input order; keyed rows are matched
        # by key.
        by_key = {k: i for i, k, _ in rows if k is not None}
        unkeyed = iter(sorted(i for i, k, _ in rows if k is None))
        return [next(unkeyed) if j.key is None else by_key.get(j.key) for j in jobs]

    def count_jobs(self, exact_below: int) -> tuple[list[Any], bool]:
        reltuples, size = self._fetch("jobs_size_estimate", {})[0]
        # Before the first ANALYZE reltuples is -1: guess from the size (~250 bytes a row).
        rows = int(reltuples) if reltuples >= 0 else int(size) // 250
        if rows < exact_below:
            return self._fetch("queue_counts", {}), False
        # A block sample of about 50,000 rows: its cost does not grow with the table.
        percent = min(100.0, max(0.01, 100.0 * 50_000 / max(rows, 1)))
        return [(q, s, round(n * 100.0 / percent)) for q, s, n in
                self._fetch("queue_counts_sampled", {"percent": percent})], True

    def waiter(self, queues: Sequence[str], listen: bool = True) -> PostgresWaiter:
        # Behind PgBouncer a LISTEN lands on a server connection that is handed to another
        # client when the statement ends: no notification would ever come. Poll instead.
        return PostgresWaiter(self, queues, listen and not self.pgbouncer)

    def now(self) -> datetime:
        return self._fetch("db_now", {})[0][0]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def listen_connection(self) -> psycopg.Connection:
        return psycopg.connect(
            self.conninfo, **self._kwargs, connect_timeout=int(self.connect_timeout)
        )


class PostgresListOps(ListOps):
    """Lists, with items loaded by COPY, and a reserve of fresh positions and a completion
    that each take one autocommit statement instead of a transaction of four or five
    round trips (bench/lists_bench.py measures both paths). On a caller's ``conn`` the same
    statements run in its transaction, each under a savepoint."""

    def _one(self, conn: Any, name: str, params: dict[str, Any]) -> list[Any]:
        if conn is None:
            return self.d.write(name, params)
        return self.d.tx(conn, lambda c: self.d.rows(c, name, params))

    def reserve(self, name: str, k: int, ttr: float | None,
                request_id: str | None, conn: Any = None) -> Reservation | None:
        if request_id is None:  # (a request id is looked up first: the generic path)
            secret = secrets.token_hex(8)
            rows = self._one(conn, "list_reserve_fresh", {
                "name": name, "k": k, "ttr": ttr, "secret": secret, "request_id": None})
            if rows:
                row_id, due_at, ranges, row_ttr = rows[0]
                return Reservation(name, token_of(int(row_id), secret), parse_ranges(ranges),
                                   due_at, 1, float(row_ttr), None)
        # A re-offer is due, the list is not sealed, unknown or handed out: the generic path.
        return super().reserve(name, k, ttr, request_id, conn)

    def complete(self, name: str, row_id: int, secret: str,
                 positions: Sequence[int] | None, conn: Any = None) -> ListCompletion:
        if positions is not None and (not positions or max(positions) >= 2**63 - 1):
            # (The one-statement completion sends half-open ranges as bigints: position
            # 2**63-1 ends at 2**63, which no bigint holds. No list is that long: the
            # generic path refuses it as a position the reservation does not hold.)
            return super().complete(name, row_id, secret, positions, conn)
        params = {"id": row_id, "name": name, "secret": secret, "last": False,
                  "ranges": None if positions is None else ranges_json(to_ranges(positions))}
        first = self._one(conn, "list_complete", params)[0]
        got = self._complete(first, positions)
        if first[0] == "last":  # it empties a chunk: again, with the batch's check, in one tx
            def run(c: Any) -> ListCompletion | None:
                row = self.d.rows(c, "list_complete", params | {"last": True})[0]
                done = self._complete(row, positions)
                if done is not None and row[5] and self.batches.complete_if_done(c, [row[6]]):
                    self.d.many(c, "list_finish", [{"batch_id": row[6]}])
                    return ListCompletion(done.completed, done.already, True)
                return done

            got = self.d.tx(conn, run)
        # None: refused (the generic path says why and raises).
        return got if got is not None else super().complete(name, row_id, secret, positions, conn)

    @staticmethod
    def _complete(row: Sequence[Any], positions: Sequence[int] | None) -> ListCompletion | None:
        status, newly, held, chunks, bits = row[:5]
        if status != "ok":
            return None
        old = dict(zip(chunks, bits, strict=True))
        asked = each(parse_ranges(held)) if positions is None else sorted(set(positions))
        already = tuple(p for p in asked if old[p // CHUNK_BITS][p % CHUNK_BITS] == "1")
        return ListCompletion(int(newly), already, False)

    def insert_items(self, c: Any, list_id: int, start: int, items: Sequence[str]) -> None:
        # COPY instead of one INSERT per item (list_item_insert): see bench/lists_bench.py
        # for the load rate of each.
        if c.info.pipeline_status != psycopg.pq.PipelineStatus.OFF:
            # (the list's row, written before, is undone with the call's savepoint or
            # transaction)
            raise InvalidOption("conn is in pipeline mode (inside `with conn.pipeline():`), "
                                "where PostgreSQL cannot COPY a list's items: load the list "
                                "outside the pipeline block")
        with c.cursor() as cur, cur.copy(
                "COPY justonce_list_items (list_id, position, item) FROM STDIN") as cp:
            for i, item in enumerate(items):
                cp.write_row((list_id, start + i, item))


class PostgresBackend(Store):
    """The Store on PostgreSQL, with one measured fast path of its own."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.pg = PostgresDialect(url, connect_timeout=connect_timeout)
        super().__init__(self.pg)
        self.lists = PostgresListOps(self.pg, self.batches)

    def job_complete_and_claim(
        self, done: Sequence[Completion], queue: str, limit: int, owner: str, lease: float,
        partitions: Partitioning | None = None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        if not done or (partitions is not None and not partitions.slots):
            return super().job_complete_and_claim(done, queue, limit, owner, lease, partitions)
        if partitions is None and not any(x.batch_item for x in done):
            # Completion and claim in ONE statement (job_complete_and_claim): one round trip
            # and one commit instead of BEGIN, two statements and COMMIT: 16,600 jobs/s
            # against 15,600 (x1.06, 100 per call, bench/fast_paths.py).
            params = self.completion_params(done)
            params.update(queue=queue, limit=limit, owner=owner, lease=lease)
            rows = self.pg.write("job_complete_and_claim", params)
            accepted = {r[1] for r in rows if r[0] == "done"}
            return accepted, claimed_jobs([r[1:] for r in rows if r[0] == "claimed"])
        name, claim = self.claim_params(queue, limit, owner, lease, partitions)

        def run(c: psycopg.Connection) -> tuple[set[int], list[Any]]:
            # A partitioned claim holds its slots' rows until COMMIT (see the query). If this
            # process froze between the claim and the COMMIT, no standby could take those
            # slots until it ran again: the server ends such a session once it has been idle
            # in this transaction for a lease (sent with the completions, no extra round trip).
            with c.pipeline():
                c.execute(Q["idle_timeout_local"], {"ms": _ms(lease)})
                accepted = self.complete_items(c, done)
            return accepted, self.pg.rows(c, name, claim)

        accepted, rows = self.pg.tx(None, run)
        return accepted, claimed_jobs(rows)


def _ms(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}ms"


@contextmanager
def _lock_timeout(c: psycopg.Connection, seconds: float) -> Iterator[None]:
    """``lock_timeout`` for a while in the caller's transaction, then the caller's own value
    again (a transaction-local setting would outlive our savepoint). The old value is read
    in a statement of its own: next to set_config it would already read the new one."""
    old = c.execute("SELECT current_setting('lock_timeout')").fetchone()
    c.execute("SELECT set_config('lock_timeout', %s, true)", (_ms(seconds),))
    yield
    c.execute("SELECT set_config('lock_timeout', %s, true)", (old[0] if old else "0",))


def _check_session(datestyle: str, encoding: str) -> None:
    """Refuse (InvalidOption) a caller's session whose settings make psycopg misread what
    justonce's statements return, or the server refuse what they send. The failure came
    after the write: an enqueue in autocommit committed its job, then raised
    NotImplementedError (a timestamptz psycopg cannot parse in DateStyle 'SQL, DMY'), and
    a retry enqueued it again."""
    if not datestyle.upper().startswith("ISO"):
        # psycopg parses ISO output only; the field order (DMY, MDY) is for input only
        # then, and justonce sends no date text to be read by it.
        order = datestyle.split(",")[-1].strip() if "," in datestyle else "MDY"
        raise InvalidOption(
            f"conn's session has DateStyle {datestyle!r}: psycopg reads timestamps in the ISO "
            f"output style only; run SET DateStyle = 'ISO, {order}' on it (your field order "
            "for dates you write stays as it is)")
    if encoding.upper() not in ("UTF8", "UNICODE"):
        raise InvalidOption(
            f"conn's session has client_encoding {encoding!r}, not UTF8: arguments, keys and "
            "results that the encoding cannot carry would be refused or read back as bytes; "
            "run SET client_encoding = 'UTF8' on it")


def _read_committed(conn: psycopg.Connection) -> None:
    """READ COMMITTED whatever the server's or role's default: batch completion relies on
    each statement seeing what committed before it started (see batchstore.py). psycopg
    sends nothing here; it names the level in each BEGIN (`BEGIN ISOLATION LEVEL READ
    COMMITTED`), so this is no session state either."""
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED


_dumps = json.JSONEncoder().encode


def _row_json(j: NewJob) -> str:
    """One job as the JSON array job_insert_many expects. Queue and task names are
    validated to a charset that needs no escaping; args/kwargs are JSON already; numbers
    are finite (validated); keys and times go through the JSON encoder."""
    return (
        f'["{j.queue}","{j.task}",{j.args_json},{j.kwargs_json},{j.priority},{j.delay!r},'
        f'{"null" if j.run_at is None else _dumps(j.run_at.isoformat())},{j.max_attempts},'
        f'{j.timeout!r},{"null" if j.key is None else _dumps(j.key)},'
        f'{"null" if j.partition_key is None else _dumps(j.partition_key)},'
        f'{"null" if j.batch_item is None else _dumps(j.batch_item)},'
        f'{"null" if j.partition_hash is None else j.partition_hash}]'
    )


class PostgresWaiter:
    """LISTEN on the backend's channel; payloads are queue names. Any failure falls back to
    sleeping for the timeout (polling), and the next wait reconnects.

    One thread waits; ``close`` may come from any other thread. A libpq connection must not
    be closed under a thread that is using it, so ``close`` only raises a flag, and the
    waiting thread (which checks it at least every ``SLICE`` seconds) closes its own
    connection."""

    SLICE = 0.25

    def __init__(self, backend: PostgresDialect, queues: Sequence[str], listen: bool) -> None:
        self.backend = backend
        self.queues = set(queues)
        self.listen = listen
        self._conn: psycopg.Connection | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._waiting = False

    def _connect(self) -> psycopg.Connection:
        conn = self.backend.listen_connection()
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.backend.channel or "justonce")))
        return conn

    def wait(self, timeout: float, idle_for: float = 0.0) -> None:
        if not self.listen:
            self._stop.wait(timeout)
            return
        with self._lock:
            if self._stop.is_set():
                return
            self._waiting = True
        deadline = time.monotonic() + timeout
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for note in self._conn.notifies(timeout=min(left, self.SLICE), stop_after=1):
                    if note.payload in self.queues:
                        return
        except (psycopg.Error, OSError):
            self._drop()
            self._stop.wait(max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._waiting = False
                if self._stop.is_set():
                    self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            if not self._waiting:
                self._drop()


_PASSING = ("starting up", "shutting down", "recovery mode", "not yet accepting",
            "too many clients", "remaining connection slots")
"""Server refusals that pass on their own: the pool waits them out."""


_SERVER_SAID = ("connection to server", "FATAL:", "ERROR:")
"""Marks of an answer from a server (or of a connection attempt): the server never sees a
password in clear to quote it back, so such a message has nothing to mask but the URL."""


def _password_forms(conninfo: str) -> set[str]:
    """Every spelling of the URL's secrets libpq may quote: the ``user:password@`` part and
    the ``password`` / ``sslpassword`` options, each as written in the URL and %-decoded."""
    parts = urlsplit(conninfo)
    found = [parts.password] if parts.password else []
    for field in parts.query.split("&"):
        key, sep, value = field.partition("=")
        if sep and value and unquote(key).lower().endswith("password"):
            found.append(value)
    return {form for raw in found for form in (raw, unquote(raw)) if form}


def _redact_reason(conninfo: str, reason: str) -> str:
    """libpq's message with the password masked exactly where libpq quotes it, and nowhere
    else. libpq's URL parser quotes a token it cannot read whole (``invalid percent-encoded
    token: "…"``, ``forbidden value %00 in percent-encoded value: "…"``, ``unexpected
    spaces found in "…"``: the password itself when it is the token at fault) or the whole
    URL (``unexpected character … in URI …: "postgresql://u:pw@[::1]x/db"``, a bracket
    that does not close). So a quoted token that is the password, a ``:password@`` and a
    ``password=`` followed by it are masked. Replacing every occurrence of the password
    turned a short one (``port``, ``5432``) into holes in the server's answer ("port ***
    failed")."""
    forms = _password_forms(conninfo)
    for form in sorted(forms, key=len, reverse=True):
        reason = reason.replace(f":{form}@", ":***@")
        for key in ("password=", "sslpassword="):
            reason = re.sub(f"(?<![A-Za-z_]){key}{re.escape(form)}(?=[&\"\\s]|$)",
                            f"{key}***", reason)
        if not any(mark in reason for mark in _SERVER_SAID):
            reason = reason.replace(f'"{form}"', '"***"')
    return reason
