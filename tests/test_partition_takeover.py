"""Issue 9: a partitioned worker frozen past its lease, then woken, must not act on the slot
or the jobs that moved on while it slept.

Six ``justonce worker`` processes share the 4 slots of the set ``takeover`` (one slot each:
four hold a slot, two stand by) and run a steady flow of short keyed jobs. Round after
round the test SIGSTOPs two slot holders that are running jobs (one of them, when it can
catch one, while it has leased jobs waiting for a free thread; the other wherever it is,
mid-claim say), keeps them stopped past their lease until a standby has taken each slot
and run some of its jobs, then SIGCONTs them; a woken worker must find its slot gone and
stand by, and start nothing it leased before the freeze. Meanwhile:

- every job writes a *start* row before it works (with the worker's start time, and a
  look at its own row in justonce_jobs: state, attempt, lease owner, lease expiry) and
  an *end* row after, with ``time.time()`` — the clock the database uses on this machine;
- a watcher thread reads justonce_partition_leases every 20 ms and keeps each slot's
  holders: token, owner and ``acquired_at`` (the database's time of the acquisition), so
  a slot's history is exact as long as no tenure is missed; one the watcher missed
  (a gap in the tokens) is filled from the worker's ``partition.acquired`` log line.

Afterwards, for every backend:

1. every job succeeded, and no job logged two accepted successes;
2. every start was made by the process holding the key's slot at that moment (the latest
   acquisition of the slot before the start);
3. every start was made under the job's own live lease: the job was running, leased to
   that process, and its lease had not expired (so no start after the job was re-offered,
   and each attempt starts once, in order);
4. per key, no two executions overlap, except the documented hole: an execution that began
   under its slot and lease and whose process was frozen while it ran may overlap the next
   holder's run of the same key (counted, not failed);
5. late writes the database rejected (``job.rejected``) are counted: they are allowed.

No clock slack is needed: starts, acquisitions and lease expiries are all read from the
same machine clock, and a frozen process is stopped seconds, not milliseconds, around the
instants compared. The freezes themselves are checked (each one's slot token moved on to
another process) so the test cannot pass vacuously. Two kinds of freeze do not count:
on SQLite, one that caught a process inside a write transaction is called off at once (it
would stop the whole database, not one worker); and one whose slot no standby could take
(a process stopped inside an open transaction may hold the slot's row) ends after a while.

A start is dated by the worker's own decision to start the job (``current_job().started_at``:
its last check of the lease and the slot, just before it called the task), not by the
code's first line: a worker stopped between the two (a window of a few calls, in which
the slot thread may also wait for the GIL; seen once in 34 long-form runs on SQLite when
starts were dated by the first line) is a run frozen before its start row, not one that
started after waking.

``JUSTONCE_TAKEOVER_FREEZES=N`` sets the number of freezes taken over per backend
(default 24 with JUSTONCE_LONG_TESTS=1, about 90 s per backend, else 2; done two at a
time); raise it for a longer soak,
e.g. ``JUSTONCE_TAKEOVER_FREEZES=100``.
"""

from __future__ import annotations

import bisect
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import proc_app
from conftest import LONG
from fleet import (
    Fleet,
    WorkerProc,
    fleet_on,
    proc_app_on,
    process_state,
    sqlite_write_lock_free,
    wait_for,
    wait_stopped,
)
from justonce import App, Enqueue, partition_of
from justonce.owner import owner_pid

pytestmark = pytest.mark.slow

