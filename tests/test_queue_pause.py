"""Paused queues, on every backend: no claim that starts after a pause has committed takes a
job of the queue (plain and partitioned claims, the completion that claims the next job, the
idle workers' polls); real worker processes stop taking its jobs, finish the ones they hold,
and take the rest exactly once after the resume; bad input is refused and changes nothing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from fleet import fleet_on, ledger, proc_app_on, wait_for
from justonce import App, Enqueue, InvalidName, InvalidOption, JobState
from justonce.models import Completion, SlotFence

OWNER = "test-owner"


def test_a_pause_is_kept_once_listed_and_resumed(app: App) -> None:
    assert app.paused_queues() == []
    pause = app.pause_queue("mail", note="smtp down", actor="ops")
    assert (pause.queue, pause.note, pause.actor) == ("mail", "smtp down", "ops")
    assert pause.paused_at.tzinfo is not None and not pause.already
    # Pausing again changes nothing: the first pause, its time and note, stays.
    again = app.pause_queue("mail", note="another reason")
    assert again.already and replace(again, already=False) == pause
    assert app.paused_queues() == [pause]
    # A paused queue is listed (to be resumed) though it holds no job.
    stats = {s.queue: s for s in app.queue_stats()}
    assert stats["mail"].paused == pause and stats["mail"].counts == {}
    assert app.resume_queue("mail") is True
    assert app.resume_queue("mail") is False  # (it was not paused)
    assert app.paused_queues() == []
    assert "mail" not in {s.queue for s in app.queue_stats()}
    app.pause_queue("b")
    app.pause_queue("a")
    assert [p.queue for p in app.paused_queues()] == ["a", "b"]


def test_bad_input_is_refused_and_changes_nothing(app: App) -> None:
    app.pause_queue("kept", note="n")
    before = app.paused_queues()
    for bad in ("", "bad name", "q" * 64, None, 7, "-q", "q\x00", ["q"], "ü"):
        with pytest.raises(InvalidName):
            app.pause_queue(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidName):
            app.resume_queue(bad)  # type: ignore[arg-type]
    for note in ("a\x00b", "n" * 4001, 7, b"x"):
        with pytest.raises(InvalidOption):
            app.pause_queue("other", note=note)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption):
        app.pause_queue("other", actor="a" * 201)
    assert app.paused_queues() == before


def test_claims_skip_a_paused_queue_and_no_other(app: App) -> None:
    @app.task(name="t")
    def t() -> None:
        return None

    mail = [t.configure(queue="mail").enqueue().id for _ in range(3)]
    other = t.configure(queue="other").enqueue().id
    keyed = t.configure(queue="mail", partition_key="k").enqueue().id
    b = app.backend
    lease = app.partitions.acquire("p", 1, lease=30, timeout=0)
    fence = SlotFence("p", 1, ((lease.slot, lease.token),))
    app.pause_queue("mail")
    t.configure(queue="mail").enqueue()  # enqueueing goes on: the job waits
    assert b.job_claim("mail", 10, OWNER, 30) == []
    assert b.job_claim("mail", 10, OWNER, 30, fence) == []
    # Nor do idle workers' looks for work (SQLite's and MySQL's precheck, MySQL's poll)
    # see its jobs: they would claim in vain at every look.
    assert b.d.read("job_any_ready", {"queue": "mail"}) == []
    if b.name == "mysql":
        assert b.d.read("jobs_ready_in", {"queues": ["mail"]}) == []
        assert b.d.read("jobs_ready_in", {"queues": ["mail", "other"]}) != []
    (taken,) = b.job_claim("other", 10, OWNER, 30)
    assert taken.id == other
    # The completion that claims the next job in the same transaction skips it too.
    accepted, claimed = b.job_complete_and_claim(
        [Completion(other, taken.lease_token, None)], "mail", 10, OWNER, 30)
    assert accepted == {other} and claimed == []
    assert Counter(j.state for j in app.list_jobs(queue="mail", limit=100)) == {JobState.READY: 5}
    assert app.resume_queue("mail")
    assert sorted(j.id for j in b.job_claim("mail", 10, OWNER, 30)) == [*mail, mail[-1] + 3]
    assert [j.id for j in b.job_claim("mail", 10, OWNER, 30, fence)] == [keyed]
    lease.release()


def test_no_claim_that_starts_after_the_pause_takes_a_job(app: App) -> None:
    """Threads claim one job at a time as fast as they can while the queue is paused: a
    claim that began after ``pause_queue`` returned gets nothing, on every backend."""
    @app.task(name="t")
    def t() -> None:
        return None

    t.enqueue_many([()] * 3000)
    b = app.backend
    paused_at: list[float] = []
    late: list[tuple[float, list[int]]] = []
    claims = Counter[str]()
    stop = threading.Event()

    def claimer() -> None:
        while not stop.is_set():
            began = time.monotonic()
            got = b.job_claim("default", 1, OWNER, 60)
            claims["after" if paused_at and began > paused_at[0] else "before"] += 1
            if got and paused_at and began > paused_at[0]:
                late.append((began - paused_at[0], [j.id for j in got]))

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for th in threads:
        th.start()
    try:
        wait_for(lambda: claims["before"] >= 30, 30, "claims before the pause")
        app.pause_queue("default")
        paused_at.append(time.monotonic())
        wait_for(lambda: claims["after"] >= 200, 60, "claims after the pause")
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    assert not late, f"claims begun after the pause took jobs: {late[:5]}"
    ready = sum(c.count for c in app.queue_counts() if c.state == JobState.READY)
    assert 0 < ready < 3000
    app.resume_queue("default")
    assert len(b.job_claim("default", 5000, OWNER, 60)) == ready


@pytest.mark.slow
def test_workers_stop_taking_a_paused_queues_jobs_and_take_them_once_resumed(
        db_url: str, tmp_path: Path) -> None:
    """Two real worker processes on a queue of short jobs: once paused (and the claims in
    flight at that moment have ended) no job leaves the ready state, and jobs enqueued
    meanwhile wait too; after the resume every job runs, exactly once."""
    with proc_app_on(db_url) as app, fleet_on(db_url, tmp_path) as fleet:
        fleet.start(concurrency=4)
        fleet.start(concurrency=4)
        app.enqueue_many([Enqueue("proc_app.record", args=[i]) for i in range(2000)])
        wait_for(lambda: len(ledger(db_url)) >= 100, 60, "the first jobs to run")
        app.pause_queue("default")
        # Jobs claimed before the pause finish; then nothing leaves the ready state.
        wait_for(lambda: _counts(app).get("running", 0) == 0, 30, "the claimed jobs to finish")
        frozen = _counts(app)
        assert 0 < frozen.get("ready", 0) < 2000, frozen
        app.enqueue_many([Enqueue("proc_app.record", args=[i]) for i in range(2000, 2100)])
        time.sleep(2.0)  # (several polls and heartbeats of both workers)
        waiting = _counts(app)
        assert waiting == {**frozen, "ready": frozen["ready"] + 100}, (frozen, waiting)
        assert len(ledger(db_url)) == frozen["succeeded"]
        assert app.resume_queue("default")
        wait_for(lambda: _counts(app).get("succeeded", 0) == 2100, 120, "every job to run")
        runs = Counter(n for n, _, _ in ledger(db_url))
        assert sorted(runs) == list(range(2100)) and set(runs.values()) == {1}


@pytest.mark.slow
def test_jobs_a_worker_leased_before_the_pause_do_not_start_after_it(
        db_url: str, tmp_path: Path) -> None:
    """A worker that has leased more jobs than it runs at once (its guess of how many to
    prefetch came from fast jobs; these take 0.2 s): once the queue is paused, it starts
    none of the jobs it still holds, but gives them back unstarted, their attempts
    refunded; after the resume each job starts once."""
    with proc_app_on(db_url) as app, fleet_on(db_url, tmp_path) as fleet:
        worker = fleet.start(concurrency=2)
        app.enqueue_many([Enqueue("proc_app.noop") for _ in range(400)])
        app.enqueue_many([Enqueue("proc_app.slow_record", args=[i, 0.2]) for i in range(1000, 1100)])
        wait_for(lambda: ledger(db_url, "start"), 60, "a slow job to start")
        app.pause_queue("default")
        time.sleep(2.0)  # (the jobs running at the pause end; a claim in flight lands)
        started = len(ledger(db_url, "start"))
        time.sleep(3.0)
        assert len(ledger(db_url, "start")) == started, "jobs started after the pause"
        assert started < 100 and _counts(app).get("running", 0) == 0, _counts(app)
        given_back = worker.events("worker.queue_paused")
        assert given_back and all(e["queue"] == "default" for e in given_back)
        assert all(j.attempts == 0 for j in app.list_jobs(state="ready", limit=1000))
        app.resume_queue("default")
        wait_for(lambda: _counts(app).get("succeeded", 0) == 500, 120, "every job to run")
        starts = Counter(n for n, _, _ in ledger(db_url, "start"))
        assert sorted(starts) == list(range(1000, 1100)) and set(starts.values()) == {1}


@pytest.mark.slow
def test_async_jobs_that_wait_for_a_busy_event_loop_do_not_start_after_the_pause(
        db_url: str, tmp_path: Path) -> None:
    """An async job's code starts when the worker's one event loop gets to it. Two jobs
    leased and let through while another job's code held the loop started 1.3 s after the
    pause once the loop was free (found by an adversarial run). They are decided again on
    the loop, at the last instant: given back unstarted, attempts refunded."""
    with proc_app_on(db_url) as app, fleet_on(db_url, tmp_path) as fleet:
        worker = fleet.start(concurrency=3)
        holder = app.enqueue("proc_app.async_record", args=[1], kwargs={"hold": 2.5})
        wait_for(lambda: ledger(db_url, "start"), 30, "the job that holds the loop to start")
        waiting = [app.enqueue("proc_app.async_record", args=[n]) for n in (2, 3)]
        wait_for(lambda: all(app.get_job(j.id).state == JobState.RUNNING for j in waiting), 10,
                 "the worker to lease the two jobs while the loop is held")
        app.pause_queue("default")
        wait_for(lambda: app.get_job(holder.id).state == JobState.SUCCEEDED, 30, "the holder to end")
        time.sleep(1.0)
        assert [n for n, _, _ in ledger(db_url, "start")] == [1], "a job started after the pause"
        for j in waiting:
            job = app.get_job(j.id)
            assert job.state == JobState.READY and job.attempts == 0, job
        assert {e["job_id"] for e in worker.events("worker.queue_paused")} == {j.id for j in waiting}
        app.resume_queue("default")
        wait_for(lambda: all(app.get_job(j.id).state == JobState.SUCCEEDED for j in waiting), 30,
                 "the two jobs to run after the resume")
        assert Counter(n for n, _, _ in ledger(db_url, "start")) == {1: 1, 2: 1, 3: 1}


def _counts(app: App) -> dict[str, int]:
    return {str(c.state): c.count for c in app.queue_counts() if c.count}
