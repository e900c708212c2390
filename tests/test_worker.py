"""The worker run in-process (threads), against every backend. Process-level behaviour
(kill -9, SIGSTOP, SIGTERM) is in test_processes.py."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
import warnings

import pytest

import proc_app
from fleet import events, named
from justonce import App, Backoff, Enqueue, JobState, NonRetryable, ValidationError, Worker


def test_sync_and_async_tasks_run_and_store_their_results(app: App, worker_factory) -> None:
    @app.task(name="mul")
    def mul(a: int, b: int) -> int:
        return a * b

    @app.task(name="amul")
    async def amul(a: int, b: int = 2) -> dict:
        await asyncio.sleep(0.01)
        return {"product": a * b}

    j1 = mul.enqueue(6, 7)
    j2 = amul.configure(priority=-1).enqueue(5, b=3)
    worker_factory()
    assert app.wait(j1.id, 10).result == 42
    done = app.wait(j2.id, 10)
    assert done.state is JobState.SUCCEEDED and done.result == {"product": 15}


def test_a_job_that_raises_is_retried_with_growing_delays_then_dead(app: App, worker_factory) -> None:
    @app.task(name="flaky", max_attempts=4, backoff=Backoff(base=0.1, factor=2, jitter=0.25))
    def flaky() -> None:
        raise RuntimeError("always broken")

    job = flaky.enqueue()
    worker_factory()
    final = app.wait(job.id, 20)
    assert final.state is JobState.DEAD and final.attempts == 4
    assert len(final.errors) == 4 and "always broken" in final.last_error
    delays = [e["retry_in"] for e in final.errors]
    assert delays[-1] is None  # the last failure is final
    assert delays[0] < delays[1] < delays[2], delays
    stamps = [_t(e["at"]) for e in final.errors]
    for waited, delay in zip(
        [b - a for a, b in zip(stamps, stamps[1:], strict=False)], delays, strict=False
    ):
        assert waited >= delay * 0.95, (waited, delay)  # never retried before its time


def _t(value) -> float:
    from datetime import datetime

    text = str(value).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def test_unknown_task_goes_dead_with_the_reason(app: App, worker_factory) -> None:
    client = App(app.database_url, strict=False)
    job = client.enqueue("nobody.knows.me", [1])
    worker_factory()
    final = app.wait(job.id, 10)
    assert final.state is JobState.DEAD and "unknown task" in final.last_error
    assert final.attempts == 1
    client.close()


def test_arguments_that_do_not_fit_the_signature_go_dead(app: App, worker_factory) -> None:
    @app.task(name="two")
    def two(a: int, b: int) -> int:
        return a + b

    client = App(app.database_url, strict=False)
    job = client.enqueue("two", [1, 2, 3])
    worker_factory()
    final = app.wait(job.id, 10)
    assert final.state is JobState.DEAD and "arguments do not match" in final.last_error
    client.close()


def test_an_app_that_knows_the_task_refuses_arguments_that_cannot_fit_it(app: App) -> None:
    """A job that could never run is refused at enqueue (InvalidArguments, nothing
    written) on every path of an App that registers the task; one that does not know it
    enqueues by name, and the worker says bad_arguments (above)."""
    from justonce import Enqueue, InvalidArguments

    @app.task(name="two")
    def two(a: int, b: int = 0) -> int:
        return a + b

    @app.task(name="kw")
    def kw(a: int, *, must: str) -> None: ...

    @app.task(name="anything")
    def anything(*args: object, **kwargs: object) -> None: ...

    @app.task(name="slot_task")
    def slot_task(predicate: str, slot: int, n: int) -> None: ...

    @app.task(name="callback")
    def callback(tag: str, batch: object) -> None: ...

    before = len(app.list_jobs(limit=1000))
    refused: list[tuple[str, object]] = [
        ("enqueue", lambda: app.enqueue("two", [1, 2, 3])),
        ("task.enqueue", lambda: two.enqueue()),
        ("unknown keyword", lambda: app.enqueue(two, [1], {"c": 3})),
        ("keyword-only missing", lambda: kw.enqueue(1)),
        ("enqueue_many", lambda: app.enqueue_many([Enqueue(two, args=[1]), Enqueue(two, args=[1, 2, 3])])),
        ("enqueue_calls", lambda: app.enqueue_calls(two, [(1,), (1, 2), (1, 2, 3)])),
        ("batch enqueue", lambda: app.batches.enqueue(app.batches.open().id, [Enqueue(two, args=[])])),
        ("batch enqueue_calls", lambda: app.batches.enqueue_calls(app.batches.open().id, "two", [{"b": 1}])),
        ("callback", lambda: app.batches.open(on_complete=Enqueue(callback, args=["x", "y"]))),
        ("scan", lambda: app.partitions.scan(two, column="id", n=2)),
    ]
    for what, call in refused:
        with pytest.raises(InvalidArguments, match="arguments do not match") as info:
            call()  # type: ignore[operator]
        assert "two" in str(info.value) or "kw" in str(info.value) or "callback" in str(info.value), what
    with pytest.raises(InvalidArguments, match="call 2: "):  # (the call is named)
        app.enqueue_calls(two, [(1,), (1, 2), (1, 2, 3)])
    assert len(app.list_jobs(limit=1000)) == before  # (nothing written)
    # What fits is taken, on every path.
    assert not two.enqueue(1).duplicate and not two.enqueue(1, b=2).duplicate and kw.enqueue(1, must="x")
    assert anything.enqueue(1, 2, 3, x=4) and app.enqueue_calls(two, [(1,), (1, 2), {"a": 1}])
    assert app.batches.open(on_complete=Enqueue(callback, args=["x"])).id  # (batch= is passed)
    assert app.partitions.scan(slot_task, column="id", n=2).id
    assert app.enqueue(two, None, {"a": 1}) and app.enqueue_many([Enqueue(two, args=None, kwargs={"a": 2})])
    # A decorator may supply arguments: the function is read as called, not through
    # functools.wraps (a wrapper of *args, **kwargs takes anything).
    import functools

    def inject(fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            return fn("conn", *a, **k)
        return wrapper

    @app.task(name="with_conn")
    @inject
    def with_conn(conn: str, x: int) -> None: ...

    assert with_conn.enqueue(5) and app.enqueue_calls(with_conn, [(5,)])
    # Malformed calls are still named as such, before any signature is looked at.
    with pytest.raises(InvalidArguments, match="each call must be"):
        app.enqueue_calls(two, [5])  # type: ignore[list-item]
    # A list's task is called with one item.
    with pytest.raises(InvalidArguments, match="a list's task takes one item"):
        app.lists.create("pairs", task=callback, items=[1, 2])
    assert "pairs" not in {i.name for i in app.lists.list()}


def test_an_async_job_that_timed_out_waiting_for_the_event_loop_never_starts_that_attempt(
        app: App, worker_factory) -> None:
    """One job's code holds the event loop 2 s; another (timeout 0.5 s) waits for it and
    times out before its code starts. Its future was cancelled, its slot counted it out,
    and then the loop's last-instant check came to it: counted out a second time (the
    running count went to -1, and a later job's grace at shutdown was cut short), and with
    a fresh read of the pauses its code even started. Its code never having run, it is
    given back unstarted (no attempt charged), counted out once, and runs once."""
    import time as _time

    starts: list[int] = []

    @app.task(name="hog", timeout=30)
    async def hog() -> None:
        _time.sleep(2.0)  # (a blocking call: the loop is held)

    @app.task(name="short", timeout=0.5, backoff=Backoff(base=0.05, jitter=0))
    async def short(n: int) -> int:
        starts.append(n)
        return n

    w = worker_factory(concurrency=3)
    stop = threading.Event()

    def read_pauses() -> None:  # (what the other slots' starts do on a busy worker)
        while not stop.wait(0.02):
            w._read_pauses()

    reader = threading.Thread(target=read_pauses, daemon=True)
    reader.start()
    app.enqueue(hog)
    _time.sleep(0.3)
    job = app.enqueue(short, [1])
    final = app.wait(job.id, 15)
    stop.set()
    assert final.state is JobState.SUCCEEDED and starts == [1], (final, starts)
    # Its wait for the loop was not its code running: given back unstarted, not charged.
    assert final.attempts == 1 and not final.errors, final
    _time.sleep(0.5)
    assert w.running == 0


def test_a_stop_gives_back_async_jobs_still_waiting_for_the_event_loop(app: App, worker_factory) -> None:
    """SIGTERM (stop) while async jobs wait for an event loop another job's code holds:
    they are unstarted, so given back at once, not started after the stop, and not
    'interrupted' (an attempt charged, dead on a last attempt) when the grace runs out."""
    import time as _time

    starts: list[int] = []

    @app.task(name="hog3", timeout=30)
    async def hog3() -> None:
        _time.sleep(3.0)

    @app.task(name="once", max_attempts=1)
    async def once(n: int) -> int:
        starts.append(n)
        return n

    w = worker_factory(concurrency=4, grace=0.5)
    app.enqueue(hog3)
    _time.sleep(0.3)
    jobs = [app.enqueue(once, [n]) for n in range(3)]
    _time.sleep(0.7)
    loop = w.executor.async_runner.loop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.stop()
        assert w.join(15)
        _time.sleep(0.2)
        assert starts == []
        for j in jobs:
            job = app.get_job(j.id)
            assert job.state is JobState.READY and job.attempts == 0, job
        # The worker's event loop ends with it (once the hog lets go): the hand-overs it
        # never reached are closed unstarted, not dropped as coroutines never awaited,
        # and the loop's sockets are closed.
        deadline = _time.monotonic() + 10
        while not loop.is_closed() and _time.monotonic() < deadline:
            _time.sleep(0.05)
        assert loop.is_closed()
        gc.collect()
    assert not [c for c in caught if "never awaited" in str(c.message)], [str(c.message) for c in caught]


def test_async_jobs_start_when_reading_the_paused_queues_is_slow(app: App, worker_factory) -> None:
    """An async job held over 0.1 s since its claim is checked against a fresh read of the
    paused queues on the event loop. With reads slower than 0.1 s (a distant database),
    a read was never fresh by the time it came back, and such jobs were given back
    forever. A read the check made itself counts, however long it took."""
    import time as _time

    @app.task(name="quick_async")
    async def quick_async(n: int) -> int:
        return n

    @app.task(name="slower_async")
    async def slower_async(n: int) -> int:
        await asyncio.sleep(0.05)
        return n

    w = worker_factory(concurrency=1, lease=30.0)  # (held jobs stay well inside their leases)
    # No-op jobs first: the worker's guess of how many to lease ahead grows, so the
    # slower jobs after them wait in its hands past 0.1 s.
    for i in app.enqueue_calls(quick_async, [(i,) for i in range(400)]):
        app.wait(i, 30)
    real = w.backend.queue_pauses

    def slow_read():  # type: ignore[no-untyped-def]
        _time.sleep(0.15)
        return real()

    w.backend.queue_pauses = slow_read  # type: ignore[method-assign]
    ids = app.enqueue_calls(slower_async, [(i,) for i in range(30)])
    for i in ids:
        assert app.wait(i, 60).state is JobState.SUCCEEDED
    # Each claimed once: none given back and claimed again (the old check gave them back
    # after three reads it judged stale, over and over).
    assert w.stats.claimed == 430, w.stats


def test_non_retryable_error_goes_dead_at_once(app: App, worker_factory) -> None:
    @app.task(name="refuse", max_attempts=10)
    def refuse() -> None:
        raise NonRetryable("card declined")

    job = refuse.enqueue()
    worker_factory()
    final = app.wait(job.id, 10)
    assert final.state is JobState.DEAD and final.attempts == 1


def test_unserialisable_result_is_dropped_with_a_note_not_a_failure(app: App, worker_factory) -> None:
    @app.task(name="odd")
    def odd() -> object:
        return object()

    job = odd.enqueue()
    worker_factory()
    final = app.wait(job.id, 10)
    assert final.state is JobState.SUCCEEDED and final.result is None
    assert "not JSON-serialisable" in final.last_error


def test_async_task_past_its_timeout_is_failed_and_retried(app: App, worker_factory) -> None:
    @app.task(name="slow_async", timeout=0.3, max_attempts=2, backoff=lambda n: 0.0)
    async def slow_async() -> None:
        await asyncio.sleep(10)

    job = slow_async.enqueue()
    worker_factory()
    final = app.wait(job.id, 15)
    assert final.state is JobState.DEAD and final.attempts == 2
    assert all(e["kind"] == "timeout" for e in final.errors)


def test_sync_task_past_its_timeout_is_failed_and_the_worker_keeps_serving(app: App, worker_factory) -> None:
    release = threading.Event()

    @app.task(name="stuck", timeout=0.3, max_attempts=1)
    def stuck() -> None:
        release.wait(20)

    @app.task(name="quick")
    def quick() -> str:
        return "ok"

    job = stuck.enqueue()
    worker_factory(concurrency=1)
    final = app.wait(job.id, 10)
    assert final.state is JobState.DEAD and final.errors[0]["kind"] == "timeout"
    # The only slot is stuck in the task; a replacement slot serves the next job.
    assert app.wait(quick.enqueue().id, 10).result == "ok"
    release.set()


def test_a_sync_task_that_returns_just_past_its_timeout_has_timed_out(app: App, worker_factory) -> None:
    """The supervisor checks timeouts every 0.1 s, between its own writes: a sync task
    that returned (or raised) after its timeout while that thread was busy (here held in
    its first lease renewal) was taken as done, success or error; about one in three of
    those a little late under load. Its return is checked too."""
    from justonce import failpoints

    @app.task(name="late_return", timeout=0.4, max_attempts=1)
    def late_return(fail: bool) -> str:
        time.sleep(0.5)
        if fail:
            raise ValueError("late and wrong")
        return "too late"

    ids = late_return.enqueue_many([(i % 2 == 1,) for i in range(4)])
    failpoints.configure("heartbeat.before_write=1*sleep(1500)")
    try:
        worker_factory(concurrency=4, heartbeat=0.2)
        for job_id in ids:
            final = app.wait(job_id, 20)
            assert final.state is JobState.DEAD and final.result is None, final
            assert [e["kind"] for e in final.errors] == ["timeout"], final.errors
    finally:
        failpoints.configure(None)


def test_a_timeout_error_a_task_raises_itself_is_its_failure_not_the_jobs_timeout(
        app: App, worker_factory) -> None:
    """A task may raise TimeoutError of its own (a socket read, an inner asyncio
    wait_for) well within its job's timeout: that attempt failed with the task's own
    message and traceback (kind "failed"), not "ran over its timeout" (once every
    TimeoutError was taken for the job's timeout, and the task's message was lost)."""
    @app.task(name="own_sync", timeout=300, max_attempts=1)
    def own_sync() -> None:
        raise TimeoutError("upstream read timed out after 2s")

    @app.task(name="own_async", timeout=300, max_attempts=1)
    async def own_async() -> None:
        await asyncio.wait_for(asyncio.sleep(10), 0.01)

    worker_factory()
    jobs = ((own_sync.enqueue(), "upstream read timed out"), (own_async.enqueue(), "TimeoutError"))
    for job, message in jobs:
        final = app.wait(job.id, 10)
        assert final.state is JobState.DEAD and [e["kind"] for e in final.errors] == ["failed"], final.errors
        assert message in (final.last_error or "") and "ran over" not in (final.last_error or "")


def test_worker_drains_many_jobs_exactly_once(app: App, worker_factory) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    @app.task(name="collect")
    def collect(i: int) -> None:
        with lock:
            seen.append(i)

    app.enqueue_many([Enqueue("collect", args=(i,)) for i in range(3000)])
    worker_factory(concurrency=4)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        counts = {c.state: c.count for c in app.queue_counts()}
        if counts.get(JobState.SUCCEEDED) == 3000:
            break
        time.sleep(0.1)
    assert sorted(seen) == list(range(3000))


def test_graceful_stop_finishes_running_jobs_and_releases_the_rest(app: App) -> None:
    started = threading.Event()

    @app.task(name="sleepy")
    def sleepy() -> str:
        started.set()
        time.sleep(0.5)
        return "done"

    first = sleepy.enqueue()
    rest = [sleepy.enqueue() for _ in range(5)]
    w = Worker(app, concurrency=1, lease=5, poll=0.1, prefetch=10, grace=5).start()
    assert started.wait(10)
    w.stop()
    assert w.join(10)
    assert app.get_job(first.id).state is JobState.SUCCEEDED
    states = {app.get_job(j.id).state for j in rest}
    assert JobState.RUNNING not in states


def test_grace_period_over_releases_the_running_job(app: App) -> None:
    started = threading.Event()
    release = threading.Event()

    @app.task(name="long")
    def long() -> None:
        started.set()
        release.wait(30)

    job = long.enqueue()
    w = Worker(app, concurrency=1, lease=5, poll=0.1, grace=0.2).start()
    assert started.wait(10)
    w.stop()
    assert w.join(10)
    after = app.get_job(job.id)
    assert after.state is JobState.READY and after.attempts == 1
    release.set()


def test_worker_rejects_bad_options(app: App) -> None:
    for bad in ({"concurrency": 0}, {"concurrency": "4"}, {"lease": -1}, {"lease": 1, "heartbeat": 2},
                {"queues": []}, {"queues": "default"}, {"queues": ["bad name"]}, {"prefetch": 0},
                {"grace": -1}, {"grace": "x"}, {"poll": 0}, {"ack_batch": 0}, {"ack_interval": 0},
                {"heartbeat": 1e-9}, {"lease": 1e300}, {"keep_dead": -1},
                {"housekeeping_interval": 0}):
        with pytest.raises(ValidationError):
            Worker(app, **bad)


def test_a_heartbeat_must_leave_time_to_renew_before_the_margin(app: App) -> None:
    """A leased job is started (and a slot claimed for) only while more than the margin
    (lease/5, at most 2 s) of its lease is left by the worker's clock; a heartbeat later
    than lease - margin would let every lease reach that point before its renewal, so
    unstarted jobs would be dropped and slots left idle in every cycle."""
    with pytest.raises(ValidationError, match="margin"):
        Worker(app, lease=1, heartbeat=0.9)
    with pytest.raises(ValidationError, match="margin"):
        Worker(app, lease=30, heartbeat=28.5)
    assert Worker(app, lease=1, heartbeat=0.7).heartbeat == 0.7
    assert Worker(app, lease=30, heartbeat=27).heartbeat == 27


def test_closing_the_app_right_after_stop_leaves_running_threads_their_connections(app: App) -> None:
    """A worker's threads may still be inside a claim when its app is closed; closing their
    connections under them used to crash the process (SQLite)."""

    @app.task(name="quick")
    def quick() -> None:
        return None

    for _ in range(10):
        quick.enqueue_many([()] * 50)
        w = Worker(app, concurrency=4, poll=0.05, lease=5).start()
        time.sleep(0.05)
        w.stop()
        app.close()  # no join first, on purpose
        assert w.join(15)
    assert app.queue_counts()  # the app reopens its database after close


def test_nothing_a_task_does_strands_its_job(app: App, worker_factory) -> None:
    """A broken custom backoff, sys.exit() in a task, a result too deep to encode, a result
    or an error with a NUL character: every job still ends in a recorded state, and the
    worker goes on serving."""
    import sys

    @app.task(name="bad_backoff", max_attempts=2, backoff=lambda: 1)  # type: ignore[arg-type]
    def bad_backoff() -> None:
        raise RuntimeError("first")

    @app.task(name="exits", max_attempts=1)
    def exits() -> None:
        sys.exit(3)

    @app.task(name="deep")
    def deep() -> list:
        value: list = []
        for _ in range(100_000):
            value = [value]
        return value

    @app.task(name="nul_result")
    def nul_result() -> str:
        return "a\x00b"

    @app.task(name="nul_error", max_attempts=1)
    def nul_error() -> None:
        raise ValueError("bad \x00 byte")

    @app.task(name="fine")
    def fine() -> str:
        return "ok"

    jobs = {t: app.enqueue(t) for t in ("bad_backoff", "exits", "deep", "nul_result", "nul_error")}
    worker_factory(concurrency=2)
    first = app.wait(jobs["bad_backoff"].id, 20)
    assert first.state is JobState.DEAD and "backoff failed" in first.errors[0]["error"]
    assert app.wait(jobs["exits"].id, 10).state is JobState.DEAD
    for name in ("deep", "nul_result"):
        done = app.wait(jobs[name].id, 10)
        assert done.state is JobState.SUCCEEDED and "result dropped" in done.last_error, done
    failed = app.wait(jobs["nul_error"].id, 10)
    assert failed.state is JobState.DEAD and "bad \\x00 byte" in failed.last_error
    assert app.wait(app.enqueue("fine").id, 10).result == "ok"


def test_cancelling_a_hung_sync_job_frees_its_slot(app: App, worker_factory) -> None:
    release = threading.Event()

    @app.task(name="hang")
    def hang() -> None:
        release.wait(30)

    @app.task(name="after")
    def after() -> str:
        return "served"

    job = app.enqueue("hang")
    worker_factory(concurrency=1, heartbeat=0.2)
    deadline = time.monotonic() + 10
    while app.get_job(job.id).state is not JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    app.cancel(job.id)
    assert app.wait(app.enqueue("after").id, 10).result == "served"
    release.set()


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_run_whose_lease_was_lost_keeps_its_job_and_key_from_starting_again_in_its_process(
    app: App, db_url: str, worker_factory, partitioned: bool
) -> None:
    """The first run of a job blocks; meanwhile its lease is lost (here: given back under
    it, as housekeeping does after a pause or a stalled database) and the same worker claims
    the job again. The second run must not start in this process before the first run's
    code has returned (and, for a partitioned job, neither may the key's next job)."""
    spans: list[tuple[str, float, float]] = []
    release = threading.Event()

    @app.task(queue="q", max_attempts=5)
    def step(name: str) -> None:
        began = time.monotonic()
        if name == "first" and not spans:
            release.wait(10)
        spans.append((name, began, time.monotonic()))

    key = {"partition_key": "k"} if partitioned else {}
    first = app.enqueue(step, ["first"], **key)
    if partitioned:
        app.enqueue(step, ["next"], **key)
    options = {"partitions": "overlap:1"} if partitioned else {}
    worker_factory(queues=["q"], concurrency=2, lease=2.0, heartbeat=0.3, **options)
    deadline = time.monotonic() + 10
    while (job := app.get_job(first.id)).state != JobState.RUNNING or not job.started_at:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.2)  # the first run is in its code now
    conn = proc_app.ledger_connect(db_url)
    try:
        token = conn.execute(proc_app._sql(conn, "SELECT lease_token FROM justonce_jobs WHERE id = ?"),
                             (first.id,)).fetchone()[0]
    finally:
        conn.close()
    assert app.backend.job_release([(first.id, token)], refund=False) == {first.id}
    # The worker sees the lease lost at its next heartbeat and claims the job again.
    while (again := app.get_job(first.id)).attempts < 2:
        assert time.monotonic() < deadline, again
        time.sleep(0.02)
    time.sleep(0.6)  # time enough to start the second run, were it allowed
    assert [name for name, _, _ in spans] == []
    release.set()
    while app.get_job(first.id).state != JobState.SUCCEEDED or (partitioned and len(spans) < 3):
        assert time.monotonic() < deadline + 10
        time.sleep(0.02)
    ordered = sorted(spans, key=lambda s: s[1])
    for (_, _, end), (_, start, _) in zip(ordered, ordered[1:], strict=False):
        assert start >= end, f"runs overlap in one process: {ordered}"


