"""Batches, against every backend: lifecycle, idempotent acks, exactly-once completion
(with threads racing for it), jobs as batch items, clean-up, storage size, bad input."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from justonce import (
    App,
    BatchExpired,
    BatchNotFound,
    BatchState,
    Enqueue,
    InvalidItemId,
    InvalidOption,
    InvalidTransition,
    ItemNotFound,
    JobState,
    ValidationError,
)
from justonce.items import CHUNK_BITS


def register(app: App) -> dict[str, Any]:
    """Tasks every test here may use: callbacks and batch items."""

    @app.task(name="on_done")
    def on_done(batch: dict[str, Any], tag: str = "") -> dict[str, Any]:
        return batch

    @app.task(name="on_ok")
    def on_ok(batch: dict[str, Any]) -> None:
        pass

    @app.task(name="item", max_attempts=2, backoff=lambda attempt: 0)
    def item(n: int) -> int:
        if n < 0:
            raise ValueError(f"bad item {n}")
        return n

    return {"on_done": on_done, "on_ok": on_ok, "item": item}


@pytest.fixture
def tasks(app: App) -> dict[str, Any]:
    return register(app)


def callbacks(app: App, task: str = "on_done") -> list[dict[str, Any]]:
    """The ``batch`` argument of every callback job of ``task`` enqueued so far."""
    return [j.kwargs["batch"] for j in app.list_jobs(task=task, limit=10000)]


# -- lifecycle -------------------------------------------------------------------------------


def test_the_last_ack_after_the_seal_completes_the_batch_and_enqueues_the_callbacks(
    app: App, tasks: dict[str, Any]
) -> None:
    batch = app.batches.open("catalog 7", on_complete=Enqueue("on_done", kwargs={"tag": "x"}),
                             on_success="on_ok")
    group = batch.add(3)
    ids = group.item_ids()
    assert app.batches.ack(ids[:2]).resolved == 2
    sealed = batch.seal()
    assert sealed.state is BatchState.SEALED and not sealed.completed
    assert callbacks(app) == []
    last = app.batches.ack(ids[2])
    assert last.completed == (batch.id,)
    info = batch.info()
    assert (info.state, info.total, info.acked, info.failed, info.pending) == (
        BatchState.COMPLETED, 3, 3, 0, 0)
    [done] = app.list_jobs(task="on_done")
    assert done.kwargs == {"tag": "x", "batch": {"id": batch.id, "description": "catalog 7",
                                                  "total": 3, "acked": 3, "failed": 0,
                                                  "succeeded": True}}
    assert len(callbacks(app, "on_ok")) == 1


def test_item_ids_are_built_by_the_client_from_what_add_returned(app: App) -> None:
    batch = app.batches.open()
    group = batch.add(CHUNK_BITS * 2 + 5)
    built = [f"{group.batch_id}:{group.group_id}:{i}" for i in range(group.count)]
    assert group.item_ids() == built == list(group)
    assert group.item_id(17) == built[17]
    assert app.batches.ack(built).resolved == len(built)
    with pytest.raises(InvalidOption):
        group.item_id(group.count)


def test_a_second_ack_changes_nothing_and_says_already(app: App) -> None:
    batch = app.batches.open()
    ids = batch.add(10).item_ids()
    first = app.batches.ack(ids[:6])
    again = app.batches.ack([ids[5], ids[6], ids[6], ids[0]])
    assert first.resolved == 6 and first.already == ()
    assert again.resolved == 1
    assert again.already == (ids[5], ids[6], ids[0])
    assert batch.info().acked == 7


def test_sealing_an_empty_batch_completes_it_at_once(app: App, tasks: dict[str, Any]) -> None:
    batch = app.batches.open(on_complete="on_done", on_success="on_ok")
    result = batch.seal()
    assert result.completed and result.state is BatchState.COMPLETED
    assert callbacks(app) == [{"id": batch.id, "description": None, "total": 0, "acked": 0,
                               "failed": 0, "succeeded": True}]


def test_sealing_a_fully_acked_batch_completes_it_at_once(app: App, tasks: dict[str, Any]) -> None:
    batch = app.batches.open(on_complete="on_done")
    for _ in range(3):
        app.batches.ack(batch.add(100).item_ids())
    assert batch.info().state is BatchState.OPEN  # not sealed: more items may come
    assert batch.seal().completed
    assert [c["acked"] for c in callbacks(app)] == [300]


def test_sealing_twice_is_harmless(app: App, tasks: dict[str, Any]) -> None:
    batch = app.batches.open(on_complete="on_done")
    ids = batch.add(2).item_ids()
    assert not batch.seal().already_sealed
    again = batch.seal()
    assert again.already_sealed and again.state is BatchState.SEALED and not again.completed
    app.batches.ack(ids)
    third = batch.seal()
    assert third.already_sealed and third.state is BatchState.COMPLETED and not third.completed
    assert len(callbacks(app)) == 1


def test_adding_to_a_sealed_batch_is_refused(app: App) -> None:
    batch = app.batches.open()
    batch.add(1)
    batch.seal()
    with pytest.raises(InvalidTransition, match="sealed"):
        batch.add(5)
    assert batch.info().total == 1


def test_acks_after_completion_are_harmless(app: App, tasks: dict[str, Any]) -> None:
    batch = app.batches.open(on_complete="on_done")
    ids = batch.add(4).item_ids()
    batch.seal()
    assert app.batches.ack(ids).completed == (batch.id,)
    late = app.batches.ack(ids)
    assert late.resolved == 0 and late.already == tuple(ids) and late.completed == ()
    assert len(callbacks(app)) == 1


def test_failed_items_complete_the_batch_with_failures_and_skip_the_success_callback(
    app: App, tasks: dict[str, Any]
) -> None:
    batch = app.batches.open(on_complete="on_done", on_success="on_ok")
    ids = batch.add(5).item_ids()
    batch.seal()
    app.batches.ack(ids[:3])
    assert app.batches.fail(ids[3], "supplier said no").resolved == 1
    assert app.batches.fail(ids[3], "again").already == (ids[3],)
    assert app.batches.ack(ids[4]).completed == (batch.id,)
    info = batch.info()
    assert (info.acked, info.failed, info.pending) == (4, 1, 0)
    assert [(f.item, f.reason) for f in app.batches.failures(batch.id)] == [
        (ids[3], "supplier said no")]
    assert callbacks(app)[0]["failed"] == 1 and not callbacks(app)[0]["succeeded"]
    assert callbacks(app, "on_ok") == []


def test_one_bulk_ack_may_span_batches_and_complete_several(app: App, tasks: dict[str, Any]) -> None:
    a = app.batches.open(on_complete="on_done")
    b = app.batches.open(on_complete="on_done")
    ids = a.add(CHUNK_BITS + 1).item_ids() + b.add(7).item_ids()
    a.seal()
    b.seal()
    result = app.batches.ack(list(reversed(ids)))
    assert sorted(result.completed) == sorted([a.id, b.id])
    assert sorted(c["id"] for c in callbacks(app)) == sorted([a.id, b.id])


def test_list_and_get_report_progress(app: App) -> None:
    first = app.batches.open("first")
    second = app.batches.open("second")
    app.batches.ack(second.add(4).item_ids()[:1])
    listed = app.batches.list()
    assert [b.id for b in listed] == [second.id, first.id]
    assert (listed[0].total, listed[0].acked, listed[0].pending) == (4, 1, 3)
    assert [b.id for b in app.batches.list(state="open", limit=1)] == [second.id]
    assert app.batches.get(first.id).description == "first"


# -- jobs as batch items ---------------------------------------------------------------------


def test_jobs_in_a_batch_ack_their_items_when_they_succeed(
    app: App, tasks: dict[str, Any], worker_factory: Any
) -> None:
    batch = app.batches.open(on_complete="on_done", on_success="on_ok")
    group, job_ids = batch.enqueue_calls("item", [(i,) for i in range(50)])
    group2, more = batch.enqueue([Enqueue("item", args=(100 + i,), priority=i) for i in range(3)])
    assert app.get_job(job_ids[7]).batch_item == group.item_id(7)
    assert app.get_job(more[2]).batch_item == group2.item_id(2)
    batch.seal()
    worker_factory()
    deadline = time.monotonic() + 30
    while batch.info().state is not BatchState.COMPLETED and time.monotonic() < deadline:
        time.sleep(0.05)
    info = batch.info()
    assert (info.state, info.acked, info.failed) == (BatchState.COMPLETED, 53, 0)
    assert len(callbacks(app)) == 1 and len(callbacks(app, "on_ok")) == 1


def test_a_batchs_bulk_enqueue_gives_each_job_its_own_item_whatever_the_calls_shape(
    app: App, tasks: dict[str, Any]
) -> None:
    @app.task(name="any_item")
    def any_item(*args: object, **kwargs: object) -> None:
        return None

    deep: list = []
    for _ in range(40):  # deeper than MariaDB's JSON functions read
        deep = [deep]
    batch = app.batches.open()
    for calls in ([(i,) for i in range(20)], [{"a": i} for i in range(20)],
                  [(i,) if i % 2 else {"a": i} for i in range(20)],
                  [(i,) for i in range(10)] + [(deep,)] + [(i,) for i in range(9)]):
        group, job_ids = batch.enqueue_calls("any_item", calls)
        for i, job_id in enumerate(job_ids):
            job = app.get_job(job_id)
            assert job.batch_item == group.item_id(i)
            assert job.args == (list(calls[i]) if isinstance(calls[i], tuple) else [])


def test_a_cancelled_job_marks_its_item_failed_and_a_later_run_does_not_change_it(
    app: App, tasks: dict[str, Any], worker_factory: Any
) -> None:
    batch = app.batches.open(on_complete="on_done", on_success="on_ok")
    runs, _ = batch.enqueue_calls("item", [(1,)])
    later, [later_job] = batch.enqueue_calls("item", [(2,)], delay=3600)
    app.cancel(later_job)
    assert [(f.item, f.reason) for f in app.batches.failures(batch.id)] == [
        (later.item_id(0), "cancelled")]
    batch.seal()
    worker_factory()
    deadline = time.monotonic() + 30
    while batch.info().state is not BatchState.COMPLETED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(c["acked"], c["failed"]) for c in callbacks(app)] == [(1, 1)]
    assert callbacks(app, "on_ok") == []
    app.retry(later_job)  # it runs and succeeds, but its item's first outcome stands
    deadline = time.monotonic() + 30
    while app.get_job(later_job).state is not JobState.SUCCEEDED and time.monotonic() < deadline:
        time.sleep(0.05)
    info = batch.info()
    assert (info.acked, info.failed) == (1, 1) and len(callbacks(app)) == 1


def test_a_job_that_ends_dead_fails_its_item(app: App, tasks: dict[str, Any],
                                             worker_factory: Any) -> None:
    batch = app.batches.open(on_complete="on_done", on_success="on_ok")
    group, job_ids = batch.enqueue_calls("item", [(5,), (-5,)])
    batch.seal()
    worker_factory()
    deadline = time.monotonic() + 30
    while batch.info().state is not BatchState.COMPLETED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.get_job(job_ids[1]).state is JobState.DEAD
    [failure] = app.batches.failures(batch.id)
    assert failure.item == group.item_id(1) and "bad item -5" in failure.reason
    assert [(c["acked"], c["failed"]) for c in callbacks(app)] == [(1, 1)]
    assert callbacks(app, "on_ok") == []


def test_a_job_whose_last_lease_expires_fails_its_item(app: App, tasks: dict[str, Any]) -> None:
    batch = app.batches.open(on_complete="on_done")
    group, [job_id] = batch.enqueue_calls("item", [(1,)], max_attempts=1)
    batch.seal()
    [claimed] = app.backend.job_claim("default", 1, "a-worker-that-dies", lease=0.05)
    assert claimed.batch_item == group.item_id(0)
    time.sleep(0.1)
    assert app.backend.jobs_rescue().dead == 1
    assert app.get_job(job_id).state is JobState.DEAD
    [failure] = app.batches.failures(batch.id)
    assert failure.item == group.item_id(0) and "lease expired" in failure.reason
    assert [(c["acked"], c["failed"]) for c in callbacks(app)] == [(0, 1)]


def test_acks_on_the_callers_connection_commit_and_roll_back_with_it(db_url: str, app: App) -> None:
    batch = app.batches.open()
    ids = batch.add(3).item_ids()
    conn = _caller_connection(db_url)
    try:
        conn.execute("CREATE TABLE mine (x integer)")
        conn.commit()
        _begin(conn)
        assert app.batches.ack(ids[0], conn=conn).resolved == 1
        conn.rollback()
        assert batch.info().acked == 0
        _begin(conn)
        conn.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(ItemNotFound):  # refused under a savepoint: my insert stays
            app.batches.ack([ids[1], f"{batch.id}:{'f' * 12}:0"], conn=conn)
        assert app.batches.ack(ids[1], conn=conn).resolved == 1
        conn.commit()
        assert batch.info().acked == 1
        assert conn.execute("SELECT count(*) FROM mine").fetchone()[0] == 1
    finally:
        conn.close()


def test_batch_calls_on_a_repeatable_read_connection_are_refused(pg_server_url: str) -> None:
    """Completion needs each statement to see what committed before it (Postgres only:
    SQLite has one writer at a time). The pool's own connections are READ COMMITTED even
    when the server's default is not."""
    import psycopg

    from conftest import _drop_schema

    schema = f"t_{uuid.uuid4().hex[:12]}"
    url = f"{pg_server_url}{'&' if '?' in pg_server_url else '?'}schema={schema}"
    app = App(url)
    try:
        app.migrate()
        batch = app.batches.open()
        ids = batch.add(2).item_ids()
        conn = _caller_connection(url)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with pytest.raises(InvalidOption, match="READ COMMITTED"):
                app.batches.ack(ids, conn=conn)
        finally:
            conn.close()
        assert batch.info().acked == 0
        with psycopg.connect(pg_server_url, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {admin.info.dbname} SET default_transaction_isolation "
                          "= 'repeatable read'")
            try:
                other = App(url)
                batch.seal()
                assert other.batches.ack(ids).completed == (batch.id,)
                other.close()
            finally:
                admin.execute(f"ALTER DATABASE {admin.info.dbname} RESET default_transaction_isolation")
    finally:
        app.close()
        _drop_schema(pg_server_url, schema)


