"""PostgreSQL keeps the plan of a prepared statement: psycopg prepares a statement after
five runs on a connection, and once the server settles on the generic plan it keeps it
until something invalidates it (an ANALYZE, which nothing runs with autovacuum off). A
generic plan made while a table held a few rows may scan it whole: fine then, ruinous once
it holds millions (a Push fell 60-fold; a heartbeat would read every job).

The first test takes, for every statement of the backend, the generic plan the server
makes on near-empty tables and the one it makes once they hold a few thousand rows. A
statement whose first plan scans a growing table that the second reaches by an index is a
trap: it must be in PLANNED_EACH_TIME (never prepared, planned for the table as it is), or
in PREPARED_ANYWAY (its plan lasts PLAN_MAX_AGE, as every plan does). The second runs them
through the code paths that send them, and finds none of them prepared; the third, that a
connection's prepared plans are dropped once they are PLAN_MAX_AGE old."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from justonce import App
from justonce.items import CHUNK_BITS
from justonce.worker import Worker

pytest.importorskip("psycopg")
import psycopg  # noqa: E402

from justonce.backends.postgres import backend as pg_backend  # noqa: E402
from justonce.backends.postgres.backend import (  # noqa: E402
    PLANNED_EACH_TIME,
    PREPARED_ANYWAY,
    Q,
    parse_postgres_url,
)

QUERIES = Path(pg_backend.__file__).parent / "queries.sql"

# Tables whose rows come with use (jobs, entries, batches, lists, reservations): a scan of
# one of them grows with the deployment. The others hold a row per slot, token, set or
# migration.
GROWING = {"justonce_jobs", "justonce_effects", "justonce_effect_chunks", "justonce_batches",
           "justonce_batch_chunks",
           "justonce_batch_failures", "justonce_lists", "justonce_list_items",
           "justonce_list_reservations", "justonce_audit"}


def _fragments() -> set[str]:
    """Blocks only ever included in others ({{name}}), never run alone."""
    text = QUERIES.read_text()
    included = set(re.findall(r"{{(\w+)}}", text))
    # job_claim and job_complete_many are included and also run alone.
    return included - {"job_claim", "job_complete_many"}


def _positional(text: str) -> tuple[str, int]:
    """psycopg's %(name)s placeholders as the server's $n: (text, how many)."""
    order: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    body = re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%").rstrip().rstrip(";")
    return body, len(order)


def _generic_plans(conninfo: str, schema: str, names: list[str]) -> dict[str, str]:
    """name -> the generic plan the server makes for it now (EXPLAIN, nothing run)."""
    plans = {}
    with psycopg.connect(conninfo, autocommit=True, options=f"-c search_path={schema}") as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        for name in names:
            body, n = _positional(Q[name])
            c.execute(f"PREPARE justonce_plan_probe AS {body}")
            try:
                args = f"({','.join(['NULL'] * n)})" if n else ""
                rows = c.execute(f"EXPLAIN EXECUTE justonce_plan_probe{args}").fetchall()
                plans[name] = "\n".join(r[0] for r in rows)
            finally:
                c.execute("DEALLOCATE justonce_plan_probe")
    return plans


def _sizes(conninfo: str, schema: str) -> dict[str, int]:
    with psycopg.connect(conninfo, autocommit=True, options=f"-c search_path={schema}") as c:
        return {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in sorted(GROWING)}


def _scanned(plan: str) -> set[str]:
    return set(re.findall(r"Seq Scan on (\w+)", plan)) & GROWING


def _use(app: App, conninfo: str, schema: str, tag: str, n: int) -> None:
    """Every growing table gets about ``n`` more rows, through the API and a worker."""
    app.enqueue_calls("plans.noop", [(i,) for i in range(n)], queue=f"q{tag}")
    app.enqueue("plans.noop", (0,), queue=f"q{tag}", key=f"k{tag}")
    with psycopg.connect(conninfo, options=f"-c search_path={schema}") as conn:
        # One transaction of ours for them all: three of their own per batch is slow.
        for b in range(n // 3):
            batch = app.batches.open(f"b{tag}{b}", conn=conn)
            batch.add(5, conn=conn)
            batch.seal(conn=conn)
    # Chunk rows by the thousand: a batch_flip's plan turns to the index only past tens
    # of thousands of them.
    big = app.batches.open(f"big{tag}")
    for _ in range(n // 100):
        big.add(CHUNK_BITS * 1000)
    big.seal()
    for b in range(max(2, n // 100)):  # batches with an item that dies: failure rows
        batch = app.batches.open(f"f{tag}{b}")
        batch.enqueue_calls("plans.fail", [(0,)], queue=f"q{tag}")
        batch.seal()
    app.effects.run_many(f"e{tag}", range(n), lambda key: None)
    app.effects.run_many(f"c{tag}", range(n), lambda key: None, chunk=5)  # chunk rows
    app.effects.run_many(f"m{tag}", range(n // 10), lambda key: key)  # results of their own
    app.lists.create(f"l{tag}", items=range(n))
    for r in range(max(2, n // 3)):  # completed ones go; the rest stay held
        reservation = app.lists.reserve(f"l{tag}", 1, ttr=3600)
        assert reservation is not None
        if r % 10 == 0:
            app.lists.complete(reservation)
    for t in range(max(2, n // 100)):
        info, _secret = app.tokens.create(f"t{tag}{t}", "read")
        app.tokens.revoke(info.id)
        app.audit.record("tokens.revoke", target=str(info.id), token_id=info.id)
    worker = Worker(app, queues=[f"q{tag}"], concurrency=4, poll=0.05, lease=30.0).start()
    try:
        deadline = time.monotonic() + 120
        while any(c.queue == f"q{tag}" and c.state in ("ready", "running") for c in app.queue_counts()):
            assert time.monotonic() < deadline, "the worker did not drain the queue"
            time.sleep(0.1)
    finally:
        worker.stop()
        assert worker.join(15)


@pytest.fixture
def plan_app(db_url: str) -> Iterator[App]:
    app = App(db_url)
    app.migrate()

    @app.task(name="plans.noop", max_attempts=1)
    def noop(i: int) -> None:
        return None

    @app.task(name="plans.fail", max_attempts=1)
    def fail(i: int) -> None:
        raise RuntimeError("a batch item that fails")

    yield app
    app.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_no_prepared_statement_keeps_a_plan_that_scans_a_grown_table(plan_app: App, db_url: str) -> None:
    conninfo, schema, _ = parse_postgres_url(db_url)
    assert schema
    fragments = _fragments()
    stale = sorted((PLANNED_EACH_TIME | PREPARED_ANYWAY) - set(Q))
    assert not stale, f"statements named that do not exist: {stale}"
    assert not PLANNED_EACH_TIME & PREPARED_ANYWAY
    names = sorted(n for n in Q if n not in fragments and n not in PLANNED_EACH_TIME
                   and not Q[n].lstrip().upper().startswith(("BEGIN", "SET ")))

    _use(plan_app, conninfo, schema, "a", 3)
    small = _generic_plans(conninfo, schema, names)
    _use(plan_app, conninfo, schema, "b", 3000)
    grown = _generic_plans(conninfo, schema, names)

    sizes = _sizes(conninfo, schema)
    traps = {name: sorted(_scanned(small[name]) - _scanned(grown[name])) for name in names}
    assert all(traps[name] for name in PREPARED_ANYWAY), "no trap any more: take it out of PREPARED_ANYWAY"
    traps = {name: tables for name, tables in traps.items() if tables and name not in PREPARED_ANYWAY}
    assert not traps, (
        "prepared statements whose generic plan on near-empty tables scans a table that "
        "they reach by an index once it has grown (put them in PLANNED_EACH_TIME): "
        + "; ".join(f"{name} scans {tables}" for name, tables in traps.items())
        + f" (rows then: {sizes})")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_no_path_prepares_a_statement_planned_at_each_run(db_url: str) -> None:
    """A plan psycopg prepared while the ledger was small would stay (nothing ANALYZEs it
    with autovacuum off): a 10,000,000-user Push on such a plan slowed 60-fold. One pooled
    connection, so the statements that are prepared are all on it."""
    app = App(f"{db_url}&pool_size=1", strict=False)  # (db_url has ?schema=)
    app.backend.pg.plan_max_age = 3600.0  # (no drop halfway, on however slow a machine)
    try:
        app.migrate()
        app.effects.run_many("prep", ["seed"], lambda k: None)
        for i in range(12):
            app.effects.get("prep", "seed")  # prepared after a few runs: the control
            outcome = app.effects.run_many("prep", [f"{i}-a", f"{i}-b", "seed"], lambda k: k)
            assert outcome.done == 2 and outcome.skipped["done"] == 1
        app.effects.resolve_many("prep", ["0-a"], done=True, force=True)
        # The job claim too (a worker idling on an empty queue prepared it, then drained a
        # batch of 100,000 jobs at a quarter of the speed).
        for _ in range(12):
            assert app.backend.job_claim("q-empty", 10, "o", 30.0) == []
        # A worker's lease renewals, batch acks, the metrics scrape (the test above says
        # why these: here, that each path really leaves them unprepared).
        app.enqueue_calls("plans.t", [(i,) for i in range(3)], queue="q-held")
        held = [(j.id, j.lease_token) for j in app.backend.job_claim("q-held", 3, "o", 30.0)]
        batch = app.batches.open("acks")
        items = batch.add(12).item_ids()
        batch.seal()
        for item in items:
            app.backend.job_heartbeat(held, 30.0)
            app.batches.ack(item)
            app.metrics_snapshot()
        app.backend.job_release(held, refund=True)
        with app.backend.pg._connection() as conn:
            prepared = {" ".join(r[0].split()) for r in
                        conn.execute("SELECT statement FROM pg_prepared_statements")}
        # Nothing of PLANNED_EACH_TIME, by its text as psycopg sends it ($n placeholders).
        def shape(text: str) -> str:
            return re.sub(r"\$\d+", "$", " ".join(text.split()))

        assert shape(_positional(Q["effect_get"])[0]) in {shape(s) for s in prepared}  # control
        for marker in ("json_array_elements(", "unnest("):
            assert not [s for s in prepared if marker in s and "justonce_effects" in s], marker
        assert not [s for s in prepared if "UPDATE justonce_jobs" in s]
        sent = {name: shape(_positional(Q[name])[0]) for name in PLANNED_EACH_TIME}
        kept = {name for name, text in sent.items() if any(shape(s) == text for s in prepared)}
        assert not kept
        assert len(prepared) >= 3  # (the control: others are prepared, and compared)
    finally:
        app.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_connection_drops_its_prepared_plans_once_they_are_old(db_url: str) -> None:
    """Every plan psycopg prepared is remade after PLAN_MAX_AGE: batch_flip's, prepared on
    a near-empty chunk table (PREPARED_ANYWAY), scans no grown table for long."""
    app = App(f"{db_url}&pool_size=1")
    app.backend.pg.plan_max_age = 3600.0  # until the test says otherwise
    try:
        app.migrate()
        batch = app.batches.open("aged")
        items = batch.add(40).item_ids()
        batch.seal()

        def prepared() -> set[str]:
            with app.backend.pg._connection() as conn:
                return {" ".join(r[0].split()) for r in
                        conn.execute("SELECT statement FROM pg_prepared_statements")}

        flip = "WITH want AS ( SELECT (w->>0)::bigint AS batch_id"
        for item in items[:12]:
            app.batches.ack(item)
        assert any(s.startswith(flip) for s in prepared())
        app.backend.pg.plan_max_age = 0.2
        time.sleep(0.3)
        assert prepared() == set()  # dropped as the connection was lent, before the look
        app.backend.pg.plan_max_age = 3600.0
        for item in items[12:30]:  # prepared again, and used: psycopg forgot them too
            assert app.batches.ack(item).resolved == 1
        assert any(s.startswith(flip) for s in prepared())
        assert app.batches.ack(items[30:]).resolved == 10
    finally:
        app.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_plans_dropped_while_none_was_prepared_do_not_hide_later_drops(db_url: str) -> None:
    """A drop on a connection that had prepared nothing yet, then statements prepared, then
    a second drop: psycopg must forget the second time too (it once did not, and the next
    run of a prepared statement failed: "prepared statement _pg3_3 does not exist")."""
    app = App(f"{db_url}&pool_size=1", strict=False)
    pg = app.backend.pg
    pg.plan_max_age = 3600.0
    try:
        app.migrate()
        for _ in range(3):
            app.enqueue("t.noop", queue="aged")
        pg.plan_max_age = 0.05
        time.sleep(0.1)
        assert app.queue_counts()  # lent: dropped with nothing prepared on it yet
        pg.plan_max_age = 3600.0
        for _ in range(8):  # prepared now (psycopg prepares a text after five runs)
            app.queue_counts()
        with pg._connection() as conn:
            assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] > 0
        pg.plan_max_age = 0.05
        time.sleep(0.1)
        for _ in range(8):  # dropped again as it is lent; then prepared again, and run
            assert app.queue_counts()
    finally:
        app.close()


@contextmanager
def _unanalyzed_ledger(db_url: str) -> Iterator[tuple[App, psycopg.Connection]]:
    """A migrated app and a connection of the test's own to its schema, the effects table
    never analyzed behind the test's back (autovacuum off for it): the ledger as a
    growing Push sees it."""
    app = App(db_url)
    try:
        app.migrate()
        conninfo, schema = parse_postgres_url(db_url)[:2]
        with psycopg.connect(conninfo, autocommit=True, options=f"-c search_path={schema}") as c:
            c.execute("ALTER TABLE justonce_effects SET (autovacuum_enabled = false)")
            yield app, c
    finally:
        app.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_chunk_finish_reads_its_entries_by_the_chunk_not_by_the_whole_scope(db_url: str) -> None:
    """Planned at each run is not enough where the table has no statistics yet (a scope
    that grew since the last ANALYZE): given the chunk and the scope, the planner ANDed
    the chunk's index with the primary key's scope prefix, and so read every entry of the
    scope for each chunk a run_many finished (a Push's finish grew with its list: 15 ms a
    chunk of 500 in a scope of 100,000, against 0.4). The custom plans of the finish's two
    reads of a chunk (its count, its keys), on a table never analyzed, must not touch the
    primary key."""
    with _unanalyzed_ledger(db_url) as (app, c):
        outcome = app.effects.run_many("grown", range(6000), lambda k: None, chunk=500)
        assert outcome.done == 6000
        chunk = c.execute("SELECT max(chunk_id) FROM justonce_effects").fetchone()[0]
        args = {"chunk": chunk, "scope": "grown"}
        assert len(c.execute(Q["effect_chunk_keys"], args).fetchall()) == 500
        assert c.execute(Q["effect_chunk_held"], args).fetchone()[0] == 500
        for name in ("effect_chunk_keys", "effect_chunk_held"):
            plan = "\n".join(r[0] for r in c.execute("EXPLAIN " + Q[name], args))
            assert "justonce_effects_chunk" in plan and "justonce_effects_pkey" not in plan, (name, plan)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_page_of_a_grown_scope_walks_the_key_index_and_sorts_nothing(db_url: str) -> None:
    """effects.list promises that each page of a scope costs the same. On a scope grown
    since the last ANALYZE (estimated at a few hundred entries), the planner read every
    entry after the page's first key with a bitmap scan and sorted them all, for each page
    (0.55 s a page of 20,000 in a scope of 1,000,000). Its statement now runs with the
    planner settings of PLANNER_LOCAL, in its own transaction: the plan walks the primary
    key in order, and the settings are gone from the connection afterwards."""
    with _unanalyzed_ledger(db_url) as (app, c):
        # The planner's costs as they ship, whatever this server was tuned to: the
        # trap below is shown with them.
        for name, value in (("seq_page_cost", "1"), ("random_page_cost", "4"), ("work_mem", "4MB"),
                            ("effective_cache_size", "4GB"), ("cpu_tuple_cost", "0.01"),
                            ("cpu_index_tuple_cost", "0.005"), ("cpu_operator_cost", "0.0025")):
            c.execute("SELECT set_config(%s, %s, false)", (name, value))
        # Never analyzed (a new ledger; or a scope that grew since, which the planner
        # estimates the same way: a few hundred entries).
        assert app.effects.run_many("grown", range(40_000), lambda k: None).done == 40_000
        args = {"scope": "grown", "state": None, "limit": 1000, "after": "2"}

        def plan() -> str:
            return "\n".join(r[0] for r in c.execute("EXPLAIN " + Q["effects_list"], args))

        # The trap, as the planner sees the grown scope without the settings ...
        assert "Sort" in plan(), plan()
        with c.transaction():
            for name, value in pg_backend.PLANNER_LOCAL["effects_list"].items():
                c.execute("SELECT set_config(%s, %s, true)", (name, value))
            fixed = plan()
        # ... and with them: the key index in order, each entry's chunk by its own key.
        assert "Sort" not in fixed and "Bitmap" not in fixed and "justonce_effects_pkey" in fixed, fixed

        # Through the backend: the pages, in order, and nothing left set on its connections.
        keys: list[str] = []
        after = None
        while page := app.effects.list("grown", "done", limit=7000, after=after):
            keys += [e.key for e in page]
            after = page[-1].key
        assert keys == sorted(str(k) for k in range(40_000))
        with app.backend.d._lend() as conn:  # type: ignore[attr-defined]
            assert conn.execute("SHOW enable_sort").fetchone()[0] == "on"
            assert conn.execute("SHOW enable_bitmapscan").fetchone()[0] == "on"


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("bouncer", [False, True])
def test_planner_settings_hold_for_their_statement_alone(db_url: str, bouncer: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """PLANNER_LOCAL's settings are sent in the statement's own pipeline and transaction:
    the statement runs with them (directly, and in PgBouncer mode, where the schema is set
    the same way), and the next statement on the connection runs without them."""
    probe = ("SELECT current_setting('enable_sort'), current_setting('enable_bitmapscan'), "
             "current_schema(), pg_backend_pid()")
    monkeypatch.setitem(Q, "settings_probe", probe)
    monkeypatch.setitem(pg_backend.PLANNER_LOCAL, "settings_probe",
                        {"enable_sort": "off", "enable_bitmapscan": "off"})
    monkeypatch.setitem(Q, "settings_plain", probe)
    schema = parse_postgres_url(db_url)[1]
    # One connection in the pool: the statement after the one with settings runs on the
    # same server session, so a leak could not hide on another connection.
    app = App(db_url + "&pool_size=1" + ("&pgbouncer=1" if bouncer else ""))
    try:
        app.migrate()
        d = app.backend.d  # type: ignore[attr-defined]
        pids = set()
        for _ in range(3):
            (*settings, pid), = d.read("settings_probe", {})
            assert settings == ["off", "off", schema]
            (*after, pid_after), = d.read("settings_plain", {})
            assert after == ["on", "on", schema]
            pids |= {pid, pid_after}
        assert len(pids) == 1, pids
        with pytest.raises(AssertionError, match="planner settings"), d._lend() as conn:
            d.rows(conn, "settings_probe", {})
    finally:
        app.close()
