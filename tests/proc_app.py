"""The app that tests/test_processes.py runs in real worker processes
(``python -m justonce worker --app proc_app:app``).

Each task writes what it does to a ``ledger`` table in the same database as the jobs, so
the tests can count how often task code really ran and in which process. The ledger
helpers below are shared by the tasks (in the workers) and the tests (to read it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import justonce

app = justonce.App(os.environ.get("JUSTONCE_DATABASE_URL"))

LEDGER_DDL = "CREATE TABLE IF NOT EXISTS ledger (n INTEGER NOT NULL, pid INTEGER NOT NULL, event TEXT NOT NULL)"

# -- the ledger ---------------------------------------------------------------------------


_mysql_class: Any = None


def _mysql_connection_class() -> Any:
    """A PyMySQL connection (so justonce's ``conn=`` check accepts it) that the tests use
    like the others: ``execute()`` returns a cursor, ``transaction()`` is a block."""
    global _mysql_class
    if _mysql_class is None:
        import pymysql

        class LedgerConnection(pymysql.connections.Connection):  # type: ignore[misc]
            def execute(self, sql: str, params: Any = None) -> Any:
                cur = self.cursor()
                cur.execute(sql, params)
                return cur

            def executemany(self, sql: str, seq: Any) -> Any:
                cur = self.cursor()
                cur.executemany(sql, seq)
                return cur

            @contextmanager
            def transaction(self) -> Iterator[Any]:
                self.begin()
                try:
                    yield self
                except BaseException:
                    if self.open:
                        self.rollback()
                    raise
                self.commit()

        _mysql_class = LedgerConnection
    return _mysql_class


def ledger_connect(url: str, client_flag: int = 0) -> Any:
    """A new autocommit connection to the database of ``url`` (a justonce URL). On MySQL in
    UTC and READ COMMITTED, the settings justonce asks of a caller's connection, with
    PyMySQL's ``client_flag`` (CLIENT_FOUND_ROWS, say) added."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = url.split("?", 1)[0][len("sqlite:///"):]
        conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=60000")
        return conn
    if parts.scheme in ("mysql", "mariadb"):
        from justonce.backends.mysql.backend import parse_mysql_url

        kwargs, _ = parse_mysql_url(url)  # (no TLS unless ?ssl=1: see the backend)
        conn = _mysql_connection_class()(**kwargs, autocommit=True, charset="utf8mb4",
                                         connect_timeout=10, client_flag=client_flag)
        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        conn.execute("SET time_zone = '+00:00'")
        return conn
    import psycopg

    query = dict(parse_qsl(parts.query))
    schema = query.pop("schema", None)  # justonce's own option, not libpq's
    conninfo = urlunsplit(parts._replace(query=urlencode(query)))
    options: dict[str, Any] = {"options": f"-c search_path={schema}"} if schema else {}
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=10, **options)


def _sql(conn: Any, text: str) -> str:
    """``text`` with ``?`` placeholders, and ``"key"`` quoted the standard way, for ``conn``."""
    if isinstance(conn, sqlite3.Connection):
        return text
    text = text.replace("?", "%s")
    return text.replace('"key"', "`key`") if dialect(conn) == "mysql" else text


def create_ledger(url: str) -> None:
    conn = ledger_connect(url)
    try:
        conn.execute(LEDGER_DDL)
    finally:
        conn.close()


def ledger_rows(url: str, event: str | None = "done") -> list[tuple[int, int, str]]:
    """(n, pid, event) rows, all of them or those of one event."""
    conn = ledger_connect(url)
    try:
        if event is None:
            return [tuple(r) for r in conn.execute("SELECT n, pid, event FROM ledger").fetchall()]
        cur = conn.execute(_sql(conn, "SELECT n, pid, event FROM ledger WHERE event = ?"), (event,))
        return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


_local = threading.local()


