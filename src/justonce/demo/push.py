"""``justonce demo push``: the story of the first seed, run for real.

A Push ("Kitty lovers") goes to a list (everyone within 50 km of Sydney who is a kitty
lover; the list's criteria are stored serialised and turned into SQL). An A/B phase sends
each of two variants to 1,000 random users of the list; then the "rest" phase sends the
winner to the list minus those already reached (L minus R), started while the A/B phase is
still sending, so R is incomplete and the rest phase reaches for users the A/B phase is about
to reach: the race that sent duplicates in the seed.

By default each phase is the seed's shape: ``N`` jobs, one per slot, each running the list's
query with ``MOD(users.id, N) = k`` and sending its share in chunks through the effect
ledger (``push_app.send_push_slot``). ``--per-user-jobs`` sends one job per user instead.
Real worker processes send through a real SMTP server; the report counts what the server
received (no user may have two emails of the Push: the demo exits non-zero if one does) and
sets the Push's rate beside the mail server's own ceiling, measured at the start with the
same number of plain senders.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..backends import redact_url
from ..errors import DatabaseUnavailable, LeaseLost
from ..models import EffectInfo
from ..owner import owner_pid
from ..partitions import PartitionLease
from ..tasks import Enqueue
from . import connect, stop_workers, worker_env
from .mail import SMTP_ENV, Ceiling, Recorder, ThreadSMTP, measure_ceiling, render, start_smtp
from .push_app import CHUNK_LEASE, SENDERS_ENV, WINNER, app, send_push_email, send_push_slot
from .push_data import VARIANTS, create_push, create_schema, list_members, load_users, save_ab, save_reached

T = TypeVar("T")

AB_SIZE = 1000
KILL_AT = 0.4
"""--kill-one: the share of the list sent when a sending worker is killed."""


@dataclass
class Options:
    users: int = 200_000
    workers: int = 4
    senders: int = 4
    kill_one: bool = False
    smtp: str | None = None
    seed: int = 7
    per_user_jobs: bool = False
    redo: bool = False
    ceiling_seconds: float = 3.0


@dataclass
class Run:
    """What happened, for the report."""

    push_id: int
    """New on every run (the demo's tables are made anew, the effect ledger is kept)."""
    members: list[int]
    ab: list[int]
    setup_s: float
    users_s: float
    ceiling: Ceiling | None = None
    rest_enqueued: int | None = None
    killed: int | None = None
    kill_looks: int = 0
    """--kill-one: the looks for a worker inside a chunk (all workers frozen for each)."""
    elapsed: float = 0.0
    sent: int = 0
    in_doubt: int = 0
    """Entries in doubt after the run (a worker died between its sends and their done mark)."""
    delivered_in_doubt: list[str] = field(default_factory=list)
    """Of them, those whose message the SMTP server's log has: resolved done."""
    never_sent: list[str] = field(default_factory=list)
    """Of them, those the server never got: the users the run never reached."""
    never_received: list[str] | None = None
    """Users of the list with no message at the server after the run (before any redo)."""
    redone: int = 0
    busy_machine: bool = False
    """The machine was not quiet when the ceiling was measured (its number is low)."""

    @property
    def scope(self) -> str:
        return f"push:{self.push_id}"


def run_push_demo(database_url: str | None, opts: Options, out: Console) -> bool:
    if database_url:
        app.use_database(database_url)
    url = app.database_url
    app.migrate()
    # One demo Push per database at a time: its set-up drops and remakes the demo's tables,
    # which a Push still running there reads (it would lose its whole Push). The product's
    # own partition lease says whether one runs; it lapses 10 s after a demo that died.
    lease = app.partitions.try_acquire(DEMO_LEASE, 1, lease=10.0)
    if lease is None:
        out.print(f"[red]another `justonce demo push` is running on {redact_url(url)}: wait for it to end "
                  "(or use another database)[/red]")
        return False
    lease.start_renewing()
    # SIGTERM ends the demo through its finally blocks (its workers stopped, the workers it
    # froze to pick a victim let go on), not at once.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
    try:
        return _run(url, opts, out, lease)
    except LeaseLost as exc:
        # (The renewals failed past the lease: another demo may have taken the database and
        # remade its tables; nothing this run reads can be trusted any more.)
        out.print(f"[red]stopped: {exc}[/red]")
        return False
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        lease.release()


DEMO_LEASE = "justonce-demo-push"


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _held(lease: PartitionLease) -> None:
    """Stop unless this demo still holds its lease on the database (renewed in the
    background): once lost, another demo may have remade the tables this one reads. Lost:
    a renewal found it taken or expired, or none succeeded for twice the lease by this
    process's clock (a renewal held up for a few seconds on a busy machine is no reason)."""
    if lease.lost or not lease.alive_for(-lease.lease):
        raise LeaseLost("this demo's lease on the database ran out (its renewals failed: the "
                        "database was unreachable or busy); another `justonce demo push` may have "
                        "remade its tables, so this run stops")


def _run(url: str, opts: Options, out: Console, lease: PartitionLease) -> bool:
    conn = connect(url)
    run = _setup(conn, opts)
    _held(lease)
    mode = "one job per user" if opts.per_user_jobs else f"{opts.workers} slot jobs per phase"
    out.print(f"[bold]justonce demo push[/bold]: {opts.users:,} users, list of {len(run.members):,} "
              f"(kitty lovers within 50 km of Sydney), {opts.workers} worker processes × "
              f"{opts.senders} senders, {mode}, database {redact_url(url)}")
    if len(run.members) <= 2 * AB_SIZE:
        out.print(f"[yellow]a list of {len(run.members):,} is no bigger than the A/B phase's "
                  f"{2 * AB_SIZE:,}: the A/B phase takes all of it (variant A {len(run.ab[:AB_SIZE]):,}, "
                  f"B {len(run.ab[AB_SIZE:]):,}) and the rest phase finds no one left to race for; "
                  "--users 100000 or more shows it[/yellow]")
    out.print(f"set-up: {run.setup_s:.1f}s ({opts.users:,} users made and loaded in {run.users_s:.1f}s, "
              f"{opts.users / max(run.users_s, 1e-9):,.0f}/s)")
    controller, recorder, address = (None, None, opts.smtp) if opts.smtp else start_smtp()
    out.print(f"SMTP: {'your server at ' + opts.smtp if opts.smtp else 'a local server at ' + address}")
    assert address is not None
    # The ceiling first, before any worker starts: idle workers poll the database (on
    # MariaDB five of them took ~0.2 of a core with the server's share, and lowered the
    # ceiling by ~10 %), and nothing of justonce may run beside the plain senders.
    if not _await_quiet_machine():
        run.busy_machine = True
        out.print("[yellow]this machine stayed busy for 10 s after the set-up: the ceiling "
                  "is measured beside whatever runs[/yellow]")
    try:
        run.ceiling = measure_ceiling(address, opts.workers, opts.senders, opts.ceiling_seconds)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        # A measurement that went wrong is reported, and the Push still runs (its own
        # sends say whether the server works).
        out.print(f"[yellow]mail server ceiling not measured: {exc}[/yellow]")
    else:
        out.print(f"mail server ceiling: {run.ceiling.per_second:,.0f} messages/s from "
                  f"{run.ceiling.senders} plain smtplib senders ({opts.workers} processes × "
                  f"{opts.senders}, {run.ceiling.seconds:g}s, no database, no workers yet)")
    tag = secrets.token_hex(3)
    queue = f"push-{tag}"
    procs = _start_workers(url, queue, f"push-{tag}", address, opts)
    try:
        if not _await_started(procs):
            out.print("[yellow]the workers were still busy after 30 s: the Push starts "
                      "beside their start-up[/yellow]")
        _send(run, queue, opts, procs, out, recorder, lease)
    finally:
        stop_workers(procs)
    _settle(run)
    _held(lease)
    if recorder is not None:
        _reconcile(run, recorder, address, out, opts.redo)
        time.sleep(0.2)
    if controller is not None:
        controller.stop()
    ok = _report(out, run, recorder, opts)
    conn.close()
    return ok


def _setup(conn: Any, opts: Options) -> Run:
    t0 = time.perf_counter()
    create_schema(conn)
    load_users(conn, opts.users, opts.seed)
    users_s = time.perf_counter() - t0
    push_id = secrets.randbelow(10**9) + 1
    create_push(conn, push_id)
    members = list_members(conn)
    ab = random.Random(opts.seed).sample(members, min(2 * AB_SIZE, len(members)))
    save_ab(conn, push_id, {"A": ab[:AB_SIZE], "B": ab[AB_SIZE:]})
    return Run(push_id=push_id, members=members, ab=ab, setup_s=time.perf_counter() - t0, users_s=users_s)


def _start_workers(url: str, queue: str, pset: str, address: str, opts: Options) -> list[subprocess.Popen[Any]]:
    env = worker_env({**os.environ, SMTP_ENV: address, SENDERS_ENV: str(opts.senders)}, url)
    cmd = [sys.executable, "-m", "justonce", "worker", "--app", "justonce.demo.push_app:app",
           "--queues", queue, "--lease", "3", "--heartbeat", "0.5", "--grace", "10",
           "--log-level", "WARNING", "--housekeeping-interval", "0.5"]
    if opts.per_user_jobs:
        # Jobs partitioned by user: one process per slot of MOD(user_id, N), each running
        # one job per sender thread.
        cmd += ["--partitions", f"{pset}:{opts.workers}", "--concurrency", str(opts.senders)]
    else:
        # One slot job at a time per process (its sender threads share it): a process never
        # takes two slots while another has none.
        cmd += ["--concurrency", "1"]
    # One more process than slots: a standby, to take over the work of a worker that dies.
    count = opts.workers + 1
    return [subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL) for _ in range(count)]


