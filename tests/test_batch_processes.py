"""Batches under real processes: many ackers at once, and a batch of jobs whose worker is
killed with ``kill -9``. Completion must be reported, and its callback run, exactly once."""

from __future__ import annotations

import multiprocessing
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import proc_app
from fleet import Fleet, WorkerProc, ledger, proc_app_on, running_jobs_of, state_counts, wait_for
from justonce import App, BatchState, Job, Worker

pytestmark = pytest.mark.slow


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    with proc_app_on(db_url) as a:
        yield a


def run_callbacks(app: App, batch_id: int) -> None:
    """Run the callback job(s) with an in-process worker until the ledger shows one."""
    w = Worker(app, queues=["default"], concurrency=1, poll=0.1, lease=5).start()
    try:
        wait_for(lambda: ledger(app.database_url, "batch_done"), 30, "the callback to run")
    finally:
        w.stop()
        assert w.join(15)


SETTLE = 0.3
"""Seconds between stopping a process and looking at what it holds."""


def kill_holding_jobs(app: App, victim: WorkerProc, tries: int = 200) -> list[Job]:
    """``kill -9`` the victim at a moment it holds leased jobs, and return them. Its jobs are
    quick, so it may be between a batch of acks and its next fetch: it is stopped, looked
    at, and let go again until it is caught holding some. The look waits a moment after
    the stop: an ack the victim sent just before it must land first (seen once: a job
    looked running, then the ack's COMMIT, already on its way, completed it)."""
    for _ in range(tries):
        victim.signal(signal.SIGSTOP)
        time.sleep(SETTLE)
        held = running_jobs_of(app, victim)
        if held:
            victim.signal(signal.SIGKILL)
            assert victim.wait(10) == -signal.SIGKILL
            return held
        victim.signal(signal.SIGCONT)
        time.sleep(0.01)
    pytest.fail(f"the victim held no job in {tries} looks", pytrace=False)


def test_8_processes_ack_200000_items_in_random_order_with_repeats_while_the_producer_adds_and_seals(
    app: App, db_url: str
) -> None:
    """The producer adds 20 groups of 10,000 items while 8 acker processes ack them in
    random order, in bulk calls of 500; 10% of the ids are sent a second time (to a random
    acker). The seal comes right after the last add, while acks are still flowing.
    Exactly one ack call reports the completion, and exactly one callback job exists and
    runs, saying 200,000 acked."""
    groups, per_group, ackers = 20, 10_000, 8
    total = groups * per_group
    ctx = multiprocessing.get_context("spawn")
    work = [ctx.Queue() for _ in range(ackers)]
    results = ctx.Queue()
    procs = [ctx.Process(target=proc_app.ack_items, args=(db_url, q, results)) for q in work]
    for p in procs:
        p.start()
    try:
        batch = app.batches.open("200k", on_complete=proc_app.batch_done)
        rng = random.Random(20261122)
        repeats = 0
        for _ in range(groups):
            ids = batch.add(per_group).item_ids()
            rng.shuffle(ids)
            parts: list[list[str]] = [[] for _ in range(ackers)]
            for item in ids:
                parts[rng.randrange(ackers)].append(item)
            for item in rng.sample(ids, per_group // 10):
                parts[rng.randrange(ackers)].append(item)
                repeats += 1
            for q, part in zip(work, parts, strict=True):
                q.put(part)
        sealed = batch.seal()
        pending_at_seal = batch.info().pending
        for q in work:
            q.put(None)
        reports = [results.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert not sealed.completed and pending_at_seal > 0, "the seal did not come midway"
    assert sum(r[1] for r in reports) == total
    assert sum(r[2] for r in reports) == repeats == total // 10
    assert [b for r in reports for b in r[3]] == [batch.id]
    info = batch.info()
    assert (info.state, info.acked, info.failed, info.pending) == (BatchState.COMPLETED, total, 0, 0)
    [callback] = app.list_jobs(task="proc_app.batch_done")
    assert callback.kwargs["batch"]["acked"] == total
    run_callbacks(app, batch.id)
    assert ledger(db_url, "batch_done") == [(batch.id, ledger(db_url, "batch_done")[0][1], "batch_done")]


def test_a_batch_of_10000_jobs_completes_exactly_once_after_a_worker_is_killed(
    app: App, db_url: str, fleet: Fleet
) -> None:
    """4 worker processes run a batch of 10,000 jobs; one is killed with kill -9 midway.
    Its jobs come back when their leases expire and run again elsewhere. The batch
    completes once, with 10,000 acked, and its callback runs once."""
    total = 10_000
    workers = [fleet.start(concurrency=4, ready=False) for _ in range(4)]
    fleet.wait_ready(*workers)
    batch = app.batches.open("10k jobs", on_complete=proc_app.batch_done)
    _, job_ids = batch.enqueue_calls(proc_app.record, [(n,) for n in range(total)])
    batch.seal()
    victim = workers[0]
    wait_for(lambda: sum(1 for _, pid, _ in ledger(db_url) if pid == victim.pid) >= 300, 60,
             "the victim to run some jobs", interval=0.02)
    held = kill_holding_jobs(app, victim)

    wait_for(lambda: batch.info().state is BatchState.COMPLETED, 120,
             f"the batch to complete ({batch.info()})", interval=0.25)
    wait_for(lambda: ledger(db_url, "batch_done"), 30, "the callback to run")
    info = batch.info()
    assert (info.acked, info.failed) == (total, 0)
    wait_for(lambda: state_counts(app)["succeeded"] == total + 1, 30,  # items and callback
             f"every job to succeed ({dict(state_counts(app))})")
    runs = Counter(n for n, _, _ in ledger(db_url))
    assert set(runs) == set(range(total))  # nothing lost (a killed run may have rerun)
    for job in (app.get_job(j.id) for j in held):  # the victim's jobs came back by lease expiry
        assert job.state == "succeeded" and job.attempts > 1, job
        assert "lease_expired" in [e["kind"] for e in job.errors], job
    assert len(ledger(db_url, "batch_done")) == 1
    assert len(app.list_jobs(task="proc_app.batch_done")) == 1
    for w in workers[1:]:  # the survivors wrote every outcome, none refused
        for event in ("ack.error", "job.fail_write_error", "job.rejected", "job.lease_lost"):
            assert not w.events(event), w.tail()
