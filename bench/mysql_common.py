"""What mysql_bench.py and mysql_soak.py share: fresh databases on the server, the two
queue systems measured (the raw-SQL reference and justonce), their worker processes, and
the trap that counts every warning or exception a justonce process shows its user.

The worker functions live here, not in the scripts, because ``multiprocessing`` (spawn)
imports them by module name in the child.
"""
from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

from justonce.testing.databases import fresh_mysql

TASK_NAME = "bench_noop"
DEADLOCK, LOCK_WAIT = 1213, 1205


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, as the shared harness computes it."""
    if not values:
        return None
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)]


# ---- the server and its databases ------------------------------------------------------------
def connect_kwargs(url: str) -> dict[str, Any]:
    """``mysql://user:password@host:port/db`` → PyMySQL keyword arguments."""
    p = urlsplit(url)
    return {"host": p.hostname or "127.0.0.1", "port": p.port or 3306,
            "user": unquote(p.username or "root"), "password": unquote(p.password or ""),
            "database": unquote(p.path.lstrip("/")) or None}


def connect(url: str) -> pymysql.Connection:
    """An autocommit READ COMMITTED connection (the isolation justonce's own sessions use)."""
    conn = pymysql.connect(**connect_kwargs(url), autocommit=True, charset="utf8mb4")
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def server_version(url: str) -> str:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        return str(cur.fetchone()[0])


def fresh_database(server_url: str) -> AbstractContextManager[str]:
    """``CREATE DATABASE jo_bench_<random>`` on the server of ``server_url``; its URL; dropped after."""
    return fresh_mysql(server_url, "jo_bench")


# ---- what reached the user ---------------------------------------------------------------------
def mysql_code(exc: BaseException | None) -> int | None:
    """The MySQL error code anywhere in ``exc``'s cause/context chain, else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
            return exc.args[0]
        exc = exc.__cause__ or exc.__context__
    return None


def kind_of(exc: BaseException | None, text: str) -> str:
    """``deadlock`` (MySQL 1213), ``lock_wait`` (1205) or ``other``; by the error code in the
    chain, else by the server's message in the text (a log line may carry no exception)."""
    code = mysql_code(exc)
    if code == DEADLOCK or (code is None and "Deadlock found" in text):
        return "deadlock"
    if code == LOCK_WAIT or (code is None and "Lock wait timeout" in text):
        return "lock_wait"
    return "other"


class ErrorTrap(logging.Handler):
    """Counts every record at WARNING or above on the ``justonce`` loggers, and every
    exception that escapes a thread, by kind; keeps the first few as samples."""

    SAMPLES = 8

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts = {"deadlock": 0, "lock_wait": 0, "other": 0}
        self.by_source: dict[str, int] = {}
        self.samples: list[str] = []
        self._mutex = threading.Lock()

    def install(self) -> ErrorTrap:
        logging.getLogger("justonce").addHandler(self)
        previous = threading.excepthook

        def hook(a: threading.ExceptHookArgs) -> None:
            self.note("thread " + (a.thread.name if a.thread else "?"), a.exc_value)
            previous(a)

        threading.excepthook = hook
        return self

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is still a record
            text = str(record.msg)
        if record.exc_info and exc is not None:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.count(f"log {record.name} {record.levelname}", exc, text)

    def note(self, source: str, exc: BaseException | None) -> None:
        text = "".join(traceback.format_exception(exc)) if exc is not None else ""
        self.count(source, exc, text)

    def count(self, source: str, exc: BaseException | None, text: str) -> None:
        with self._mutex:
            kind = kind_of(exc, text)
            self.counts[kind] += 1
            self.by_source[source] = self.by_source.get(source, 0) + 1
            if len(self.samples) < self.SAMPLES:
                self.samples.append(f"[{kind}] {source}: {text[-1500:]}")

    def dump(self) -> dict[str, Any]:
        return {"counts": self.counts, "by_source": self.by_source, "samples": self.samples}


def merge_traps(dumps: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"counts": {"deadlock": 0, "lock_wait": 0, "other": 0}, "by_source": {},
                           "samples": []}
    for d in dumps:
        for k, v in d.get("counts", {}).items():
            out["counts"][k] = out["counts"].get(k, 0) + v
        for k, v in d.get("by_source", {}).items():
            out["by_source"][k] = out["by_source"].get(k, 0) + v
        out["samples"].extend(d.get("samples", [])[: max(0, 8 - len(out["samples"]))])
    out["total"] = sum(out["counts"].values())
    return out