def test_batch_calls_on_a_repeatable_read_mysql_connection_are_refused() -> None:
    """MySQL's default level, REPEATABLE READ, on the caller's connection is refused as on
    Postgres; the pool's own connections are READ COMMITTED whatever the server's default
    (MariaDB's and MySQL's is REPEATABLE READ)."""
    import proc_app
    from conftest import mysql_database, mysql_or_skip

    with mysql_database(mysql_or_skip()) as url:
        app = App(url)
        try:
            app.migrate()
            batch = app.batches.open()
            ids = batch.add(2).item_ids()
            conn = proc_app.ledger_connect(url)
            conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.autocommit(False)
            try:
                with pytest.raises(InvalidOption, match="READ COMMITTED"):
                    app.batches.ack(ids, conn=conn)
            finally:
                conn.close()
            assert batch.info().acked == 0
            variable = "tx_isolation" if app.backend.mysql.mariadb else "transaction_isolation"
            admin = proc_app.ledger_connect(url)
            try:
                [(default,)] = admin.execute(f"SELECT @@global.{variable}").fetchall()
            finally:
                admin.close()
            assert default == "REPEATABLE-READ"
            batch.seal()
            assert app.batches.ack(ids).completed == (batch.id,)
        finally:
            app.close()


def test_jobs_enqueued_into_a_batch_join_the_callers_transaction(
    db_url: str, app: App, tasks: dict[str, Any]
) -> None:
    batch = app.batches.open()
    conn = _caller_connection(db_url)
    try:
        _begin(conn)
        group, ids = app.batches.enqueue_calls(batch.id, "item", [(1,), (2,)], conn=conn)
        conn.rollback()
    finally:
        conn.close()
    assert batch.info().total == 0 and app.list_jobs() == []
    with pytest.raises(ItemNotFound):
        app.batches.ack(group.item_ids())


