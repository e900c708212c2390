"""Failpoints (JUSTONCE_FAILPOINTS): the setting is checked, each action does what it says,
and a worker frozen at a failpoint past its job's lease starts nothing when it wakes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleet import events, fleet_on, ledger, named, proc_app_on, wait_for
from justonce import App, Backoff, current_job, failpoints
from justonce.errors import InvalidOption
from justonce.failpoints import FailpointError


@pytest.fixture(autouse=True)
def _none_left() -> object:
    yield
    failpoints.configure(None)


def test_a_spec_is_parsed_with_counts_and_chances() -> None:
    points = failpoints.parse("job.before_start=3*25%sleep(10); effect.after_fn=raise;"
                              "ack.after_commit=kill;batch.before_seal=off")
    assert {k: (str(v), v.chance, v.left) for k, v in points.items()} == {
        "job.before_start": ("sleep(10)", 0.25, 3), "effect.after_fn": ("raise", 1.0, None),
        "ack.after_commit": ("kill", 1.0, None), "batch.before_seal": ("off", 1.0, None)}


@pytest.mark.parametrize("spec, says", [
    ("job.bogus=kill", "no failpoint 'job.bogus'"),
    ("job.before_start", "is not point=action"),
    ("job.before_start=explode", "is not kill, raise, off or sleep(ms)"),
    ("job.before_start=sleep(-1)", "is not kill, raise, off or sleep(ms)"),
    ("job.before_start=sleep(1.5)", "is not kill, raise, off or sleep(ms)"),
    ("job.before_start=150%kill", "not in [0, 100]"),
    ("job.before_start=\x00kill", "is not kill"),
])
def test_a_bad_spec_is_refused_with_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(InvalidOption, match=None) as err:
        failpoints.configure(spec)
    assert says in str(err.value)
    assert failpoints.ACTIVE is False or failpoints._points == {}


def test_a_bad_setting_stops_the_process_at_import_with_the_message() -> None:
    env = dict(os.environ, JUSTONCE_FAILPOINTS="effect.after_fun=kill")
    out = subprocess.run([sys.executable, "-c", "import justonce"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "no failpoint 'effect.after_fun'" in out.stderr
    env = dict(os.environ, JUSTONCE_FAILPOINTS="effect.after_fn=kill",
               JUSTONCE_FAILPOINTS_SEED="x")
    out = subprocess.run([sys.executable, "-c", "import justonce"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert "JUSTONCE_FAILPOINTS_SEED must be an integer" in out.stderr


def raises(point: str, times: int) -> int:
    """How many of ``times`` hits of ``point`` raised."""
    n = 0
    for _ in range(times):
        try:
            failpoints.hit(point)
        except FailpointError:
            n += 1
    return n


def test_raise_counts_and_chances_act_as_set() -> None:
    failpoints.configure("batch.before_seal=2*raise")
    for _ in range(2):
        with pytest.raises(FailpointError, match="batch.before_seal"):
            failpoints.hit("batch.before_seal")
    failpoints.hit("batch.before_seal")  # spent
    failpoints.hit("effect.after_fn")  # not configured
    failpoints.configure("batch.before_seal=30%raise", seed=7)
    raised = raises("batch.before_seal", 2000)
    assert 450 < raised < 750, raised
    failpoints.configure("batch.before_seal=30%raise", seed=7)
    assert raises("batch.before_seal", 2000) == raised  # the seed replays the draws
    failpoints.configure("job.before_start=sleep(150)")
    t0 = time.monotonic()
    failpoints.hit("job.before_start")
    assert time.monotonic() - t0 >= 0.15
    failpoints.configure(None)
    assert failpoints.ACTIVE is False


def test_kill_is_a_sigkill_at_the_point(tmp_path: Path, db_url: str) -> None:
    """A process told effect.after_fn=kill dies by SIGKILL after the effect's function ran
    and before it was marked done: the entry is left in doubt (at most once)."""
    code = ("import sys, justonce\n"
            "app = justonce.App(sys.argv[1]); app.migrate()\n"
            "app.effects.run('mail', 'k1', lambda key: print('sent', key, flush=True))\n"
            "print('not reached', flush=True)\n")
    env = dict(os.environ, JUSTONCE_FAILPOINTS="effect.after_fn=kill")
    out = subprocess.run([sys.executable, "-c", code, db_url], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert out.stdout == "sent mail:k1\n"
    assert "failpoint hit" in out.stderr
    import justonce
    app = justonce.App(db_url)
    try:
        assert app.effects.get("mail", "k1").state == "in_doubt" or \
            app.effects.get("mail", "k1").state == "running"
    finally:
        app.close()


def test_a_worker_frozen_between_choosing_a_job_and_starting_it_does_not_start_it(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot chose the job, then the process was stopped (here at job.before_start; in
    the wild, say, while it gave back other jobs on a busy SQLite file) past the job's
    lease. Another worker ran the job meanwhile. Woken, the first must not run it too: the
    start is decided again at the last instant, and the job given back."""
    with proc_app_on(db_url) as app, fleet_on(db_url, tmp_path) as fleet:
        job = app.enqueue("proc_app.record", [1])
        monkeypatch.setenv("JUSTONCE_FAILPOINTS", "job.before_start=1*sleep(4000)")
        a = fleet.start(concurrency=1, lease=2.0, heartbeat=0.5)
        monkeypatch.delenv("JUSTONCE_FAILPOINTS")
        wait_for(lambda: a.events("failpoint.hit"), 30, "worker A to reach the failpoint")
        a.signal(signal.SIGSTOP)
        try:
            b = fleet.start(concurrency=1, lease=2.0, heartbeat=0.5)
            wait_for(lambda: app.get_job(job.id).state == "succeeded", 30,
                     "worker B to run the job after A's lease ran out")
            time.sleep(max(0.0, 4.5 - 2.0))  # A's sleep has run out by its own clock
        finally:
            a.signal(signal.SIGCONT)
        # Woken, A gives the job back unstarted (job.dropped), unless its heartbeat, woken
        # first, already learnt the lease was lost (job.lease_lost): either way, no run.
        wait_for(lambda: a.events("job.dropped") or a.events("job.lease_lost"), 15,
                 "worker A to drop the job it woke to")
        time.sleep(1.0)
        runs = ledger(db_url)
        assert [(n, pid) for n, pid, _ in runs] == [(1, b.pid)], (runs, a.tail())
        assert a.popen.poll() is None and b.popen.poll() is None
        assert app.get_job(job.id).state == "succeeded"