def _await_calm(sample: Callable[[], dict[int, int]], quiet_cores: float, limit: float) -> bool:
    """Wait until the CPU ticks counted by ``sample`` (a counter per process, or one for
    the machine) grow by at most ``quiet_cores`` cores over two half seconds in a row, at
    most ``limit`` s; False if they did not. A counter that went (a process that ended)
    is not counted."""
    window = 0.5
    quiet = quiet_cores * window * os.sysconf("SC_CLK_TCK")
    end, calm, before = time.monotonic() + limit, 0, sample()
    while time.monotonic() < end:
        time.sleep(window)
        now = sample()
        used = sum(t - before[k] for k, t in now.items() if k in before)
        calm = calm + 1 if used <= quiet else 0
        if calm == 2:
            return True
        before = now
    return False


def _await_quiet_machine(limit: float = 10.0) -> bool:
    """Wait until this machine's CPUs fall quiet, at most ``limit`` s: the ceiling is the
    mail server's with the plain senders and nothing else. Right after the set-up a
    database on this machine may still be at work on what was loaded (purging,
    analysing: CPU, not I/O wait, which is not counted), and would take its share of the
    ceiling's cores. Quiet: all processes together under a quarter of a core (or 5 % of
    each core, on many) over two half seconds in a row (``/proc/stat``, which in a
    container counts the host's cores: the 5 % each keeps a busy host from always
    waiting the limit). False if the machine was not quiet by then; True at once where
    ``/proc/stat`` cannot say (not Linux)."""
    def busy() -> dict[int, int]:
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return {}
        # user nice system idle iowait irq softirq steal: all but idle and iowait
        return {0: sum(ticks) - ticks[3] - ticks[4]} if len(ticks) == 8 else {}

    if not busy():
        return True
    return _await_calm(busy, max(0.25, 0.05 * (os.cpu_count() or 1)), limit)


