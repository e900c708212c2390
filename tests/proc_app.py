"""The app that tests/test_processes.py runs in real worker processes
(``python -m justonce worker --app proc_app:app``).

Each task writes what it does to a ``ledger`` table in the same database as the jobs, so
the tests can count how often task code really ran and in which process. The ledger
helpers below are shared by the tasks (in the workers) and the tests (to read it).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import justonce

app = justonce.App(os.environ.get("JUSTONCE_DATABASE_URL"))

LEDGER_DDL = "CREATE TABLE IF NOT EXISTS ledger (n INTEGER NOT NULL, pid INTEGER NOT NULL, event TEXT NOT NULL)"

# -- the ledger ---------------------------------------------------------------------------


def ledger_connect(url: str) -> Any:
    """A new autocommit connection to the database of ``url`` (a justonce URL)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = url.split("?", 1)[0][len("sqlite:///"):]
        conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=60000")
        return conn
    import psycopg

    query = dict(parse_qsl(parts.query))
    schema = query.pop("schema", None)  # justonce's own option, not libpq's
    conninfo = urlunsplit(parts._replace(query=urlencode(query)))
    options: dict[str, Any] = {"options": f"-c search_path={schema}"} if schema else {}
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=10, **options)


def _sql(conn: Any, text: str) -> str:
    return text if isinstance(conn, sqlite3.Connection) else text.replace("?", "%s")


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
def record(n: int) -> int:
    _write(n, "done")
    return n


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


@app.task(max_attempts=3)
def crash_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


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