# -- exactly once, under races ---------------------------------------------------------------


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released at the same instant; their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_seal_racing_the_last_ack_completes_exactly_once_500_times(app: App, tasks: dict[str, Any]) -> None:
    rounds = 500
    for n in range(rounds):
        batch = app.batches.open(on_complete="on_done")
        first, last = batch.add(2).item_ids()
        app.batches.ack(first)
        sealed, acked = race(lambda b=batch: b.seal().completed,
                             lambda i=last: bool(app.batches.ack(i).completed))
        assert sealed != acked, f"round {n}: seal completed: {sealed}, last ack completed: {acked}"
    done = callbacks(app)
    assert len(done) == rounds and len({c["id"] for c in done}) == rounds
    assert all(c["acked"] == 2 for c in done)


def test_concurrent_last_acks_of_different_chunks_complete_exactly_once(
    app: App, tasks: dict[str, Any]
) -> None:
    for n in range(100):
        batch = app.batches.open(on_complete="on_done")
        last = [batch.add(1).item_ids()[0] for _ in range(4)]
        batch.seal()
        seen = race(*(lambda i=i: app.batches.ack(i).completed for i in last))
        assert sorted(seen) == [(), (), (), (batch.id,)], f"round {n}: {seen}"
    assert len(callbacks(app)) == 100


