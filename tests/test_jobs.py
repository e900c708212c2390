"""The job queue's behaviour, run against every backend (a temp SQLite file and Postgres)."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import proc_app
from conftest import LONG
from justonce import (
    App,
    DatabaseUnavailable,
    Enqueue,
    InvalidOption,
    InvalidTransition,
    Job,
    JobNotFound,
    JobState,
    KeyConflict,
    LockTimeout,
)
from justonce.models import Completion, Failure
from justonce.worker import Maintenance

OWNER = "test-owner"


def make_tasks(app: App) -> None:
    @app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="noop", queue="other")
    def noop() -> None:
        return None


@pytest.fixture
def tapp(app: App) -> App:
    make_tasks(app)
    return app


def claim(app: App, queue: str = "default", limit: int = 10, lease: float = 30.0):
    return app.backend.job_claim(queue, limit, OWNER, lease)


def test_enqueue_returns_a_ready_job_that_can_be_looked_up(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2])
    assert job.state is JobState.READY and job.attempts == 0 and job.queue == "default"
    again = tapp.get_job(job.id)
    assert again.args == [1, 2] and again.kwargs == {} and again.task == "add"
    assert [j.id for j in tapp.list_jobs(state="ready")] == [job.id]


def test_unknown_job_id_raises_job_not_found(tapp: App) -> None:
    with pytest.raises(JobNotFound):
        tapp.get_job(123456)


def test_delayed_job_is_scheduled_then_promoted_by_housekeeping(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 1], delay=0.3)
    assert job.state is JobState.SCHEDULED
    maint = Maintenance(tapp.backend, OWNER)
    assert maint.run_once(force=True).promoted == 0
    assert claim(tapp) == []
    time.sleep(0.4)
    assert maint.run_once(force=True).promoted == 1
    assert [c.id for c in claim(tapp)] == [job.id]


def test_run_at_in_the_past_is_ready_at_once(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 1], run_at=datetime.now(UTC) - timedelta(hours=1))
    assert job.state is JobState.READY


def test_claim_respects_priority_then_enqueue_order(tapp: App) -> None:
    low = tapp.enqueue("add", [0, 0], priority=5)
    first = tapp.enqueue("add", [0, 1])
    second = tapp.enqueue("add", [0, 2])
    urgent = tapp.enqueue("add", [0, 3], priority=-5)
    assert [c.id for c in claim(tapp)] == [urgent.id, first.id, second.id, low.id]


def test_claim_only_takes_its_own_queue(tapp: App) -> None:
    tapp.enqueue("noop")
    assert claim(tapp, "default") == []
    assert len(claim(tapp, "other")) == 1


def test_key_returns_the_live_job_instead_of_a_duplicate(tapp: App) -> None:
    a = tapp.enqueue("add", [1, 2], key="order-7")
    b = tapp.enqueue("add", [9, 9], key="order-7")
    assert b.duplicate and b.id == a.id and b.args == [1, 2]
    assert not a.duplicate
    # Once the job is finished the key is free again.
    (c,) = claim(tapp)
    assert tapp.backend.job_complete_many([Completion(c.id, c.lease_token, "3")]) == {c.id}
    fresh = tapp.enqueue("add", [1, 2], key="order-7")
    assert fresh.id != a.id and not fresh.duplicate


def test_concurrent_enqueues_of_one_key_from_many_threads_create_one_job(db_url: str) -> None:
    apps = [App(db_url) for _ in range(8)]
    apps[0].migrate()
    for a in apps:
        make_tasks(a)
    barrier = threading.Barrier(len(apps))

    def hammer(a: App) -> set[int]:
        barrier.wait()
        return {a.enqueue("add", [1, 1], key="same").id for _ in range(25)}

    for _ in range(3):
        with ThreadPoolExecutor(len(apps)) as pool:
            ids = set().union(*pool.map(hammer, apps))
        assert len(ids) == 1
        live = [j for j in apps[0].list_jobs(limit=1000) if j.state.is_live]
        assert len(live) == 1
        apps[0].cancel(ids.pop())  # frees the key for the next round
    for a in apps:
        a.close()


def test_bulk_enqueue_returns_ids_in_input_order_and_respects_keys(tapp: App) -> None:
    existing = tapp.enqueue("add", [0, 0], key="k-3")
    reqs = [Enqueue("add", args=(i, i), key=f"k-{i}" if i % 3 == 0 else None) for i in range(3000)]
    reqs.append(Enqueue("add", args=(1, 1), key="k-0"))  # a duplicate within the batch
    ids = tapp.enqueue_many(reqs)
    assert len(ids) == 3001
    assert ids[3] == existing.id
    assert ids[-1] == ids[0]
    for i in (1, 2, 4, 1000, 2999):
        assert tapp.get_job(ids[i]).args == [i, i]
    total = sum(c.count for c in tapp.queue_counts())
    assert total == 3000  # 2999 new + the existing one


def test_bulk_enqueue_of_thousands_is_one_atomic_call(tapp: App) -> None:
    reqs = [Enqueue("add", args=(i, 1)) for i in range(5000)]
    reqs.append(Enqueue("add", args=(1, 1), queue="bad queue!"))
    with pytest.raises(Exception):  # noqa: B017 - validation fails before any write
        tapp.enqueue_many(reqs)
    assert tapp.queue_counts() == []
    assert len(tapp.enqueue_many(reqs[:-1])) == 5000


def _own_connection(db_url: str):
    if db_url.startswith("sqlite"):
        from justonce.backends.sqlite.backend import parse_sqlite_url

        return sqlite3.connect(parse_sqlite_url(db_url)[0])
    if db_url.startswith("mysql"):
        import proc_app

        conn = proc_app.ledger_connect(db_url)  # PyMySQL's (execute() added for the tests)
        # as the server gives it to a caller: REPEATABLE READ, autocommit off
        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.autocommit(False)
        return conn
    import psycopg

    from justonce.backends.postgres.backend import parse_postgres_url

    conninfo, schema, _ = parse_postgres_url(db_url)
    return psycopg.connect(conninfo, options=f"-c search_path={schema}")


def test_transactional_enqueue_rolled_back_leaves_no_job(tapp: App, db_url: str) -> None:
    conn = _own_connection(db_url)
    conn.execute("CREATE TABLE orders (id integer primary key)")
    conn.commit()
    conn.execute("INSERT INTO orders VALUES (1)")
    job = tapp.enqueue("add", [1, 2], conn=conn)
    conn.rollback()
    conn.close()
    with pytest.raises(JobNotFound):
        tapp.get_job(job.id)
    assert tapp.queue_counts() == []


def test_transactional_enqueue_committed_leaves_exactly_one_job(tapp: App, db_url: str) -> None:
    conn = _own_connection(db_url)
    conn.execute("CREATE TABLE orders (id integer primary key)")
    conn.execute("INSERT INTO orders VALUES (1)")
    job = tapp.enqueue("add", [1, 2], conn=conn)
    ids = tapp.enqueue_many([Enqueue("add", args=(i, i)) for i in range(10)], conn=conn)
    conn.commit()
    conn.close()
    assert tapp.get_job(job.id).state is JobState.READY
    assert len(ids) == 10
    assert sum(c.count for c in tapp.queue_counts()) == 11


def test_completion_with_a_stale_lease_token_is_rejected(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2])
    (c,) = claim(tapp)
    assert tapp.backend.job_complete_many([Completion(c.id, c.lease_token + 1, None)]) == set()
    assert tapp.backend.job_fail(Failure(c.id, c.lease_token - 1, "x", 1.0)) is None
    assert tapp.backend.job_heartbeat([(c.id, c.lease_token + 7)], 30) == set()
    assert tapp.get_job(job.id).state is JobState.RUNNING
    assert tapp.backend.job_complete_many([Completion(c.id, c.lease_token, "3")]) == {c.id}
    done = tapp.get_job(job.id)
    assert done.state is JobState.SUCCEEDED and done.result == 3


def test_late_completion_from_expired_lease_is_rejected(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2])
    (zombie,) = claim(tapp, lease=0.2)
    time.sleep(0.4)
    report = Maintenance(tapp.backend, OWNER).run_once(force=True)
    assert report.rescued == 1
    (second,) = claim(tapp)
    assert second.id == job.id and second.attempts == 2
    assert second.lease_token > zombie.lease_token
    # The zombie wakes up: every write it tries is refused.
    assert tapp.backend.job_heartbeat([(zombie.id, zombie.lease_token)], 30) == set()
    assert tapp.backend.job_complete_many([Completion(zombie.id, zombie.lease_token, "1")]) == set()
    assert tapp.backend.job_complete_many([Completion(second.id, second.lease_token, "3")]) == {job.id}
    final = tapp.get_job(job.id)
    assert final.state is JobState.SUCCEEDED and final.result == 3
    assert [e["kind"] for e in final.errors] == ["lease_expired"]



def test_settled_names_the_jobs_a_token_left_settled_and_nothing_else(tapp: App) -> None:
    """job_settled, asked by a worker whose write's reply was lost: of (id, token) pairs,
    the jobs still carrying that token and no longer running, with state, attempts and
    last error. A running job, a token not the job's, and a job claimed again are left out."""
    a, b, c, d = (tapp.enqueue("add", [n, n]) for n in range(4))
    claimed = {j.id: j for j in claim(tapp)}
    ca, cb, cc, cd = (claimed[j.id] for j in (a, b, c, d))
    assert tapp.backend.job_complete_many([Completion(ca.id, ca.lease_token, "0")]) == {a.id}
    assert tapp.backend.job_fail(Failure(cb.id, cb.lease_token, "boom", None)) is JobState.DEAD
    assert tapp.backend.job_fail(Failure(cc.id, cc.lease_token, "again", 0.0)) is JobState.READY
    (again,) = claim(tapp)  # c, claimed anew: a new token
    assert again.id == c.id and again.lease_token > cc.lease_token
    asked = [(a.id, ca.lease_token), (b.id, cb.lease_token), (c.id, cc.lease_token),
             (d.id, cd.lease_token), (a.id, ca.lease_token + 1), (10**9, 1)]
    settled = tapp.backend.job_settled(asked)
    assert {i: (s.state, s.attempts, s.last_error) for i, s in settled.items()} == {
        a.id: (JobState.SUCCEEDED, 1, None), b.id: (JobState.DEAD, 1, "boom")}
    assert tapp.backend.job_settled([]) == {}

