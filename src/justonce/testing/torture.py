"""Fault scenarios with the history checked: ``python -m justonce.testing.torture``.

Each scenario runs real ``justonce worker`` processes (the tasks of
:mod:`justonce.testing.workload`) against a fresh database of each backend, while this
process enqueues work and injects faults; every process appends to one history file, and
:mod:`justonce.testing.check` checks it against the promises. The last line printed is
``violations: N``.

Scenarios:

- ``chaos``: plain and partitioned workers, jobs, keyed jobs, retries, batches and effects
  in flight at once; random ``kill -9`` (the process is replaced) and SIGSTOP/SIGCONT
  past the lease, for the scenario's share of ``--minutes``;
- ``failpoints``: a kill at every failpoint a worker passes (:data:`justonce.failpoints.POINTS`),
  each in its own worker process, replaced after it dies, the next point in turn;
- ``poison``: a job that kills its own process every attempt, among ordinary work: it ends
  dead within its attempts and the rest succeeds;
- ``skew`` (Postgres, MySQL): chaos with the workers' wall clocks set 10 minutes ahead or
  behind (Debian's ``faketime``; their monotonic clocks are left alone, as on real
  machines): leases and schedules go by the server's clock. (SQLite's processes share one
  machine, hence one clock, which is the database's.)
- ``crowd`` (SQLite): chaos with 16 worker processes on one file;
- ``pgbouncer`` (Postgres): chaos with the workers behind PgBouncer in transaction mode
  (``?pgbouncer=1``, ``--no-listen``);
- ``pg-restart`` (Postgres, a throwaway cluster started here): the server stopped with
  ``pg_ctl -m immediate`` and started again, again and again, under working workers;
- ``cut-off`` (Postgres, MySQL; root): workers on a host of their own (a network
  namespace made here, one veth link to this host) holding the partition slots, the link
  dropped for twice the lease and restored, again and again (:mod:`justonce.testing.netns`);
  packets are lost, not refused, so their connections hang as on a real network failure.
- ``full-disk`` (SQLite; root): the database on a small tmpfs of its own, filled for 1-2
  leases and freed, again and again, under working workers (one killed now and then);
  after the run SQLite's integrity check must say ok.

``--seed`` makes the faults (which worker, when, how long) and the work replayable; the
machine's timing still varies. ``--keep DIR`` keeps each run's history and worker logs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from .. import App, DatabaseUnavailable, Enqueue
from ..backends.sqlite.backend import parse_sqlite_url
from ..demo import connect
from ..failpoints import POINTS
from . import check as checker
from .databases import BACKENDS, fresh_database
from .history import Recorder, read
from .netns import CutOffHost
from .netns import unavailable as netns_unavailable
from .pgbouncer import pgbouncer_bin, start_pgbouncer
from .pgcluster import Cluster, pg_bin
from .workload import FENCE_TABLE

PG_URL = os.environ.get("JUSTONCE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
MYSQL_URL = os.environ.get("JUSTONCE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
LEASE, HEARTBEAT = 2.0, 0.5
KEYS = [f"k{i}" for i in range(12)]
LIST_ITEMS = 12
LIST_TTR = 3.0
"""A list reservation's time to run: longer than a job's lease, shorter than the longest
stop, so a stopped worker's reservation times out and is handed out again."""
SMALL_DISK_MB = 24
"""The full-disk scenario's file system: room for a run's database and its WAL."""
WORKER_POINTS = [p for p in POINTS if p.split(".")[0] in ("job", "ack", "fail", "heartbeat",
                                                          "partition", "effect", "list")
                 and p not in ("effect.after_chunk", "effect.in_finish", "list.after_append_chunk")]
"""The failpoints a workload worker passes (run_many's chunk points and a list load's are
not on its path: its tasks' effects go through run)."""


# -- databases ------------------------------------------------------------------------------


@contextmanager
def database(backend: str, folder: Path) -> Iterator[str]:
    """A fresh, empty database of ``backend``: its URL; dropped afterwards."""
    with fresh_database(backend, folder, postgres=PG_URL, mysql=MYSQL_URL, prefix="torture") as url:
        yield url


