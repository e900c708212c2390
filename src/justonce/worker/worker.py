"""The worker: claims jobs, runs them on slot threads, records outcomes, keeps leases.

Threads of one worker process:
- ``concurrency`` slot threads. A slot with nothing to run becomes the fetcher (one at a
  time): it claims a batch and, when there is none, waits on the backend's waiter
  (LISTEN/NOTIFY on Postgres, ``data_version`` on SQLite; polling as the fallback).
- the acker: successful outcomes are written in batches (every ``ack_interval`` s or
  ``ack_batch`` outcomes), one fenced statement per batch.
- the supervisor: renews the leases of every job this worker holds (one statement), and
  fails jobs that ran past their timeout.
- the housekeeper: maintenance rounds (one worker in the fleet does each round).

Failures are written at once by the slot. Every write carries the lease token; a write
that is rejected means the lease was lost, and is logged.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .. import failpoints, validate
from ..errors import InvalidOption, JustonceError, PartitionConflict
from ..events import Event, emit, wanted
from ..models import ClaimedJob, Completion, Failure
from ..owner import default_owner
from ..partitions import parse_set_spec, slots
from ..types import JobState
from .executor import Executor
from .maintenance import Maintenance
from .partitions import PartitionKeeper
from .producer import Producer

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("justonce.worker")

PAUSE_RECHECK = 0.1
"""A leased job that has waited longer than this (seconds) since its claim starts only
after the worker has read the paused queues at most this long ago (see
Worker._queue_open): a job claimed just before its queue was paused starts within this
long of the pause, or not at all."""

_FAILURE_EVENTS = {
    "failed": Event.JOB_FAILED, "timeout": Event.JOB_TIMEOUT, "interrupted": Event.JOB_INTERRUPTED,
    "unknown_task": Event.JOB_UNKNOWN_TASK, "bad_arguments": Event.JOB_BAD_ARGUMENTS,
    "undecodable": Event.JOB_UNDECODABLE,
}

_REPLY_LOST: dict[str, Any] = {"reply_lost": True}
"""The field of an outcome's event whose write's first reply was lost (it landed all the
same: the write was refused when tried again, and the row showed it ours)."""
_NOTHING: dict[str, Any] = {}


@dataclass(eq=False)
class _Slot:
    index: int
    abandoned: bool = False


@dataclass(eq=False)
class _Held:
    job: ClaimedJob
    valid_until: float
    """Monotonic time after which the job's lease may have run out (and the job been
    re-offered): from before the claim or the last successful renewal was sent, plus the
    lease, minus the worker's margin. An unstarted job past it is never started."""
    claimed: float = 0.0
    """Monotonic time the claim was sent: its queue was not paused then."""
    started: float | None = None
    deadline: float | None = None
    slot: _Slot | None = None
    finished: bool = False
    """An outcome was recorded (or is being written): lease checks leave it alone."""
    lost: bool = False
    code_started: bool = False
    """The last-instant check let its code start (an async job's waits for the event loop
    before that are not the code's: a timeout or shutdown then gives it back unstarted)."""
    counted_out: bool = False
    """The last-instant check stopped it before its code: counted out of the running jobs
    there (an async job's future may still end cancelled, not NotStarted, when a cancel
    raced the check: the slot must not count it out again)."""
    duration: float = 0.0
    future: concurrent.futures.Future[Any] | None = None


@dataclass
class WorkerStats:
    succeeded: int = 0
    failed: int = 0
    rejected: int = 0
    lost: int = 0
    claimed: int = 0
    extra: dict[str, int] = field(default_factory=dict)


_WAKEUP = -1
"""(The key of the wakeup fd the worker replaced, among the signal handlers it restores.)"""


def _noted(signum: int, frame: Any) -> None:
    """The Python-level handler of SIGTERM / SIGINT: nothing to do, the C-level handler
    already wrote the signal's byte to the worker's wakeup pipe."""


_FORK_STATE: dict[str, Any] = {}
"""What a Worker.run() on the main thread replaced (``saved``) and its pipe's write end,
while it runs."""


def _after_fork_in_child() -> None:
    """A process a job forks (multiprocessing's default on Linux, os.fork) inherits the
    worker's wakeup fd and its do-nothing handlers: a SIGTERM to the child (terminate(),
    a Pool's exit, systemd's whole control group, a terminal's Ctrl-C) wrote its byte to
    the parent's pipe and stopped the parent worker, and the child ignored it. The child
    gets the handlers and wakeup fd the worker found back."""
    state = dict(_FORK_STATE)
    _FORK_STATE.clear()
    if not state:
        return
    _put_back(state["saved"])
    with contextlib.suppress(OSError):
        os.close(state["write"])


def _put_back(saved: dict[int, Any]) -> None:
    """Put back what _install_signals replaced, in the order it was replaced (the wakeup
    fd first: a signal after it reaches the application's own), each even if another
    cannot be (a closed fd)."""
    for sig, old in saved.items():
        with contextlib.suppress(ValueError, OSError):
            if sig == _WAKEUP:
                signal.set_wakeup_fd(old)
            else:
                signal.signal(sig, old)


os.register_at_fork(after_in_child=_after_fork_in_child)