def test_heartbeat_keeps_a_lease_alive(tapp: App) -> None:
    tapp.enqueue("add", [1, 2])
    (c,) = claim(tapp, lease=0.5)
    for _ in range(4):
        time.sleep(0.2)
        assert tapp.backend.job_heartbeat([(c.id, c.lease_token)], 0.5) == {c.id}
    assert Maintenance(tapp.backend, OWNER).run_once(force=True).rescued == 0


def test_lease_expiry_of_the_last_attempt_makes_the_job_dead(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2], max_attempts=1)
    claim(tapp, lease=0.1)
    time.sleep(0.3)
    report = Maintenance(tapp.backend, OWNER).run_once(force=True)
    assert (report.rescued, report.dead) == (0, 1)
    assert tapp.get_job(job.id).state is JobState.DEAD


def test_failure_schedules_a_retry_then_dead_when_attempts_are_spent(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2], max_attempts=2)
    (c,) = claim(tapp)
    assert tapp.backend.job_fail(Failure(c.id, c.lease_token, "boom", 60.0)) is JobState.SCHEDULED
    after = tapp.get_job(job.id)
    assert after.run_at > after.created_at + timedelta(seconds=50)
    assert after.last_error == "boom"
    assert tapp.backend.job_fail(Failure(c.id, c.lease_token, "again", 1.0)) is None  # not running
    job2 = tapp.enqueue("add", [5, 5], max_attempts=2)
    (c1,) = claim(tapp)
    assert c1.id == job2.id
    assert tapp.backend.job_fail(Failure(c1.id, c1.lease_token, "e1", 0.0)) is JobState.READY
    (c2,) = claim(tapp)
    assert c2.attempts == 2
    assert tapp.backend.job_fail(Failure(c2.id, c2.lease_token, "e2", 0.0)) is JobState.DEAD
    dead = tapp.get_job(job2.id)
    assert dead.state is JobState.DEAD and [e["error"] for e in dead.errors] == ["e1", "e2"]
    assert dead.finished_at is not None


def test_dead_job_can_be_retried_by_hand(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2], max_attempts=1)
    (c,) = claim(tapp)
    tapp.backend.job_fail(Failure(c.id, c.lease_token, "boom", None))
    revived = tapp.retry(job.id)
    assert revived.state is JobState.READY and revived.attempts == 0
    assert revived.errors and revived.errors[0]["error"] == "boom"  # history is kept
    with pytest.raises(InvalidTransition):
        tapp.retry(job.id)  # ready jobs are not retried


def test_retry_refuses_when_another_live_job_holds_the_key(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2], key="k")
    tapp.cancel(job.id)
    tapp.enqueue("add", [1, 2], key="k")
    with pytest.raises(KeyConflict):
        tapp.retry(job.id)


def test_cancel_live_jobs_and_refuse_finished_ones(tapp: App) -> None:
    ready = tapp.enqueue("add", [1, 2])
    running = tapp.enqueue("add", [3, 4])
    assert tapp.cancel(ready.id).state is JobState.CANCELLED
    (c,) = claim(tapp)
    assert c.id == running.id
    tapp.cancel(running.id)
    # The worker that was running it is fenced out.
    assert tapp.backend.job_complete_many([Completion(c.id, c.lease_token, None)]) == set()
    with pytest.raises(InvalidTransition):
        tapp.cancel(ready.id)
    with pytest.raises(JobNotFound):
        tapp.cancel(999999)


def test_release_gives_unstarted_jobs_back_without_counting_the_attempt(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2])
    (c,) = claim(tapp)
    assert tapp.backend.job_release([(c.id, c.lease_token)], refund=True) == {c.id}
    back = tapp.get_job(job.id)
    assert back.state is JobState.READY and back.attempts == 0


def test_concurrent_claims_never_hand_out_one_job_twice(db_url: str) -> None:
    a0 = App(db_url)
    a0.migrate()
    make_tasks(a0)
    n = 2000
    a0.enqueue_many([Enqueue("add", args=(i, 0)) for i in range(n)])
    apps = [App(db_url) for _ in range(6)]

    def drain(a: App) -> list[int]:
        got = []
        while True:
            jobs = a.backend.job_claim("default", 7, "t", 30)
            if not jobs:
                return got
            got.extend(j.id for j in jobs)

    with ThreadPoolExecutor(len(apps)) as pool:
        claimed = [i for part in pool.map(drain, apps) for i in part]
    assert len(claimed) == n and len(set(claimed)) == n
    for a in [a0, *apps]:
        a.close()


def test_only_one_caller_wins_a_maintenance_round(db_url: str) -> None:
    apps = [App(db_url) for _ in range(6)]
    apps[0].migrate()
    barrier = threading.Barrier(len(apps))

    def attempt(a: App) -> bool:
        barrier.wait()
        return a.backend.maintenance_try("rescue", 30.0, "me")

    with ThreadPoolExecutor(len(apps)) as pool:
        wins = list(pool.map(attempt, apps))
    assert wins.count(True) == 1
    for a in apps:
        a.close()


