"""Real worker processes for the process-level tests: started the way users start them
(``python -m justonce worker --app proc_app:app …``), watched through their JSON logs, and
killed at the end whatever happened. proc_app_on() points proc_app's App at a test's
database."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import proc_app
from justonce import App, Job
from justonce.events import subscribe
from justonce.owner import owner_pid

HERE = Path(__file__).resolve().parent

# Short leases keep the tests quick: a dead worker's jobs come back within ~2.5 s.
LEASE = 2.0
HEARTBEAT = 0.5
HOUSEKEEPING = 0.5
POLL = 0.2


# -- helpers --------------------------------------------------------------------------------


@contextmanager
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every event reported in this process meanwhile, as (name, fields)."""
    got: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = subscribe(lambda e, f: got.append((e.value, dict(f))))
    try:
        yield got
    finally:
        unsubscribe()


def named(got: list[tuple[str, dict[str, Any]]], name: str) -> list[dict[str, Any]]:
    """The fields of the events called ``name`` among ``got`` (see events())."""
    return [f for e, f in got if e == name]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}", pytrace=False)
        time.sleep(interval)


class WorkerProc:
    """One ``justonce worker`` process; its JSON log lines (stderr) go to a file."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def events(self, event: str | None = None, job_id: int | None = None) -> list[dict[str, Any]]:
        out = []
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a traceback line, or a line still being written
            if not isinstance(rec, dict):
                continue
            if event is not None and rec.get("event") != event:
                continue
            if job_id is not None and rec.get("job_id") != job_id:
                continue
            out.append(rec)
        return out

    def tail(self, lines: int = 40) -> str:
        """The end of the log, without the (many) job.succeeded lines."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        keep = [ln for ln in text if '"event": "job.succeeded"' not in ln]
        return f"exit status {self.popen.returncode}; log {self.log}:\n" + "\n".join(keep[-lines:])

    def signal(self, sig: int) -> None:
        """Send ``sig``; for SIGSTOP, return once every thread has stopped (wait_stopped)."""
        if self.popen.poll() is None:
            if sig == signal.SIGSTOP:
                stop(self.pid)
            else:
                os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class Fleet:
    """Starts worker processes against one database and kills every leftover at the end."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.folder = folder
        self.procs: list[WorkerProc] = []

    def command(self, *, concurrency: int, lease: float, heartbeat: float, grace: float,
                poll: float, housekeeping_interval: float, extra: Sequence[str] = ()) -> list[str]:
        return [
            sys.executable, "-m", "justonce", "worker", "--app", "proc_app:app",
            "--database-url", self.url, "--concurrency", str(concurrency),
            "--lease", str(lease), "--heartbeat", str(heartbeat), "--grace", str(grace),
            "--poll", str(poll), "--housekeeping-interval", str(housekeeping_interval),
            "--log-level", "INFO", *extra,
        ]

    def start(self, *, concurrency: int = 2, lease: float = LEASE, heartbeat: float = HEARTBEAT,
              grace: float = 10.0, poll: float = POLL, housekeeping_interval: float = HOUSEKEEPING,
              ready: bool = True, extra: Sequence[str] = ()) -> WorkerProc:
        """One worker; ``extra``: more ``justonce worker`` options (``--no-listen``, ``--partitions …``)."""
        env = dict(os.environ)
        env.pop("JUSTONCE_DATABASE_URL", None)  # --database-url alone says where
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        log = self.folder / f"worker-{len(self.procs)}.log"
        cmd = self.command(concurrency=concurrency, lease=lease, heartbeat=heartbeat,
                           grace=grace, poll=poll, housekeeping_interval=housekeeping_interval,
                           extra=extra)
        with open(log, "wb") as err:
            popen = subprocess.Popen(cmd, cwd=self.folder, env=env, stdin=subprocess.DEVNULL,
                                     stdout=err, stderr=err, start_new_session=True)
        proc = WorkerProc(popen, log)
        self.procs.append(proc)
        if ready:
            self.wait_ready(proc)
        return proc

    def wait_ready(self, *procs: WorkerProc, timeout: float = 30.0) -> None:
        for proc in procs:
            def started(p: WorkerProc = proc) -> bool:
                if p.popen.poll() is not None:
                    pytest.fail(f"worker {p.pid} exited with {p.popen.returncode} before it "
                                f"started:\n{p.tail()}", pytrace=False)
                return bool(p.events("worker.started"))
            wait_for(started, timeout, f"worker {proc.pid} to start")

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)  # works on a stopped process too
                except ProcessLookupError:
                    pass
            proc.wait(10)


@contextmanager
def fleet_on(url: str, folder: Path) -> Iterator[Fleet]:
    """A Fleet that kills every worker it started when the block ends."""
    f = Fleet(url, folder)
    try:
        yield f
    finally:
        f.kill_all()


@contextmanager
def proc_app_on(url: str) -> Iterator[App]:
    """proc_app's own App, pointed at ``url``, with the schema and the ledger table made."""
    a = proc_app.app
    a.use_database(url)
    a.migrate()
    proc_app.create_ledger(url)
    try:
        yield a
    finally:
        a.close()