# ---- worker processes and their records ----------------------------------------------------
class Workers:
    """``count`` worker processes of one system, started together on a common "go"."""

    def __init__(self, system: Any, count: int, tmp: str) -> None:
        target, args = system.worker()
        ctx = mp.get_context("spawn")
        self.ready = [ctx.Event() for _ in range(count)]
        self.go = ctx.Event()
        self.outs = [os.path.join(tmp, f"{system.name}-{i}-{time.monotonic_ns()}.json") for i in range(count)]
        self.procs = [ctx.Process(target=target, args=(*args, self.outs[i], self.ready[i], self.go),
                                  daemon=True) for i in range(count)]

    def start(self) -> None:
        for p in self.procs:
            p.start()
        for e in self.ready:
            if not e.wait(60):
                raise RuntimeError("a worker did not start within 60 s")
        self.go.set()

    def alive(self) -> bool:
        return all(p.exitcode is None for p in self.procs)

    def stop(self) -> tuple[list[tuple[int, float]], list[str], list[dict[str, Any]], int]:
        """SIGTERM, join; (records, errors, traps, raw deadlocks retried)."""
        errors: list[str] = []
        for p in self.procs:
            if p.exitcode is None and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        for p in self.procs:
            p.join(60)
            if p.exitcode is None:
                p.kill()
                p.join()
                errors.append(f"pid {p.pid} killed after 60 s grace")
        records: list[tuple[int, float]] = []
        traps: list[dict[str, Any]] = []
        deadlocks = 0
        for i, out in enumerate(self.outs):
            try:
                with open(out) as f:
                    o = json.load(f)
            except FileNotFoundError:
                errors.append(f"worker {i}: no output")
                continue
            records.extend((int(s), float(t)) for s, t in o["records"])
            if o.get("error"):
                errors.append(o["error"])
            if "trap" in o:
                traps.append(o["trap"])
            deadlocks += o.get("deadlocks", 0)
        return records, errors, traps, deadlocks

    def kill(self) -> None:
        for p in self.procs:
            if p.exitcode is None:
                p.kill()


def exactly_once(records: list[tuple[int, float]], n: int) -> tuple[int, int, dict[int, float]]:
    first: dict[int, float] = {}
    dups = 0
    for s, t in records:
        if s in first:
            dups += 1
        else:
            first[s] = t
    return dups, sum(1 for s in range(n) if s not in first), first


def count(conn: Any, sql: str) -> int:
    with conn.cursor() as cur:
        cur.execute(sql)
        return int(cur.fetchone()[0])