def test_prune_removes_finished_jobs_past_retention(tapp: App) -> None:
    keep = tapp.enqueue("add", [1, 2])
    gone = tapp.enqueue("add", [3, 4], queue="q2")
    (c,) = claim(tapp, "q2")
    tapp.backend.job_complete_many([Completion(c.id, c.lease_token, None)])
    time.sleep(0.05)
    assert tapp.backend.jobs_prune(keep_succeeded=0.0, keep_dead=0.0) == 1
    assert tapp.get_job(keep.id).state is JobState.READY
    with pytest.raises(JobNotFound):
        tapp.get_job(gone.id)


def test_database_clock_is_used_for_times(tapp: App) -> None:
    db_now = tapp.backend.now()
    job = tapp.enqueue("add", [1, 2], delay=3600)
    assert abs((job.run_at - db_now).total_seconds() - 3600) < 5


def test_complete_and_claim_records_the_batch_and_leases_the_next_in_one_call(tapp: App) -> None:
    first, second = tapp.enqueue("add", [1, 1]), tapp.enqueue("add", [2, 2])
    (c1,) = claim(tapp, limit=1)
    zombie = Completion(c1.id, c1.lease_token + 1, None)
    accepted, jobs = tapp.backend.job_complete_and_claim(
        [Completion(c1.id, c1.lease_token, "2"), zombie], "default", 5, OWNER, 30.0
    )
    assert accepted == {first.id}
    assert [j.id for j in jobs] == [second.id]
    assert tapp.get_job(first.id).state is JobState.SUCCEEDED
    assert tapp.get_job(second.id).state is JobState.RUNNING
    accepted, jobs = tapp.backend.job_complete_and_claim([], "default", 5, OWNER, 30.0)
    assert accepted == set() and jobs == []


def test_task_enqueue_many_takes_tuples_and_dicts_with_shared_options(tapp: App) -> None:
    add = tapp.tasks["add"]
    ids = add.enqueue_many([(1, 2), {"a": 3, "b": 4}, [5, 6]], priority=3, delay=3600)
    jobs = [tapp.get_job(i) for i in ids]
    assert [(j.args, j.kwargs) for j in jobs] == [([1, 2], {}), ([], {"a": 3, "b": 4}), ([5, 6], {})]
    assert {j.state for j in jobs} == {JobState.SCHEDULED} and {j.priority for j in jobs} == {3}
    now_ids = add.enqueue_many([(7, 7)] * 50)
    assert now_ids == sorted(now_ids) and len(set(now_ids)) == 50
    assert len(claim(tapp, limit=100)) == 50


NESTED_63: list = []
for _ in range(62):
    NESTED_63 = [NESTED_63]  # 63 levels: 64 as an argument (the most allowed)


def test_bulk_enqueue_stores_each_calls_arguments_exactly_whatever_their_shape(app: App) -> None:
    # MariaDB splits a list of calls on the server when they differ in their positional
    # arguments only or their keyword arguments only, and renders rows itself otherwise or
    # when the list is nested deeper than its JSON functions read: every path keeps each
    # call's arguments as written, in order.
    @app.task(name="any")
    def any_task(*args: object, **kwargs: object) -> None:
        return None

    odd = ["é😀\u2028'\"\\", "%s %(x)s", 2**70, 0.1, -0.0, None, True, [], {"b": 1, "a": 2}]
    shapes = [
        [(i, *odd) for i in range(300)],
        [{"a": i, "odd": odd} for i in range(300)],
        [(i,) if i % 2 else {"a": i} for i in range(300)],
        [(i,) for i in range(150)] + [(NESTED_63,)] + [(i,) for i in range(150)],
        [{"a": i} for i in range(150)] + [{"deep": NESTED_63}] + [{"a": i} for i in range(150)],
        [()] * 300,
    ]
    for calls in shapes:
        ids = any_task.enqueue_many(calls)
        assert len(ids) == len(calls) and ids == sorted(ids)
        for i in (0, 1, 150, 151, len(calls) - 1):
            job = app.get_job(ids[i])
            call = calls[i]
            want = (list(call), {}) if isinstance(call, tuple) else ([], call)
            assert (job.args, job.kwargs) == want
            assert list(job.kwargs) == list(want[1])  # key order kept


def test_a_bulk_enqueue_bigger_than_one_statement_keeps_every_call_in_order(app: App, db_url: str) -> None:
    """100 calls of ~250 KiB each (every one under the payload limit): ~25 MB, more than
    MariaDB's default max_allowed_packet (16 MiB). The one INSERT was refused (1153, a raw
    driver error) or answered by the server closing the connection (DatabaseUnavailable,
    on every retry); it is now cut into statements under the limit, in one transaction."""
    @app.task(name="big")
    def big(*args: object, **kwargs: object) -> None:
        return None

    pad = "x" * (250 * 1024)
    n = 100 if LONG or db_url.startswith("mysql") else 20  # (the packet limit is MySQL's)
    for calls in ([(pad, i) for i in range(n)],            # positional only (MariaDB: one doc)
                  [(pad, i) if i % 2 else {"pad": pad, "i": i} for i in range(n)]):  # rows
        ids = big.enqueue_many(calls)
        assert len(set(ids)) == n and ids == sorted(ids)
        for i in (0, 1, n // 2 - 1, n // 2, n - 1):
            job = app.get_job(ids[i])
            want = (list(calls[i]), {}) if isinstance(calls[i], tuple) else ([], calls[i])
            assert (job.args, job.kwargs) == want
    batch = app.batches.open()
    group, ids = batch.enqueue_calls("big", [(pad, i) for i in range(n)])
    assert [app.get_job(j).batch_item for j in (ids[0], ids[n // 2], ids[-1])] == [
        group.item_ids()[0], group.item_ids()[n // 2], group.item_ids()[-1]]


@pytest.mark.mysql
def test_mysql_cuts_a_bulk_enqueue_at_any_statement_size_and_refuses_one_too_big_call(
        app: App, db_url: str) -> None:
    if not db_url.startswith("mysql"):
        pytest.skip("MySQL's max_allowed_packet")
    app.task(name="t")(lambda *a: None)
    app.backend.d.statement_bytes = 40_000  # as if max_allowed_packet were ~100 KB
    calls = [(f"{i}:" + "é" * (1000 + 37 * i), i) for i in range(200)]
    for consecutive in (True, False):  # (False: innodb_autoinc_lock_mode 2, a row at a time)
        app.backend.d.consecutive_ids = consecutive
        batch = app.batches.open()
        group, ids = batch.enqueue_calls("t", calls)
        assert len(set(ids)) == 200 and ids == sorted(ids)
        for i in range(200):
            job = app.get_job(ids[i])
            assert job.args == list(calls[i]) and job.batch_item == group.item_ids()[i]
    app.backend.d.consecutive_ids = True
    counts = sum(q.count for q in app.queue_counts())
    with pytest.raises(InvalidOption, match="max_allowed_packet"):
        app.enqueue_calls("t", [("a", 1), ("b" * 50_000, 2)])
    assert sum(q.count for q in app.queue_counts()) == counts  # nothing of the call written


def test_concurrent_bulk_enqueues_of_the_same_keys_in_opposite_orders_do_not_deadlock(
    db_url: str,
) -> None:
    apps = [App(db_url) for _ in range(2)]
    apps[0].migrate()
    for a in apps:
        make_tasks(a)
    keys = [f"k{i}" for i in range(3000)]
    orders = [keys, list(reversed(keys))]
    for _ in range(3):
        barrier = threading.Barrier(2)

        def run(i: int, barrier: threading.Barrier = barrier) -> list[int]:
            barrier.wait()
            return apps[i].enqueue_many([Enqueue("add", args=(1, 1), key=k) for k in orders[i]])

        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(run, range(2))
        assert sorted(a) == sorted(b)  # the same 3,000 jobs, whoever inserted them
        for job_id in a[:10]:
            apps[0].cancel(job_id)
        apps[0].backend.jobs_prune(0, 0)
    for a in apps:
        a.close()


def test_the_job_enqueue_returns_is_the_job_the_database_holds(tapp: App) -> None:
    job = tapp.enqueue("add", [1, 2], {}, delay=60, priority=4, key="same-as-db",
                       partition_key=7, max_attempts=3, timeout=9)
    stored = tapp.get_job(job.id)
    for field in ("id", "queue", "task", "args", "kwargs", "state", "priority", "attempts",
                  "max_attempts", "timeout", "key", "partition_key", "run_at", "created_at",
                  "errors", "result", "last_error", "started_at", "finished_at"):
        assert getattr(job, field) == getattr(stored, field), field


def test_a_time_filter_past_the_first_or_last_representable_utc_time_is_that_bound(app: App) -> None:
    """0001-01-01T00:00+14:00 is a valid aware time whose UTC lies before year 1 (and
    9999-12-31T23:59-23:59 after 9999): as a filter's bound it is the earliest or latest
    time there is, on every backend (on MariaDB, once an OverflowError and a 500)."""
    from datetime import timezone

    from justonce.models import JobFilter

    @app.task
    def t() -> None: ...

    ids = [t.enqueue().id for _ in range(3)]
    first = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))
    last = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=23, minutes=59)))
    everything = sorted(ids, reverse=True)
    cases = [(JobFilter(created_after=first), everything), (JobFilter(created_before=last), everything),
             (JobFilter(created_before=first), []), (JobFilter(created_after=last), [])]
    for where, expected in cases:
        jobs, _ = app.list_jobs_page(where)
        assert [j.id for j in jobs] == expected, where
        assert app.count_matching("cancel", where)[0] == len(expected), where


