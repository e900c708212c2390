"""justonce behind a real PgBouncer in transaction mode.

The module starts its own ``pgbouncer`` on a free loopback port, in front of the test
PostgreSQL, with a pool of 4 server connections shared by every client (so consecutive
transactions of one client really land on different server connections). Through it:
real worker processes drain a few thousand jobs (single, keyed and bulk enqueues, batch
items, a partitioned worker) while the test process acks batches, takes partition leases
and runs effects, all with ``?schema=…&pgbouncer=1``; afterwards no worker has logged a
warning or an error and every job completed exactly once. The converse is shown too:
without ``pgbouncer=1`` psycopg's prepared statements break, and ``?schema=`` cannot
even connect.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import proc_app
from conftest import REQUIRE_PG, _drop_schema
from fleet import Fleet, WorkerProc, fleet_on, wait_for
from justonce import App, Enqueue
from justonce.testing.pgbouncer import pgbouncer_bin, start_pgbouncer

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

POOL_SIZE = 4  # server connections PgBouncer keeps per (database, user)


def _pgbouncer() -> str | None:
    return pgbouncer_bin()


def _start_pgbouncer(server_url: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    try:
        return start_pgbouncer(server_url, folder, POOL_SIZE)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def bouncer(pg_server_url: str) -> Iterator[str]:
    """The test database's URL through a pgbouncer this module starts (and stops)."""
    if _pgbouncer() is None:
        msg = "pgbouncer is not installed (apt-get install pgbouncer)"
        if REQUIRE_PG:
            pytest.fail(msg + " (JUSTONCE_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip(msg)
    folder = Path(tempfile.mkdtemp(prefix="justonce-pgbouncer-"))
    folder.chmod(0o755)  # readable by the postgres user pgbouncer switches to
    proc, url = _start_pgbouncer(pg_server_url, folder)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def schema(pg_server_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    _drop_schema(pg_server_url, name)


# -- the option itself (no server needed) ------------------------------------------------------


def test_pgbouncer_option_turns_off_prepared_statements_the_startup_schema_and_listen() -> None:
    from justonce.backends.postgres.backend import PostgresBackend

    direct = PostgresBackend("postgresql://u@127.0.0.1:5432/db?schema=jobs")
    assert "prepare_threshold" not in direct.pg._kwargs
    assert direct.pg._kwargs["options"] == "-c search_path=jobs -c DateStyle=ISO"
    assert direct.pg._local_schema is None
    assert direct.waiter(["default"]).listen and not direct.waiter(["default"], listen=False).listen

    behind = PostgresBackend("postgresql://u@127.0.0.1:6432/db?schema=jobs&pgbouncer=1")
    assert behind.pg.pgbouncer and behind.pg.conninfo == "postgresql://u@127.0.0.1:6432/db"
    assert behind.pg._kwargs["prepare_threshold"] is None and "options" not in behind.pg._kwargs
    assert behind.pg._local_schema == "jobs" and behind.pg.channel == "justonce.jobs"
    assert not behind.waiter(["default"], listen=True).listen


@pytest.mark.parametrize("value", ["2", "maybe", "tru"])
def test_a_misspelt_pgbouncer_option_is_refused(value: str) -> None:
    from justonce import ConfigurationError
    from justonce.backends.postgres.backend import PostgresBackend

    with pytest.raises(ConfigurationError, match="pgbouncer"):
        PostgresBackend(f"postgresql://u@127.0.0.1/db?pgbouncer={value}")


# -- the converse: what breaks without the option --------------------------------------------


def test_without_the_option_prepared_statements_break_behind_pgbouncer(
    bouncer: str, schema: str, pg_server_url: str
) -> None:
    """Two clients take turns running one statement more often than psycopg's prepare
    threshold (5). PgBouncer hands each the server connection freed last, so the second
    client's "_pg3_0" collides with the first's (or the first's is missing on another
    server connection). Two apps with ?pgbouncer=1 doing the same prepare nothing and run
    clean."""
    import psycopg

    def failures(clients: list[Any], run: Callable[[Any], object]) -> list[str]:
        seen = []
        for _ in range(10):
            for c in clients:
                try:
                    run(c)
                except psycopg.Error as exc:
                    seen.append(str(exc))
        return seen

    plain = [psycopg.connect(bouncer, autocommit=True) for _ in range(2)]  # psycopg's default
    try:
        broken = failures(plain, lambda c: c.execute("SELECT %s::int", (1,)).fetchone())
    finally:
        for c in plain:
            c.close()
    assert broken and all("prepared statement" in m for m in broken), broken

    App(f"{pg_server_url}?schema={schema}", strict=False).migrate()
    apps = [App(f"{bouncer}?schema={schema}&pgbouncer=1&pool_size=1") for _ in range(2)]
    try:
        assert failures(apps, lambda a: a.queue_counts()) == []
    finally:
        for a in apps:
            a.close()


def test_without_the_option_a_schema_cannot_connect_through_pgbouncer(bouncer: str) -> None:
    """?schema= sets search_path with libpq's `options` startup parameter; PgBouncer 1.18
    refuses the connection (told to ignore the parameter it would drop it, and the tables
    would resolve in `public`)."""
    import psycopg

    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(bouncer, options="-c search_path=x", connect_timeout=5).close()


# -- the real thing ----------------------------------------------------------------------------

JOBS_BULK = 3000
JOBS_SINGLE = 100
KEYS = 100
BATCH_JOBS = 500
PARTITIONED_JOBS = 300
ACK_ITEMS = 4000
EFFECT_KEYS = 200


def _bad_lines(proc: WorkerProc) -> list[str]:
    """Log lines that show anything went wrong: a warning or an error, an ``*.error``
    event, anything that is not a JSON log line (a traceback), a prepared statement."""
    bad = []
    for line in proc.log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if (not isinstance(rec, dict) or "prepared statement" in line
                or rec.get("level") in ("warning", "error", "critical")
                or str(rec.get("event", "")).endswith(("error", ".failed"))):
            bad.append(line)
    return bad


def _succeeded(procs: list[WorkerProc]) -> Counter[int]:
    """How many job.succeeded lines each job id has in these workers' logs."""
    c: Counter[int] = Counter()
    for p in procs:
        for rec in p.events("job.succeeded"):
            c[int(rec["job_id"])] += 1
    return c


def test_workers_behind_pgbouncer_log_no_error_and_complete_every_job_once(
    bouncer: str, schema: str, pg_server_url: str, tmp_path: Path
) -> None:
    """Four polling workers (plus one partitioned worker) behind PgBouncer with
    ?schema=…&pgbouncer=1 while the test process enqueues every way, acks a batch in bulk
    and one by one, takes, renews and fences a partition lease and runs effects through
    the same PgBouncer. Afterwards: every job succeeded on its first attempt and was
    reported done once, the batches completed once, the effects ran once each, the
    tables are in the schema, and no worker logged a warning, an error or a traceback."""
    import psycopg

    url = f"{bouncer}?schema={schema}&pgbouncer=1"
    app = proc_app.app
    app.use_database(url)
    app.migrate()
    try:
        with fleet_on(url, tmp_path) as fleet:
            _run_everything(app, fleet, url, schema)
    finally:
        app.close()

    # The jobs are in the schema (seen directly, not through PgBouncer).
    with psycopg.connect(pg_server_url, autocommit=True) as direct:
        row = direct.execute(f'SELECT count(*) FROM "{schema}".justonce_jobs').fetchone()
        assert row is not None and row[0] > JOBS_BULK


def _run_everything(app: App, fleet: Fleet, url: str, schema: str) -> None:
    import psycopg

    expected: set[int] = set()
    # Keyed jobs before any worker runs: each key enqueued twice is one job.
    for k in range(KEYS):
        first = app.enqueue(proc_app.accept, [k], key=f"k{k}")
        again = app.enqueue(proc_app.accept, [k], key=f"k{k}")
        assert again.duplicate and again.id == first.id
        expected.add(first.id)
    keyed = [Enqueue(proc_app.accept, args=[i], key=f"m{i}") for i in range(100)]
    first_ids = app.enqueue_many(keyed + [Enqueue(proc_app.noop) for _ in range(100)])
    assert app.enqueue_many(keyed) == first_ids[:100]
    expected.update(first_ids)

    workers = [fleet.start(concurrency=4, extra=["--no-listen"], ready=False) for _ in range(3)]
    # No --no-listen: with pgbouncer=1 the worker polls anyway (a LISTEN would never fire).
    workers.append(fleet.start(concurrency=4, ready=False))
    partitioned = fleet.start(concurrency=2, ready=False, extra=[
        "--no-listen", "--queues", "pq", "--partitions", "pset:2", "--partition-slots", "2"])
    workers.append(partitioned)
    fleet.wait_ready(*workers)

    # While they run: one by one, in bulk, as batch items, on a partitioned queue.
    for _ in range(JOBS_SINGLE):
        expected.add(app.enqueue(proc_app.noop).id)
    expected.update(app.enqueue_calls(proc_app.accept, [(i,) for i in range(JOBS_BULK)]))
    jobs_batch = app.batches.open(on_complete=proc_app.accept)
    _, ids = jobs_batch.enqueue_calls(proc_app.accept, [(i,) for i in range(BATCH_JOBS)])
    expected.update(ids)
    jobs_batch.seal()
    partition_jobs = set(app.enqueue_many(
        Enqueue(proc_app.accept, args=[i], queue="pq", partition_key=f"p{i % 17}")
        for i in range(PARTITIONED_JOBS)))
    expected |= partition_jobs

    # A batch acked in bulk, then one by one; the last ack completes it, once.
    acked = app.batches.open()
    item_ids = acked.add(ACK_ITEMS).item_ids()
    acked.seal()
    bulk, singles = item_ids[:-50], item_ids[-50:]
    for i in range(0, len(bulk), 500):
        chunk = bulk[i:i + 500]
        assert app.batches.ack(chunk).resolved == len(chunk)
    results = [app.batches.ack(item) for item in singles]
    assert [list(r.completed) for r in results] == [[]] * 49 + [[acked.id]]
    assert len(app.batches.ack(item_ids[:10]).already) == 10  # idempotent, and says so

    # A partition lease: acquire, renew, fence a write in our own transaction, release.
    lease = app.partitions.acquire("lset", 2, lease=5)
    lease.renew()
    own = psycopg.connect(url.split("?")[0], autocommit=True, prepare_threshold=None)
    with own, own.transaction():
        # Our own connection through PgBouncer: the schema for this transaction only.
        own.execute("SELECT set_config('search_path', %s, true)", (schema,))
        lease.fence(own)
        own.execute("CREATE TABLE IF NOT EXISTS fenced (slot int)")
        own.execute("INSERT INTO fenced VALUES (%s)", (lease.slot,))
    lease.release()

    # Effects: each key's effect runs once, though each is asked for twice.
    ran: Counter[int] = Counter()
    for k in list(range(EFFECT_KEYS)) * 2:
        out = app.effects.run("pgb", k, lambda idem, k=k: ran.update([k]))
        assert out.state == "done"
    assert len(ran) == EFFECT_KEYS and set(ran.values()) == {1}

    def drained() -> bool:
        states = {str(qc.state) for qc in app.queue_counts()}
        return states == {"succeeded"}

    wait_for(drained, 120, "the workers to drain every queue", interval=0.2)
    assert app.batches.get(jobs_batch.id).state == "completed"

    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(30) == 0, w.tail()

    jobs = {j.id: j for j in app.list_jobs(limit=10_000)}
    assert len(set(jobs) - expected) == 1  # the batch's callback, enqueued once
    assert all(j.state == "succeeded" and j.attempts == 1 for j in jobs.values())
    done = _succeeded(workers)
    assert set(done) == set(jobs) and set(done.values()) == {1}
    assert set(_succeeded([partitioned])) == partition_jobs
    for w in workers:
        assert _bad_lines(w) == [], w.tail()


def test_the_push_demo_runs_through_pgbouncer_with_a_schema(bouncer: str, schema: str,
                                                             pg_server_url: str, tmp_path: Path) -> None:
    """The README's main job with ``?schema=…&pgbouncer=1``: the demo's own connections
    (set-up with COPY and VACUUM, the slot jobs' page queries) go through PgBouncer as
    justonce's do (nothing prepared, the schema set in each transaction), and every user
    gets one email."""
    import os
    import sys

    import psycopg

    env = dict(os.environ, COLUMNS="140")
    env.pop("JUSTONCE_DATABASE_URL", None)
    url = f"{bouncer}?schema={schema}&pgbouncer=1"
    done = subprocess.run([sys.executable, "-m", "justonce", "demo", "push", "--users", "20000",
                           "--workers", "2", "--senders", "2", "--database-url", url],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "every user of the list got exactly one email" in out, out
    with psycopg.connect(pg_server_url, autocommit=True) as direct:  # the demo's tables are in the schema
        row = direct.execute(f'SELECT count(*) FROM "{schema}".demo_users').fetchone()
        assert row is not None and row[0] == 20000
        sampled = direct.execute(f'SELECT count(*) FROM "{schema}".demo_push_ab').fetchone()
        assert sampled is not None and sampled[0] > 0

    from justonce.demo import BouncedPostgres, connect

    conn = connect(url)
    try:
        assert isinstance(conn, BouncedPostgres) and conn.conn.prepare_threshold is None
        for _ in range(10):  # past psycopg's prepare threshold, on whichever server connection
            count = conn.execute("SELECT count(*) FROM demo_push_ab WHERE push_id > %s", (0,)).fetchone()
            assert count[0] == sampled[0]
    finally:
        conn.close()