def _write(n: int, event: str) -> None:
    """Insert one ledger row on this thread's connection (reconnecting once if the
    connection broke, e.g. after a database restart)."""
    for attempt in (1, 2):
        conn = getattr(_local, "conn", None)
        if conn is None:
            conn = _local.conn = ledger_connect(app.database_url)
        try:
            conn.execute(_sql(conn, "INSERT INTO ledger (n, pid, event) VALUES (?, ?, ?)"),
                         (n, os.getpid(), event))
            return
        except Exception:
            _local.conn = None
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
            if attempt == 2:
                raise


# -- tasks --------------------------------------------------------------------------------


@app.task
def noop() -> None:
    pass


@app.task
def accept(*args: Any, **kwargs: Any) -> None:
    """Takes any arguments (a batch callback's ``batch=``) and does nothing."""


@app.task
def record(n: int) -> int:
    _write(n, "done")
    return n


def _linger() -> None:
    time.sleep(30)


@app.task
def fork_and_terminate() -> int | None:
    """Fork a child (multiprocessing's fork, the default on Linux), terminate it: its exit
    code (-15 when SIGTERM ended it)."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=_linger)
    child.start()
    time.sleep(0.3)
    child.terminate()
    child.join(20)
    if child.exitcode is None:
        child.kill()
    return child.exitcode


@app.task
def slow_record(n: int, seconds: float) -> int:
    _write(n, "start")
    time.sleep(seconds)
    _write(n, "done")
    return n


@app.task
def stall(n: int, seconds: float) -> int:
    """slow_record under its own name: the test SIGSTOPs the worker while it waits."""
    return slow_record(n, seconds)


@app.task
def nap(n: int, seconds: float) -> int:
    """Sleep and touch no database: the network test (tests/test_network_loss.py) cuts the
    worker off its server, and a task's own connection is not what it tests."""
    time.sleep(seconds)
    return n


@app.task(queue="netns")
def nap_netns(n: int) -> int:
    """A job on a queue of its own, which only the network test's cut-off worker serves:
    it succeeds only once that worker has found its way back to the database."""
    return n


@app.task(max_attempts=3)
def crash_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(max_attempts=2, backoff=justonce.Backoff(base=0.01, jitter=0))
def boom(n: int) -> None:
    """Always raises: two attempts, then dead."""
    raise ValueError(f"boom {n}")


@app.task(timeout=1, max_attempts=3, backoff=justonce.Backoff(base=0.1, jitter=0))
def overrun(n: int, seconds: float) -> int:
    """Runs past its 1 s timeout (a sync task: its thread cannot be interrupted)."""
    _write(n, "start")
    time.sleep(seconds)
    _write(n, "done")
    return n


@app.task(timeout=1, max_attempts=3, backoff=justonce.Backoff(base=0.1, jitter=0))
async def async_overrun(n: int, seconds: float) -> int:
    _write(n, "start")
    await asyncio.sleep(seconds)
    _write(n, "done")
    return n


@app.task
async def async_record(n: int, hold: float = 0.0) -> int:
    """An async task; ``hold`` s of a blocking call keep the worker's event loop from every
    other async job meanwhile (what CPU work between awaits does too)."""
    _write(n, "start")
    time.sleep(hold)
    _write(n, "done")
    return n


# -- for the concurrent-enqueue test (run in multiprocessing children) ---------------------


def enqueue_same_key(url: str, key: str, tries: int, start: Any) -> list[tuple[int, bool]]:
    """Enqueue ``record`` under one ``key`` ``tries`` times from this process, with an App
    of its own; returns (job id, duplicate) for each try."""
    own = justonce.App(url, strict=False)
    try:
        start.wait(30)
        out = []
        for i in range(tries):
            job = own.enqueue("proc_app.record", args=[i], key=key)
            out.append((job.id, job.duplicate))
        return out
    finally:
        own.close()


# -- for the list tests (``justonce lists run``, ``POST /lists/{name}/next``) ---------------


@app.task
def list_item(n: int) -> int:
    """A list's task: one ledger row (event ``list``) each time it runs on item ``n``."""
    _write(n, "list")
    return n * 2


@app.task
def list_slow(n: int) -> int:
    """A list's task that takes a while: ``list_start``, 0.3 s, ``list``."""
    _write(n, "list_start")
    time.sleep(0.3)
    _write(n, "list")
    return n