def test_a_bulk_enqueue_gives_ids_in_the_order_given_whatever_the_keys(app: App) -> None:
    """Jobs of one enqueue_many call run in the order given: ids ascend in that order
    even where the jobs carry keys that sort otherwise (keyed rows are inserted in key
    order, so that concurrent bulk inserts lock keys in one order). Once the keys' order
    decided: an account's "updated" event, key evt-aa, ran before its "created", evt-zz."""
    @app.task
    def event(n: int) -> None: ...

    keys = ["evt-zz", None, "evt-mm", "evt-aa", None, "evt-bb"]
    requests = [Enqueue(event, args=(n,), key=k, partition_key="acct-1") for n, k in enumerate(keys)]
    ids = app.enqueue_many(requests)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [app.get_job(i).args for i in ids] == [[n] for n in range(len(keys))]
    # Again with some keys held by live jobs: those answer the live job, the rest ascend.
    more = ["evt-zz", "evt-yy", None, "evt-aa", "evt-ab"]
    again = app.enqueue_many([Enqueue(event, args=(10 + n,), key=k, partition_key="acct-1")
                              for n, k in enumerate(more)])
    assert again[0] == ids[0] and again[3] == ids[3]
    fresh = [again[i] for i in (1, 2, 4)]
    assert fresh == sorted(fresh) and min(fresh) > max(ids)
    assert [app.get_job(i).args for i in fresh] == [[11], [12], [14]]


def test_a_bulk_enqueue_on_your_autocommit_connection_commits_once_in_the_order_given(
        app: App, db_url: str) -> None:
    """On your own connection in autocommit, enqueue_many is still one transaction (on
    MariaDB its rows' ids are handed back in the order given before the commit: a worker
    must never see a row whose id is about to change), and leaves the connection as it was."""
    import proc_app

    @app.task
    def event(n: int) -> None: ...

    conn = proc_app.ledger_connect(db_url)
    try:
        keys = ["k-z", "k-a", None, "k-m"]
        ids = app.enqueue_many([Enqueue(event, args=(n,), key=k, partition_key=1) for n, k in enumerate(keys)],
                               conn=conn)
        assert ids == sorted(ids)
        assert [app.get_job(i).args for i in ids] == [[0], [1], [2], [3]]
        if db_url.startswith("mysql"):
            assert conn.get_autocommit() and not app.backend.mysql._in_transaction(conn)
    finally:
        conn.close()


def test_concurrent_bulk_enqueues_of_partly_shared_keys_in_any_order_neither_deadlock_nor_reorder(
        db_url: str) -> None:
    """Four threads bulk-enqueue jobs whose keys overlap in part, in random orders, with
    options that differ (the row-by-row path): no call fails (no deadlock), each keyed
    request answers the live job holding its key, and each call's own new jobs have ids
    ascending in the order given."""
    import random

    apps = [App(db_url) for _ in range(4)]
    apps[0].migrate()
    for a in apps:
        make_tasks(a)
    errors: list[BaseException] = []
    calls: list[tuple[list[Enqueue], list[int]]] = []
    barrier = threading.Barrier(4)

    def run(t: int) -> None:
        rnd = random.Random(t)
        barrier.wait()
        for r in range(12):
            reqs = [Enqueue("add", args=(t, r * 100 + i), priority=rnd.randrange(3),
                            key=f"k{rnd.randrange(150)}" if rnd.random() < 0.8 else None)
                    for i in range(30)]
            try:
                calls.append((reqs, apps[t].enqueue_many(reqs)))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:3]
    for reqs, ids in calls:
        mine = [job_id for req, job_id in zip(reqs, ids, strict=True)
                if apps[0].get_job(job_id).args == list(req.args)]
        assert mine == sorted(mine)
        for req, job_id in zip(reqs, ids, strict=True):
            if req.key is not None:
                assert apps[0].get_job(job_id).key == req.key
    for a in apps:
        a.close()


def test_retry_all_matching_acts_on_each_job_once_though_workers_kill_them_again(tapp: App) -> None:
    """Retry-all-matching goes in chunks; a job a chunk made ready may die again (a worker
    ran it and it failed) before the next chunk. It is not taken again: each chunk starts
    after the last job the one before took (once, a job could be retried many times by
    one action, and "applied" exceed the preview's count)."""
    from justonce.models import JobFilter

    ids = tapp.enqueue_calls("add", [[i, i] for i in range(10)], queue="again", max_attempts=1)
    for job_id in ids:
        tapp.cancel(job_id)
    where = JobFilter(queue="again", max_id=max(ids))
    real = tapp.backend.jobs_retry_matching
    taken: list[int] = []

    def chunk_then_kill_them_again(w: JobFilter, limit: int, after: int = 0) -> tuple[int, int]:
        n, last = real(w, limit, after)
        ready = [j.id for j in tapp.list_jobs(queue="again", state="ready")]
        taken.extend(ready)
        for job_id in ready:  # a worker runs them and they die at once
            tapp.cancel(job_id)
        return n, last

    tapp.backend.jobs_retry_matching = chunk_then_kill_them_again  # type: ignore[method-assign]
    try:
        applied = tapp.apply_matching("retry", where, expected=10, chunk=3)
    finally:
        tapp.backend.jobs_retry_matching = real  # type: ignore[method-assign]
    assert applied == 10 and sorted(taken) == sorted(ids)


def test_retry_all_matching_leaves_out_a_key_a_new_job_takes_while_its_chunk_runs(
        tapp: App, db_url: str) -> None:
    """A keyed dead job is retried only while no live job holds its key. A live job of
    that key enqueued after the chunk's check and before its update (here: inserted by
    another transaction that commits while the chunk waits on the key's index) fails the
    chunk on the unique index: the chunk is tried again, leaves that job out, and every
    other job of it is retried (once a 500 halfway through, with earlier chunks kept)."""
    import proc_app

    ids = [tapp.enqueue("add", [i, i], key=f"rk{i}", queue="rk").id for i in range(6)]
    for job_id in ids:
        tapp.cancel(job_id)
    other = proc_app.ledger_connect(db_url)
    try:
        if db_url.startswith("sqlite"):
            pytest.skip("SQLite has one writer: no other transaction can insert meanwhile")
        # Another transaction holds a new live job of key rk3, not committed yet.
        if db_url.startswith("mysql"):
            other.begin()
        else:
            other.autocommit = False
        tapp.enqueue("add", [3, 3], key="rk3", queue="rk", conn=other)
        from justonce.models import JobFilter

        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(
            tapp.apply_matching("retry", JobFilter(queue="rk", max_id=max(ids)), expected=6)))
        t.start()
        time.sleep(1.0)  # the chunk passed its check and waits on rk3's index entry
        other.commit()
        t.join(30)
    finally:
        other.close()
    assert result == [5]
    states = {tapp.get_job(i).key: tapp.get_job(i).state for i in ids}
    assert states.pop("rk3") == "cancelled" and set(states.values()) == {"ready"}