# -- clean-up --------------------------------------------------------------------------------


def test_idle_batches_expire_and_refuse_acks_and_finished_ones_are_removed(
    app: App, tasks: dict[str, Any]
) -> None:
    idle = app.batches.open(expire_after=0.2, on_complete="on_done")
    ids = idle.add(3).item_ids()
    waiting = app.batches.open(expire_after=0.2)  # sealed: it waits for its items, however long
    waiting.add(2)
    waiting.seal()
    # busy idles out after 1 s; acking it every 0.15 s for 1.2 s keeps it open. The margin
    # is wide so that a loaded machine does not expire it between the two prunes below.
    busy = app.batches.open(expire_after=1.0)
    busy_ids = busy.add(100).item_ids()
    finished = app.batches.open()
    finished.seal()
    for i in range(8):
        time.sleep(0.15)
        app.batches.ack(busy_ids[i])
    report = app.batches.prune(retention=3600)
    assert (report.expired, report.removed) == (1, 0)
    assert idle.info().state is BatchState.EXPIRED
    assert busy.info().state is BatchState.OPEN
    assert waiting.info().state is BatchState.SEALED
    with pytest.raises(BatchExpired):
        app.batches.ack(ids[0])
    with pytest.raises(BatchExpired):
        idle.add(1)
    with pytest.raises(BatchExpired):
        idle.seal()
    assert idle.info().acked == 0 and callbacks(app) == []
    app.batches.ack(busy_ids[8])  # busy is still in use
    report = app.batches.prune(retention=0)
    assert (report.expired, report.removed) == (0, 2)  # the expired one and the completed one
    assert busy.info().state is BatchState.OPEN
    with pytest.raises(BatchNotFound):
        idle.info()
    with pytest.raises(BatchNotFound):
        app.batches.ack(ids[0])
    assert finished.id not in [b.id for b in app.batches.list()]


