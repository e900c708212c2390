"""``justonce demo jobs``: N jobs, W worker processes, and a count that proves it.

Every execution of the task writes a row (run, n, pid) into ``justonce_demo_runs`` in the
same database. At the end the demo compares three numbers: jobs succeeded, distinct jobs
executed, and executions. Without a crash they are all N. With ``--kill-one`` a worker is
killed with SIGKILL midway: its leased jobs come back after the lease and run elsewhere,
so every job still succeeds exactly once, while the task code of the jobs it was running
may have run twice (that is what a crash means; the effect ledger, shown by
``justonce demo push``, makes such side effects just-once).
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..app import App
from ..backends import redact_url
from ..tasks import Enqueue
from ..types import JobState
from . import broken, connect, exit_with_parent, stop_workers, thread_connection, worker_env

app = App(strict=True)
exit_with_parent()  # (in a worker the demo started: stop once the demo is gone)
_local = threading.local()

LEDGER_DDL = (
    "CREATE TABLE IF NOT EXISTS justonce_demo_runs (run TEXT NOT NULL, n INTEGER NOT NULL, "
    "pid INTEGER NOT NULL)"
)


def _ledger() -> Any:
    return thread_connection(_local, app.database_url)


@app.task(name="demo.record", queue="demo", max_attempts=5)
def record(run: str, n: int) -> None:
    conn = _ledger()
    ph = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute(f"INSERT INTO justonce_demo_runs (run, n, pid) VALUES ({ph}, {ph}, {ph})",
                 (run, n, os.getpid()))


def run_demo(database_url: str | None, n_jobs: int, workers: int, kill_one: bool,
             out: Console) -> bool:
    if database_url:
        app.use_database(database_url)
    url = app.database_url
    app.migrate()
    conn = connect(url)
    conn.execute(LEDGER_DDL)
    run = secrets.token_hex(4)
    queue = f"demo-{run}"
    out.print(f"[bold]justonce demo[/bold]: {n_jobs} jobs on {workers} worker processes, "
              f"database {redact_url(url)}, run {run}")

    t0 = time.perf_counter()
    for start in range(0, n_jobs, 5000):
        app.enqueue_many(Enqueue(record, args=(run, n), queue=queue)
                         for n in range(start, min(n_jobs, start + 5000)))
    enqueue_s = time.perf_counter() - t0
    out.print(f"queued {n_jobs} jobs in {enqueue_s:.2f}s ({n_jobs / enqueue_s:,.0f} jobs/s)")

    cmd = [sys.executable, "-m", "justonce", "worker", "--app", "justonce.demo.jobs:app",
           "--queues", queue, "--concurrency", "2", "--lease", "3",
           "--grace", "10", "--log-level", "WARNING", "--housekeeping-interval", "0.5"]
    env = worker_env(os.environ, url)
    procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL) for _ in range(workers)]
    killed = None
    t1 = time.perf_counter()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=out) as bar:
            task = bar.add_task("succeeded", total=n_jobs)
            while True:
                counts = {c.state: c.count for c in app.queue_counts() if c.queue == queue}
                done = counts.get(JobState.SUCCEEDED, 0) + counts.get(JobState.DEAD, 0)
                bar.update(task, completed=done)
                if kill_one and killed is None and done >= n_jobs // 3:
                    killed = procs[0]
                    killed.send_signal(signal.SIGKILL)
                    bar.console.print(f"killed worker pid {killed.pid} with SIGKILL at {done} jobs")
                if done >= n_jobs:
                    break
                if all(p.poll() is not None for p in procs):
                    out.print("[red]all workers exited[/red]")
                    break
                time.sleep(0.1)
        elapsed = time.perf_counter() - t1
    finally:
        stop_workers(procs)

    counts = {c.state: c.count for c in app.queue_counts() if c.queue == queue}
    succeeded = counts.get(JobState.SUCCEEDED, 0)
    if broken(conn):  # (lost meanwhile: the report reads on a new one)
        conn = connect(url)
    ph = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    executions, distinct = conn.execute(
        f"SELECT count(*), count(DISTINCT n) FROM justonce_demo_runs WHERE run = {ph}", (run,)
    ).fetchone()
    conn.close()
    missing = n_jobs - distinct
    reran = executions - distinct

    table = Table("", "count", title="report")
    table.add_row("jobs queued", str(n_jobs))
    table.add_row("jobs succeeded (completed exactly once)", str(succeeded))
    table.add_row("jobs never executed (lost)", str(missing))
    table.add_row("executions", str(executions))
    table.add_row("re-executions after a crash", str(reran))
    table.add_row("worker killed with SIGKILL", "yes" if killed else "no")
    table.add_row("processing time", f"{elapsed:.2f}s")
    table.add_row("jobs per second", f"{n_jobs / elapsed:,.0f}")
    out.print(table)
    ok = succeeded == n_jobs and missing == 0 and (killed is not None or reran == 0)
    out.print("[green]OK: nothing lost, nothing completed twice[/green]" if ok
              else "[red]FAILED[/red]")
    return ok