def test_an_error_in_a_later_chunk_says_how_many_jobs_the_earlier_chunks_changed(tapp: App) -> None:
    """Chunks commit one by one: when one fails, the exception carries ``applied`` (what
    the service writes to its audit trail before the error goes on) and a note."""
    from justonce import DatabaseUnavailable
    from justonce.models import JobFilter

    ids = tapp.enqueue_calls("add", [[i, i] for i in range(7)], queue="halfway")
    real = tapp.backend.jobs_cancel_matching
    calls = 0

    def second_chunk_fails(w: JobFilter, limit: int, after: int = 0) -> tuple[int, int]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise DatabaseUnavailable("the database went away")
        return real(w, limit, after)

    tapp.backend.jobs_cancel_matching = second_chunk_fails  # type: ignore[method-assign]
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            tapp.apply_matching("cancel", JobFilter(queue="halfway", max_id=max(ids)), expected=7, chunk=3)
    finally:
        tapp.backend.jobs_cancel_matching = real  # type: ignore[method-assign]
    assert caught.value.applied == 3  # type: ignore[attr-defined]
    assert "3 jobs were changed" in "".join(caught.value.__notes__)
    assert sum(tapp.get_job(i).state == "cancelled" for i in ids) == 3


def test_a_jobs_own_created_at_as_shown_bounds_the_time_filters_exactly(tapp: App) -> None:
    """created_after is inclusive, created_before exclusive, to the microsecond a time is
    shown in: a job shown at T is found by [T, T + 1 µs), left out by created_before=T and
    by created_after=T + 1 µs. Jobs are enqueued one at a time (each its own time). SQLite
    keeps finer epoch seconds: its bounds were off by a fraction of a microsecond for about
    a third of jobs, then (shifted in SQL) by a float step for about a tenth."""
    from datetime import timezone

    from justonce.models import JobFilter

    ids = [tapp.enqueue("add", [i, i], queue="exact-times").id for i in range(150)]
    one = timedelta(microseconds=1)
    for n, job_id in enumerate(ids):
        t = tapp.get_job(job_id).created_at.astimezone(timezone(timedelta(hours=[14, -12, 5.5][n % 3])))

        def listed(**bounds: datetime) -> list[int]:
            return [j.id for j in tapp.list_jobs_page(JobFilter(queue="exact-times", **bounds), limit=1000)[0]]

        assert job_id in listed(created_after=t, created_before=t + one), (job_id, t)
        assert job_id not in listed(created_before=t), (job_id, t)
        assert job_id not in listed(created_after=t + one), (job_id, t)


def test_a_short_housekeeping_interval_is_not_held_back_by_a_long_one(db_url: str) -> None:
    """A round is taken by a caller once its own interval has passed since the last round
    by anyone: a worker with --housekeeping-interval 3600 that took a round does not hold
    back the promotion and rescue of a worker with 0.2 s (once it set "next run" for
    everyone, and a delayed job could wait an hour past its run_at)."""
    app = App(db_url)
    app.migrate()
    try:
        assert app.backend.maintenance_try("rescue", 3600.0, "slow")
        assert not app.backend.maintenance_try("rescue", 0.2, "quick")  # a round just began
        time.sleep(0.3)
        assert app.backend.maintenance_try("rescue", 0.2, "quick")
        assert not app.backend.maintenance_try("rescue", 3600.0, "slow")
    finally:
        app.close()


def test_prune_leaves_a_dead_job_retried_while_it_ran(tapp: App, db_url: str) -> None:
    """Prune picks dead jobs past retention, then deletes them; a retry that commits in
    between (here: both wait on a row lock a third transaction holds, the retry first)
    makes the job live again, and prune must leave it (Postgres once deleted it: the
    retried job was gone)."""
    import proc_app

    if db_url.startswith("sqlite"):
        pytest.skip("SQLite has one writer: nothing commits between prune's pick and delete")
    job = tapp.enqueue("add", [1, 1], queue="pr")
    tapp.cancel(job.id)
    holder = proc_app.ledger_connect(db_url)
    try:
        if db_url.startswith("mysql"):
            holder.begin()
            holder.cursor().execute("SELECT id FROM justonce_jobs WHERE id = %s FOR UPDATE", (job.id,))
        else:
            holder.autocommit = False
            holder.execute("SELECT id FROM justonce_jobs WHERE id = %s FOR UPDATE", (job.id,))
        retried: list[Job] = []
        pruned: list[int] = []
        a = threading.Thread(target=lambda: retried.append(tapp.retry(job.id)))
        a.start()
        time.sleep(0.5)
        b = threading.Thread(target=lambda: pruned.append(tapp.backend.jobs_prune(0.0, 0.0)))
        b.start()
        time.sleep(0.5)
        holder.commit()
        a.join(30)
        b.join(30)
    finally:
        holder.close()
    assert retried and retried[0].state == "ready"
    assert tapp.get_job(job.id).state == "ready" and pruned == [0]


BIG_FLOATS = [1e16, -1.5e300, 1e308, 2.0**70, 1e-7, 0.5, "1e+16 stays a string", 7]


def _same(got: object) -> None:
    assert got == BIG_FLOATS and [type(v) for v in got] == [type(v) for v in BIG_FLOATS], got  # type: ignore[union-attr]