def test_housekeeping_prunes_batches(app: App) -> None:
    from justonce.worker.maintenance import Maintenance

    done = app.batches.open()
    done.seal()
    orphan = app.batches.open(expire_after=0.05)
    time.sleep(0.1)
    report = Maintenance(app.backend, "test", batch_retention=3600).run_once(force=True)
    assert (report.batches_expired, report.batches_removed) == (1, 0)
    assert orphan.info().state is BatchState.EXPIRED
    report = Maintenance(app.backend, "test", batch_retention=0).run_once(force=True)
    assert report.batches_removed == 2


def test_a_job_whose_batch_was_removed_still_completes(app: App, tasks: dict[str, Any],
                                                       worker_factory: Any) -> None:
    batch = app.batches.open(expire_after=0.05)
    _, job_ids = batch.enqueue_calls("item", [(1,)], delay=0.3)
    time.sleep(0.1)
    app.batches.prune(retention=0)
    with pytest.raises(BatchNotFound):
        batch.info()
    worker_factory()
    deadline = time.monotonic() + 20
    while app.get_job(job_ids[0]).state is not JobState.SUCCEEDED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.get_job(job_ids[0]).state is JobState.SUCCEEDED


# -- storage ---------------------------------------------------------------------------------


def test_a_million_items_take_about_one_bit_each(app: App, db_url: str) -> None:
    batch = app.batches.open()
    batch.add(1_000_000)
    conn = _caller_connection(db_url)
    try:
        if db_url.startswith("sqlite"):
            # Row data: the bits, the group id and five numbers of at most 8 bytes each.
            row = conn.execute(
                "SELECT count(*), sum(length(bits) + length(group_id) + 5 * 8), "
                "(SELECT sum(pgsize) FROM dbstat WHERE name = 'justonce_batch_chunks') "
                "FROM justonce_batch_chunks WHERE batch_id = ?", (batch.id,)).fetchone()
        elif db_url.startswith("mysql"):
            # Row data as on SQLite: the bits, the group id and five numbers (ids, counts
            # and the DATETIME(6)) of at most 8 bytes each; the table's pages from InnoDB's
            # statistics, brought up to date first.
            conn.execute("ANALYZE TABLE justonce_batch_chunks").fetchall()
            row = conn.execute(
                "SELECT count(*), sum(LENGTH(bits) + LENGTH(group_id) + 5 * 8), "
                "(SELECT DATA_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
                " AND TABLE_NAME = 'justonce_batch_chunks') "
                "FROM justonce_batch_chunks WHERE batch_id = %s", (batch.id,)).fetchone()
        else:
            row = conn.execute(
                "SELECT count(*), sum(pg_column_size(c.*)), "
                "pg_relation_size('justonce_batch_chunks') FROM justonce_batch_chunks c "
                "WHERE batch_id = %s", (batch.id,)).fetchone()
    finally:
        conn.close()
    rows, size, on_disk = row
    print(f"\n{db_url.split(':')[0]}: 1,000,000 items in {rows} rows, {size} bytes of row data, "
          f"{on_disk} bytes of table pages", end=" ")
    assert rows == -(-1_000_000 // CHUNK_BITS)
    assert 125_000 <= size <= 200_000


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [
    "", "1", "1:2", "1:abc:0", "0:0123456789ab:0", "-1:0123456789ab:0", "1:0123456789AB:0",
    "1:0123456789ab:-1", "1:0123456789ab:01", "1:0123456789ab:1:2", " 1:0123456789ab:1",
    "1:0123456789ab:1\n", "1:0123456789ab:99999999999", 12, None, b"1:0123456789ab:0",
])
def test_malformed_item_ids_are_refused(app: App, bad: Any) -> None:
    with pytest.raises(InvalidItemId):
        app.batches.ack([bad])