def test_an_idle_sqlite_waiter_looks_less_often_and_still_wakes_on_a_change(tmp_path) -> None:
    """The SQLite waiter reads PRAGMA data_version every few milliseconds while its worker
    has been claiming jobs, and every QUIET_EVERY once it has claimed nothing for
    QUIET_AFTER (the wake-ups were an idle worker's cost); a commit still wakes it."""
    app = App(f"sqlite:///{tmp_path / 'q.db'}")
    app.migrate()

    @app.task(name="t")
    def t(n: int) -> None:
        return None

    waiter = app.backend.waiter(["default"])
    try:
        waiter.wait(0.01)  # connects
        looks: list[str] = []
        waiter._conn.set_trace_callback(looks.append)  # type: ignore[attr-defined]
        waiter.wait(1.0, idle_for=0.0)
        busy, looks[:] = len(looks), []
        waiter.wait(1.0, idle_for=60.0)
        quiet = len(looks)
        # (An upper bound on the quiet one: a loaded machine only makes fewer looks.)
        assert 1 <= quiet <= 1.0 / waiter.QUIET_EVERY + 3 and busy > 2 * quiet
        commit = threading.Timer(0.3, lambda: t.enqueue(1))
        commit.start()
        started = time.monotonic()
        waiter.wait(30.0, idle_for=60.0)
        commit.join()
        assert time.monotonic() - started < 20  # woken by the commit, not the timeout
    finally:
        waiter.close()
        waiter.wait(0.0)  # (the waiting thread closes its own connection)
        app.close()