class Worker:
    """Runs the jobs of ``queues`` from ``app``'s database.

    ``lease``: seconds a claim is valid without renewal; the worker renews every
    ``heartbeat`` s (default ``lease / 3``). A worker that dies loses its leases within
    ``lease`` s and housekeeping re-offers its jobs. ``grace``: seconds in-flight jobs get
    to finish after a stop request; then each attempt still running is given up and counts
    (ready again at once, or dead on the job's last attempt). ``prefetch``: the most jobs
    leased at once; the worker leases about 50 ms of work at a time (see Producer), so
    only very short jobs reach it.

    ``partitions``: ``"SET:N"`` (or ``(set, n)``) makes a partitioned worker: it holds up to
    ``partition_slots`` slots of the set (standing by while all are held, taking over a slot
    whose holder stops renewing) and runs only the jobs with a ``partition_key`` whose slot
    it holds — one job per key at a time, in enqueue order.

    Nothing is started that may have been re-offered: a leased job is started only while
    its lease, by this process's monotonic clock and less a margin (a fifth of the lease,
    at most 2 s), cannot have run out, and a partitioned job only while its slot is held
    by the same rule. A pause longer than a heartbeat (the process was stopped, or starved)
    drops every leased job not yet started and renews the slots before the next claim.
    """

    def __init__(
        self, app: App, *, queues: Sequence[str] | None = None, concurrency: int = 4,
        lease: float = 15.0, heartbeat: float | None = None, poll: float = 1.0,
        grace: float = 30.0, listen: bool = True, prefetch: int = 250,
        ack_interval: float = 0.02, ack_batch: int = 500, housekeeping: bool = True,
        housekeeping_interval: float = 1.0, keep_succeeded: float = 86400.0,
        keep_dead: float = 7 * 86400.0, batch_retention: float = 7 * 86400.0,
        partitions: str | tuple[str, int] | None = None, partition_slots: int = 1,
        owner: str | None = None,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= 1000:
            raise InvalidOption(
                f"concurrency must be an integer in [1, 1000], not {validate.shown(concurrency)}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= 10000:
            raise InvalidOption(f"prefetch must be an integer in [1, 10000], not {validate.shown(prefetch)}")
        self.app = app
        if queues is None:
            queues = sorted({t.queue for t in app.tasks.values()}) or ["default"]
        if isinstance(queues, str) or not queues:
            raise InvalidOption("queues must be a non-empty list of queue names")
        self.queues = [validate.queue_name(q) for q in queues]
        self.concurrency = concurrency
        self.lease = validate.bounded(lease, "lease", 0.1, 86400)
        self.heartbeat = (validate.bounded(heartbeat, "heartbeat", 0.01, 86400)
                          if heartbeat is not None else self.lease / 3)
        if self.heartbeat >= self.lease:
            raise InvalidOption("heartbeat must be shorter than the lease")
        self.margin = min(self.lease / 5, 2.0)
        """Seconds of lease a job (or slot) must have left by our clock to be started."""
        if self.heartbeat >= self.lease - self.margin:
            # Past lease - margin an unstarted job is dropped and a slot is not claimed
            # for: renewals must come before that, or every cycle would waste both.
            raise InvalidOption(
                f"heartbeat must be shorter than the lease less its margin ({self.margin:g}s, "
                f"a fifth of the lease, at most 2s): under {self.lease - self.margin:g}s, "
                f"not {self.heartbeat:g}")
        self.poll = validate.bounded(poll, "poll", 0.001, 3600)
        self.grace = validate.bounded(grace, "grace", 0, 86400)
        self.listen = validate.flag(listen, "listen")
        housekeeping = validate.flag(housekeeping, "housekeeping")
        self.ack_interval = validate.bounded(ack_interval, "ack_interval", 0.001, 60)
        if isinstance(ack_batch, bool) or not isinstance(ack_batch, int) or not 1 <= ack_batch <= 100_000:
            raise InvalidOption(f"ack_batch must be an integer in [1, 100000], not {validate.shown(ack_batch)}")
        self.ack_batch = ack_batch
        housekeeping_interval = validate.bounded(housekeeping_interval, "housekeeping_interval",
                                                 0.01, 3600)
        keep_succeeded = validate.bounded(keep_succeeded, "keep_succeeded", 0, 10 * 365 * 86400)
        keep_dead = validate.bounded(keep_dead, "keep_dead", 0, 10 * 365 * 86400)
        batch_retention = validate.bounded(batch_retention, "batch_retention", 0, 10 * 365 * 86400)
        self.owner = owner or default_owner()
        self.backend = app.backend
        self.keeper = self._partition_keeper(partitions, partition_slots)
        self.producer = Producer(
            self.backend, self.queues, self.owner, self.lease, prefetch,
            partitions=None if self.keeper is None else self.keeper.fence,
        )
        self.executor = Executor(app)
        self.maintenance = (
            Maintenance(self.backend, self.owner, housekeeping_interval,
                        keep_succeeded=keep_succeeded, keep_dead=keep_dead,
                        batch_retention=batch_retention)
            if housekeeping else None
        )
        self.stats = WorkerStats()

        # Hot paths take the plain lock (a C-level context manager); the condition shares
        # it for the few places that wait or notify.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ready: deque[int] = deque()
        self._held: dict[int, _Held] = {}
        self._acks: list[Completion] = []
        self._unsure: set[tuple[int, int]] = set()
        """(id, token) of completions whose write raised: it may have committed (_settle)."""
        self._running = 0
        self._fetching = False
        self._stopping = False
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self._ack_wake = threading.Event()  # write now: a batch is full, a key waits, a stop
        self._ack_any = threading.Event()   # there are completions to write (or a stop)
        self._idle_since: float | None = None  # the first of the claims in a row that found nothing
        # Heartbeat and release are multi-row writes over overlapping rows (unstarted jobs);
        # run concurrently, in different orders, they deadlock in Postgres. One at a time.
        self._batch_write = threading.Lock()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._slot_of: dict[threading.Thread, _Slot] = {}
        self._grace_override: float | None = None
        self._recheck = False
        """A pause was seen: renew the slots before the next claim."""
        self._pauses_lock = threading.Lock()
        self._paused: set[str] = set()
        self._pauses_sent = -math.inf
        """When the read of the paused queues in ``_paused`` was sent (monotonic)."""
        self._in_code: dict[int, list[_Held]] = {}
        """The runs whose code is in this process now, by job id (a lease may be lost)."""
        self._keys_in_code: dict[int, list[_Held]] = {}
        """The same runs, by partition hash."""
        self._blocked = False
        """A leased job waits for an earlier run's code to return (see _pop_startable)."""
        self._waiter = self.backend.waiter(self.queues, listen=listen)
        self._runner: threading.Thread | None = None

    def _partition_keeper(self, spec: str | tuple[str, int] | None,
                          want: int) -> PartitionKeeper | None:
        if spec is None:
            return None
        set_name, n = parse_set_spec(spec) if isinstance(spec, str) else (
            validate.set_name(spec[0]), slots(spec[1]))
        if isinstance(want, bool) or not isinstance(want, int) or not 1 <= want <= n:
            raise InvalidOption(f"partition_slots must be an integer in [1, {n}], not {validate.shown(want)}")
        return PartitionKeeper(self.app.partitions, set_name, n, want, self.lease, self.owner,
                               margin=self.margin)

    # -- public control ----------------------------------------------------------------
    def run(self) -> None:
        """Run until :meth:`stop` (or SIGTERM / SIGINT when called on the main thread)."""
        saved: dict[int, Any] = {}
        pipe: dict[str, Any] = {}
        try:
            self._install_signals(saved, pipe)
            self._start_threads()
            emit(Event.WORKER_STARTED, "worker started", owner=self.owner, queues=self.queues,
                 concurrency=self.concurrency, backend=self.backend.name)
            # In steps: the main thread runs the application's own Python signal handlers,
            # and only when it runs (a signal another thread took while the process was
            # stopped waited for the stop otherwise).
            while not self._stop_requested.wait(0.5):
                pass
            self._shutdown()
        finally:
            try:
                _put_back(saved)
            finally:
                _FORK_STATE.clear()
                if "write" in pipe:  # the write end: the relay thread reads EOF and stops
                    pipe["ending"] = True
                    os.close(pipe["write"])
                self._done.set()

    def start(self) -> Worker:
        """Run in a background thread (for embedding and tests); returns self."""
        self._runner = threading.Thread(target=self.run, name="justonce-worker", daemon=True)
        self._runner.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        """Ask for a graceful stop: no new claims, in-flight jobs get ``grace`` seconds
        (default: the worker's), then whatever still runs is given up, its attempt counted."""
        if grace is not None:
            self._grace_override = grace
        self._stop_requested.set()
        self._waiter.close()

    def join(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def running(self) -> int:
        """Jobs running on this worker's slots now."""
        return self._running

    # -- threads -----------------------------------------------------------------------
    def _install_signals(self, saved: dict[int, Any], pipe: dict[str, Any]) -> None:
        """SIGTERM / SIGINT (and SIGHUP, unless ignored or handled already): the first
        asks for a graceful stop, a second stops at once.
        ``saved`` gets what was replaced (the wakeup fd first), step by step, so that
        run() puts back whatever was changed even if a signal interrupts this; ``pipe``
        gets the pipe's write end (``write``), and ``ending`` once run() is ending.

        The signal's byte reaches a pipe from the C-level handler (``set_wakeup_fd``),
        whichever thread the kernel gave the signal to, and a thread of ours reads it and
        acts. Python runs its own handlers only on the main thread, when that thread runs:
        a SIGTERM sent to a stopped worker (or right after its SIGCONT) goes to another
        thread, and the main thread, waiting on an Event, never ran the handler: the
        worker never stopped (reproduced on every backend). Nor does the relay act in a
        handler: one runs between any two steps of the main thread, maybe while it holds
        a lock, and a second signal close behind the first took that lock again. A child
        a job forks gets its handlers and wakeup fd back (see _after_fork_in_child)."""
        if threading.current_thread() is not threading.main_thread():
            return
        r, w = os.pipe()
        os.set_blocking(w, False)
        # SIGHUP (the terminal that started the worker closed) stops it gracefully too,
        # where nobody handles it: by default it killed the worker mid-job, every job it
        # held left to its lease. Under nohup (ignored) or a handler of the application's
        # own it stays as it is.
        hangup = signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        ours = (signal.SIGTERM, signal.SIGINT, *((signal.SIGHUP,) if hangup else ()))
        stops = {int(s) for s in ours}
        # The wakeup fd first, then the handlers: a signal between the two would reach the
        # old fd and a handler that does nothing, and be lost.
        saved[_WAKEUP] = theirs = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        pipe.update(write=w, ending=False)

        def relay() -> None:
            try:
                while got := os.read(r, 64):
                    if pipe["ending"]:
                        continue  # (run() is ending: its fd and handlers are going back)
                    if n := sum(1 for b in got if b in stops):
                        self._on_signals(n)
                    other = bytes(b for b in got if b not in stops)
                    if other and theirs >= 0:
                        # (the application's own handled signals: its wakeup fd gets them)
                        with contextlib.suppress(OSError):
                            os.write(theirs, other)
            except OSError:
                pass
            finally:
                os.close(r)  # (here, not by run(): no read of a number reused meanwhile)

        threading.Thread(target=relay, name="justonce-signals", daemon=True).start()
        _FORK_STATE.update(saved=saved, write=w)
        for sig in ours:
            saved[sig] = signal.signal(sig, _noted)  # (the byte is the wakeup fd's)

    def _on_signals(self, count: int) -> None:
        for _ in range(count):
            if self._stop_requested.is_set():
                emit(Event.WORKER_KILL, "second signal: stopping now")
                self._grace_override = 0.0
                with self._lock:
                    self._cond.notify_all()
            self.stop()

    def _spawn(self, target: Any, name: str, *args: Any) -> threading.Thread:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        if args and isinstance(args[0], _Slot):
            self._slot_of[t] = args[0]
        t.start()
        self._threads.append(t)
        return t

    def _start_threads(self) -> None:
        if self.keeper is not None:
            try:
                self.keeper.run_once()  # hold slots (or stand by) before the first claim
            except PartitionConflict:
                raise  # started with another n than the set's holders: a configuration error
            except Exception as exc:  # noqa: BLE001 - the supervisor tries again
                emit(Event.PARTITION_ERROR, "partition round failed", error=str(exc))
        for i in range(self.concurrency):
            self._spawn(self._slot_loop, f"justonce-slot-{i}", _Slot(i))
        self._spawn(self._ack_loop, "justonce-acker")
        self._spawn(self._supervise_loop, "justonce-supervisor")
        if self.maintenance is not None:
            self._spawn(self._maintenance_loop, "justonce-housekeeper")

    # -- slots -------------------------------------------------------------------------
    def _slot_loop(self, slot: _Slot) -> None:
        while True:
            try:
                held = self._next_job(slot)
            except Exception:  # noqa: BLE001 - a slot thread that died left the worker a slot short
                # Our own bookkeeping between jobs failed (a claim's aftermath, a give-back):
                # the thread died with it, and with it the worker's only fetcher, so that the
                # worker claimed nothing more until it was restarted. The slot goes on.
                emit(Event.SLOT_ERROR, "slot failed between jobs; going on", exc_info=True)
                if self._stop_requested.wait(0.5):
                    return
                continue
            if held is None:
                return
            try:
                self._execute(held)
            except BaseException:  # our own bookkeeping failed: never strand the job
                emit(Event.SLOT_ERROR, "slot failed; giving its job back", exc_info=True,
                     job_id=held.job.id)
                self._give_up(held)
            if slot.abandoned:
                return  # a replacement slot took over while this one was stuck

    def _startable(self, h: _Held, now: float) -> bool:
        """Whether a leased job may start now: its lease cannot have run out (by our clock,
        less the margin), and a partitioned job's slot is still held by the same rule."""
        if now >= h.valid_until:
            return False
        return h.job.partition_hash is None or self.keeper is None or self.keeper.holds(
            h.job.partition_hash)

    def _pop_startable(self, slot: _Slot, stale: list[_Held]) -> _Held | None:
        """Called with the lock held: take the first leased job that may start now, and
        mark it started. Jobs that may no longer start go to ``stale``. A job whose earlier
        attempt's code still runs in this process (its lease was lost while it ran: a
        pause, a stalled database), or a partitioned job whose key's earlier job's code
        does, stays in line until that code returns or passes its own timeout: within one
        process, two runs of a job or of a key never overlap (a timed-out sync task's
        thread is let go, as before)."""
        now = time.monotonic()
        waiting: list[int] = []
        found = None
        while self._ready:
            job_id = self._ready.popleft()
            nxt = self._held.get(job_id)
            if nxt is None:
                continue  # its lease was lost before it started
            if not self._startable(nxt, now):
                del self._held[job_id]
                stale.append(nxt)
                continue
            key = nxt.job.partition_hash
            if self._still_running(self._in_code.get(job_id), now) or (
                    key is not None and self._still_running(self._keys_in_code.get(key), now)):
                waiting.append(job_id)
                continue
            found = nxt
            break
        if waiting:
            self._ready.extendleft(reversed(waiting))
        self._blocked = bool(waiting)
        if found is None:
            return None
        found.started = now
        found.deadline = now + found.job.timeout
        found.slot = slot
        self._running += 1
        self._in_code.setdefault(found.job.id, []).append(found)
        if found.job.partition_hash is not None:
            self._keys_in_code.setdefault(found.job.partition_hash, []).append(found)
        return found

    @staticmethod
    def _still_running(runs: list[_Held] | None, now: float) -> bool:
        return any(r.deadline is None or now < r.deadline for r in runs or ())

    def _next_job(self, slot: _Slot) -> _Held | None:
        while True:
            stale: list[_Held] = []
            h: _Held | None = None
            free = 0  # > 0: this slot became the fetcher
            with self._lock:
                while True:
                    if self._stopping:
                        break
                    if self._ready:
                        h = self._pop_startable(slot, stale)
                        if h is not None:
                            break
                        # Every leased job waits for an earlier run's code: fetch or wait.
                    if len(self._acks) >= self.ack_batch:
                        # Back-pressure: while the database is not taking our completions,
                        # claiming more would only pile up leases to renew.
                        self._ack_wake.set()
                        self._cond.wait(0.05)
                        continue
                    if not self._fetching:
                        self._fetching = True
                        free = max(1, self.concurrency - self._running)
                        break
                    self._cond.wait(0.5)
            if stale:
                self._drop_stale(stale)
            if h is not None:
                return h
            if not free:
                return None  # stopping
            sent = time.monotonic()
            try:
                jobs = self._fetch(free)
            except BaseException:
                with self._lock:  # another slot fetches in its place
                    self._fetching = False
                    self._cond.notify_all()
                raise
            with self._lock:
                self._fetching = False
                late: list[ClaimedJob] = []
                if self._stopping:
                    late, jobs = jobs, []
                valid_until = sent + self.lease - self.margin
                for job in jobs:
                    self._held[job.id] = _Held(job, valid_until, claimed=sent)
                    self._ready.append(job.id)
                self.stats.claimed += len(jobs)
                self._cond.notify_all()
            if late:
                # Claimed while a stop began: give them back unstarted.
                self._release(late, refund=True)

    def _drop_stale(self, stale: list[_Held]) -> None:
        """Leased jobs that may no longer be ours to start (see _startable): give back the
        ones whose lease is still valid, unstarted; the others were re-offered already."""
        for h in stale:
            h.lost = True
        self.stats.extra["stale"] = self.stats.extra.get("stale", 0) + len(stale)
        emit(Event.JOB_DROPPED, "leased jobs dropped unstarted: their lease or slot may have run out",
             jobs=[h.job.id for h in stale][:50], count=len(stale))
        self._release([h.job for h in stale], refund=True)

    def _fetch(self, free: int) -> list[ClaimedJob]:
        """Claim the next batch; completions waiting to be written go in the same
        transaction (one commit per batch instead of two)."""
        if self._recheck and self.keeper is not None:
            # After a pause: learn which slots are still ours before claiming for them.
            self._recheck = False
            try:
                self._partition_round()
            except Exception as exc:  # noqa: BLE001 - the supervisor tries again
                emit(Event.PARTITION_ERROR, "partition round failed", error=str(exc))
        done = self._take_acks()
        try:
            accepted, jobs = self.producer.claim(self.producer.batch_size(free), done)
            if done and failpoints.ACTIVE:
                # (in the try: ``raise`` here is a reply lost after the COMMIT)
                failpoints.hit("ack.after_commit")
        except Exception as exc:  # the fetching slot must survive anything the DB throws
            self._return_acks(done, unsure=True)
            emit(Event.CLAIM_ERROR, "claim failed, retrying", error=str(exc),
                 exc_info=not isinstance(exc, JustonceError))
            self._stop_requested.wait(min(self.poll, 1.0))
            return []
        if jobs and failpoints.ACTIVE:
            failpoints.hit("job.after_claim")
        try:
            self._settle(done, accepted)
        except Exception:  # noqa: BLE001 - the jobs just claimed must still be held and run
            # (raised here, they were leased to nobody: never renewed, never started, back
            # only when their lease ran out, an attempt spent)
            emit(Event.SLOT_ERROR, "logging the completions written with a claim failed; "
                 "the claimed jobs run", exc_info=True)
        if jobs and wanted(Event.JOB_CLAIMED, log):
            for job in jobs:
                emit(Event.JOB_CLAIMED, "job claimed", job_id=job.id, task=job.task,
                     queue=job.queue, attempt=job.attempts, token=job.lease_token,
                     queue_wait=job.queue_wait)
        if jobs:
            self._idle_since = None
        elif not self._stop_requested.is_set():
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            self._waiter.wait(self.poll, idle_for=now - self._idle_since)
        return jobs

    def _execute(self, h: _Held) -> None:
        def on_future(fut: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                h.future = fut

        if failpoints.ACTIVE:
            failpoints.hit("job.before_start")
        task = self.app.tasks.get(h.job.task)
        in_loop = task is not None and task.is_async  # (its code starts on the event loop)
        if not self._still_startable(h, starting=not in_loop):
            return

        def gate() -> bool:
            # An async job's code starts when the worker's event loop gets to it, which may
            # be long after the check above if other jobs' code holds the loop (a blocking
            # call, CPU between awaits): decided again then, on the loop, with nothing
            # awaited from the verdict to the task's code (so no cancel can land between
            # them). A read of the paused queues it needs is made here, on the loop (at
            # most one per PAUSE_RECHECK for the process, only for jobs held that long); a
            # give-back is handed to a thread, not awaited.
            verdict = self._start_verdict(h, paused=not self._queue_open(h), starting=True)
            if verdict is None:
                return True
            if verdict:
                threading.Thread(target=self._give_back, args=(h, verdict),
                                 name="justonce-give-back", daemon=False).start()
            return False

        try:
            outcome = self.executor.run(replace(h.job, started_at=time.time()), on_future, gate)
        finally:
            with self._lock:
                self._out_of_code(h)
        with self._lock:
            # Counted out once, by whichever comes first: the last-instant check on the
            # event loop (it stopped the job: its give-back or the supervisor's failure
            # stands), or this slot (its code ran, or its future was cancelled before the
            # loop got to it; the check then lets nothing start).
            if h.counted_out:
                return
            h.counted_out = True
            if not (h.slot is not None and h.slot.abandoned):
                self._running -= 1  # an abandoned slot was already counted out
        if failpoints.ACTIVE:
            failpoints.hit("job.after_run")
        self.producer.observe(outcome.duration)
        with self._lock:
            if self._stopping:
                self._cond.notify_all()  # the shutdown waits for running jobs
            if h.finished or h.lost:
                # The supervisor already failed it (timeout) or the lease was lost.
                discarded = True
            else:
                discarded = False
                h.finished = True
                h.duration = outcome.duration
                if outcome.completion is not None:
                    if not self._acks:
                        self._ack_any.set()
                    self._acks.append(outcome.completion)
                    # A partitioned job's completion unblocks the next job of its key:
                    # write it now rather than at the next ack interval.
                    if len(self._acks) >= self.ack_batch or self.keeper is not None:
                        self._ack_wake.set()
                    return
                self._forget(h.job.id, h.job.lease_token)
        if discarded:
            emit(Event.JOB_DISCARDED, "outcome discarded: the job's lease was lost or it timed out",
                 job_id=h.job.id, task=h.job.task, queue=h.job.queue, outcome=outcome.kind)
            return
        assert outcome.failure is not None
        self._record_failure(h.job, outcome.failure, outcome.kind, outcome.duration)

    def _queue_open(self, h: _Held) -> bool:
        """Whether a leased job's queue may still be open. Its claim found the queue not
        paused; a job held longer than PAUSE_RECHECK since starts only if a read of the
        paused queues sent within the last PAUSE_RECHECK (so after its claim) does not name
        its queue. The read is made here when needed: only by a worker that holds jobs
        that long (a wrong guess of how many to prefetch, slow jobs), at most once per
        PAUSE_RECHECK. A read that fails cannot tell: the last set read stands until the
        next try (a job of a queue in it is given back, which is always safe; the others
        start, as their claims allowed)."""
        open_ = self._queue_open_cached(h)
        if open_ is not None:
            return open_
        self._read_pauses()
        return h.job.queue not in self._paused

    def _queue_open_cached(self, h: _Held) -> bool | None:
        """``_queue_open`` without the database: None when it would need a fresh read."""
        now = time.monotonic()
        if now - h.claimed <= PAUSE_RECHECK:
            return True
        if now - self._pauses_sent <= PAUSE_RECHECK:
            return h.job.queue not in self._paused
        return None

    def _read_pauses(self) -> None:
        """Read the paused queues unless a read was sent within PAUSE_RECHECK (by any thread)."""
        with self._pauses_lock:
            if time.monotonic() - self._pauses_sent > PAUSE_RECHECK:
                sent = time.monotonic()
                try:
                    self._paused = {p.queue for p in self.backend.queue_pauses()}
                except Exception:  # noqa: BLE001 - the database is down: try again later
                    pass
                self._pauses_sent = sent

    def _still_startable(self, h: _Held, starting: bool = True) -> bool:
        """Decide again, at the last instant before the job's code runs, whether it may
        start. The slot chose it under the lock, but then may have waited: on a stale job's
        release (a write that waits for SQLite's lock), or for the whole of a pause (the
        process was stopped there). Meanwhile the lease or the key's slot may have moved on,
        or its queue been paused (_queue_open). A job that may no longer start is given
        back unstarted, its attempt refunded."""
        verdict = self._start_verdict(h, paused=not self._queue_open(h), starting=starting)
        if verdict is None:
            return True
        self._give_back(h, verdict)
        return False

    def _start_verdict(self, h: _Held, paused: bool, starting: bool = True) -> str | None:
        """Without the database: None if the job may start now; else it will not start and
        is counted out (under the lock), and the answer says how it is to be given back
        (``_give_back``): "paused", "stale" (lease or slot gone), or "" (nothing to give
        back: its lease is gone already, a renewal that failed or the shutdown, or the
        supervisor has failed it for its timeout while it waited for the event loop)."""
        with self._lock:
            if (not paused and not h.lost and not h.finished and not h.counted_out
                    and not self._stopping and self._startable(h, time.monotonic())):
                if starting:  # (else the event loop decides again, right before its code)
                    h.code_started = True
                    # The timeout is the code's, counted from here (as an async task's own
                    # deadline is): waiting for the event loop was not running.
                    h.deadline = time.monotonic() + h.job.timeout
                return None
            # Counted out once: the slot may have done it already (its future was cancelled
            # before the loop got to it). Nothing to give back then, nor when the supervisor
            # failed it for its timeout meanwhile, nor when its lease is gone already.
            first = not h.counted_out
            give_back = first and not h.lost and not h.finished
            h.counted_out = h.lost = True
            if self._held.get(h.job.id) is h:
                del self._held[h.job.id]
            if first and not (h.slot is not None and h.slot.abandoned):
                self._running -= 1
            self._out_of_code(h)
            if self._stopping:
                self._cond.notify_all()
        if not give_back:
            return ""
        return "paused" if paused else "stopping" if self._stopping else "stale"

    def _give_back(self, h: _Held, verdict: str) -> None:
        """The database's part of a job that will not start (see ``_start_verdict``)."""
        if verdict == "paused":
            emit(Event.QUEUE_PAUSE_SEEN, "a leased job's queue was paused: given back unstarted",
                 job_id=h.job.id, queue=h.job.queue)
            self._release([h.job], refund=True)
        elif verdict == "stopping":
            # (SIGTERM came while it waited for the event loop: an unstarted job, given
            # back at once like the others, its attempt not counted)
            self._release([h.job], refund=True)
        elif verdict == "stale":
            self._drop_stale([h])

    def _out_of_code(self, h: _Held) -> None:
        """Called with the lock held when a job's code has returned (or raised)."""
        for runs, key in ((self._in_code, h.job.id), (self._keys_in_code, h.job.partition_hash)):
            mine = runs.get(key) if key is not None else None
            if mine is None:
                continue
            try:
                mine.remove(h)
            except ValueError:
                pass
            if not mine and key is not None:
                del runs[key]
        if self._blocked:
            self._blocked = False  # let the slots look again
            self._cond.notify_all()

    def _give_up(self, h: _Held) -> None:
        with self._lock:
            h.lost = True
            if self._held.get(h.job.id) is h:
                del self._held[h.job.id]
            if not (h.slot is not None and h.slot.abandoned) and h.started is not None:
                self._running = max(0, self._running - 1)
            self._cond.notify_all()
        if not h.code_started:  # (set only after the slot took it: started too)
            self._release([h.job], refund=True)
        else:
            self._interrupt([h.job], "the worker's bookkeeping failed while it ran")

    def _interrupt(self, jobs: list[ClaimedJob], why: str) -> None:
        """End the attempt of jobs that started and are given up before they finished: the
        attempt counts, as a lease that runs out would count it. A job with attempts left
        is ready again at once; one on its last attempt ends dead (its batch item failed),
        so a job that never finishes within a stop's grace cannot run past max_attempts.
        A write that fails leaves the job to its lease, whose rescue does the same; after
        one failed write the rest are left to theirs too (a stop must not wait on a
        database that is down, job after job)."""
        for job in jobs:
            failure = Failure(job.id, job.lease_token,
                              f"interrupted during attempt {job.attempts}: {why} ({self.owner})",
                              retry_in=0.0, batch_item=job.batch_item)
            if not self._record_failure(job, failure, "interrupted", 0.0, tries=1):
                return

    def _record_failure(self, job: ClaimedJob, failure: Failure, kind: str, duration: float,
                        tries: int = 3) -> bool:
        """Write a failed attempt (``tries`` times at most); False if it could not be written.

        A try that raised may have committed all the same (a reply lost after the COMMIT):
        a refusal of the next try is then checked against the row (see _failure_landed)."""
        state = None
        raised = reply_lost = False
        for attempt in range(tries):
            try:
                state = self.backend.job_fail(failure, kind)
                failpoints.hit("fail.after_commit")  # (in the try: see _fetch)
                break
            except Exception as exc:
                raised = True
                if attempt == tries - 1:
                    emit(Event.JOB_FAIL_WRITE_ERROR, "could not record failure; the lease will "
                         "expire and the job will be re-offered", job_id=job.id, error=str(exc))
                    return False
                time.sleep(0.2 * (attempt + 1))
        if state is None and raised:
            state = self._failure_landed(job, failure)
            reply_lost = state is not None
        if state is None:
            self.stats.rejected += 1
            emit(Event.JOB_REJECTED, "late write rejected: lease lost", job_id=job.id,
                 task=job.task, queue=job.queue, outcome=kind, token=job.lease_token)
            return True
        self.stats.failed += 1
        event = _FAILURE_EVENTS.get(kind, Event.JOB_FAILED)
        if wanted(event, log):
            emit(event, f"job {kind}", job_id=job.id, task=job.task, queue=job.queue,
                 attempt=job.attempts, token=job.lease_token, state=state.value,
                 retry_in=None if failure.retry_in is None else round(failure.retry_in, 3),
                 duration_ms=round(duration * 1000, 3),
                 error=failure.error.splitlines()[-1][:200] if failure.error else None,
                 **(_REPLY_LOST if reply_lost else _NOTHING))
        return True

    def _failure_landed(self, job: ClaimedJob, failure: Failure) -> JobState | None:
        """The state an earlier try of ``failure``'s write left, if the row shows that it
        committed; None when it did not, or cannot be told. Claimed only when unambiguous:
        the row still carries our lease token (no claim since ours), is ready, scheduled or
        dead (what our write makes), with our attempt count (an operator's retry resets it)
        and our error as its last (the lease's expiry writes its own). A row that moved on
        (claimed again, cancelled) cannot tell, and is reported refused, as before."""
        try:
            row = self.backend.job_settled([(failure.id, failure.lease_token)]).get(failure.id)
        except Exception as exc:  # noqa: BLE001 - cannot tell: reported refused
            emit(Event.JOB_FAIL_WRITE_ERROR, "could not read whether a failure whose reply was "
                 "lost was written", job_id=failure.id, error=str(exc))
            return None
        if (row is None or row.state not in (JobState.READY, JobState.SCHEDULED, JobState.DEAD)
                or row.attempts != job.attempts or row.last_error != failure.error):
            return None
        return row.state

    # -- acker -------------------------------------------------------------------------
    def _ack_loop(self) -> None:
        # Asleep while there is nothing to write (an idle worker's acker used to wake every
        # ack_interval for nothing); once there is, the batch collects for ack_interval,
        # or less when a write is wanted now. The wait on _ack_any is bounded all the same:
        # a wake-up missed would leave completions unwritten for a second, not forever.
        while not self._closed.is_set():
            self._ack_any.wait(1.0)
            self._ack_wake.wait(self.ack_interval)
            self._ack_wake.clear()
            self._ack_any.clear()
            try:
                self._flush_acks()  # (a batch it could not write goes back: _return_acks)
            except Exception:
                emit(Event.ACK_ERROR, "ack round failed", level=logging.ERROR, exc_info=True)

    def _take_acks(self) -> list[Completion]:
        with self._lock:
            batch, self._acks = self._acks, []
        return batch

    def _return_acks(self, batch: list[Completion], unsure: bool = False) -> None:
        """Put completions back to be written again. ``unsure``: their write raised, and
        may have committed all the same (a reply lost after the COMMIT): a refusal of the
        next try is then checked against the rows (see _settle)."""
        if batch:
            with self._lock:
                self._acks[:0] = batch
                if unsure:
                    self._unsure.update((c.id, c.lease_token) for c in batch)
            self._ack_any.set()

    def _flush_acks(self) -> bool:
        """Write buffered completions; False if the database did not take them."""
        batch = self._take_acks()
        if not batch:
            return True
        try:
            failpoints.hit("ack.before_write")
            accepted = self.backend.job_complete_many(batch)
            failpoints.hit("ack.after_commit")  # (in the try: see _fetch)
        except Exception as exc:
            self._return_acks(batch, unsure=True)
            emit(Event.ACK_ERROR, "could not record completions, retrying", error=str(exc),
                 pending=len(batch), exc_info=not isinstance(exc, JustonceError))
            self._closed.wait(0.5)
            return False
        self._settle(batch, accepted)
        return True

    def _forget(self, job_id: int, token: int) -> _Held | None:
        """Drop the held entry of this claim (not of a later claim of the same job)."""
        h = self._held.get(job_id)
        if h is None or h.job.lease_token != token:
            return None
        del self._held[job_id]
        return h

    def _settle(self, batch: list[Completion], accepted: set[int]) -> None:
        """Forget written completions and log each outcome (or its rejection).

        A completion refused after an earlier try of it raised may have been written by
        that try (the connection broke after the COMMIT, before the reply): the refusal is
        then our own success, found by the row being ``succeeded`` under our lease token
        (no one else can write that: the token is ours until a new claim replaces it).
        When that cannot be read now, the completions go back to be written (and checked)
        again rather than be reported either way."""
        if not batch:
            return
        with self._lock:
            doubtful = [(c.id, c.lease_token) for c in batch
                        if c.id not in accepted and (c.id, c.lease_token) in self._unsure]
        landed: set[int] = set()
        if doubtful:
            try:
                settled = self.backend.job_settled(doubtful)
            except Exception as exc:
                back = set(doubtful)
                self._return_acks([c for c in batch if (c.id, c.lease_token) in back])
                batch = [c for c in batch if (c.id, c.lease_token) not in back]
                emit(Event.ACK_ERROR, "could not read whether completions whose reply was lost "
                     "were written, retrying", error=str(exc), pending=len(back),
                     exc_info=not isinstance(exc, JustonceError))
                self._closed.wait(0.5)  # (as after a failed write: no loop of refused writes)
            else:
                landed = {i for i, s in settled.items() if s.state is JobState.SUCCEEDED}
        info = wanted(Event.JOB_SUCCEEDED, log)
        with self._lock:
            self._unsure.difference_update((c.id, c.lease_token) for c in batch)
            helds = [self._forget(c.id, c.lease_token) for c in batch]
            self._cond.notify_all()
        for c, h in zip(batch, helds, strict=True):
            if c.id in accepted or c.id in landed:
                self.stats.succeeded += 1
                if info and h is not None:
                    emit(Event.JOB_SUCCEEDED, "job succeeded", job_id=c.id, task=h.job.task,
                         queue=h.job.queue, attempt=h.job.attempts, token=c.lease_token,
                         duration_ms=round(h.duration * 1000, 3), note=c.note,
                         batch_item=c.batch_item,
                         **(_REPLY_LOST if c.id in landed else _NOTHING))
            else:
                self.stats.rejected += 1
                emit(Event.JOB_REJECTED, "late completion rejected: lease lost", job_id=c.id,
                     task=h.job.task if h else None, queue=h.job.queue if h else None,
                     outcome="succeeded", token=c.lease_token)

    # -- supervisor: leases and timeouts -----------------------------------------------
    def _supervise_loop(self) -> None:
        tick = min(0.1, self.heartbeat / 4)
        next_beat = time.monotonic() + self.heartbeat
        while True:
            # A pause is measured across the sleep alone: a round's own wait on the database
            # (a pooled connection, a renewal behind a lock, a database that is away) is no
            # pause of the process, and counting it dropped every unstarted job for nothing.
            # Leases that run out while the round waits are caught by each job's (and each
            # slot's) monotonic deadline, which needs no ticking.
            before = time.monotonic()
            if self._closed.wait(tick):
                return
            slept = time.monotonic() - before
            try:
                if slept > tick + self.heartbeat:
                    self._after_pause(slept)
                    next_beat = time.monotonic()  # renew what is left at once
                self._check_timeouts()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.heartbeat
                    self._renew_leases()
                    if self.keeper is not None:
                        try:
                            self._partition_round()
                        except JustonceError as exc:  # the database is away: said in one line
                            emit(Event.PARTITION_ERROR, "partition round failed", error=str(exc))
            except Exception as exc:  # a dead supervisor would let every lease expire
                emit(Event.SUPERVISOR_ERROR, "supervisor round failed", error=str(exc),
                     exc_info=not isinstance(exc, JustonceError))

    def _after_pause(self, gap: float) -> None:
        """The process did not run for ``gap`` s (stopped, or starved): any lease may have
        run out meanwhile. Drop every leased job not yet started (giving back those whose
        lease is still valid) and renew the slots before the next claim."""
        with self._lock:
            unstarted = [self._held.pop(i) for i in self._ready
                         if (h := self._held.get(i)) is not None and h.started is None]
            self._ready.clear()
            self._recheck = True
        emit(Event.WORKER_PAUSED, "the worker was paused: unstarted jobs dropped, slots re-checked",
             seconds=round(gap, 3), dropped=len(unstarted))
        if unstarted:
            self._drop_stale(unstarted)

    def _partition_round(self) -> None:
        """Renew the slots (take more while standing by); give back the unstarted jobs
        of slots lost, and of slots no longer live by our clock."""
        assert self.keeper is not None
        self.keeper.run_once()
        with self._lock:
            now = time.monotonic()
            stale = [h for i in self._ready if (h := self._held.get(i)) is not None
                     and not self._startable(h, now)]
            for h in stale:
                del self._held[h.job.id]
            if stale:
                gone = {h.job.id for h in stale}
                self._ready = deque(i for i in self._ready if i not in gone)
        if stale:
            self._drop_stale(stale)

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        late: list[_Held] = []
        with self._lock:
            for h in self._held.values():
                if h.deadline is not None and not h.finished and not h.lost and now > h.deadline:
                    h.finished = True
                    late.append(h)
                    if h.slot is not None and h.future is None:
                        # A sync task cannot be interrupted: leave its thread to finish on
                        # its own (its outcome will be discarded) and start a new slot.
                        self._abandon(h.slot)
            for h in late:
                self._held.pop(h.job.id, None)
        for h in late:
            if h.future is not None:
                h.future.cancel()
        # A timeout that passed while the job waited for the event loop (other jobs' code
        # held it): its code never ran, so no attempt is charged; given back, in one write.
        unstarted = [h.job for h in late if not h.code_started]
        if unstarted:
            emit(Event.JOB_DROPPED, "jobs' timeouts passed before their code started (the event "
                 "loop was held): given back unstarted", jobs=[j.id for j in unstarted][:50],
                 count=len(unstarted))
            self._release(unstarted, refund=True)
        for h in late:
            if not h.code_started:
                continue
            task = self.app.tasks.get(h.job.task)
            failure = self.executor.failure_for(
                h.job, task, f"timeout: attempt {h.job.attempts} ran over {h.job.timeout:g}s"
            )
            self._record_failure(h.job, failure, "timeout", now - (h.started or now))

    def _abandon(self, slot: _Slot) -> None:
        """Called with the lock held: count the slot's job out and start a replacement."""
        slot.abandoned = True
        self._running -= 1
        self._spawn(self._slot_loop, f"justonce-slot-{slot.index}r", _Slot(slot.index))

    def _renew_leases(self) -> None:
        # Jobs with an outcome waiting to be written are left out: their completion goes
        # out within milliseconds, and leaving them out keeps this statement off the rows
        # the ack writes touch (two multi-row updates in different orders deadlock).
        with self._lock:
            pairs = [(i, h.job.lease_token) for i, h in self._held.items() if not h.finished]
        if not pairs:
            return
        sent = time.monotonic()
        try:
            failpoints.hit("heartbeat.before_write")
            with self._batch_write:
                renewed = self.backend.job_heartbeat(pairs, self.lease)
        except Exception as exc:
            emit(Event.HEARTBEAT_ERROR, "lease renewal failed", error=str(exc),
                 exc_info=not isinstance(exc, JustonceError))
            return
        lost = []
        valid_until = sent + self.lease - self.margin
        with self._lock:
            for job_id, token in pairs:
                h = self._held.get(job_id)
                if h is None or h.finished or h.job.lease_token != token:
                    continue
                if job_id in renewed:
                    h.valid_until = max(h.valid_until, valid_until)
                    continue
                h.lost = True
                lost.append(h)
                del self._held[job_id]
                if h.started is None:
                    try:
                        self._ready.remove(job_id)
                    except ValueError:
                        pass
                elif h.slot is not None and h.future is None and not h.slot.abandoned:
                    # A sync task cannot be stopped; its outcome will be discarded. Hand
                    # its slot's work to a new thread so a hung task cannot eat the slot.
                    self._abandon(h.slot)
        for h in lost:
            self.stats.lost += 1
            if h.future is not None:
                h.future.cancel()
            emit(Event.JOB_LEASE_LOST, "lease lost: the job was re-offered or cancelled",
                 job_id=h.job.id, task=h.job.task, queue=h.job.queue)

    # -- housekeeping ------------------------------------------------------------------
    def _maintenance_loop(self) -> None:
        assert self.maintenance is not None
        while not self._closed.wait(self.maintenance.interval):
            try:
                self.maintenance.run_once()
            except Exception as exc:
                emit(Event.MAINTENANCE_ERROR, "housekeeping failed", error=str(exc),
                     exc_info=not isinstance(exc, JustonceError))

    # -- shutdown ----------------------------------------------------------------------
    def _shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            unstarted = [self._held.pop(i) for i in self._ready if i in self._held]
            self._ready.clear()
            self._cond.notify_all()
        self._release([h.job for h in unstarted], refund=True)
        grace = self.grace if self._grace_override is None else self._grace_override
        stop_at = time.monotonic()
        deadline = stop_at + grace
        with self._lock:
            while self._running > 0 or self._fetching:
                left = deadline - time.monotonic()
                if self._grace_override is not None:
                    left = min(left, self._grace_override)  # a second signal cuts it short
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.1))
            # Claims that raced with the stop, and jobs still running after the grace.
            leftovers = [h for h in self._held.values() if not h.finished]
            for h in leftovers:
                h.lost = True
                self._held.pop(h.job.id, None)
        for h in leftovers:
            if h.future is not None:
                h.future.cancel()
        # (started by a slot but not in its code: an async job that waited for the event
        # loop all through the grace is unstarted too)
        self._release([h.job for h in leftovers if not h.code_started], refund=True)
        still_running = [h.job for h in leftovers if h.code_started]
        if still_running:
            emit(Event.WORKER_RELEASED, "grace period over: giving back running jobs",
                 jobs=[j.id for j in still_running])
        waited = time.monotonic() - stop_at
        self._interrupt(still_running, "the worker stopped: " + (
            f"its grace period ({grace:g}s) ran out" if waited >= grace else
            f"a second signal ended its grace period after {waited:.1f}s"))
        for _ in range(20):
            if self._flush_acks():
                with self._lock:
                    if not self._acks:
                        break
        with self._lock:
            unwritten = len(self._acks)
        if unwritten:
            emit(Event.WORKER_UNWRITTEN, "completions could not be written before stopping; their "
                 "jobs will be re-offered when their leases expire", count=unwritten)
        self._closed.set()
        self._ack_wake.set()
        self._ack_any.set()
        self._waiter.close()
        # Let the slots, acker, supervisor and housekeeper end before the worker reports
        # itself stopped (a caller may close the database next). A slot stuck in a sync
        # task that timed out is abandoned and not waited for.
        stuck = {id(h.slot) for h in leftovers if h.slot is not None}
        end = time.monotonic() + max(1.0, self.poll + 1.0)
        for t in self._threads:
            slot = self._slot_of.get(t)
            if t is threading.current_thread() or (slot is not None and (
                    slot.abandoned or id(slot) in stuck)):
                continue  # still in user code past the grace; its outcome is discarded
            t.join(timeout=max(0.0, end - time.monotonic()))
        self.executor.async_runner.close()
        if self.keeper is not None:
            self.keeper.release_all()  # a standby takes the slots at once
        emit(Event.WORKER_STOPPED, "worker stopped", owner=self.owner,
             succeeded=self.stats.succeeded, failed=self.stats.failed,
             rejected=self.stats.rejected)

    def _release(self, jobs: list[ClaimedJob], refund: bool) -> None:
        if not jobs:
            return
        try:
            with self._batch_write:
                self.backend.job_release([(j.id, j.lease_token) for j in jobs], refund)
        except Exception as exc:
            emit(Event.RELEASE_ERROR, "could not release jobs; their leases will expire",
                 error=str(exc))