def test_a_bad_id_in_a_bulk_ack_fails_the_whole_call_and_changes_nothing(app: App) -> None:
    batch = app.batches.open()
    group = batch.add(10)
    other = app.batches.open()
    forged = f"{batch.id}:{'0' * 12}:1" if group.group_id != "0" * 12 else f"{batch.id}:{'1' * 12}:1"
    for bad, error in [(forged, ItemNotFound), (f"{batch.id}:{group.group_id}:10", ItemNotFound),
                       (f"{other.id}:{group.group_id}:0", ItemNotFound),
                       (f"{other.id + 100}:{group.group_id}:0", BatchNotFound),
                       ("nonsense", InvalidItemId)]:
        with pytest.raises(error):
            app.batches.ack(group.item_ids()[:5] + [bad])
        assert batch.info().acked == 0, bad


@pytest.mark.parametrize("call", [
    lambda app: app.batches.open(description=7),
    lambda app: app.batches.open(description="x" * 1001),
    lambda app: app.batches.open(description="nul\x00"),
    lambda app: app.batches.open(expire_after=0),
    lambda app: app.batches.open(expire_after="soon"),
    lambda app: app.batches.open(on_complete=42),
    lambda app: app.batches.open(on_complete="not registered"),
    lambda app: app.batches.open(on_complete=Enqueue("on_done", key="k")),
    lambda app: app.batches.open(on_complete=Enqueue("on_done", delay=5)),
    lambda app: app.batches.open(on_complete=Enqueue("on_done", kwargs={"batch": 1})),
    lambda app: app.batches.add(0, 5),
    lambda app: app.batches.add("1", 5),
    lambda app: app.batches.add(1, 0),
    lambda app: app.batches.add(1, -3),
    lambda app: app.batches.add(1, 2.5),
    lambda app: app.batches.add(1, 10**9),
    lambda app: app.batches.add(1, True),
    lambda app: app.batches.enqueue_calls(1, "item", []),
    lambda app: app.batches.enqueue_calls(1, "item", [(1,)], key="k"),
    lambda app: app.batches.enqueue(1, [Enqueue("item", args=(1,), key="k")]),
    lambda app: app.batches.ack("1:0123456789ab:0x"),
    lambda app: app.batches.ack(["1:0123456789ab:0"] * 100_001),
    lambda app: app.batches.fail("1:0123456789ab:0", reason=None),
    lambda app: app.batches.fail("1:0123456789ab:0", reason="  "),
    lambda app: app.batches.ack(12),
    lambda app: app.batches.ack(None),
    lambda app: app.batches.ack(f"{2**63}:0123456789ab:0"),
    lambda app: app.batches.ack(f"1:0123456789ab:{i}" for i in itertools.count()),
    lambda app: app.batches.enqueue(1, Enqueue("item", args=(1,))),
    lambda app: app.batches.enqueue(1, "item"),
    lambda app: app.batches.enqueue(1, ["item"]),
    lambda app: app.enqueue_many(Enqueue("item", args=(1,))),
    lambda app: app.batches.list(state="done"),
    lambda app: app.batches.list(limit=0),
    lambda app: app.batches.failures(1, limit=-1),
    lambda app: app.batches.prune(retention=-1),
    lambda app: app.batches.seal(0),
])
def test_bad_batch_input_is_refused_before_anything_is_written(
    app: App, tasks: dict[str, Any], call: Any
) -> None:
    batch = app.batches.open()
    with pytest.raises(ValidationError) as info:
        call(app)
    assert str(info.value)
    assert [b.id for b in app.batches.list()] == [batch.id]
    assert app.batches.get(batch.id).total == 0 and app.list_jobs() == []


def test_unknown_batches_are_reported(app: App, tasks: dict[str, Any]) -> None:
    for call in (lambda: app.batches.get(99), lambda: app.batches.seal(99),
                 lambda: app.batches.add(99, 1), lambda: app.batches.failures(99),
                 lambda: app.batches.enqueue_calls(99, "item", [(1,)])):
        with pytest.raises(BatchNotFound, match="no batch 99"):
            call()
    assert app.list_jobs() == []


# -- helpers ---------------------------------------------------------------------------------


def _caller_connection(db_url: str) -> Any:
    import proc_app

    conn = proc_app.ledger_connect(db_url)
    if db_url.startswith("mysql"):
        conn.autocommit(False)  # PyMySQL's is a method
    elif not db_url.startswith("sqlite"):
        conn.autocommit = False
    return conn


def _begin(conn: Any) -> None:
    import sqlite3

    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN")
    else:
        conn.execute("SELECT 1")