# -- a write that committed and whose reply was lost ------------------------------------------


def test_completions_whose_reply_was_lost_after_the_commit_are_the_successes_they_were(
        app: App, worker_factory: Any) -> None:
    """The completions' write commits and its reply is lost (the failpoint raises after the
    COMMIT, as a connection that broke right then would). The worker writes them again and
    is refused (the rows are no longer running); the rows show them succeeded under its own
    lease tokens, so they are its successes: job.succeeded with reply_lost, counted as
    succeeded, and no job.rejected (which said "lease lost" of jobs that had succeeded)."""
    @app.task(name="double")
    def double(n: int) -> int:
        return 2 * n

    jobs = [double.enqueue(n) for n in range(3)]  # one claim takes them all
    failpoints.configure("ack.after_commit=1*raise")
    with events() as got:
        w = worker_factory(concurrency=4)
        for n, job in enumerate(jobs):
            assert app.wait(job.id, 30).result == 2 * n
        wait_for(lambda: w.stats.succeeded + w.stats.rejected >= len(jobs), 30,
                 "the worker to settle every completion")
    assert [h["point"] for h in named(got, "failpoint.hit")] == ["ack.after_commit"]
    assert (w.stats.succeeded, w.stats.rejected) == (3, 0)
    assert named(got, "job.rejected") == []
    succeeded = named(got, "job.succeeded")
    assert sorted(f["job_id"] for f in succeeded) == [j.id for j in jobs]
    assert any(f.get("reply_lost") for f in succeeded), succeeded
    for job in jobs:
        done = app.get_job(job.id)
        assert (done.state, done.attempts, done.errors) == ("succeeded", 1, []), done