def wait_drained(mon: Any, system: Any, workers: Workers, timeout: float, poll: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count(mon, system.pending_sql) == 0:
            return time.time()
        if not workers.alive():
            return None
        time.sleep(poll)
    return None


# ---- the raw-SQL reference ------------------------------------------------------------------
RAW_DDL = """
CREATE TABLE bench_jobs (
    id               BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue            VARCHAR(63) NOT NULL DEFAULT 'default',
    priority         INT         NOT NULL DEFAULT 0,
    args             JSON        NOT NULL,
    state            VARCHAR(16) NOT NULL DEFAULT 'ready',
    run_at           DATETIME(6) NOT NULL DEFAULT NOW(6),
    attempts         INT         NOT NULL DEFAULT 0,
    lease_expires_at DATETIME(6),
    KEY bench_jobs_claim (state, queue, priority, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""
# The same table and claim as the Postgres reference (shared/bench/adapters/raw_sql.py), with
# the partial index as an index led by the state. There is no UPDATE ... RETURNING: lock with
# SKIP LOCKED, update by id, commit; the ack is one autocommit UPDATE.
RAW_INSERT = "INSERT INTO bench_jobs (args) VALUES (%s)"
RAW_CLAIM = """
SELECT id, args FROM bench_jobs
 WHERE state = 'ready' AND queue = 'default' AND run_at <= NOW(6)
 ORDER BY priority, id
 LIMIT %s
 FOR UPDATE SKIP LOCKED
"""
RAW_MARK = ("UPDATE bench_jobs SET state = 'running', attempts = attempts + 1,"
            " lease_expires_at = NOW(6) + INTERVAL 30 SECOND WHERE id IN ({})")
RAW_ACK = "UPDATE bench_jobs SET state = 'done', lease_expires_at = NULL WHERE id IN ({})"


class RawSystem:
    """The raw reference: one table, claim up to ``batch`` jobs, run, ack them together."""

    pending_sql = "SELECT count(*) FROM bench_jobs WHERE state IN ('ready', 'running')"
    done_sql = "SELECT count(*) FROM bench_jobs WHERE state = 'done'"

    def __init__(self, url: str, batch: int, poll: float) -> None:
        self.url, self.batch, self.poll = url, batch, poll
        self.name = f"raw_mysql_b{batch}"
        self.conn: pymysql.Connection | None = None

    def version(self) -> str:
        return f"PyMySQL {pymysql.__version__}"

    def install(self) -> None:
        with connect(self.url) as conn, conn.cursor() as cur:
            cur.execute(RAW_DDL)

    def open(self) -> None:
        self.conn = connect(self.url)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def enqueue_one(self, seq: int) -> None:
        assert self.conn is not None
        with self.conn.cursor() as cur:
            cur.execute(RAW_INSERT, (json.dumps({"seq": seq}),))

    def enqueue_bulk(self, seqs: list[int]) -> None:
        assert self.conn is not None
        with self.conn.cursor() as cur:  # PyMySQL sends this as one multi-row INSERT
            cur.executemany(RAW_INSERT, [(json.dumps({"seq": s}),) for s in seqs])

    def worker(self) -> tuple[Any, tuple[Any, ...]]:
        return raw_worker_main, (self.url, self.batch, self.poll)


def raw_worker_main(url: str, batch: int, poll: float, out_path: str, ready: Any, go: Any) -> None:
    """Claim → run → ack until SIGTERM; an empty claim sleeps ``poll`` s (no notifications)."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    records: list[tuple[int, float]] = []
    err, deadlocks = None, 0
    try:
        conn = connect(url)
        cur = conn.cursor()
        ready.set()
        go.wait()
        while not stopping.is_set():
            try:
                conn.begin()
                cur.execute(RAW_CLAIM, (batch,))
                rows = cur.fetchall()
                if not rows:
                    conn.commit()
                    stopping.wait(poll)
                    continue
                marks = ",".join(["%s"] * len(rows))
                ids = [r[0] for r in rows]
                cur.execute(RAW_MARK.format(marks), ids)
                conn.commit()
            except pymysql.err.OperationalError as exc:
                if mysql_code(exc) != DEADLOCK:
                    raise
                deadlocks += 1  # rolled back whole: claim again
                continue
            for _id, args in rows:
                records.append((json.loads(args)["seq"], time.time()))  # the no-op "task"
            cur.execute(RAW_ACK.format(marks), ids)
        conn.close()
    except BaseException as e:  # still dump what we have
        err = f"{type(e).__name__}: {e}"
    finally:
        with open(out_path, "w") as f:
            json.dump({"records": records, "error": err, "deadlocks": deadlocks}, f)


# ---- justonce ----------------------------------------------------------------------------------
class JustonceSystem:
    """justonce as a user runs it: ``App(url)``, ``app.migrate()``, a no-op task."""

    name = "justonce_mysql"
    pending_sql = "SELECT count(*) FROM justonce_jobs WHERE state IN ('scheduled', 'ready', 'running')"
    done_sql = "SELECT count(*) FROM justonce_jobs WHERE state = 'succeeded'"

    def __init__(self, url: str) -> None:
        self.url = url
        self.app: Any = None
        self.task: Any = None

    def version(self) -> str:
        import justonce

        return f"justonce {justonce.__version__}, PyMySQL {pymysql.__version__}"

    def install(self) -> None:
        import justonce

        app = justonce.App(self.url)
        try:
            app.migrate()
        finally:
            app.close()

    def open(self) -> None:
        import justonce

        self.app = justonce.App(self.url)

        @self.app.task(name=TASK_NAME)
        def bench_noop(seq: int) -> None:  # pragma: no cover - runs in the workers
            pass

        self.task = bench_noop

    def close(self) -> None:
        if self.app is not None:
            self.app.close()
            self.app = self.task = None

    def enqueue_one(self, seq: int) -> None:
        self.task.enqueue(seq)

    def enqueue_bulk(self, seqs: list[int]) -> None:
        self.task.enqueue_many([(s,) for s in seqs])

    def worker(self) -> tuple[Any, tuple[Any, ...]]:
        return justonce_worker_main, (self.url,)


def justonce_worker_main(url: str, out_path: str, ready: Any, go: Any) -> None:
    """One ``justonce.Worker(app, concurrency=1)``, defaults otherwise, on the main thread
    (SIGTERM is the library's graceful stop); what it ran and what it warned about go to
    ``out_path`` as it exits."""
    trap = ErrorTrap().install()
    import justonce

    records: list[tuple[int, float]] = []
    append = records.append
    app = justonce.App(url)

    @app.task(name=TASK_NAME)
    def bench_noop(seq: int) -> None:
        append((seq, time.time()))

    err = None
    try:
        worker = justonce.Worker(app, concurrency=1)  # library defaults otherwise
        ready.set()
        go.wait()
        worker.run()
    except BaseException as e:  # still dump what we have
        err = f"{type(e).__name__}: {e}"
        trap.note("Worker.run", e)
    finally:
        try:
            app.close()
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            trap.note("App.close", e)
        with open(out_path, "w") as f:
            json.dump({"records": records, "error": err, "trap": trap.dump()}, f)