SET_NAME, N = "takeover", 4
WORKERS, CONCURRENCY = 6, 3
LEASE, HEARTBEAT, POLL, HOUSEKEEPING = 2.0, 0.5, 0.1, 0.2
KEYS = [f"acct-{i}" for i in range(80)]
JOB_SECONDS = 0.01
FIRST_JOBS, LOW_WATER = 4000, 1200  # below LOW_WATER unfinished jobs, top up to twice it
FREEZES = int(os.environ.get("JUSTONCE_TAKEOVER_FREEZES", "24" if LONG else "2"))
PER_ROUND = 2
FROZEN_FOR = 2.5 * LEASE
SUCCESSOR_STARTS = 3  # jobs of the slot its new holder starts before the frozen one wakes
STALLED_START = 1.0  # a start row written this long after its code began: frozen in between
GIVE_UP = 6.0  # seconds past FROZEN_FOR to wait for a takeover
# Rounds allowed before the test gives up: a round whose freezes were called off (SQLite's
# write lock) or not taken over (a victim stopped holding its slot's row) takes nothing
# away, it only costs time, so on a slow machine FREEZES takeovers may need a few more.
MAX_ROUNDS = 3 * FREEZES + 4

SLOTS_SQL = {
    "sqlite": "SELECT slot, token, owner, acquired_at, expires_at FROM justonce_partition_leases"
              " WHERE set_name = ?",
    "postgres": "SELECT slot, token, owner, extract(epoch from acquired_at)::float8,"
                " extract(epoch from expires_at)::float8 FROM justonce_partition_leases"
                " WHERE set_name = %s",
    # the ledger connection runs in UTC: UNIX_TIMESTAMP reads the DATETIMEs as justonce wrote them
    "mysql": "SELECT slot, token, owner, CAST(UNIX_TIMESTAMP(acquired_at) AS DOUBLE),"
             " CAST(UNIX_TIMESTAMP(expires_at) AS DOUBLE) FROM justonce_partition_leases"
             " WHERE set_name = %s",
}


pid_of = owner_pid
"""The pid in a worker's owner string ``host:pid:hex``."""


# -- the slots' holders ---------------------------------------------------------------------


@dataclass(frozen=True)
class Tenure:
    slot: int
    token: int
    pid: int
    acquired_at: float
    source: str = "table"  # or "log": a tenure the watcher missed