@app.task(max_attempts=2, backoff=justonce.Backoff(base=0.01, jitter=0))
def list_odd_fails(n: int) -> int:
    """Raises on odd items (released once, then buried on the second attempt)."""
    _write(n, "list_try")
    if n % 2:
        raise ValueError(f"odd item {n}")
    return n


def _deep(n: int) -> Any:
    out: Any = 0
    for _ in range(n):
        out = [out]
    return out


ODD_RETURNS: dict[str, Any] = {
    "object": object, "bytes": lambda: b"bytes", "surrogate": lambda: "lone \ud800",
    "nul": lambda: "nul \x00", "deep": lambda: _deep(3000), "nan": lambda: float("nan"),
    "set": lambda: {1, 2}, "big": lambda: "x" * (20 * 1024 * 1024),
    "tuple": lambda: (1, "two"), "int_keys": lambda: {1: "a"}, "float_1e16": lambda: 1e16,
}
"""What ``list_odd_return`` returns for each item: values that are not JSON, too deep or too
big (a job would drop them with a note), and values JSON changes (a job keeps them so)."""


@app.task
def list_odd_return(kind: str) -> Any:
    """A list's task that returns ``ODD_RETURNS[kind]()``."""
    return ODD_RETURNS[kind]()


# -- for the batch process tests ------------------------------------------------------------


@app.task
def batch_done(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch's completion callback: one ledger row (n = the batch id) each time it runs."""
    _write(batch["id"], "batch_done")
    return batch


def ack_items(url: str, work: Any, results: Any, per_call: int = 500) -> None:
    """Ack the item ids that arrive on ``work`` (lists of ids; None ends), in shuffled bulk
    calls of ``per_call``, from this process; put (pid, resolved, already, completed) on
    ``results``."""
    own = justonce.App(url, strict=False)
    rng = random.Random(os.getpid())
    resolved = already = 0
    completed: list[int] = []
    try:
        while (ids := work.get(timeout=120)) is not None:
            rng.shuffle(ids)
            for i in range(0, len(ids), per_call):
                r = own.batches.ack(ids[i:i + per_call])
                resolved += r.resolved
                already += len(r.already)
                completed.extend(r.completed)
        results.put((os.getpid(), resolved, already, completed))
    finally:
        own.close()


# -- for the partition tests ----------------------------------------------------------------

PARTITION_TABLES = {
    "sqlite": [
        "CREATE TABLE IF NOT EXISTS lease_log (id INTEGER PRIMARY KEY AUTOINCREMENT, slot INTEGER,"
        " token INTEGER, pid INTEGER, event TEXT, expires REAL, at REAL)",
        "CREATE TABLE IF NOT EXISTS fenced_writes (slot INTEGER, token INTEGER, pid INTEGER, at REAL)",
        "CREATE TABLE IF NOT EXISTS order_log (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT,"
        " i INTEGER, event TEXT, pid INTEGER)",
        "CREATE TABLE IF NOT EXISTS scan_rows (id INTEGER PRIMARY KEY)",
        "CREATE TABLE IF NOT EXISTS processed (id INTEGER NOT NULL, pid INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS processed_id ON processed (id)",
    ],
    "postgres": [
        "CREATE TABLE IF NOT EXISTS lease_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " slot int, token bigint, pid int, event text, expires float8, at float8)",
        "CREATE TABLE IF NOT EXISTS fenced_writes (slot int, token bigint, pid int, at float8)",
        "CREATE TABLE IF NOT EXISTS order_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " key text, i int, event text, pid int)",
        "CREATE TABLE IF NOT EXISTS scan_rows (id bigint PRIMARY KEY)",
        "CREATE TABLE IF NOT EXISTS processed (id bigint NOT NULL, pid int NOT NULL)",
        "CREATE INDEX IF NOT EXISTS processed_id ON processed (id)",
    ],
    "mysql": [
        "CREATE TABLE IF NOT EXISTS lease_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, slot INT,"
        " token BIGINT, pid INT, event VARCHAR(40), expires DOUBLE, at DOUBLE)",
        "CREATE TABLE IF NOT EXISTS fenced_writes (slot INT, token BIGINT, pid INT, at DOUBLE)",
        "CREATE TABLE IF NOT EXISTS order_log (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
        " `key` VARCHAR(200), i INT, event VARCHAR(40), pid INT)",
        "CREATE TABLE IF NOT EXISTS scan_rows (id BIGINT PRIMARY KEY)",
        "CREATE TABLE IF NOT EXISTS processed (id BIGINT NOT NULL, pid INT NOT NULL,"
        " INDEX processed_id (id))",
    ],
}
DB_NOW = {"sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
          "postgres": "extract(epoch from clock_timestamp())",
          # NOW(6) is the time the statement started (not the transaction, unlike Postgres's now())
          "mysql": "UNIX_TIMESTAMP(NOW(6))"}