def test_floats_of_1e16_and_more_come_back_floats_on_every_backend(app: App, worker_factory) -> None:
    """Postgres' jsonb keeps a number's value, not its spelling: 1e+16 came back as the
    int 10000000000000000 (arguments, results, effect results, a batch callback's
    arguments), where SQLite and MariaDB gave back the float."""
    seen: list[object] = []

    @app.task(name="echo")
    def echo(values: list[object], *, more: list[object]) -> list[object]:
        seen.append((values, more))
        return values

    @app.task(name="after")
    def after(values: list[object], batch: object = None) -> None:
        seen.append(("after", values))

    one = app.enqueue("echo", [BIG_FLOATS], {"more": BIG_FLOATS})
    (many,) = app.enqueue_many([Enqueue("echo", args=(BIG_FLOATS,), kwargs={"more": BIG_FLOATS})])
    (call,) = app.enqueue_calls("echo", [{"values": BIG_FLOATS, "more": BIG_FLOATS}])
    stored = app.get_job(one.id)
    _same(stored.args[0])
    _same(stored.kwargs["more"])
    _same(app.get_job(many).args[0])
    _same(app.get_job(call).kwargs["values"])
    batch = app.batches.open(on_complete=Enqueue("after", args=(BIG_FLOATS,)))
    app.batches.seal(batch.id)  # empty: the callback is enqueued at once
    worker_factory()
    for j in (one.id, many, call):
        done = app.wait(j, 30)
        assert done.state is JobState.SUCCEEDED, done
        _same(done.result)
    deadline = time.monotonic() + 30
    while not any(s[0] == "after" for s in seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    (cb,) = [s[1] for s in seen if s[0] == "after"]
    _same(cb)
    for values, more in [s for s in seen if s[0] != "after"]:
        _same(values)
        _same(more)
    out = app.effects.run("floats", "k", lambda idem: BIG_FLOATS)
    assert out.ran
    _same(out.result)
    _same(app.effects.get("floats", "k").result)
    # The limits are on the JSON as Python writes it (1e200 is 6 bytes there, 202 written
    # out): 88 KB of arguments fit the 256 KiB, whatever they grow to on the way in.
    wide = app.enqueue("echo", [[1e200] * 11_000], {"more": []})
    assert app.get_job(wide.id).args == [[1e200] * 11_000]
    from justonce.validate import result_json

    assert result_json([1.2e300] * 300)[1] is None


def _another_justonce_database(db_url: str, stack: Any) -> str:
    """The URL of a second migrated justonce database of the same backend."""
    from conftest import _drop_schema, mysql_database, mysql_or_skip, postgres_or_skip

    if db_url.startswith("sqlite"):
        from justonce.backends.sqlite.backend import parse_sqlite_url

        url = f"sqlite:///{parse_sqlite_url(db_url)[0]}.other.db"
    elif db_url.startswith("mysql"):
        url = stack.enter_context(mysql_database(mysql_or_skip()))
    else:
        server, schema = postgres_or_skip(), f"t_{uuid.uuid4().hex[:12]}"
        url = f"{server}{'&' if '?' in server else '?'}schema={schema}"
        stack.callback(_drop_schema, server, schema)
    other = App(url, strict=False)
    other.migrate()
    other.close()
    return url


def test_conn_to_another_database_a_closed_one_or_a_failed_transaction_is_refused(
        tapp: App, db_url: str) -> None:
    """conn= must reach this App's database: a connection to another justonce database
    was taken, the job written there, and its id (of the other database) named another
    job here. Closed connections and (Postgres) failed transactions got the driver's error."""
    from contextlib import ExitStack

    mine = tapp.enqueue("add", [0, 0])
    with ExitStack() as stack:
        other_url = _another_justonce_database(db_url, stack)
        other = _own_connection(other_url)
        stack.callback(other.close)
        for call in (lambda c: tapp.enqueue("add", [1, 2], conn=c),
                     lambda c: tapp.enqueue_many([Enqueue("add", args=(1, 2))], conn=c),
                     lambda c: tapp.effects.run("conn", "k", lambda idem: 1, conn=c),
                     lambda c: tapp.batches.open("b", conn=c)):
            with pytest.raises(InvalidOption, match="another (justonce )?database"):
                call(other)
            other.rollback()
        check = App(other_url, strict=False)
        stack.callback(check.close)
        assert check.queue_counts() == [] and check.batches.list() == []
        closed = _own_connection(db_url)
        closed.close()
        with pytest.raises(InvalidOption, match="closed"):
            tapp.enqueue("add", [1, 2], conn=closed)
        if db_url.startswith("postgres"):
            failed = _own_connection(db_url)
            stack.callback(failed.close)
            with pytest.raises(Exception):  # noqa: B017 - the caller's own failing statement
                failed.execute("SELECT 1/0")
            with pytest.raises(InvalidOption, match="roll it back"):
                tapp.enqueue("add", [1, 2], conn=failed)
        if db_url.startswith("mysql"):
            import pymysql

            from justonce.backends.mysql.backend import parse_mysql_url

            kw = parse_mysql_url(db_url)[0]
            latin = pymysql.connect(**{**kw, "charset": "latin1"})
            stack.callback(latin.close)
            with pytest.raises(InvalidOption, match="utf8mb4"):
                tapp.enqueue("add", [1, 2], conn=latin)
        # The right database still works, and nothing above reached it.
        good = _own_connection(db_url)
        stack.callback(good.close)
        job = tapp.enqueue("add", [3, 4], conn=good)
        good.commit()
        assert tapp.get_job(job.id).args == [3, 4]
        assert sum(c.count for c in tapp.queue_counts()) == 2 and tapp.get_job(mine.id).args == [0, 0]


@pytest.mark.parametrize("zone", ["-05:00", "+05:30"])
def test_a_mysql_conn_whose_session_is_not_in_utc_is_refused(tapp: App, db_url: str, zone: str) -> None:
    """justonce keeps times in UTC and reads the clock with NOW(6), which follows the
    session's time zone: a caller's connection at -05:00 passed a fence on a lease expired
    0.5 s before, expired a batch of expire_after=3600 at the next prune, let another caller
    redo an effect inside its 600 s lease and ran a job delayed by an hour at once (+05:00:
    a live holder's fence refused). Refused now, before anything is written, and the
    caller's transaction stays usable."""
    if not db_url.startswith("mysql"):
        pytest.skip("a MySQL session's time zone (Postgres keeps timestamptz, SQLite julianday)")
    lease = tapp.partitions.acquire("tz", 2, lease=30)
    conn = _own_connection(db_url)
    try:
        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        conn.execute(f"SET time_zone = '{zone}'")
        for call in (lambda: lease.fence(conn),
                     lambda: tapp.batches.open("tz", expire_after=3600, conn=conn),
                     lambda: tapp.effects.claim("tz", 1, lease=600, conn=conn),
                     lambda: tapp.enqueue("add", [1, 2], delay=3600, conn=conn)):
            with pytest.raises(InvalidOption, match=r"not in UTC .*SET time_zone = '\+00:00'"):
                call()
        conn.execute("SELECT 1")  # (still usable)
        conn.rollback()
        assert tapp.queue_counts() == [] and tapp.batches.list() == []
        assert tapp.effects.list("tz") == []
        for ok in ("+00:00", "UTC" if conn.execute("SELECT CONVERT_TZ(NOW(), '+00:00', 'UTC')")
                   .fetchone()[0] else "+00:00"):  # (named zones need the server's zone tables)
            conn.execute(f"SET time_zone = '{ok}'")
            lease.fence(conn)
            job = tapp.enqueue("add", [1, 2], delay=3600, conn=conn)
            conn.commit()
            assert tapp.get_job(job.id).state == "scheduled"
    finally:
        conn.close()
        lease.release()


@pytest.mark.parametrize("found_rows", [False, True], ids=["rows-changed", "rows-found"])
def test_a_held_key_on_a_mysql_conn_that_counts_rows_found_returns_its_holder(
        tapp: App, db_url: str, found_rows: bool) -> None:
    """A connection opened with CLIENT_FOUND_ROWS (SQLAlchemy's mysql+pymysql default)
    counts an upsert that changed nothing as 1 row: a keyed enqueue of a held key went on
    to read LAST_INSERT_ID(), the connection's previous insert, and returned that job (an
    earlier job, or whichever job had the id of the caller's own order row) as new; a pause
    of a paused queue answered already=False."""
    if not db_url.startswith("mysql"):
        pytest.skip("CLIENT_FOUND_ROWS is a MySQL connection flag")
    from pymysql.constants import CLIENT

    conn = proc_app.ledger_connect(db_url, CLIENT.FOUND_ROWS if found_rows else 0)
    try:
        earlier = tapp.enqueue("add", [1, 1], key="earlier", conn=conn)
        holder = tapp.enqueue("add", [2, 2], key="k")
        again = tapp.enqueue("add", [3, 3], key="k", conn=conn)
        assert (again.id, again.duplicate) == (holder.id, True) and earlier.id != holder.id
        # The caller's own insert in the same transaction, whose id is an existing job's
        # (LAST_INSERT_ID(expr) sets it as such an insert would).
        conn.execute("CREATE TEMPORARY TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT)")
        with conn.transaction():
            conn.execute("INSERT INTO orders (v) VALUES (1)")
            conn.execute("SELECT LAST_INSERT_ID(%s)", (earlier.id,))
            third = tapp.enqueue("add", [4, 4], key="k", conn=conn)
            new = tapp.enqueue("add", [5, 5], key="fresh", conn=conn)
        assert (third.id, third.duplicate) == (holder.id, True)
        assert not new.duplicate and tapp.get_job(new.id).args == [5, 5]
        assert tapp.get_job(earlier.id).args == [1, 1]
        assert tapp.pause_queue("q", conn=conn).already is False
        assert tapp.pause_queue("q", conn=conn).already is True
        assert tapp.pause_queue("q").already is True
        assert tapp.resume_queue("q", conn=conn) is True
    finally:
        conn.close()


def test_a_key_taken_after_your_snapshot_began_is_its_holder_or_a_clear_error(tapp: App, db_url: str) -> None:
    """Your transaction read first (its snapshot begins), then another one committed the
    key's holder, then you enqueue the key. MySQL's REPEATABLE READ (the server's default):
    the insert's unique check saw the holder and the look-up did not, so the call failed
    with 'could not settle key' (retrying it in the same transaction never could); now the
    holder is read with a locking read. Postgres (REPEATABLE READ) and SQLite (a deferred
    transaction that read) refuse the write: the driver's own error came out; now it is a
    DatabaseUnavailable (LockTimeout on SQLite) saying to run the transaction again."""
    conn = _own_connection(db_url)
    kind = next(k for k in ("postgres", "mysql", "sqlite") if db_url.startswith(k))
    try:
        def read_first() -> None:
            if kind == "postgres":
                import psycopg

                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            if kind == "sqlite":
                conn.execute("BEGIN")
            conn.execute("SELECT COUNT(*) FROM justonce_jobs").fetchall()  # (the snapshot)

        for n, call in enumerate((lambda k: tapp.enqueue("add", [9, 9], key=k, conn=conn).id,
                                  lambda k: tapp.enqueue_many([Enqueue("add", args=(9, 9), key=k),
                                                               Enqueue("add", args=(8, 8))], conn=conn)[0])):
            read_first()
            holder = tapp.enqueue("add", [n, n], key=f"snap{n}")
            if kind == "mysql":
                assert call(f"snap{n}") == holder.id
                conn.commit()
            else:
                with pytest.raises(DatabaseUnavailable, match="run it again") as raised:
                    call(f"snap{n}")
                assert isinstance(raised.value, LockTimeout) == (kind == "sqlite")
                conn.rollback()
                assert call(f"snap{n}") == holder.id  # (run again: a new snapshot)
                conn.commit()
        assert sorted(j.args for j in tapp.list_jobs()) == [[0, 0], [1, 1], [8, 8]]
    finally:
        conn.close()


def test_a_conn_whose_session_the_server_ended_gives_database_unavailable(tapp: App, db_url: str) -> None:
    """The server ends your session (a restart, an operator's kill, a failover): calls on
    that connection let the driver's error out (pymysql OperationalError 2013, psycopg
    AdminShutdown), which code that retries on DatabaseUnavailable missed."""
    if db_url.startswith("sqlite"):
        pytest.skip("no server session to end")
    import proc_app

    calls = (lambda c: tapp.enqueue("add", [1, 2], conn=c),
             lambda c: tapp.enqueue("add", [1, 2], key="k", conn=c),
             lambda c: tapp.enqueue_many([Enqueue("add", args=(1, 2))], conn=c),
             lambda c: tapp.batches.open("b", conn=c),
             lambda c: tapp.effects.run("s", 1, lambda idem: None, conn=c),
             lambda c: lease.fence(c),
             lambda c: tapp.cancel(1, conn=c))
    lease = tapp.partitions.acquire("gone", 1, lease=30)
    killer = proc_app.ledger_connect(db_url)
    try:
        for call in calls:
            conn = proc_app.ledger_connect(db_url)
            if db_url.startswith("mysql"):
                killer.execute("KILL %s", (conn.thread_id(),))
            else:
                killer.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            time.sleep(0.1)
            with pytest.raises(DatabaseUnavailable, match="run (your transaction|it) again"):
                call(conn)
            conn.close()
        assert tapp.queue_counts() == [] and tapp.effects.list("s") == []
    finally:
        killer.close()
        lease.release()


def test_a_refused_conn_leaves_the_callers_postgres_transaction_usable(tapp: App, db_url: str) -> None:
    """The check of a caller's connection reads nothing that can fail: an error there
    ended the caller's whole transaction (the README promises a refused call leaves the
    caller's own writes alone), and a role without SELECT on justonce_migrations (it
    needs none) was refused."""
    if not db_url.startswith("postgres"):
        pytest.skip("Postgres: an error ends the transaction it happens in")
    import psycopg

    from justonce.backends.postgres.backend import parse_postgres_url

    conninfo, schema, _ = parse_postgres_url(db_url)
    with psycopg.connect(conninfo) as c:  # search_path without the App's schema
        c.execute("CREATE TEMP TABLE mine (n int)")
        c.execute("INSERT INTO mine VALUES (1)")
        for call in (lambda: tapp.enqueue("add", [1, 2], conn=c),
                     lambda: tapp.batches.open("b", conn=c),
                     lambda: tapp.effects.run("conn", "k", lambda idem: 1, conn=c)):
            with pytest.raises(InvalidOption, match="does not see justonce's tables"):
                call()
            assert c.execute("SELECT n FROM mine").fetchall() == [(1,)]
    role = f"jo_least_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            tables = [r[0] for r in admin.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> "
                "'justonce_migrations'", (schema,))]
            admin.execute(f"GRANT ALL ON {', '.join(f'{schema}.{t}' for t in tables)} TO {role}")
            admin.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
            least = conninfo.replace("postgres@", f"{role}@", 1) if "postgres@" in conninfo \
                else f"{conninfo} user={role}"
            with psycopg.connect(least, options=f"-c search_path={schema}") as c:
                job = tapp.enqueue("add", [5, 6], conn=c)
                c.commit()
            assert tapp.get_job(job.id).args == [5, 6]
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_a_sqlite_connection_opened_while_another_holds_the_file_waits_for_it(tmp_path: Path) -> None:
    """A new connection sets the file's journal mode (WAL), which takes a lock: eight CLI
    commands started together on a new file failed now and then (1 in ~300) with "database
    is locked" at once, the 5 ms busy timeout of the connection alone deciding. It waits as
    every write does now (the file's busy timeout)."""
    path = tmp_path / "held.db"
    first = App(f"sqlite:///{path}")
    first.migrate()
    first.close()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("PRAGMA journal_mode=DELETE")  # (a file some tool switched back)
    other.execute("BEGIN EXCLUSIVE")
    releaser = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    releaser.start()
    try:
        started = time.monotonic()
        app = App(f"sqlite:///{path}", strict=False)
        job = app.enqueue("t", [1])
        assert time.monotonic() - started >= 0.4 and app.get_job(job.id).args == [1]
        app.close()
    finally:
        releaser.join()
        other.close()