def _await_started(procs: list[subprocess.Popen[Any]], limit: float = 30.0) -> bool:
    """Wait until the workers have started (imports, connections, first claims: their CPU
    falls quiet), at most ``limit`` s, so that the sending time is the Push's and not the
    workers' start-up (started together, five workers keep a small machine's cores busy
    for seconds). Quiet: all of them together under a quarter of a core (or 5 % of a core
    each, for many) over two half seconds in a row (idle, they poll: five take ~0.1 of a
    core). False if they were not quiet by then; where ``/proc`` cannot say (not Linux),
    a fixed pause."""
    def ticks() -> dict[int, int]:
        out = {}
        for p in procs:
            try:
                with open(f"/proc/{p.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[p.pid] = int(fields[11]) + int(fields[12])  # utime + stime
            except (OSError, IndexError, ValueError):
                pass  # (gone)
        return out

    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        time.sleep(2.0)
        return True
    return _await_calm(ticks, max(0.25, 0.05 * len(procs)), limit)


def _enqueue_phase(run: Run, queue: str, opts: Options, phase: str, users: list[int] | None = None) -> None:
    if not opts.per_user_jobs:
        column = "ab.user_id" if phase == "ab" else "u.id"
        app.partitions.scan(send_push_slot, column=column, n=opts.workers, queue=queue,
                            kwargs={"push_id": run.push_id, "phase": phase},
                            description=f"push {run.push_id}, {phase} phase")
        return
    if phase == "ab":
        calls = [(uid, variant) for variant, ids in (("A", run.ab[:AB_SIZE]), ("B", run.ab[AB_SIZE:]))
                 for uid in ids]
    else:
        calls = [(uid, WINNER) for uid in users or ()]
    for at in range(0, len(calls), 5000):
        app.enqueue_many(Enqueue(send_push_email, args=(run.push_id, uid, variant, phase), partition_key=uid,
                                 queue=queue) for uid, variant in calls[at:at + 5000])


def _send(run: Run, queue: str, opts: Options, procs: list[subprocess.Popen[Any]], out: Console,
          recorder: Recorder | None, lease: PartitionLease) -> None:
    t1 = time.perf_counter()
    _enqueue_phase(run, queue, opts, "ab")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=out) as bar:
        task = bar.add_task("emails sent", total=len(run.members))
        pause, counted_at, done = 0.25, -math.inf, 0
        look, looked_at = 0.1, -math.inf
        while True:
            if time.perf_counter() - counted_at >= pause:
                t = counted_at = time.perf_counter()
                done = _again(lambda: app.effects.counts(run.scope)).get("done", 0)
                # A count reads every entry of the Push, and the database's CPU is shared
                # with the sending: keep the counts to ~2.5 % of one core of it. (Counting
                # at least every 2 s, as before, took 6-15 % of a core of MariaDB on a
                # list of 190,000, whose count takes 0.13-0.3 s there.) The bar moves less
                # often on a big list; the end is seen from the jobs table below. (Until
                # --kill-one has killed against a server other than the demo's own, the
                # count is what says when: it runs every loop then.)
                # Until the rest phase starts, every loop (a count of at most a few
                # thousand entries): the A/B phase takes well under a second on a fast
                # machine, and the rest phase must start in the middle of it.
                pause = (0.0 if run.rest_enqueued is None
                         else min(30.0, max(0.25, 40 * (time.perf_counter() - t))))
                bar.update(task, completed=done)
            if run.rest_enqueued is None and done >= min(AB_SIZE // 2, len(run.ab) // 4):
                _start_rest(run, queue, opts, bar.console)
            if opts.kill_one and run.killed is None and run.rest_enqueued is not None:
                # Done marks come a chunk at a time; the server sees each message as it
                # arrives, so its count says when the senders are in the middle of chunks.
                if recorder is not None:
                    sent = recorder.received(str(run.push_id))
                else:
                    sent, pause = done, 0.05  # (only the ledger's count can say: look often)
                if sent >= len(run.members) * KILL_AT:
                    run.kill_looks += 1
                    run.killed = _again(lambda: _kill_a_sender(run.scope, procs))
                    if run.killed is not None:
                        # Counted after the kill, not before the look that chose the victim
                        # (seconds of sends later on a busy database).
                        marked = _again(lambda: app.effects.counts(run.scope)).get("done", 0)
                        at = (f"{recorder.received(str(run.push_id)):,} emails received by the "
                              "server, " if recorder is not None else "")
                        bar.console.print(f"killed worker pid {run.killed} with SIGKILL: {at}{marked:,} "
                                          f"marked sent in the ledger ({marked / len(run.members):.0%} "
                                          "of the list)")
            # The end is the moment the last job finished, seen within a tenth of a second
            # (the jobs table counted per state: a few rows with slot jobs; with one job per
            # user, looked at less often as it costs more), not at the next progress count:
            # up to 2 s late on a big list, which the sending time would have counted.
            if time.perf_counter() - looked_at >= look:
                t = looked_at = time.perf_counter()
                live = _again(lambda: _live_jobs(queue))
                look = min(1.0, max(0.1, 20 * (time.perf_counter() - t)))
                if live == 0 and run.rest_enqueued is None:
                    # The A/B jobs ended before enough of their emails were marked sent
                    # (their sends failed for good): the rest of the list is still sent.
                    _start_rest(run, queue, opts, bar.console)
                elif live == 0:
                    run.elapsed = t - t1
                    run.sent = _again(lambda: app.effects.counts(run.scope)).get("done", 0)
                    bar.update(task, completed=run.sent)
                    break
            if all(p.poll() is not None for p in procs):
                out.print("[red]all workers exited[/red]")
                break
            _held(lease)
            time.sleep(0.05 if opts.kill_one and run.killed is None else 0.1)
    run.elapsed = run.elapsed or time.perf_counter() - t1
    if opts.kill_one and run.killed is None:
        # Said plainly, not left to a "no" in the table: the run shows nothing of a kill.
        out.print(f"[yellow]--kill-one: no worker was killed: {_why_no_kill(run)}[/yellow]")


def _why_no_kill(run: Run) -> str:
    """Why a Push with --kill-one ended with nobody killed, in a phrase."""
    if not run.kill_looks:
        return (f"the Push ended before {KILL_AT:.0%} of its list was sent (a list this small, or "
                "a mail server this fast, leaves no moment to kill a worker in the middle of a chunk)")
    return (f"at each of {run.kill_looks} look(s), from {KILL_AT:.0%} of the list sent to the end, "
            "no worker held a claimed, unsent chunk (the Push ended first)")


def _again(read: Callable[[], T]) -> T:
    """A read of the demo's watch loop, tried again for a minute while the database is away
    (its connections were ended, say): the workers go on meanwhile, and one lost connection
    ended the demo with the Push half sent."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return read()
        except DatabaseUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _start_rest(run: Run, queue: str, opts: Options, console: Console) -> None:
    """The rest phase, while the A/B phase is still sending: L minus R, R as it is now."""
    reached = sorted(int(e.key) for e in _entries(run.scope, "done"))
    conn = connect(app.database_url)
    try:
        save_reached(conn, run.push_id, reached)
    finally:
        conn.close()
    taken = set(reached)
    rest = [uid for uid in run.members if uid not in taken]
    _enqueue_phase(run, queue, opts, "rest", rest)
    run.rest_enqueued = len(rest)
    # (R as read for the rest phase, not the count that decided to start it: one moment)
    console.print(f"rest phase started with {len(reached):,} of {len(run.ab):,} A/B emails sent: "
                  f"{len(rest):,} users of the list not reached yet, "
                  f"{len(set(rest) & set(run.ab)):,} of them still waiting for their A/B email")


def _live_jobs(queue: str) -> int:
    return sum(c.count for c in app.queue_counts() if c.queue == queue and c.state.is_live)


def _kill_a_sender(scope: str, procs: list[subprocess.Popen[Any]]) -> int | None:
    """SIGKILL one of ``procs`` in the middle of its sends: the worker that holds the most
    claimed, unmarked ledger entries of the Push (``scope``), by their owner
    (``host:pid:…``). Every live worker is frozen (SIGSTOP) at once and the ledger looked
    at a moment later (the done marks they sent before they stopped land first); the
    holder is killed and the others let go on (SIGCONT). Frozen together, no worker can
    mark its chunk done between the look and the kill, and the Push cannot end meanwhile:
    looking at one worker at a time (the others sending on through each 0.3 s look) let a
    Push into a fast server run from the moment the kill was due to its end, or well past
    it. None when no worker holds a live claim at that moment (all between chunks, or the
    Push done): the caller looks again. (Killing the holder of a running job instead could
    hit a worker whose senders were all between chunks: nothing in doubt.)"""
    frozen: list[int] = []
    victim: int | None = None
    try:
        for p in procs:
            if p.poll() is None:  # (not reaped: its pid is still its own)
                try:
                    os.kill(p.pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                frozen.append(p.pid)
        if not frozen:
            return None
        time.sleep(0.3)  # (a done mark sent just before the stop lands first)
        held: Counter[int] = Counter()
        for entry in _entries(scope, "running"):
            pid = owner_pid(entry.owner)
            if entry.state == "running" and pid in frozen:  # (a live claim, not in doubt)
                held[pid] += 1
        if held:
            victim = held.most_common(1)[0][0]
            os.kill(victim, signal.SIGKILL)  # (a stopped process cannot have exited meanwhile)
        return victim
    finally:
        for pid in frozen:
            if pid != victim:
                try:
                    os.kill(pid, signal.SIGCONT)  # (never left stopped, whatever was raised)
                except ProcessLookupError:
                    pass


def _settle(run: Run) -> None:
    """Wait for the chunk leases still running to run out: a send whose outcome is unknown
    (the mail server's connection broke after DATA) leaves its user claimed by its chunk
    until that chunk's lease ends, and in doubt from then on; the report counts it then."""
    deadline = time.monotonic() + CHUNK_LEASE + 5
    while app.effects.counts(run.scope).get("running", 0) and time.monotonic() < deadline:
        time.sleep(0.2)


def _reconcile(run: Run, recorder: Recorder, address: str, out: Console, redo: bool) -> None:
    """What an operator does with the entries in doubt, done with the demo server's log: an
    entry whose message the server accepted (its Message-ID is the idempotency key) was
    sent, so it is resolved done; the others were never sent. With ``redo`` those are
    resolved for a redo and sent now, once."""
    doubt = [e.key for e in app.effects.in_doubt(run.scope, limit=100_000)]
    push = str(run.push_id)
    run.in_doubt = len(doubt)
    run.delivered_in_doubt = [k for k in doubt if recorder.delivered(push, f"{run.scope}:{k}")]
    delivered = set(run.delivered_in_doubt)
    run.never_sent = [k for k in doubt if k not in delivered]
    received = recorder.per_recipient.get(push, Counter())
    run.never_received = [str(uid) for uid in run.members if not received.get(f"user{uid}@example.test")]
    app.effects.resolve_many(run.scope, run.delivered_in_doubt, done=True,
                             note="delivered: the SMTP server's log has its Message-ID")
    if doubt:
        out.print(f"in doubt after the run: {len(doubt)} (a worker died between its sends and their "
                  f"done mark, or the mail server's connection broke after DATA); the SMTP "
                  f"server's log has {len(delivered)} of them (resolved done), "
                  f"{len(run.never_sent)} were never sent")
    if not redo or not run.never_sent:
        return
    app.effects.resolve_many(run.scope, run.never_sent, done=False,
                             note="never sent: the SMTP server's log lacks it")
    os.environ[SMTP_ENV] = address
    smtp, ab = ThreadSMTP(), {uid: ("A" if i < AB_SIZE else "B") for i, uid in enumerate(run.ab)}

    def send(idempotency_key: str) -> str:
        uid = int(idempotency_key.rpartition(":")[2])
        variant, phase = (ab[uid], "ab") if uid in ab else (WINNER, "rest")
        email = f"user{uid}@example.test"
        smtp.send(email, render(run.push_id, email, variant, phase, VARIANTS[variant], idempotency_key))
        return f"{phase} {variant}"

    outcome = app.effects.run_many(run.scope, run.never_sent, send, lease=30)
    run.redone = outcome.done
    out.print(f"--redo: {len(run.never_sent)} resolved for a redo and sent again: {outcome}")


def _entries(scope: str, state: str) -> Iterator[EffectInfo]:
    """The Push's ledger entries in ``state``, a page at a time (a list of 945,504 users
    read at once held ~1 GB of entries in the demo's process)."""
    after = None
    while page := app.effects.list(scope, state, limit=20_000, after=after):
        yield from page
        after = page[-1].key


def _report(out: Console, run: Run, recorder: Recorder | None, opts: Options) -> bool:
    by_phase: Counter[str] = Counter()
    reached: set[int] = set()
    for e in _entries(run.scope, "done"):
        by_phase[str(e.result)] += 1
        reached.add(int(e.key))
    members = run.members
    missed = [uid for uid in members if uid not in reached]
    doubt = {e.key for e in app.effects.in_doubt(run.scope, limit=100_000)}
    table = Table("", "count", title=f"report: Push {run.push_id}, \"Kitty lovers\"")
    table.add_row("users in the list (L)", f"{len(members):,}")
    table.add_row("A/B phase: variant A / variant B (by the ledger)",
                  f"{by_phase['ab A']:,} / {by_phase['ab B']:,}")
    table.add_row("rest phase: users not in R when it started (L minus R)", f"{run.rest_enqueued or 0:,}")
    table.add_row("rest phase: winner A sent (by the ledger)", f"{by_phase['rest A']:,}")
    if recorder is not None:
        # Entries in doubt whose message the server's log has, resolved done after the run:
        # their sender died before its done mark, so the ledger has no phase for them.
        by_log = len(reached) - by_phase["ab A"] - by_phase["ab B"] - by_phase["rest A"]
        table.add_row("in doubt, resolved done by the SMTP server's log", f"{by_log:,}")
    table.add_row("emails marked sent in the effect ledger", f"{len(reached):,}")
    dupes, server_ok = 0, True
    if recorder is not None:
        received = recorder.per_recipient.get(str(run.push_id), Counter())
        dupes = sum(1 for c in received.values() if c > 1)
        variants = recorder.per_variant.get(str(run.push_id), Counter())
        table.add_row("messages the SMTP server received", f"{sum(received.values()):,}")
        table.add_row("  of them A/B phase A / B, rest phase A",
                      f"{variants[('A', 'ab')]:,} / {variants[('B', 'ab')]:,} / {variants[('A', 'rest')]:,}")
        table.add_row("users who received two emails of this Push", str(dupes))
        # User by user: every user marked sent got exactly one message, and every message
        # went to a user marked sent or still in doubt.
        email_of = {f"user{uid}@example.test": uid for uid in members}
        server_ok = all(received.get(f"user{uid}@example.test", 0) == 1 for uid in reached) and all(
            email_of.get(rcpt) in reached or str(email_of.get(rcpt)) in doubt for rcpt in received)
    else:
        table.add_row("messages the SMTP server received", "(your server: see its own count)")
    if recorder is not None:
        table.add_row("in doubt after the run (a worker died between sends and done marks)", str(run.in_doubt))
        table.add_row("  of them delivered, by the SMTP server's log (resolved done)",
                      str(len(run.delivered_in_doubt)))
        table.add_row("  of them never sent", str(len(run.never_sent)))
        table.add_row("users the server had no message for after the run", str(len(run.never_received or ())))
    if opts.redo:
        table.add_row("sent again with --redo (the never sent)", str(run.redone))
    table.add_row("users of the list never reached", str(len(missed)))
    table.add_row("  of them in doubt", str(sum(1 for u in missed if str(u) in doubt)))
    table.add_row("worker killed with SIGKILL", f"yes (pid {run.killed})" if run.killed
                  else "no: the Push ended first" if opts.kill_one else "no")
    table.add_row("set-up time (users, list, Push)", f"{run.setup_s:.1f}s")
    table.add_row("sending time", f"{run.elapsed:.1f}s")
    rate = run.sent / run.elapsed if run.elapsed else 0.0
    table.add_row("emails per second", f"{rate:,.0f}")
    if run.ceiling is not None:
        ceiling = run.ceiling.per_second
        table.add_row(f"mail server ceiling ({run.ceiling.senders} plain senders)", f"{ceiling:,.0f}")
        table.add_row("emails per second ÷ ceiling", f"{rate / ceiling:.2f}" if ceiling else "-")
    out.print(table)
    if run.ceiling is not None and run.busy_machine:
        out.print("[yellow]the ceiling was measured while the machine was busy: it is low, and the "
                  "ratio high[/yellow]")
    if run.ceiling is not None and run.killed:
        # After a kill the sending time holds the waits for the killed worker's leases (its
        # slot job's, then its chunk's): the ratio is not the bookkeeping's cost then.
        out.print("[yellow]the sending time includes the waits for the killed worker's leases: "
                  "the ratio is low[/yellow]")
    if doubt:
        out.print("[yellow]in doubt (at most once: not resent; check the SMTP log, then "
                  f"`justonce effects resolve {run.scope} KEY --done|--redo`):[/yellow] "
                  + ", ".join(sorted(doubt)[:20]) + (" …" if len(doubt) > 20 else ""))
    unexplained = [u for u in missed if str(u) not in doubt]
    # The users the run never reached must be exactly the entries in doubt that were never sent.
    exact = recorder is None or sorted(run.never_received or ()) == sorted(run.never_sent)
    ok = dupes == 0 and server_ok and not unexplained and exact
    if not ok:
        out.print("[red]FAILED: " + ("duplicates! " if dupes else "")
                  + ("" if server_ok else "the SMTP server's messages and the ledger disagree! ")
                  + (f"{len(unexplained)} users never reached! " if unexplained else "")
                  + ("" if exact else "the users never reached are not the entries in doubt never sent! ")
                  + "[/red]")
    elif recorder is None:
        out.print("[green]OK by the ledger: no user marked sent twice[/green] (compare with your "
                  "SMTP server's own count)")
    else:
        out.print("[green]OK: every user of the list got exactly one email of the Push[/green]"
                  if not missed else "[green]OK: no user got two emails[/green]")
    return ok