def test_a_supervisor_that_waits_on_the_database_past_a_heartbeat_is_not_a_paused_worker(
        app: App, db_url: str, worker_factory) -> None:
    """The supervisor's lease renewal waits 3 s, more than a heartbeat and a tick, for a
    lock another transaction holds (the running job's row; on SQLite the file's write
    lock). The process ran all along: it must not log worker.paused (which drops every
    unstarted job), only measure pauses across its own sleep. The renewal goes through
    once the lock is gone, and the job succeeds with its first attempt. (A real SIGSTOP
    is still seen: test_processes' test_jobs_leased_before_a_sigstop_past_the_lease_...
    The heartbeat is 1 s: a thread of a loaded machine's process may wait for the CPU for
    half a second, and a pause that long counts, by design, as one.)"""
    started = threading.Event()

    @app.task(name="steady")
    def steady() -> str:
        started.set()
        time.sleep(5.0)
        return "done"

    job = steady.enqueue()
    with events() as got:
        worker_factory(concurrency=1, lease=6.0, heartbeat=1.0)
        assert started.wait(30)
        time.sleep(1.2)  # a renewal first: the lease now runs well past the lock
        if db_url.startswith("sqlite"):
            holder = sqlite3.connect(db_url[len("sqlite:///"):], isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
        else:
            holder = proc_app.ledger_connect(db_url)
            if db_url.startswith("mysql"):
                holder.begin()
                holder.cursor().execute("SELECT id FROM justonce_jobs WHERE id = %s FOR UPDATE",
                                        (job.id,))
            else:
                holder.autocommit = False
                holder.execute("SELECT id FROM justonce_jobs WHERE id = %s FOR UPDATE", (job.id,))
        try:
            time.sleep(3.0)
        finally:
            holder.commit() if not db_url.startswith("sqlite") else holder.execute("COMMIT")
            holder.close()
        done = app.wait(job.id, 30)
    assert (done.state, done.attempts, done.result) == ("succeeded", 1, "done"), done
    assert named(got, "worker.paused") == []
    assert named(got, "job.lease_lost") == [] and named(got, "job.rejected") == []


def test_a_child_a_task_forks_that_returns_from_the_task_ends_there(app: App, worker_factory) -> None:
    """A task forks and its child returns from the task instead of ending itself: the child
    went on in the worker's loop, completed the job in its parent's place, ran other jobs
    over its parent's connections and outlived the worker. It ends at the task's return."""
    import os

    @app.task(name="forks")
    def forks() -> str:
        pid = os.fork()
        if pid == 0:
            return "child"  # (a child that forgot os._exit)
        _, status = os.waitpid(pid, 0)
        return f"parent, child exited {os.waitstatus_to_exitcode(status)}"

    @app.task(name="whose")
    def whose() -> int:
        return os.getpid()

    job = forks.enqueue()
    worker_factory(concurrency=1)
    assert app.wait(job.id, 20).result == "parent, child exited 0"
    for other in [whose.enqueue() for _ in range(5)]:
        assert app.wait(other.id, 20).result == os.getpid()