def test_the_sqlite_check_of_a_callers_connection_takes_no_snapshot(tapp: App, db_url: str) -> None:
    """In a deferred transaction that has not written yet, a read before the first write
    pins a snapshot: another process committing in between made that write fail at once
    ("database is locked", no busy wait). The check reads which file the connection is
    on without reading the file."""
    if not db_url.startswith("sqlite"):
        pytest.skip("SQLite's snapshots")
    from justonce.backends.sqlite.backend import parse_sqlite_url

    path = parse_sqlite_url(db_url)[0]
    caller = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE IF NOT EXISTS beside (n integer)")
    fired: list[str] = []

    def commit_beside(statement: str) -> None:  # just before justonce's first write
        if not fired and "justonce_jobs" in statement and statement.lstrip().upper().startswith("INSERT"):
            fired.append(statement)
            other.execute("INSERT INTO beside VALUES (1)")

    caller.execute("BEGIN")
    caller.set_trace_callback(commit_beside)
    job = tapp.enqueue("add", [1, 2], conn=caller)
    caller.set_trace_callback(None)
    caller.execute("COMMIT")
    assert fired and tapp.get_job(job.id).state is JobState.READY
    caller.close()
    other.close()


@contextmanager
def scratch_postgres_database(prefix: str) -> Iterator[str]:
    """The URL of a Postgres database of its own (created, then dropped)."""
    import psycopg

    from conftest import postgres_or_skip

    server = postgres_or_skip().split("?")[0]
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{server.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.postgres
def test_a_conn_moved_to_another_install_after_a_good_call_is_refused() -> None:
    """The check is made on every call: a connection checked once and then moved by its
    own ``SET search_path`` (Postgres) or ``USE`` (MySQL) to another justonce install was
    taken when the check was remembered per connection, and the job written there."""
    import psycopg

    with scratch_postgres_database("jo_moved") as url:
        mine = App(url, strict=False)  # (no ?schema=: public)
        other = App(f"{url}?schema=other", strict=False)
        for a in (mine, other):
            a.migrate()
        with psycopg.connect(url) as c:
            ids = [mine.enqueue("t", [i], conn=c).id for i in range(2)]
            c.commit()
            assert [mine.get_job(i).args for i in ids] == [[0], [1]]
            c.execute("SET search_path = other")
            c.commit()
            with pytest.raises(InvalidOption, match="another justonce database"):
                mine.enqueue("t", [9], conn=c)
        assert other.queue_counts() == []
        for a in (mine, other):
            a.close()


@pytest.mark.mysql
def test_a_mysql_conn_moved_by_use_to_another_install_is_refused() -> None:
    from conftest import mysql_database, mysql_or_skip

    server = mysql_or_skip()
    with mysql_database(server) as url_a, mysql_database(server) as url_b:
        mine, other = App(url_a, strict=False), App(url_b, strict=False)
        for a in (mine, other):
            a.migrate()
        c = _own_connection(url_a)
        try:
            job = mine.enqueue("t", [1], conn=c)
            c.commit()
            assert mine.get_job(job.id).args == [1]
            c.select_db(url_b.rsplit("/", 1)[1].split("?")[0])
            with pytest.raises(InvalidOption, match="another justonce database"):
                mine.enqueue("t", [9], conn=c)
            c.rollback()
        finally:
            c.close()
        assert other.queue_counts() == []
        for a in (mine, other):
            a.close()


@pytest.mark.mysql
def test_a_mysql_conn_whose_snapshot_predates_the_tables_gets_a_clear_refusal() -> None:
    """A REPEATABLE READ transaction that read anything before justonce's tables were made
    cannot read them (MySQL error 1412); the call said so in the server's raw words. It
    is refused with what to do, and the caller's transaction stays usable."""
    from conftest import mysql_database, mysql_or_skip

    server = mysql_or_skip()
    with mysql_database(server) as url:
        c = _own_connection(url)
        try:
            with c.cursor() as cur:
                cur.execute("CREATE TABLE mine (x INT)")
                cur.execute("BEGIN")
                cur.execute("SELECT * FROM mine")  # the snapshot starts here
                app = App(url, strict=False)
                app.migrate()
                with pytest.raises(InvalidOption, match="began before justonce's tables"):
                    app.enqueue("t", [1], conn=c)
                cur.execute("INSERT INTO mine VALUES (1)")
                c.commit()
                job = app.enqueue("t", [2], conn=c)
                c.commit()
            assert app.get_job(job.id).args == [2] and sum(q.count for q in app.queue_counts()) == 1
            app.close()
        finally:
            c.close()


@pytest.mark.postgres
def test_a_database_made_again_under_a_live_app_is_taken_as_its_own() -> None:
    """The App remembered what its database looked like; once the tables were dropped and
    migrated again under it, every conn= call was refused as another justonce database
    until the process restarted. A refusal now reads the App's own mark again first."""
    import psycopg

    with scratch_postgres_database("jo_again") as url:
        app = App(url, strict=False)
        app.migrate()
        with psycopg.connect(url) as c:
            app.enqueue("t", [1], conn=c)
            c.commit()
            c.execute("DROP SCHEMA public CASCADE")
            c.execute("CREATE SCHEMA public")
            c.commit()
            again = App(url, strict=False)
            again.migrate()
            again.close()
            job = app.enqueue("t", [2], conn=c)
            c.commit()
        assert app.get_job(job.id).args == [2]
        app.close()


def test_keyed_enqueue_cancel_and_retry_on_your_own_connection_see_your_transaction(
        tapp: App, db_url: str) -> None:
    """On your own connection (conn=): a keyed duplicate, a cancel and a retry read rows
    as dicts; a plain sqlite3 connection has no Row factory, and they failed with a
    TypeError. A refused cancel reads the job in your transaction (it said JobNotFound
    for a job your transaction had just enqueued)."""
    c = _own_connection(db_url)
    if db_url.startswith("mysql"):  # (a cancel in your transaction reads what committed)
        c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    try:
        with proc_app._Tx(c) as tx:
            first = tapp.enqueue("add", [1, 2], key="mine", conn=tx)
            again = tapp.enqueue("add", [1, 2], key="mine", conn=tx)
            assert (again.id, again.duplicate) == (first.id, True)
            assert tapp.cancel(first.id, conn=tx).state is JobState.CANCELLED
            with pytest.raises(InvalidTransition, match="cancelled"):
                tapp.cancel(first.id, conn=tx)
            assert tapp.retry(first.id, conn=tx).state is JobState.READY
        assert tapp.get_job(first.id).state is JobState.READY
    finally:
        c.close()


def test_a_relative_sqlite_path_names_one_file_whatever_the_directory_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative URL is resolved when the App opens it: after a chdir (daemons chdir to
    /) a connection the App opened later went to another file, and conn= to the App's
    own file was refused as another one."""
    monkeypatch.chdir(tmp_path)
    app = App("sqlite:///rel.db", strict=False)
    app.migrate()
    first = app.enqueue("t", [1])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    conn = sqlite3.connect(tmp_path / "rel.db")
    job = app.enqueue("t", [2], conn=conn)
    conn.commit()
    conn.close()
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(app.get_job(job.id).args))  # a new connection
    t.start()
    t.join()
    assert seen == [[2]] and app.get_job(first.id).args == [1]
    assert not (elsewhere / "rel.db").exists()
    app.close()


def test_a_sqlite_path_through_a_symlink_and_dotdot_names_the_file_the_kernel_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made absolute by joining, not normalising: "link/../jobs.db" with link -> real/sub
    is real/jobs.db (as sqlite3 and the kernel read it), not ./jobs.db."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    monkeypatch.chdir(tmp_path)
    app = App("sqlite:///link/../jobs.db", strict=False)
    app.migrate()
    app.enqueue("t", [1])
    assert (tmp_path / "real" / "jobs.db").exists() and not (tmp_path / "jobs.db").exists()
    conn = sqlite3.connect("link/../jobs.db")
    app.enqueue("t", [2], conn=conn)
    conn.commit()
    conn.close()
    app.close()


def test_connections_of_ours_give_up_on_a_server_gone_silent_within_a_minute(tapp: App, db_url: str) -> None:
    """A server host that vanishes without a FIN or RST (a paused VM, a failover) left
    workers, producers and the service waiting on their sockets for the kernel's limits
    (~15 min, over 2 h idle). Every TCP connection of ours has keepalives after 10 s and a
    30 s limit on unacknowledged data (the URL's own libpq settings win on Postgres)."""
    import socket

    if db_url.startswith("sqlite"):
        pytest.skip("a file, no socket")
    with tapp.backend.transaction() as c:
        if db_url.startswith("mysql"):
            s = c._sock
            got = (s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,
                   s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                   s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
        else:
            info = {o.keyword.decode(): (o.val or b"").decode() for o in c.pgconn.info}
            got = (info["keepalives"] == "1", int(info["keepalives_idle"]), int(info["tcp_user_timeout"]))
    assert got == (True, 10, 30_000)
    if db_url.startswith("postgres"):
        mine = App(db_url + ("&" if "?" in db_url else "?") + "keepalives_idle=60")
        try:
            assert "keepalives_idle" not in mine.backend.d._kwargs  # type: ignore[attr-defined]
            assert mine.backend.d._kwargs["tcp_user_timeout"] == 30_000  # type: ignore[attr-defined]
        finally:
            mine.close()