def reachable(backend: str) -> str | None:
    """None when the backend's server answers, else why not."""
    try:
        if backend == "postgres":
            import psycopg

            psycopg.connect(PG_URL, connect_timeout=3).close()
        elif backend == "mysql":
            import pymysql

            from ..backends.mysql.backend import parse_mysql_url

            kwargs, _ = parse_mysql_url(MYSQL_URL)
            pymysql.connect(**kwargs, connect_timeout=3).close()
    except Exception as exc:  # noqa: BLE001 - reported as the reason to skip
        return f"{type(exc).__name__}: {exc}"
    return None


# -- one run --------------------------------------------------------------------------------


@dataclass
class Worker:
    popen: subprocess.Popen[bytes]
    partitioned: bool
    points: str | None
    stopped_until: float | None = None
    replaced: bool = False
    concurrency: int = 2
    slots: int = 2
    skew: float = 0.0
    host: CutOffHost | None = None


@dataclass
class Result:
    scenario: str
    backend: str
    faults: dict[str, int] = field(default_factory=dict)
    report: Any = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def violations(self) -> int:
        if self.error is not None:
            return 1
        return int(self.report.violations)


class Run:
    """A database, its workers and the history they share, for one scenario."""

    def __init__(self, url: str, folder: Path, rng: random.Random) -> None:
        self.url, self.folder, self.rng = url, folder, rng
        self.history_path = folder / "history.jsonl"
        self.history = Recorder(self.history_path)
        self.app = App(url, strict=False)  # the tasks are the workers' (workload.py)
        self.app.migrate()
        db = connect(url)  # the table of the fenced jobs' writes (workload.fenced)
        try:
            db.execute(f"CREATE TABLE IF NOT EXISTS {FENCE_TABLE} "
                       "(slot INTEGER NOT NULL, token BIGINT NOT NULL, n INTEGER NOT NULL)")
        finally:
            db.close()
        self.workers: list[Worker] = []
        self.faults: dict[str, int] = {}
        self.jobs: dict[int, tuple[str | None, int]] = {}  # id -> (key, max_attempts)
        self.batches: dict[int, list[int]] = {}
        self.lists: dict[str, int] = {}  # name -> items
        self.open_lists: set[str] = set()
        self.n = 0
        self._logs = 0
        self.worker_url = url
        self.worker_extra: list[str] = []
        self.cluster: Cluster | None = None

    # -- workers ---------------------------------------------------------------------
    def start_worker(self, partitioned: bool, points: str | None = None, *,
                     concurrency: int = 2, slots: int = 2, skew: float = 0.0,
                     host: CutOffHost | None = None) -> Worker:
        """A ``justonce worker`` process: on the keyed queue with ``slots`` of the 4 slots,
        or on the plain queue; ``points``: its JUSTONCE_FAILPOINTS; ``skew``: seconds its
        wall clock runs ahead (faketime); ``host``: the network namespace it runs in (its
        only way to the database is that namespace's link)."""
        env = dict(os.environ, JUSTONCE_HISTORY=str(self.history_path))
        for name in ("JUSTONCE_FAILPOINTS", "JUSTONCE_DATABASE_URL", "JUSTONCE_HISTORY_SKEW"):
            env.pop(name, None)
        if points:
            env["JUSTONCE_FAILPOINTS"] = points
        cmd = [sys.executable, "-m", "justonce", "worker", "--app",
               "justonce.testing.workload:app", "--database-url",
               host.url(self.worker_url) if host is not None else self.worker_url,
               "--concurrency", str(concurrency), "--lease", str(LEASE), "--heartbeat",
               str(HEARTBEAT), "--poll", "0.1", "--housekeeping-interval", "0.3", "--grace",
               "5", "--log-level", "WARNING", *self.worker_extra]
        cmd += (["--queues", "torture_keyed", "--partitions", "torture:4",
                 "--partition-slots", str(slots)] if partitioned else ["--queues", "torture"])
        if skew:
            # The wall clock only: a machine's monotonic clock is its own, never skewed.
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
            env["JUSTONCE_HISTORY_SKEW"] = str(skew)
            # time.sleep fails under that setting; see faketime_site/sitecustomize.py
            env["PYTHONPATH"] = os.pathsep.join(
                [str(Path(__file__).parent / "faketime_site"), *filter(None, [env.get("PYTHONPATH")])])
            cmd = ["faketime", "-f", f"{skew:+.0f}", *cmd]
        if host is not None:
            cmd = host.command(cmd)
        self._logs += 1
        with open(self.folder / f"worker-{self._logs}.log", "wb") as log:
            popen = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, start_new_session=True)
        w = Worker(popen, partitioned, points, concurrency=concurrency, slots=slots, skew=skew,
                   host=host)
        self.workers.append(w)
        return w

    def replace(self, w: Worker) -> Worker:
        """A worker like ``w`` (without its failpoints), for one that died."""
        w.replaced = True
        return self.start_worker(w.partitioned, concurrency=w.concurrency, slots=w.slots,
                                 skew=w.skew, host=w.host)

    def sqlite_path(self) -> Path:
        """The file of a SQLite run's database."""
        return Path(parse_sqlite_url(self.url)[0])

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.popen.poll() is None]

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def kill(self, w: Worker) -> None:
        try:
            os.killpg(w.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        w.popen.wait(10)
        self.fault("kill -9")

    def stop_for(self, w: Worker, seconds: float) -> None:
        try:
            os.killpg(w.popen.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        w.stopped_until = time.monotonic() + seconds
        self.fault("SIGSTOP")

    def wake_due(self, everyone: bool = False) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.stopped_until is not None and (everyone or now >= w.stopped_until):
                w.stopped_until = None
                try:
                    os.killpg(w.popen.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def stop_all(self) -> None:
        self.wake_due(everyone=True)
        for w in self.live():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for w in self.workers:
            try:
                w.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.popen.pid, signal.SIGKILL)
                w.popen.wait(10)

    # -- work ------------------------------------------------------------------------
    def enqueue(self, task: str, args: list[Any], *, key: str | None = None,
                max_attempts: int = 5) -> int:
        queue = "torture_keyed" if key is not None else "torture"
        job = self.app.enqueue(f"justonce.testing.workload.{task}", args, queue=queue,
                               partition_key=key, max_attempts=max_attempts)
        self.jobs[job.id] = (key, max_attempts)
        self.history.record("enqueue", job=job.id, key=key, max_attempts=max_attempts)
        return job.id

    def flow(self) -> None:
        """One round of the mixed workload (skipped while the database is unavailable)."""
        try:
            self._flow()
        except DatabaseUnavailable:
            self.fault("enqueue refused: database unavailable")

    def _flow(self) -> None:
        for _ in range(3):
            self.n += 1
            self.enqueue("step", [self.n, 0.003, self.rng.random() < 0.3])
        for _ in range(3):
            self.n += 1
            self.enqueue("step", [self.n, 0.003], key=self.rng.choice(KEYS))
        if self.rng.random() < 0.1:
            self.n += 1
            self.enqueue("flaky", [self.n])
        if self.rng.random() < 0.3:
            self.n += 1
            self.enqueue("fenced", [self.n])
        if self.rng.random() < 0.05:
            batch = self.app.batches.open("torture", on_complete="justonce.testing.workload.batch_done")
            reqs = []
            for _ in range(4):
                self.n += 1
                reqs.append(Enqueue("justonce.testing.workload.step", [self.n, 0.003],
                                    queue="torture", max_attempts=5))
            _, ids = batch.enqueue(reqs)
            batch.seal()
            self.batches[batch.id] = ids
            for job_id in ids:
                self.jobs[job_id] = (None, 5)
                self.history.record("enqueue", job=job_id, key=None, max_attempts=5)
        if self.rng.random() < 0.04 and len(self.open_lists) < 3:
            name = f"torture-{self.n}"
            self.app.lists.create(name, items=range(LIST_ITEMS), ttr=LIST_TTR)
            self.lists[name] = LIST_ITEMS
            self.open_lists.add(name)
            for i in range(LIST_ITEMS):
                self.history.record("list_add", list=name, item=i)
        self.feed_lists()

    def feed_lists(self) -> None:
        """A job to take a part of each list not yet completed (positions held by a
        worker that died or stopped are handed out again after their time to run)."""
        for name in sorted(self.open_lists):
            if self.app.lists.get(name).state == "completed":
                self.open_lists.discard(name)
            elif self.rng.random() < 0.5:
                self.n += 1
                self.enqueue("list_part", [name, 3])

    def _busy(self) -> list[Any]:
        """The torture queues' counts of jobs not finished (ready, running, scheduled)."""
        return [qc for qc in self.app.queue_counts()
                if str(qc.state) in ("ready", "running", "scheduled") and qc.queue.startswith("torture")]

    def backlog(self) -> int:
        """Jobs not finished, and lists not completed; -1 when the database cannot say."""
        try:
            return len(self.open_lists) + sum(qc.count for qc in self._busy())
        except DatabaseUnavailable:
            return -1

    def left(self) -> str:
        """What is not finished, for a run that did not drain."""
        try:
            jobs = [f"{qc.count} {qc.state} on {qc.queue}" for qc in self._busy()]
            lists = [f"list {n} {self.app.lists.get(n).progress}" for n in sorted(self.open_lists)]
        except DatabaseUnavailable as exc:
            return f"the database is unavailable: {exc}"
        return "; ".join(jobs + lists) or "nothing (it finished late)"

    def drain(self, timeout: float) -> bool:
        """Let the work finish without faults; False if it did not within ``timeout``."""
        self.wake_due(everyone=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(DatabaseUnavailable):
                self.feed_lists()  # lists held by dead or stopped workers need new takers
            if self.backlog() == 0:
                return True
            for w in list(self.workers):
                if w.popen.poll() is not None and not w.replaced:
                    self.replace(w)  # died on its own (a poison job): replace it
            time.sleep(0.2)
        return False

    def finish(self) -> None:
        """The database's last word on every job and batch, as history."""
        lines = read([self.history_path]) if self.batches else []
        acked: dict[int, float] = {}
        logged = {line["job"] for line in lines if line.ev == "batch_ack" and line.get("job")}
        for line in lines:
            if line.ev in ("complete", "end") and line.get("job") is not None:
                job = int(line["job"])
                if line.ev == "complete" and line.get("accepted"):
                    acked[job] = line.t
                else:
                    acked.setdefault(job, line.t)
        states: dict[int, str] = {}
        for job_id in sorted(self.jobs):
            j = self.app.get_job(job_id)
            states[job_id] = str(j.state)
            self.history.record("final", job=job_id, state=states[job_id], attempts=j.attempts,
                                max_attempts=j.max_attempts)
        for name, n in self.lists.items():
            info = self.app.lists.get(name)
            buried = {p for b in self.app.lists.buried(name, limit=1000)
                      for lo, hi in b.ranges for p in range(lo, hi)}
            # Done when the list completed, or when done and buried make up the whole list;
            # else every position not buried is reported as still to do (a loss).
            rest = ("done" if info.progress.done + info.progress.buried == info.progress.total
                    else f"not done ({info.state}: {info.progress})")
            for i in range(n):
                self.history.record("list_final", list=name, item=i,
                                    state="buried" if i in buried else rest)
        for batch_id, ids in self.batches.items():
            self.history.record("batch_items", batch=str(batch_id), n=len(ids))
            for i, job_id in enumerate(ids):
                state = states.get(job_id) or str(self.app.get_job(job_id).state)
                if state == "succeeded" and job_id in acked and job_id not in logged:
                    # Acked in the transaction that accepted its job's success, by a worker
                    # that died before it could log it (its history ends at the commit).
                    self.history.line("batch_ack", t=acked[job_id], batch=str(batch_id),
                                      item=i, accepted=True, derived=True)

    def close(self) -> None:
        # Each worker leads its own process group (a faketime wrapper and its python):
        # kill every group, whether or not its leader is still there.
        for w in self.workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.popen.wait(10)
        self.app.close()


# -- scenarios ------------------------------------------------------------------------------


def chaos(run: Run, seconds: float) -> None:
    """Random kill -9 and SIGSTOP past the lease, jobs of every kind in flight."""
    for _ in range(2):
        run.start_worker(False)
    for _ in range(3):
        run.start_worker(True)  # 2 x 2 slots of 4, and one standing by
    _faults(run, seconds)


def skew(run: Run, seconds: float) -> None:
    """Chaos with every worker's wall clock 10 minutes ahead or behind."""
    for i in range(2):
        run.start_worker(False, skew=600 if i % 2 else -600)
    for i in range(3):
        run.start_worker(True, skew=-600 if i % 2 else 600)
    _faults(run, seconds)


def crowd(run: Run, seconds: float) -> None:
    """Chaos with 16 processes on one SQLite file."""
    for _ in range(8):
        run.start_worker(False, concurrency=1)
    for _ in range(8):
        run.start_worker(True, concurrency=1, slots=1)  # 4 hold a slot, 4 stand by
    _faults(run, seconds)


def pgbouncer(run: Run, seconds: float) -> None:
    """Chaos with the workers behind PgBouncer in transaction mode."""
    proc, url = start_pgbouncer(PG_URL, run.folder, pool_size=8)
    try:
        schema = run.url.split("schema=", 1)[1].split("&", 1)[0]
        run.worker_url = f"{url}?schema={schema}&pgbouncer=1"
        run.worker_extra = ["--no-listen"]
        chaos(run, seconds)
        run.drain(90)
        run.stop_all()
        run.worker_url, run.worker_extra = run.url, []  # the bouncer goes: drain directly
    finally:
        proc.terminate()
        proc.wait(10)


def pg_restart(run: Run, seconds: float) -> None:
    """The Postgres server stopped with -m immediate and started again, over and over."""
    assert run.cluster is not None
    for _ in range(2):
        run.start_worker(False)
    for _ in range(2):
        run.start_worker(True)
    end = time.monotonic() + seconds
    next_stop = time.monotonic() + run.rng.uniform(1.0, 2.0)
    while time.monotonic() < end:
        run.flow()
        if time.monotonic() >= next_stop:
            run.cluster.stop("immediate")
            run.fault("postgres stopped -m immediate")
            time.sleep(run.rng.uniform(0.3, 2.5))
            run.cluster.start()
            next_stop = time.monotonic() + run.rng.uniform(2.0, 4.0)
        time.sleep(0.05)


def cut_off(run: Run, seconds: float) -> None:
    """Workers on a host of their own (a network namespace) whose link to the database is
    dropped for twice the lease and restored, again and again, while the workers on this
    host carry on and take over their jobs and slots.

    Each round: the cut-off host's two partitioned workers hold the 4 slots; the link is
    cut for two leases (this host's two partitioned workers take the slots over); it comes
    back (the cut-off workers find their slots gone and their late writes refused); then
    this host's partitioned workers are killed and, a lease later, replaced, so the slots
    go back to the cut-off host for the next round."""
    server = urlsplit(run.url)
    port = server.port or (5432 if server.scheme.startswith("postgres") else 3306)
    with CutOffHost(server.hostname or "127.0.0.1", port) as host:
        run.start_worker(False, host=host)
        for _ in range(2):
            run.start_worker(True, host=host)
        time.sleep(1.5)  # the cut-off host's workers take the 4 slots first
        for _ in range(2):
            run.start_worker(False)
        here = [run.start_worker(True) for _ in range(2)]
        end = time.monotonic() + seconds
        step, due = "cut", time.monotonic() + run.rng.uniform(1.0, 2.0)
        while time.monotonic() < end or step != "cut":
            run.flow()
            now = time.monotonic()
            if now < due:
                time.sleep(0.05)
            elif step == "cut":
                host.cut()
                run.fault(f"link cut for {2 * LEASE:g} s")
                step, due = "restore", now + 2 * LEASE
            elif step == "restore":
                host.restore()
                step, due = "hand back", now + run.rng.uniform(1.0, 2.0)
            elif step == "hand back":
                for w in here:
                    run.kill(w)
                step, due = "replace", now + LEASE + 1.5
            else:
                here = [run.replace(w) for w in here]
                step, due = "cut", now + run.rng.uniform(1.5, 3.0)
        run.drain(90)  # while the namespace's workers still have their link
        run.stop_all()


def full_disk(run: Run, seconds: float) -> None:
    """SQLite on a small file system of its own (a tmpfs): while work flows, the disk is
    filled for 1-2 leases and freed again, a few times, and a worker is killed now and then.
    Every write meanwhile must fail cleanly (DatabaseUnavailable: the disk is full), nothing
    may be half written, and the work must resume when space returns (the file's integrity
    is checked after the run)."""
    for _ in range(2):
        run.start_worker(False)
    for _ in range(2):
        run.start_worker(True)
    disk = run.sqlite_path().parent
    end = time.monotonic() + seconds
    next_fill = time.monotonic() + run.rng.uniform(1.0, 2.0)
    filler: Path | None = None
    free_at = 0.0
    try:
        while time.monotonic() < end or filler is not None:
            run.flow()
            now = time.monotonic()
            if filler is None and now >= next_fill and now < end:
                filler = fill(disk)
                free_at = now + run.rng.uniform(1.0, 2.0) * LEASE
                run.fault("disk full")
            elif filler is not None and now >= free_at:
                filler.unlink(missing_ok=True)
                filler = None
                next_fill = now + run.rng.uniform(1.0, 2.5)
                live = run.live()
                if live and run.rng.random() < 0.5:
                    w = run.rng.choice(live)
                    run.kill(w)
                    run.replace(w)
            time.sleep(0.05)
    finally:
        if filler is not None:
            filler.unlink(missing_ok=True)


def fill(folder: Path) -> Path:
    """Take every free byte of ``folder``'s file system (the file keeps what it got)."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 65536)
    return filler


@contextmanager
def tmpfs(disk: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` mounted on the empty folder ``disk`` (needs root), unmounted
    after; RuntimeError when it cannot be mounted."""
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
                          str(disk)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@contextmanager
def small_disk_database(folder: Path) -> Iterator[tuple[str, None]]:
    """A SQLite database on a tmpfs of SMALL_DISK_MB mounted in ``folder`` (needs root)."""
    disk = folder / "disk"
    disk.mkdir()
    with tmpfs(disk, SMALL_DISK_MB):
        yield f"sqlite:///{quote(str(disk / 'torture.db'))}", None  # (URLs are %-decoded)


def sqlite_integrity(path: Path) -> str | None:
    """None when SQLite's integrity check of ``path`` says ok, else what it says."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as c:
        said = str(c.execute("PRAGMA integrity_check").fetchone()[0])
    return None if said == "ok" else f"integrity_check: {said}"


def _faults(run: Run, seconds: float) -> None:
    """The chaos loop: work flows; every 0.4-1.2 s a worker is killed (and replaced) or
    stopped for 0.5-2.5 leases."""
    end = time.monotonic() + seconds
    next_fault = time.monotonic() + run.rng.uniform(0.5, 1.5)
    while time.monotonic() < end:
        run.flow()
        run.wake_due()
        if time.monotonic() >= next_fault:
            candidates = [w for w in run.live() if w.stopped_until is None]
            if candidates:
                w = run.rng.choice(candidates)
                if run.rng.random() < 0.55:
                    run.kill(w)
                    run.replace(w)
                else:
                    run.stop_for(w, run.rng.uniform(0.5, 2.5) * LEASE)
            next_fault = time.monotonic() + run.rng.uniform(0.4, 1.2)
        time.sleep(0.05)


def failpoint_kills(run: Run, seconds: float) -> None:
    """A kill at every failpoint on a worker's path, each in a worker of its own."""
    points = list(WORKER_POINTS)
    run.rng.shuffle(points)
    run.start_worker(False)
    run.start_worker(True)
    armed: dict[int, str] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end or points or armed:
        run.flow()
        for w in list(run.workers):
            point = armed.get(w.popen.pid)
            if point is not None and w.popen.poll() is not None:
                del armed[w.popen.pid]
                w.replaced = True
                if w.popen.returncode == -signal.SIGKILL:
                    run.fault(f"kill at {point}")
                else:
                    run.fault(f"exited {w.popen.returncode} at {point}?")
        while points and len(armed) < 4:
            point = points.pop()
            # A partition point needs a slot (the other partitioned worker holds 2 of 4);
            # the others need the plain queue's work (retries, effects).
            w = run.start_worker(point.startswith("partition"), f"{point}=kill")
            armed[w.popen.pid] = point
        if time.monotonic() > end + 60:
            for point in armed.values():
                run.fault(f"not reached: {point}")
            for w in run.live():
                if w.popen.pid in armed:
                    run.kill(w)
            break
        time.sleep(0.15)  # a lighter flow: the points are the faults here, not the backlog
    run.start_worker(False)
    run.start_worker(True)


def poison(run: Run, seconds: float) -> None:
    """A job that kills its own process every attempt, among ordinary work."""
    run.start_worker(False)
    run.start_worker(False)
    run.start_worker(True)
    run.start_worker(True)
    run.n += 1
    run.enqueue("poison", [run.n], max_attempts=3)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        run.flow()
        for w in list(run.workers):
            if w.popen.poll() is not None and not w.replaced:
                run.fault("killed by the poison job")
                run.replace(w)
        time.sleep(0.05)


SCENARIOS: dict[str, Callable[[Run, float], None]] = {
    "chaos": chaos, "failpoints": failpoint_kills, "poison": poison, "skew": skew,
    "crowd": crowd, "pgbouncer": pgbouncer, "pg-restart": pg_restart, "cut-off": cut_off,
    "full-disk": full_disk,
}
ONLY_ON = {"crowd": {"sqlite"}, "full-disk": {"sqlite"}, "pgbouncer": {"postgres"}, "pg-restart": {"postgres"},
           "skew": {"postgres", "mysql"}, "cut-off": {"postgres", "mysql"}}
"""Scenarios that are about some backends. Skew and cut-off are about servers: SQLite's
time is each process's own clock, its processes share one machine, hence one clock, and
they reach the file through no network."""


def missing_tool(scenario: str) -> str | None:
    """Why a scenario cannot run on this machine, or None."""
    if scenario == "skew" and shutil.which("faketime") is None:
        return "faketime is not installed (Debian: apt-get install faketime)"
    if scenario == "pgbouncer" and pgbouncer_bin() is None:
        return "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
    if scenario == "pg-restart" and pg_bin() is None:
        return "initdb / pg_ctl are not installed (Debian: postgresql)"
    if scenario == "cut-off":
        return netns_unavailable()
    if scenario == "full-disk":
        return tmpfs_unavailable()
    return None


def tmpfs_unavailable() -> str | None:
    """None when this process can mount (and unmount) a small tmpfs, else why not."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "mounting a small tmpfs needs root and mount(8)"
    with tempfile.TemporaryDirectory(prefix="torture-tmpfs-") as d:
        try:
            with tmpfs(Path(d), 1):
                pass
        except RuntimeError as exc:
            return str(exc)
    return None


@contextmanager
def cluster_database() -> Iterator[tuple[str, Cluster]]:
    """A throwaway Postgres cluster of this run's own (it will be stopped hard)."""
    cluster = Cluster.create()
    try:
        yield cluster.url, cluster
    finally:
        cluster.destroy()


def run_one(scenario: str, backend: str, seconds: float, seed: int, keep: Path | None) -> Result:
    rng = random.Random(f"{seed}:{scenario}:{backend}")
    folder = Path(tempfile.mkdtemp(prefix=f"torture-{scenario}-{backend}-"))
    result = Result(scenario, backend)
    started = time.monotonic()
    try:
        with (cluster_database() if scenario == "pg-restart"
              else small_disk_database(folder) if scenario == "full-disk"
              else _no_cluster(database(backend, folder))) as (url, cluster):
            run = Run(url, folder, rng)
            run.cluster = cluster
            try:
                SCENARIOS[scenario](run, seconds)
                if not run.live():
                    run.start_worker(False)
                    run.start_worker(True)
                if not run.drain(90):
                    result.error = f"work not finished 90 s after the faults stopped: {run.left()}"
                run.stop_all()
                run.finish()
                if scenario == "full-disk":
                    result.error = result.error or sqlite_integrity(run.sqlite_path())
            finally:
                result.faults = dict(run.faults)
                run.close()
        lines = read([folder / "history.jsonl"])
        result.report = checker.check(lines)
        result.error = result.error or _vacuous(scenario, lines)
    except Exception as exc:  # noqa: BLE001 - a failed run is reported, not raised
        result.error = f"{type(exc).__name__}: {exc}"
    result.seconds = time.monotonic() - started
    if keep is not None:
        dest = keep / f"{scenario}-{backend}"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(folder, dest)
    shutil.rmtree(folder, ignore_errors=True)
    return result


def _vacuous(scenario: str, lines: list[Any]) -> str | None:
    """Why a run proved little although nothing was violated: the workload's tasks do not
    fail for good (but the poison job), so many dead jobs mean the work itself broke (as
    when every sleep failed under faketime), and dead ends pass the no-loss rule."""
    finals = [x for x in lines if x.ev == "final"]
    dead = sum(1 for x in finals if x["state"] == "dead")
    allowed = max(3, len(finals) // 50) + (1 if scenario == "poison" else 0)
    if dead > allowed:
        return (f"{dead} of {len(finals)} jobs ended dead: the work itself failed (see the "
                "workers' logs, --keep)")
    return None


@contextmanager
def _no_cluster(db: Any) -> Iterator[tuple[str, None]]:
    with db as url:
        yield url, None


def table(results: list[Result]) -> str:
    rows = ["| scenario | backend | faults injected | jobs / effects / acks / slots / list items "
            "checked | violations |", "|---|---|---|---|---|"]
    for r in results:
        faults = ", ".join(f"{n} {k}" for k, n in sorted(r.faults.items())) or "none"
        if r.report is not None:
            c = r.report.counts
            checked = (f"{c.get('jobs', 0)} / {c.get('effects', 0)} / {c.get('acks', 0)} / "
                       f"{c.get('slots', 0)} / {c.get('list_items', 0)}")
        else:
            checked = "-"
        v = r.violations if r.error is None else f"{r.violations} ({r.error})"
        rows.append(f"| {r.scenario} | {r.backend} | {faults} | {checked} | {v} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m justonce.testing.torture", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=3.0,
                   help="time with faults, shared among the runs (each gets at least 5 s)")
    p.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--keep", type=Path, default=None, help="keep histories and logs here")
    p.add_argument("--require-all", action="store_true",
                   help="a backend that does not answer is a failure, not a skip")
    a = p.parse_args(argv)
    if not 0 < a.minutes <= 7 * 24 * 60:
        p.error("--minutes must be in (0, 10080]")
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(10**9)
    scenarios = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    for s in scenarios:
        if s not in SCENARIOS:
            p.error(f"no scenario {s!r}; the scenarios are {', '.join(SCENARIOS)}")
    for b in backends:
        if b not in BACKENDS:
            p.error(f"no backend {b!r}; the backends are {', '.join(BACKENDS)}")
    print(f"torture: seed {seed}, {a.minutes:g} min, scenarios {', '.join(scenarios)}, "
          f"backends {', '.join(backends)}", flush=True)
    runs = [(s, b) for b in backends for s in scenarios if b in ONLY_ON.get(s, {b})]
    share = max(5.0, a.minutes * 60 / max(1, len(runs)))
    results: list[Result] = []
    skipped = 0
    for scenario, backend in runs:
        why = missing_tool(scenario) or (None if scenario == "pg-restart" else reachable(backend))
        if why is not None:
            print(f"torture: SKIPPED {scenario} on {backend}: {why}", flush=True)
            skipped += 1
            continue
        r = run_one(scenario, backend, share, seed, a.keep)
        results.append(r)
        print(f"torture: {scenario} on {backend}: {r.violations} violations in "
              f"{r.seconds:.0f} s", flush=True)
        if r.report is not None and r.report.violations:
            print(r.report.text(), flush=True)
        if r.error:
            print(f"torture: {scenario} on {backend} failed: {r.error}", flush=True)
    print(table(results))
    total = sum(r.violations for r in results) + (skipped if a.require_all else 0)
    print(f"violations: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