def state_counts(app: App) -> Counter[str]:
    c: Counter[str] = Counter()
    for qc in app.queue_counts():
        c[str(qc.state)] += qc.count
    return c


def ledger(url: str, event: str | None = "done") -> list[tuple[int, int, str]]:
    return proc_app.ledger_rows(url, event)


def error_kinds(job: Job) -> list[str]:
    return [str(e.get("kind")) for e in job.errors]


def running_jobs_of(app: App, proc: WorkerProc) -> list[Job]:
    return [j for j in app.list_jobs(state="running", limit=10000)
            if owner_pid(j.lease_owner) == proc.pid]


def _state(stat_path: str) -> str:
    """The state letter (R, S, D, T...) of a /proc ``stat`` file."""
    with open(stat_path) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` (T: stopped), or "gone"."""
    try:
        return _state(f"/proc/{pid}/stat")
    except OSError:
        return "gone"


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it has stopped (wait_stopped)."""
    os.kill(pid, signal.SIGSTOP)
    wait_stopped(pid)


def wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Wait until every thread of ``pid`` is stopped (state T in /proc/<pid>/task/*/stat).
    ``kill(pid, SIGSTOP)`` returns once the signal is sent, not once the process has
    stopped: a thread still on a CPU (on a VM, one whose virtual CPU the host has not
    run yet) can go on for a while and take a lock after a look that found it free. Seen:
    a SQLite write lock found free just after the stop, then held by the stopped process
    for the whole freeze."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            states = []
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    states.append(_state(f"/proc/{pid}/task/{tid}/stat"))
                except OSError:
                    pass  # a thread that has just exited
        except OSError:
            return  # the process is gone
        if all(state in "TtZX" for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop within {timeout}s: thread states {states}")
        time.sleep(0.001)


def sqlite_write_lock_free(url: str, within: float = 0.5) -> bool:
    """Can a writer get SQLite's write lock? A process stopped inside a write transaction
    holds it, and then the whole database waits for it: not the freeze under test."""
    conn = proc_app.ledger_connect(url)
    conn.execute("PRAGMA busy_timeout=0")
    deadline = time.monotonic() + within
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
                return True
            except sqlite3.OperationalError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.002)
    finally:
        conn.close()


def slot_row_free(url: str, set_name: str, slot: int) -> bool:
    """Is no transaction holding the slot's row (a fence holds it until its COMMIT)?"""
    conn = proc_app.ledger_connect(url)
    try:
        with proc_app._Tx(conn) as c:
            c.execute(proc_app._sql(c, "SELECT 1 FROM justonce_partition_leases "
                                       "WHERE set_name = ? AND slot = ? FOR UPDATE NOWAIT"),
                      (set_name, slot))
        return True
    except Exception:  # noqa: BLE001 - the lock is not available (either driver's error)
        return False
    finally:
        conn.close()


def stop_outside_a_write(pid: int, url: str, tries: int = 50,
                         slot: tuple[str, int] | None = None) -> None:
    """SIGSTOP ``pid`` outside its write transactions. On SQLite a process stopped inside one
    holds the one write lock of the file (and every other writer waits for it: README,
    "SQLite and frozen processes"); elsewhere one stopped inside a fenced transaction holds
    ``slot``'s row until the server ends its session (a different test). Either way, let it
    run on and stop it again until the lock is free."""
    for _ in range(tries):
        stop(pid)
        if url.startswith("sqlite"):
            if sqlite_write_lock_free(url):
                return
        elif slot is None or slot_row_free(url, *slot):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.013)
    raise AssertionError(f"process {pid} held a lock at each of {tries} stops")


class Procs:
    """Spawned helper processes (functions importable by name, as spawn needs), killed at the
    end whatever happens."""

    def __init__(self) -> None:
        import multiprocessing

        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[Any] = []

    def start(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        p = self.ctx.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        p.start()
        self.procs.append(p)
        return p

    def kill_all(self) -> None:
        for p in self.procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join(10)