def dialect(conn: Any) -> str:
    if isinstance(conn, sqlite3.Connection):
        return "sqlite"
    pymysql = sys.modules.get("pymysql")
    if pymysql is not None and isinstance(conn, pymysql.connections.Connection):
        return "mysql"
    return "postgres"


def integers_sql(lo: int, hi: int) -> str:
    """A MySQL SELECT of the integers ``lo..hi`` as column ``x``, without a recursive CTE
    (MySQL 8 stops those at 1,000 levels): a cross join of digits."""
    width = len(str(hi - lo))
    digits = " UNION ALL ".join(f"SELECT {d}" + (" AS d" if d == 0 else "") for d in range(10))
    tables = ", ".join(f"({digits}) AS d{i}" for i in range(width))
    number = " + ".join(f"d{i}.d * {10 ** i}" for i in range(width))
    return f"SELECT {lo} + {number} AS x FROM {tables} WHERE {number} <= {hi - lo}"


def create_partition_tables(url: str) -> None:
    conn = ledger_connect(url)
    try:
        for ddl in PARTITION_TABLES[dialect(conn)]:
            conn.execute(ddl)
    finally:
        conn.close()


class _Tx:
    """A write transaction on an autocommit ledger connection, on either backend."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __enter__(self) -> Any:
        if dialect(self.conn) == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn
        self._tx = self.conn.transaction()
        self._tx.__enter__()
        return self.conn

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if dialect(self.conn) == "sqlite":
            self.conn.execute("ROLLBACK" if et else "COMMIT")
        else:
            self._tx.__exit__(et, ev, tb)


def _log_lease(conn: Any, lease: Any, event: str) -> None:
    conn.execute(_sql(conn, f"INSERT INTO lease_log (slot, token, pid, event, expires, at) "
                            f"VALUES (?, ?, ?, ?, ?, {DB_NOW[dialect(conn)]})"),
                 (lease.slot, lease.token, os.getpid(), event, lease.expires_at.timestamp()))


def hold_slot(url: str, set_name: str, n: int, lease: float) -> None:
    """Take a slot (standing by while all are held), log it, renew every lease/3 and log
    each renewal with its new expiry, until killed or the slot is lost."""
    own = justonce.App(url, strict=False)
    conn = ledger_connect(url)
    got = own.partitions.acquire(set_name, n, lease=lease, poll=0.05)
    _log_lease(conn, got, "acquired")
    while True:
        time.sleep(lease / 3)
        try:
            got.renew()
        except justonce.LeaseLost:
            _log_lease(conn, got, "lost")
            return
        _log_lease(conn, got, "renewed")


def fenced_writer(url: str, set_name: str, n: int, lease: float) -> None:
    """Hold a slot and write a row every 50 ms under its fence, renewing inline (a SIGSTOP
    stops both). Once the fence refuses a write, log "write_rejected" and stop."""
    own = justonce.App(url, strict=False)
    conn = ledger_connect(url)
    got = own.partitions.acquire(set_name, n, lease=lease, poll=0.05)
    _log_lease(conn, got, "acquired")
    next_renew = time.monotonic() + lease / 3
    while True:
        try:
            with _Tx(conn) as c:
                got.fence(c)
                c.execute(_sql(c, f"INSERT INTO fenced_writes (slot, token, pid, at) "
                                  f"VALUES (?, ?, ?, {DB_NOW[dialect(c)]})"),
                          (got.slot, got.token, os.getpid()))
        except justonce.LeaseLost:
            _log_lease(conn, got, "write_rejected")
            return
        if time.monotonic() >= next_renew:
            next_renew = time.monotonic() + lease / 3
            try:
                got.renew()
            except justonce.LeaseLost:
                _log_lease(conn, got, "renew_lost")  # and the next write must be refused
        time.sleep(0.05)


def _exec(sql: str, params: tuple[Any, ...]) -> None:
    for attempt in (1, 2):
        conn = getattr(_local, "conn", None)
        if conn is None:
            conn = _local.conn = ledger_connect(app.database_url)
        try:
            conn.execute(_sql(conn, sql), params)
            return
        except Exception:
            _local.conn = None
            if attempt == 2:
                raise


@app.task(queue="ordered")
def ordered_step(key: str, i: int) -> None:
    """Log its start and end, so the test sees order and overlap per key."""
    _exec("""INSERT INTO order_log ("key", i, event, pid) VALUES (?, ?, 'start', ?)""",
          (key, i, os.getpid()))
    time.sleep(0.001)
    _exec("""INSERT INTO order_log ("key", i, event, pid) VALUES (?, ?, 'done', ?)""",
          (key, i, os.getpid()))


@app.task(queue="scan", max_attempts=10)
def scan_slot(predicate: str, slot: int, n: int) -> int:
    """Process the rows of one slot of scan_rows (``predicate`` is over ``r.id``), 500 at a
    time: each chunk's ledger rows
    are written in one transaction, so a job killed midway leaves whole chunks, and its
    retry goes on with the rows not in the ledger yet."""
    conn = getattr(_local, "scan", None)
    if conn is None:
        conn = _local.scan = ledger_connect(app.database_url)
    total = 0
    while True:
        with _Tx(conn) as c:
            cur = c.execute(_sql(c, f"INSERT INTO processed (id, pid) SELECT r.id, ? FROM scan_rows r "
                                    f"WHERE {predicate} AND NOT EXISTS "
                                    f"(SELECT 1 FROM processed p WHERE p.id = r.id) "
                                    f"ORDER BY r.id LIMIT 500"), (os.getpid(),))
            count = cur.rowcount
        total += count
        if count < 500:
            return total
        time.sleep(0.02)


# -- for the effect tests ---------------------------------------------------------------------

EFFECT_DDL = {"sqlite": "CREATE TABLE IF NOT EXISTS effect_log (k TEXT, pid INTEGER, event TEXT)",
              "postgres": "CREATE TABLE IF NOT EXISTS effect_log (k text, pid int, event text)",
              "mysql": "CREATE TABLE IF NOT EXISTS effect_log (k VARCHAR(600), pid INT, event VARCHAR(40))"}


def create_effect_log(url: str) -> None:
    conn = ledger_connect(url)
    try:
        conn.execute(EFFECT_DDL[dialect(conn)])
    finally:
        conn.close()


def effect_rows(url: str) -> list[tuple[str, int, str]]:
    conn = ledger_connect(url)
    try:
        return [tuple(r) for r in conn.execute("SELECT k, pid, event FROM effect_log").fetchall()]
    finally:
        conn.close()


def race_effects(url: str, scope: str, keys: list[int], start: Any, results: Any) -> None:
    """Run the effect of every key (in a shuffled order) from this process; the effect
    writes one effect_log row. Puts (pid, how many ran here) on ``results``."""
    own = justonce.App(url, strict=False)
    conn = ledger_connect(url)
    rng = random.Random(os.getpid())
    keys = list(keys)
    rng.shuffle(keys)
    start.wait(60)
    ran = 0
    for k in keys:
        def effect(idem: str, k: int = k) -> None:
            conn.execute(_sql(conn, "INSERT INTO effect_log (k, pid, event) VALUES (?, ?, 'sent')"),
                         (idem, os.getpid()))
        out = own.effects.run(scope, k, effect, lock_timeout=60)
        ran += out.ran
    results.put((os.getpid(), ran))
    conn.close()
    own.close()


def hang_in_effect(url: str, scope: str, key: int, policy: str, lease: float) -> None:
    """Claim the effect, log "start", then hang inside it (the test kills this process)."""
    own = justonce.App(url, strict=False)
    conn = ledger_connect(url)

    def effect(idem: str) -> None:
        conn.execute(_sql(conn, "INSERT INTO effect_log (k, pid, event) VALUES (?, ?, 'start')"),
                     (idem, os.getpid()))
        time.sleep(600)

    own.effects.run(scope, key, effect, policy=policy, lease=lease)


# -- for the takeover test (tests/test_partition_takeover.py) -------------------------------

TAKEOVER_DDL = {
    "sqlite": "CREATE TABLE IF NOT EXISTS takeover_log (id INTEGER PRIMARY KEY AUTOINCREMENT,"
              " exec TEXT, n INTEGER, key TEXT, pid INTEGER, event TEXT, at REAL, db_at REAL,"
              " job_id INTEGER, state TEXT, attempts INTEGER, owner TEXT, lease_expires REAL, decided REAL)",
    "postgres": "CREATE TABLE IF NOT EXISTS takeover_log (id bigint GENERATED ALWAYS AS IDENTITY"
                " PRIMARY KEY, exec text, n int, key text, pid int, event text, at float8,"
                " db_at float8, job_id bigint, state text, attempts int, owner text,"
                " lease_expires float8, decided float8)",
    "mysql": "CREATE TABLE IF NOT EXISTS takeover_log (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
             " exec VARCHAR(100), n INT, `key` VARCHAR(200), pid INT, event VARCHAR(40), at DOUBLE,"
             " db_at DOUBLE, job_id BIGINT, state VARCHAR(20), attempts INT, owner VARCHAR(300),"
             " lease_expires DOUBLE, decided DOUBLE)",
}
# The job's own row as its code starts, found by the job's unique key (a task is not told
# its job id): NULL columns mean the job was no longer live (it had succeeded elsewhere).
_TAKEOVER_START = {
    "sqlite": "INSERT INTO takeover_log (exec, n, key, pid, event, at, db_at, job_id, state,"
              " attempts, owner, lease_expires, decided)"
              f" SELECT ?, ?, ?, ?, 'start', ?, {DB_NOW['sqlite']}, j.id, j.state, j.attempts,"
              " j.lease_owner, j.lease_expires_at, ?"
              " FROM (SELECT 1) AS one LEFT JOIN justonce_jobs j"
              " ON j.key = ? AND j.state IN ('scheduled','ready','running')",
    "postgres": "INSERT INTO takeover_log (exec, n, key, pid, event, at, db_at, job_id, state,"
                " attempts, owner, lease_expires, decided)"
                f" SELECT %s, %s, %s, %s, 'start', %s, {DB_NOW['postgres']}, j.id, j.state,"
                " j.attempts, j.lease_owner, extract(epoch from j.lease_expires_at)::float8, %s"
                " FROM (SELECT 1) AS one LEFT JOIN justonce_jobs j"
                " ON j.key = %s AND j.state IN ('scheduled','ready','running')",
    # the ledger connection runs in UTC, as justonce's: UNIX_TIMESTAMP reads the DATETIME so
    "mysql": "INSERT INTO takeover_log (exec, n, `key`, pid, event, at, db_at, job_id, state,"
             " attempts, owner, lease_expires, decided)"
             f" SELECT %s, %s, %s, %s, 'start', %s, {DB_NOW['mysql']}, j.id, j.state,"
             " j.attempts, j.lease_owner, UNIX_TIMESTAMP(j.lease_expires_at), %s"
             " FROM (SELECT 1) AS one LEFT JOIN justonce_jobs j"
             " ON j.`key` = %s AND j.state IN ('scheduled','ready','running')",
}
_TAKEOVER_END = ('INSERT INTO takeover_log (exec, n, "key", pid, event, at) '
                 "VALUES (?, ?, ?, ?, 'end', ?)")
_executions = itertools.count()


def takeover_job_key(n: int) -> str:
    """The unique job key of takeover job ``n``, by which its code finds its own row."""
    return f"takeover:{n}"


def create_takeover_log(url: str) -> None:
    conn = ledger_connect(url)
    try:
        conn.execute(TAKEOVER_DDL[dialect(conn)])
    finally:
        conn.close()


def takeover_rows(url: str) -> list[tuple[Any, ...]]:
    """(exec, n, key, pid, event, at, db_at, job_id, state, attempts, owner, lease_expires,
    decided)."""
    conn = ledger_connect(url)
    try:
        return [tuple(r) for r in conn.execute(
            _sql(conn, 'SELECT exec, n, "key", pid, event, at, db_at, job_id, state, attempts,'
                       " owner, lease_expires, decided FROM takeover_log ORDER BY id")).fetchall()]
    finally:
        conn.close()


def _run_on_ledger(statement: dict[str, str] | str, params: tuple[Any, ...]) -> None:
    """Like _exec, with a statement per dialect."""
    for attempt in (1, 2):
        conn = getattr(_local, "conn", None)
        if conn is None:
            conn = _local.conn = ledger_connect(app.database_url)
        sql = statement[dialect(conn)] if isinstance(statement, dict) else _sql(conn, statement)
        try:
            conn.execute(sql, params)
            return
        except Exception:
            _local.conn = None
            if attempt == 2:
                raise


@app.task(queue="takeover")
def takeover_step(n: int, key: str, seconds: float) -> int:
    """Record a start row (with a look at the job's own lease, taken as the code begins)
    BEFORE working, so a frozen or zombie execution shows its start; then work for
    ``seconds`` and record the end. Times are time.time(): the clock the database uses on
    this machine."""
    began = time.time()
    job = justonce.current_job()
    decided = None if job is None else job.started_at  # the worker's start, before our first line
    run = f"{os.getpid()}-{next(_executions)}"
    _run_on_ledger(_TAKEOVER_START, (run, n, key, os.getpid(), began, decided, takeover_job_key(n)))
    time.sleep(seconds)
    _run_on_ledger(_TAKEOVER_END, (run, n, key, os.getpid(), time.time()))
    return os.getpid()


def list_reserver(url: str, name: str, seed: int, log_path: str, ttr: float, pause: float) -> None:
    """Reserve random k positions of list ``name``, "work" ``pause`` s, and complete them in
    one or two calls, until nothing is ready or reserved. Its log (line-buffered):
    ``R token positions`` once a reserve returned, ``S token`` as a completion starts,
    ``C token positions`` with the positions a
    completion accepted (not those already done), ``X token positions`` when a completion
    was refused as stale. A kill -9 can lose the line of a call that committed, never add one."""
    own = justonce.App(url, strict=False)
    rnd = random.Random(seed)
    with open(log_path, "a", buffering=1) as log:
        while True:
            res = own.lists.reserve(name, rnd.randint(1, 200), ttr=ttr)
            if res is None:
                p = own.lists.progress(name)
                if p.ready == 0 and p.reserved == 0:
                    log.write("E\n")
                    return
                time.sleep(0.05)
                continue
            log.write(f"R {res.token} {' '.join(map(str, res.positions))}\n")
            time.sleep(pause)
            cut = rnd.randint(0, res.count)
            for part in (res.positions[:cut], res.positions[cut:]):
                if not part:
                    continue
                log.write(f"S {res.token}\n")
                try:
                    try:
                        got = own.lists.complete(res, positions=part)
                    except justonce.DatabaseUnavailable:
                        # In doubt (the connection broke): a completion is safe to repeat.
                        got = own.lists.complete(res, positions=part)
                except justonce.StaleReservation:
                    log.write(f"X {res.token} {' '.join(map(str, part))}\n")
                    break
                done = [p for p in part if p not in set(got.already)]
                log.write(f"C {res.token} {' '.join(map(str, done))}\n")