class LeaseWatcher:
    """Reads the set's slot rows every 20 ms in a thread: every (slot, token) seen with its
    owner and acquired_at, and each slot's current row."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.tenures: dict[tuple[int, int], Tenure] = {}
        self.current: dict[int, tuple[int, int | None, float | None]] = {}
        self.polls = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-watcher", daemon=True)

    def __enter__(self) -> LeaseWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            conn = proc_app.ledger_connect(self.url)
            sql = SLOTS_SQL[proc_app.dialect(conn)]
            try:
                while not self._stop.is_set():
                    rows = conn.execute(sql, (SET_NAME,)).fetchall()
                    with self._lock:
                        for slot, token, owner, acquired_at, expires_at in rows:
                            pid = pid_of(owner)
                            self.current[slot] = (token, pid, expires_at)
                            if pid is not None and (slot, token) not in self.tenures:
                                self.tenures[(slot, token)] = Tenure(slot, token, pid, acquired_at)
                        self.polls += 1
                    self._stop.wait(0.02)
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def live_holders(self) -> dict[int, Tenure]:
        """pid -> the tenure of the slot it holds now (by the slot rows' expiry)."""
        now = time.time()
        with self._lock:
            return {pid: self.tenures[(slot, token)]
                    for slot, (token, pid, expires) in self.current.items()
                    if pid is not None and expires is not None and expires > now
                    and (slot, token) in self.tenures}

    def successor(self, slot: int, token: int) -> Tenure | None:
        """The first tenure of ``slot`` after ``token`` seen so far."""
        with self._lock:
            later = [t for (s, k), t in self.tenures.items() if s == slot and k > token]
        return min(later, key=lambda t: t.token) if later else None


def sqlite_file_locks(url: str) -> dict[str, list[str]]:
    """The POSIX locks held on the SQLite file and its ``-shm`` (from /proc/locks), as
    ``pid:R|W@offset`` (in the -shm, offset 120 is WAL's write lock, 121 the checkpoint
    lock, 122 recovery, 123 + i the read mark i): who holds what when writers wait."""
    path = url.split("?", 1)[0][len("sqlite:///"):]
    inodes = {}
    for suffix in ("", "-shm"):
        try:
            inodes[os.stat(path + suffix).st_ino] = suffix or "db"
        except OSError:
            pass
    out: dict[str, list[str]] = {name: [] for name in inodes.values()}
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if "->" in parts:  # a waiter's line
                    parts.remove("->")
                if len(parts) < 8 or parts[1] != "POSIX":
                    continue
                inode = int(parts[5].rsplit(":", 1)[1])
                if inode in inodes:
                    out[inodes[inode]].append(f"{parts[4]}:{parts[3][0]}@{parts[6]}-{parts[7]}")
    except OSError:
        pass
    return out


def log_time(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


class History:
    """Each slot's holders in token order; the holder at an instant is the latest
    acquisition before it."""

    def __init__(self, watcher: LeaseWatcher, logs: dict[int, list[dict[str, Any]]]) -> None:
        logged: dict[tuple[int, int], Tenure] = {}
        for pid, events in logs.items():
            for e in events:
                if e.get("event") == "partition.acquired" and e.get("set") == SET_NAME:
                    # The line is written after the acquisition committed: its time is an
                    # upper bound, so a start by the new holder is never put before it.
                    logged[(e["slot"], e["token"])] = Tenure(e["slot"], e["token"], pid,
                                                            log_time(e["ts"]), "log")
        self.by_slot: dict[int, list[Tenure]] = {}
        self.missed = 0
        for slot in range(N):
            tokens = [k for s, k in set(watcher.tenures) | set(logged) if s == slot]
            chain = []
            for token in range(1, max(tokens, default=0) + 1):
                tenure = watcher.tenures.get((slot, token)) or logged.get((slot, token))
                assert tenure is not None, f"slot {slot}: no holder known for token {token}"
                self.missed += tenure.source == "log"
                chain.append(tenure)
            times = [t.acquired_at for t in chain]
            assert times == sorted(times), f"slot {slot}: acquisitions out of token order {chain}"
            self.by_slot[slot] = chain
        self._times = {s: [t.acquired_at for t in c] for s, c in self.by_slot.items()}

    def holder(self, slot: int, at: float) -> Tenure | None:
        i = bisect.bisect_right(self._times[slot], at)
        return self.by_slot[slot][i - 1] if i else None

    def takeovers(self) -> int:
        return sum(max(0, len(c) - 1) for c in self.by_slot.values())


# -- freezes --------------------------------------------------------------------------------


@dataclass
class Freeze:
    pid: int
    slot: int
    token: int
    stopped_at: float
    continued_at: float = float("inf")
    successor: Tenure | None = None
    successor_starts: int = 0  # jobs of the slot its new holder started before the wake
    called_off: bool = False  # SQLite: it held the write lock, so it was woken at once
    note: str = ""  # not taken over: what the slot's row and the processes looked like then


class Scenario:
    """The jobs, the fleet and the freezes of one run."""

    def __init__(self, app: App, url: str, fleet: Fleet, watcher: LeaseWatcher) -> None:
        self.app, self.url, self.fleet, self.watcher = app, url, fleet, watcher
        self.sqlite = url.startswith("sqlite")
        self.ids: dict[int, int] = {}  # job number -> job id
        self.workers: list[WorkerProc] = []
        self.freezes: list[Freeze] = []
        self.rng = random.Random()
        self.conn = proc_app.ledger_connect(url)
        self.q = "?" if self.sqlite else "%s"

    def enqueue(self, count: int) -> None:
        first = len(self.ids)
        numbers = range(first, first + count)
        ids = self.app.enqueue_many(
            Enqueue(proc_app.takeover_step, args=(n, KEYS[n % len(KEYS)], JOB_SECONDS),
                    partition_key=KEYS[n % len(KEYS)], key=proc_app.takeover_job_key(n))
            for n in numbers)
        self.ids.update(zip(numbers, ids, strict=True))

    def backlog(self) -> int:
        """Jobs not finished yet."""
        return sum(c.count for c in self.app.queue_counts()
                   if c.queue == "takeover" and str(c.state) in ("scheduled", "ready", "running"))

    def top_up(self) -> None:
        """Keep the flow steady: a slot whose jobs ran out cannot show its new holder
        running them (and the freeze would not count)."""
        backlog = self.backlog()
        if backlog < LOW_WATER:
            self.enqueue(2 * LOW_WATER - backlog)

    def start_workers(self) -> None:
        extra = ["--queues", "takeover", "--partitions", f"{SET_NAME}:{N}", "--partition-slots", "1"]
        self.workers = [self.fleet.start(concurrency=CONCURRENCY, lease=LEASE, heartbeat=HEARTBEAT,
                                         poll=POLL, housekeeping_interval=HOUSEKEEPING,
                                         ready=False, extra=extra) for _ in range(WORKERS)]
        self.fleet.wait_ready(*self.workers)

    def last_row(self) -> int:
        return self.conn.execute("SELECT coalesce(max(id), 0) FROM takeover_log").fetchone()[0]

    def starts_since(self, row: int, pid: int, at: float) -> list[str]:
        q = self.q
        return [k for (k,) in self.conn.execute(
            proc_app._sql(self.conn, f'SELECT "key" FROM takeover_log WHERE id > {q}'
                                     f" AND event = 'start' AND pid = {q} AND at >= {q}"),
            (row, pid, at)).fetchall()]

    def leased(self) -> Counter[int]:
        """pid -> jobs it holds leased now: the ones it runs, and those waiting for a free
        thread of its (leased in the same claim)."""
        rows = self.conn.execute("SELECT lease_owner FROM justonce_jobs WHERE state = 'running'").fetchall()
        return Counter(pid_of(r[0]) for r in rows if r[0])

    def pick_victims(self) -> list[Tenure]:
        """PER_ROUND slot holders that run jobs. The first is, if one turns up within a
        second, a holder that has jobs leased beyond its threads (waiting to start, what a
        woken worker must drop); the others are stopped wherever they are (mid-claim,
        say: a claim must not go through for a slot lost meanwhile)."""
        ours = {w.pid for w in self.workers}
        deadline = time.monotonic() + 1.0
        while True:
            holders = {pid: t for pid, t in self.watcher.live_holders().items() if pid in ours}
            leased = self.leased()
            busy = sorted(pid for pid in holders if leased[pid])
            queued = [pid for pid in busy if leased[pid] > CONCURRENCY]
            if len(busy) >= PER_ROUND and (queued or time.monotonic() >= deadline):
                first = self.rng.choice(queued or busy)
                rest = self.rng.sample([pid for pid in busy if pid != first], PER_ROUND - 1)
                return [holders[pid] for pid in [first, *rest]]
            time.sleep(0.005)

    def freeze_round(self) -> None:
        """SIGSTOP PER_ROUND slot holders that run jobs, past their lease, until a standby
        holds each one's slot and has started jobs of it; then SIGCONT them."""
        row = self.last_row()
        victims = self.pick_victims()
        stopped = time.time()
        for v in victims:
            os.kill(v.pid, signal.SIGSTOP)
        for v in victims:
            wait_stopped(v.pid)
        freezes = [Freeze(v.pid, v.slot, v.token, stopped) for v in victims]
        self.freezes.extend(freezes)
        if self.sqlite and not sqlite_write_lock_free(self.url):
            for f in freezes:
                os.kill(f.pid, signal.SIGCONT)
                f.continued_at, f.called_off = time.time(), True
            time.sleep(0.3)
            return

        def taken_over() -> bool:
            for f in freezes:
                f.successor = self.watcher.successor(f.slot, f.token)
                if f.successor is not None:
                    keys = self.starts_since(row, f.successor.pid, f.successor.acquired_at)
                    f.successor_starts = sum(partition_of(k, N) == f.slot for k in keys)
            return time.time() - stopped >= FROZEN_FOR and all(
                f.successor is not None and f.successor_starts >= SUCCESSOR_STARTS for f in freezes)

        # A standby takes a slot about LEASE + HEARTBEAT after its holder stopped. One that
        # is stopped inside an open transaction may hold the slot's row (a fenced claim)
        # and keep it: such a freeze ends after GIVE_UP and does not count.
        deadline = stopped + FROZEN_FOR + GIVE_UP
        while not taken_over() and time.time() < deadline:
            self.top_up()
            time.sleep(0.05)
        for f in freezes:
            if f.successor is None:
                f.note = self.snapshot(f)
        continued = time.time()
        for f in freezes:
            os.kill(f.pid, signal.SIGCONT)
            f.continued_at = continued
        time.sleep(0.5)  # the woken ones find their slots gone and stand by

    def snapshot(self, f: Freeze) -> str:
        """Why might no standby have taken ``f``'s slot? Its row, the holders and standbys,
        each worker's process state (T: stopped), SQLite's write lock: for the report."""
        now = time.time()
        token, pid, expires = self.watcher.current.get(f.slot, (None, None, None))
        left = "?" if expires is None else f"{expires - now:+.1f}s"
        holders = {p: t.slot for p, t in self.watcher.live_holders().items()}
        states = {w.pid: process_state(w.pid) for w in self.workers}
        lock = (f"; SQLite write lock free: {sqlite_write_lock_free(self.url, 0.2)}, "
                f"file locks {sqlite_file_locks(self.url)}" if self.sqlite else "")
        return (f"slot {f.slot} row: token {token} (frozen with {f.token}), pid {pid}, expiry {left} "
                f"from now, watcher polls {self.watcher.polls}, error {self.watcher.error!r}; "
                f"holders pid->slot {holders}; standbys "
                f"{[w.pid for w in self.workers if w.pid not in holders]}; states {states}{lock}")

    def taken_over(self) -> list[Freeze]:
        return [f for f in self.freezes if f.successor is not None]

    def called_off(self) -> list[Freeze]:
        return [f for f in self.freezes if f.called_off]

    def stop_workers(self) -> None:
        for w in self.workers:
            w.signal(signal.SIGCONT)
            w.signal(signal.SIGTERM)
        for w in self.workers:
            w.wait(20)
        self.conn.close()


# -- what happened ----------------------------------------------------------------------------


@dataclass
class Execution:
    run: str
    n: int
    key: str
    pid: int
    start: float  # the worker's decision to start it (current_job().started_at)
    written: float  # the database's time when the start row was written
    job_id: int | None  # the job's row when the start row was written (None: no longer live)
    state: str | None
    attempt: int | None
    owner: int | None
    lease_expires: float | None
    end: float | None = None

    @property
    def slot(self) -> int:
        return partition_of(self.key, N)

    @property
    def stalled(self) -> bool:
        """Its start row was written long after its start: frozen or stalled in between,
        and the row's look at the job is of that later moment."""
        return self.written - self.start > STALLED_START


def executions(url: str) -> list[Execution]:
    out: dict[str, Execution] = {}
    ends: dict[str, float] = {}
    for run, n, key, pid, event, at, db_at, job_id, state, attempts, owner, expires, decided in \
            proc_app.takeover_rows(url):
        if event == "start":
            # A run starts when its worker decided to start it (its last check of lease and
            # slot, just before calling the task), which a stop may part from the code's
            # first line: then the run stalled before its start row, it did not start late.
            start = at if decided is None else decided
            out[run] = Execution(run, n, key, pid, start, db_at, job_id, state, attempts,
                                 pid_of(owner), expires)
        else:
            ends[run] = at
    for run, at in ends.items():
        out[run].end = at
    return sorted(out.values(), key=lambda e: e.start)


class Verdict:
    """The checks of the module docstring over one run, as counts and examples."""

    def __init__(self, s: Scenario, history: History, runs: list[Execution],
                 jobs: dict[int, str], logs: dict[int, list[dict[str, Any]]]) -> None:
        self.s, self.history, self.runs, self.logs = s, history, runs, logs
        self.events = Counter(e.get("event") for events in logs.values() for e in events)
        self.succeeded = Counter(e["job_id"] for events in logs.values() for e in events
                                 if e.get("event") == "job.succeeded")
        self.t0 = min((e.start for e in runs), default=0.0)
        self.failures: dict[str, list[str]] = defaultdict(list)
        self.holes: set[str] = set()
        self.overlapped = 0
        self.frozen_at_start = 0
        self.stalled_at_start = 0
        freezes: dict[int, list[Freeze]] = defaultdict(list)
        for f in s.freezes:
            freezes[f.pid].append(f)
        self.freezes_of = freezes
        self.check_jobs(jobs)
        ok_slot = {e.run for e in runs if self.check_slot(e)}
        ok_lease = {e.run for e in runs if self.check_lease(e)}
        self.check_attempts(ok_lease)
        self.bad_wakes = {self.woken_by(e) for e in runs
                          if e.run not in ok_slot or e.run not in ok_lease} - {None}
        self.check_overlaps(ok_slot & ok_lease)

    def warnings_between(self, a: float, b: float) -> list[str]:
        """The workers' partition events and warnings logged between ``a`` and ``b``."""
        out = []
        for pid, events in self.logs.items():
            for e in events:
                name, level = str(e.get("event", "")), e.get("level")
                if (name.startswith("partition.") or level in ("warning", "error")) and \
                        "ts" in e and a <= log_time(e["ts"]) <= b:
                    extra = {k: v for k, v in e.items() if k in ("slot", "token", "error")}
                    out.append((e["ts"], f"{e['ts']} pid {pid} {level} {name}: {e.get('msg', '')} {extra}"))
        return [line for _, line in sorted(out)]

    def t(self, at: float | None) -> str:
        return "never" if at is None else f"+{at - self.t0:.3f}s"

    def woken_by(self, e: Execution) -> int | None:
        """The index of the freeze that ended last before ``e`` started, in its process."""
        ended = [(f.continued_at, i) for i, f in enumerate(self.s.freezes)
                 if f.pid == e.pid and f.continued_at <= e.start and not f.called_off]
        return max(ended)[1] if ended else None

    def frozen_between(self, pid: int, a: float, b: float) -> bool:
        return any(f.stopped_at < b and a < f.continued_at for f in self.freezes_of[pid])

    def check_jobs(self, jobs: dict[int, str]) -> None:
        for n, job_id in self.s.ids.items():
            if jobs.get(job_id) != "succeeded":
                self.failures["not succeeded"].append(f"job {job_id} (#{n}) is {jobs.get(job_id)}")
        for job_id, count in self.succeeded.items():
            if count > 1:
                self.failures["two successes"].append(f"job {job_id}: {count} job.succeeded lines")
        started = {e.n for e in self.runs if e.end is not None}
        for n in self.s.ids.keys() - started:
            self.failures["never ran to its end"].append(f"job {self.s.ids[n]} (#{n})")

    def check_slot(self, e: Execution) -> bool:
        holder = self.history.holder(e.slot, e.start)
        if holder is not None and holder.pid == e.pid:
            return True
        since = "nobody" if holder is None else (
            f"pid {holder.pid} since {self.t(holder.acquired_at)} (token {holder.token})")
        self.failures["started without its slot"].append(
            f"pid {e.pid} started job {e.job_id or self.s.ids[e.n]} (key {e.key}, slot {e.slot}) "
            f"at {self.t(e.start)}; the slot was held by {since}")
        return False

    def check_lease(self, e: Execution) -> bool:
        if e.stalled:
            # Its look at the lease came seconds after its code began: its process was
            # frozen in between, or the database was (SQLite: another process frozen with
            # the write lock; README, "SQLite and frozen processes"), and leases ran out
            # meanwhile. The start itself was checked by the worker, not seen here.
            if self.frozen_between(e.pid, e.start, e.written):
                self.frozen_at_start += 1
            else:
                self.stalled_at_start += 1
            return True
        job = self.s.ids[e.n]
        if e.job_id == job and e.state == "running" and e.owner == e.pid and \
                e.lease_expires is not None and e.lease_expires >= e.start:
            return True
        if e.job_id is None:
            why = "the job had already succeeded elsewhere"
        elif e.state != "running":
            why = f"the job had been re-offered (state {e.state})"
        elif e.owner != e.pid:
            why = f"the job was leased to pid {e.owner} (attempt {e.attempt})"
        else:
            why = f"its lease had expired at {self.t(e.lease_expires)}"
        self.failures["started without its job lease"].append(
            f"pid {e.pid} started job {job} (key {e.key}) at {self.t(e.start)}: {why}")
        return False

    def check_attempts(self, ok: set[str]) -> None:
        by_job: dict[int, list[Execution]] = defaultdict(list)
        for e in self.runs:
            # A start row written long after its code began (stalled) looked at the job's
            # row then, not at its start: by then a later attempt may hold the job (even
            # in the same process), and its attempt number says nothing of this run's.
            if e.stalled:
                continue
            if e.run in ok and e.attempt is not None and e.owner == e.pid:
                by_job[e.n].append(e)
        for n, runs in by_job.items():
            attempts = [e.attempt for e in runs]
            if attempts != sorted(set(attempts)):
                self.failures["attempts out of order"].append(
                    f"job {self.s.ids[n]}: attempts started in the order {attempts}: " + ", ".join(
                        f"[pid {e.pid} at {self.t(e.start)}, written {self.t(e.written)}, ended "
                        f"{self.t(e.end)}, lease to {self.t(e.lease_expires)}]" for e in runs))

    def check_overlaps(self, clean: set[str]) -> None:
        by_key: dict[str, list[Execution]] = defaultdict(list)
        for e in self.runs:
            by_key[e.key].append(e)
        for key, runs in by_key.items():
            open_runs: list[Execution] = []
            for e in runs:  # in start order
                open_runs = [p for p in open_runs if p.end is None or p.end > e.start]
                for p in open_runs:
                    frozen = self.frozen_between(p.pid, p.start, p.end or float("inf")) or (
                        p.stalled)  # stalled before its first write
                    # The documented hole: code already running when its process (or the
                    # database) stalled overlaps the next run elsewhere. Within one process
                    # the worker never starts a job or key while an earlier run's code runs.
                    if frozen and p.run in clean and p.pid != e.pid:
                        self.holes.add(p.run)
                        self.overlapped += 1
                        continue
                    self.failures["two runs of one key at once"].append(
                        f"key {key}: pid {e.pid} started job {self.s.ids[e.n]} at {self.t(e.start)} "
                        f"while pid {p.pid} ran job {self.s.ids[p.n]} ({self.t(p.start)} to "
                        f"{self.t(p.end)}{', frozen' if frozen else ''})")
                open_runs.append(e)

    def report(self) -> str:
        ev = self.events
        taken = self.s.taken_over()
        off = len(self.s.called_off())
        ran = sum(f.successor_starts >= SUCCESSOR_STARTS for f in taken)
        reruns = sum(c - 1 for c in Counter(e.n for e in self.runs).values() if c > 1)
        lines = [
            f"{len(self.s.ids)} jobs, {len(self.runs)} executions ({reruns} re-runs), "
            f"{len(self.s.freezes)} freezes: {len(taken)} taken over ({ran} with jobs of the slot "
            f"run by the new holder before the wake), {len(self.s.freezes) - len(taken) - off} "
            f"not taken over, {off} called off (a stopped process held SQLite's write lock); "
            f"{self.history.takeovers()} takeovers in all ({self.history.missed} seen only in "
            f"the logs), {self.s.watcher.polls} lease polls",
            f"woken processes that then started what they must not: after {len(self.bad_wakes)} "
            f"of {len(taken)} freezes",
            f"allowed: {len(self.holes)} runs frozen mid-way overlapped by {self.overlapped} runs "
            f"of the next holder, {self.frozen_at_start} runs frozen and {self.stalled_at_start} "
            "stalled by the database before their start row, "
            f"{ev['job.rejected']} rejected late writes, {ev['job.lease_lost']} job leases lost, "
            f"{ev['partition.lost']} slots lost",
        ]
        for f in self.s.freezes:
            if f.successor is None and not f.called_off:
                lines.append(f"not taken over: pid {f.pid} stopped at {self.t(f.stopped_at)} "
                             f"for {f.continued_at - f.stopped_at:.1f}s; {f.note}")
                lines.extend(f"    {x}" for x in self.warnings_between(f.stopped_at, f.continued_at)[:12])
        for kind, examples in self.failures.items():
            lines.append(f"VIOLATION {kind}: {len(examples)}, e.g.")
            lines.extend(f"    {x}" for x in examples[:4])
        return "\n".join(lines)


def job_states(url: str) -> dict[int, str]:
    conn = proc_app.ledger_connect(url)
    try:
        return dict(conn.execute("SELECT id, state FROM justonce_jobs WHERE queue = 'takeover'").fetchall())
    finally:
        conn.close()


# -- the test ---------------------------------------------------------------------------------


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    with proc_app_on(db_url) as a:
        proc_app.create_takeover_log(db_url)
        yield a


def test_a_worker_frozen_past_its_partition_lease_starts_nothing_that_moved_on_when_it_wakes(
    app: App, db_url: str, tmp_path: Path
) -> None:
    """6 partitioned workers for 4 slots, a flow of keyed 10 ms jobs, and FREEZES holders
    SIGSTOPped past their lease (two at a time) until a standby runs their slot, then
    SIGCONTed. Every job succeeds once; no start by a process that had lost the key's slot
    or the job's lease; no two runs of a key at once but the documented frozen-mid-run
    hole."""
    with fleet_on(db_url, tmp_path) as fleet, LeaseWatcher(db_url) as watcher:
        s = Scenario(app, db_url, fleet, watcher)
        assert {partition_of(k, N) for k in KEYS} == set(range(N))
        s.enqueue(FIRST_JOBS)
        s.start_workers()
        wait_for(lambda: len(watcher.live_holders()) == N, 30, "4 slot holders")
        rounds = 0
        while len(s.taken_over()) < FREEZES:
            rounds += 1
            assert rounds <= MAX_ROUNDS, (
                f"only {len(s.taken_over())} takeovers in {rounds - 1} rounds "
                f"({len(s.called_off())} freezes called off, {len(s.freezes)} in all); "
                + "; ".join(f"pid {f.pid}: {f.note}" for f in s.freezes if f.note)[:3000])
            assert all(w.popen.poll() is None for w in s.workers), "a worker exited"
            s.top_up()
            s.freeze_round()
        wait_for(lambda: s.backlog() == 0, 120, "every job to finish", interval=0.5)
        s.stop_workers()
    assert watcher.error is None, f"the lease watcher failed: {watcher.error!r}"
    logs = {w.pid: w.events() for w in s.workers}
    history = History(watcher, logs)
    verdict = Verdict(s, history, executions(db_url), job_states(db_url), logs)
    report = verdict.report()
    print(f"\n[{db_url.split(':', 1)[0]}] {report}")
    assert len(s.taken_over()) >= FREEZES
    # A freeze no standby took over is allowed now and then (its victim held the slot's
    # row); as many of them as the takeovers wanted would be a standby that seldom takes over.
    not_taken = len(s.freezes) - len(s.taken_over()) - len(s.called_off())
    assert not_taken < FREEZES, f"{not_taken} freezes were not taken over:\n{report}"
    for f in s.taken_over():
        assert f.successor is not None and f.successor.pid != f.pid and \
            f.stopped_at < f.successor.acquired_at < f.continued_at, (
                f"pid {f.pid} was stopped but slot {f.slot} (token {f.token}) was not taken over "
                f"by another process while it was: {f.successor}")
    assert not verdict.failures, report