@pytest.mark.parametrize("max_attempts, state", [(1, "dead"), (2, "scheduled")])
def test_a_failure_whose_reply_was_lost_after_the_commit_is_the_failure_it_was(
        app: App, worker_factory: Any, max_attempts: int, state: str) -> None:
    """The failed attempt's write commits and its reply is lost; the worker's second try is
    refused. The row still carries the worker's lease token, its attempt count and its
    error, in the state the write makes (dead on the last attempt, else scheduled for the
    retry): the failure is the worker's own, logged job.failed (reply_lost) with that
    state, not job.rejected. The retry then runs once and succeeds."""
    @app.task(name="once_broken", max_attempts=max_attempts,
              backoff=Backoff(base=1.5, factor=1, jitter=0))
    def once_broken() -> str:
        job = current_job()
        assert job is not None
        if job.attempts == 1:
            raise RuntimeError("broken on the first attempt")
        return "fine"

    job = once_broken.enqueue()
    failpoints.configure("fail.after_commit=1*raise")
    with events() as got:
        w = worker_factory(concurrency=1)
        wait_for(lambda: w.stats.failed + w.stats.rejected >= 1, 30, "the failure to be settled")
        if state == "scheduled":
            assert app.wait(job.id, 30).result == "fine"
            wait_for(lambda: w.stats.succeeded >= 1, 30, "the retry's success to be settled")
    assert [h["point"] for h in named(got, "failpoint.hit")] == ["fail.after_commit"]
    assert named(got, "job.rejected") == []
    failed = named(got, "job.failed")
    assert [(f["job_id"], f["state"], f.get("reply_lost")) for f in failed] == [(job.id, state, True)]
    assert (w.stats.failed, w.stats.rejected) == (1, 0)
    final = app.get_job(job.id)
    assert [e["kind"] for e in final.errors] == ["failed"], final.errors
    if state == "scheduled":
        assert (final.state, final.attempts) == ("succeeded", 2)
    else:
        assert (final.state, final.attempts) == ("dead", 1)


def test_a_completion_refused_after_a_lost_reply_is_still_refused_when_it_did_not_land(
        app: App, worker_factory: Any) -> None:
    """The other side: a completion whose write raised and which is then refused is not
    claimed as a success unless the row shows it. Here the job is cancelled while it runs
    (its completion cannot land), and the write raises once: the row is cancelled under the
    worker's token, not succeeded, so the worker reports job.rejected, as before."""
    @app.task(name="cancelled_while_running")
    def cancelled_while_running() -> int:
        job = current_job()
        assert job is not None
        app.cancel(job.id)
        return 1

    job = cancelled_while_running.enqueue()
    failpoints.configure("ack.after_commit=1*raise")
    with events() as got:
        w = worker_factory(concurrency=1)
        wait_for(lambda: w.stats.succeeded + w.stats.rejected >= 1, 30,
                 "the worker to settle the completion")
    assert [h["point"] for h in named(got, "failpoint.hit")] == ["ack.after_commit"]
    assert (w.stats.succeeded, w.stats.rejected) == (0, 1)
    assert [f["job_id"] for f in named(got, "job.rejected")] == [job.id]
    assert named(got, "job.succeeded") == []
    assert app.get_job(job.id).state == "cancelled"


def test_a_slot_whose_bookkeeping_fails_between_jobs_goes_on_fetching(
        app: App, worker_factory: Any) -> None:
    """An error between a claim and the jobs' start (here the failpoint right after the
    claim) killed the fetching slot's thread, and with it the worker's only fetcher: the
    worker claimed nothing more until it was restarted. The slot logs slot.error and goes
    on; the jobs of the claim it lost come back when their lease runs out."""
    @app.task(name="triple", max_attempts=3)
    def triple(n: int) -> int:
        return 3 * n

    first = [triple.enqueue(n) for n in range(3)]
    failpoints.configure("job.after_claim=1*raise")
    with events() as got:
        w = worker_factory(concurrency=1, lease=1.0)
        later = [triple.enqueue(n) for n in range(3, 6)]
        for n, job in enumerate(first + later):
            assert app.wait(job.id, 30).result == 3 * n
    assert [h["point"] for h in named(got, "failpoint.hit")] == ["job.after_claim"]
    assert len(named(got, "slot.error")) == 1
    assert w.stats.succeeded == 6
