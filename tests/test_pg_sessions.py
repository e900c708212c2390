"""A caller's own PostgreSQL connection (``conn=``) in the session states an adversarial
tester found: each is refused before anything is written, or fails leaving the caller's
transaction and its own writes as they were, with an error that says what happened."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conftest import _drop_schema, postgres_or_skip
from justonce import App, DatabaseUnavailable, Enqueue, InvalidOption, LockTimeout

psycopg = pytest.importorskip("psycopg")

Connect = Callable[..., Any]


@pytest.fixture
def pg() -> Iterator[tuple[App, Connect, str]]:
    """An App on a fresh schema, a way to open a caller's connection that sees it (with a
    table ``mine`` of the caller's own), and the schema's name."""
    server = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in server else "?"
    app = App(f"{server}{sep}schema={schema}")
    app.migrate()

    @app.task(name="test_pg_sessions.noop")
    def noop(*args: Any) -> None:
        return None

    opened: list[Any] = []

    def connect(**kwargs: Any) -> Any:
        conn = psycopg.connect(server, options=f"-c search_path={schema},public", **kwargs)
        opened.append(conn)
        return conn

    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE TABLE "{schema}".mine (id serial PRIMARY KEY, note text)')
    try:
        yield app, connect, schema
    finally:
        for conn in opened:
            conn.close()
        app.close()
        _drop_schema(server, schema)


def _count(connect: Connect, query: str, *params: Any) -> int:
    with connect(autocommit=True) as c:
        return int(c.execute(query, params).fetchone()[0])


def test_autocommit_connection_whose_isolation_level_is_repeatable_read_is_refused_for_batches(
        pg: tuple[App, Connect, str]) -> None:
    """The session's default is READ COMMITTED, but the transaction justonce opens on an
    autocommit connection begins in its isolation_level: acks in REPEATABLE READ left a
    fully acked batch never completed."""
    app, connect, _ = pg
    batch = app.batches.open()
    group = batch.add(1)
    batch.seal()
    for level in (psycopg.IsolationLevel.REPEATABLE_READ, psycopg.IsolationLevel.SERIALIZABLE):
        c = connect(autocommit=True)
        c.isolation_level = level
        with pytest.raises(InvalidOption, match="READ COMMITTED"):
            app.batches.ack(group.item_id(0), conn=c)
        with pytest.raises(InvalidOption, match="READ COMMITTED"):
            app.batches.open(conn=c)
    assert app.batches.get(batch.id).acked == 0
    c = connect(autocommit=True)
    c.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    app.batches.ack(group.item_id(0), conn=c)
    assert app.batches.get(batch.id).state.value == "completed"


@pytest.mark.parametrize("style", ["SQL, DMY", "Postgres, MDY", "German"])
@pytest.mark.parametrize("autocommit", [True, False])
def test_non_iso_datestyle_is_refused_before_the_job_is_written(
        pg: tuple[App, Connect, str], style: str, autocommit: bool) -> None:
    """psycopg reads timestamps in the ISO style only: the enqueue raised its
    NotImplementedError after the job was written (committed, in autocommit)."""
    app, connect, _ = pg
    c = connect(autocommit=autocommit)
    c.execute(f"SET DateStyle = '{style}'")
    c.commit()
    with pytest.raises(InvalidOption, match="DateStyle.*ISO"):
        app.enqueue("test_pg_sessions.noop", ["probe"], conn=c)
    c.commit()
    assert _count(connect, "SELECT count(*) FROM justonce_jobs") == 0
    c.execute("SET DateStyle = 'ISO, DMY'")  # what the error says to do: then it works
    c.commit()
    job = app.enqueue("test_pg_sessions.noop", ["probe"], conn=c)
    c.commit()
    assert app.get_job(job.id) is not None


@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252", "SQL_ASCII"])
def test_client_encoding_other_than_utf8_is_refused(
        pg: tuple[App, Connect, str], encoding: str) -> None:
    app, connect, _ = pg
    c = connect()
    c.execute(f"SET client_encoding = '{encoding}'")
    c.commit()
    with pytest.raises(InvalidOption, match="client_encoding"):
        app.enqueue("test_pg_sessions.noop", ["héllo € 日本語 😀"], key="k-é", conn=c)
    c.commit()
    assert _count(connect, "SELECT count(*) FROM justonce_jobs") == 0


def test_enqueue_refused_in_callers_transaction_leaves_their_earlier_writes(
        pg: tuple[App, Connect, str]) -> None:
    """A key held by another open transaction, the caller's lock_timeout short: the call
    fails, and the caller's own row still commits (it ran under a savepoint)."""
    app, connect, _ = pg
    other = connect()
    app.enqueue("test_pg_sessions.noop", [0], key="held", conn=other)
    c = connect()
    c.execute("SET lock_timeout = '300ms'")
    c.execute("INSERT INTO mine (note) VALUES ('order')")
    with pytest.raises(LockTimeout):
        app.enqueue("test_pg_sessions.noop", [1], key="held", conn=c)
    with pytest.raises(LockTimeout):
        app.enqueue_many([Enqueue("test_pg_sessions.noop", [2]),
                          Enqueue("test_pg_sessions.noop", [1], key="held")], conn=c)
    assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    kept = app.enqueue("test_pg_sessions.noop", [3], conn=c)  # the transaction is usable
    c.commit()
    other.rollback()
    assert _count(connect, "SELECT count(*) FROM mine WHERE note = 'order'") == 1
    assert _count(connect, "SELECT count(*) FROM justonce_jobs") == 1
    assert app.get_job(kept.id) is not None


def test_read_only_transaction_is_refused_as_invalid_option(
        pg: tuple[App, Connect, str]) -> None:
    app, connect, _ = pg
    for autocommit in (True, False):
        c = connect(autocommit=autocommit)
        c.execute("SET default_transaction_read_only = on")
        c.commit()
        with pytest.raises(InvalidOption, match="read-only"):
            app.enqueue("test_pg_sessions.noop", [1], conn=c)
        c.rollback()


def test_statement_timeout_inside_a_call_says_the_transaction_is_still_open(
        pg: tuple[App, Connect, str]) -> None:
    """The call ran under justonce's savepoint: the cancelled statement undid the call
    only, and the caller's transaction and its writes commit."""
    app, connect, _ = pg
    app.effects.run("st", "k", lambda k: None, policy="at_least_once")
    holder = connect()
    holder.execute("SELECT 1 FROM justonce_effects WHERE scope = 'st' FOR UPDATE")
    c = connect()
    c.execute("SET statement_timeout = '300ms'")
    c.commit()
    c.execute("INSERT INTO mine (note) VALUES ('mine')")
    with pytest.raises(DatabaseUnavailable, match="still open") as caught:
        app.effects.run("st", "k", lambda k: None, policy="at_least_once", lock_timeout=5,
                        conn=c)
    assert "gone" not in str(caught.value)
    assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    c.commit()
    holder.rollback()
    assert _count(connect, "SELECT count(*) FROM mine WHERE note = 'mine'") == 1


@pytest.mark.parametrize("autocommit", [True, False])
def test_list_create_in_pipeline_mode_is_refused_and_leaves_no_list(
        pg: tuple[App, Connect, str], autocommit: bool) -> None:
    app, connect, _ = pg
    c = connect(autocommit=autocommit)
    with c.pipeline(), pytest.raises(InvalidOption, match="pipeline"):
        app.lists.create("piped", items=[1, 2, 3], conn=c)
    c.commit()
    assert app.lists.create("piped", items=[1, 2, 3]).state == "sealed"


def test_lock_row_needs_an_open_transaction_and_a_table_it_can_see(
        pg: tuple[App, Connect, str]) -> None:
    app, connect, schema = pg
    c = connect(autocommit=True)
    with pytest.raises(InvalidOption, match=r"lock_row\(\) needs your open transaction"):
        app.effects.lock_row(c, f"{schema}.mine", "id", 1, timeout=1)
    c = connect()
    c.execute("INSERT INTO mine (note) VALUES ('x')")
    with pytest.raises(InvalidOption, match="no_such_table"):
        app.effects.lock_row(c, f"{schema}.no_such_table", "id", 1, timeout=1)
    with pytest.raises(InvalidOption, match="no_such_column"):
        app.effects.lock_row(c, f"{schema}.mine", "no_such_column", 1, timeout=1)
    assert app.effects.lock_row(c, f"{schema}.mine", "id", 1, timeout=1) is True
    c.commit()
    assert _count(connect, "SELECT count(*) FROM mine") == 1


def test_our_own_sessions_read_iso_dates_in_utf8_whatever_the_databases_defaults() -> None:
    """A database whose default DateStyle is another (ALTER DATABASE … SET DateStyle = 'SQL,
    DMY') or whose encoding is not UTF8: our own pooled sessions met psycopg's "can't parse
    timestamptz with DateStyle" after every write had landed. They set both at startup."""
    from urllib.parse import urlsplit, urlunsplit

    server = postgres_or_skip()
    name = f"jo_ds_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(server)
    admin = psycopg.connect(server, autocommit=True)
    try:
        admin.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                      "TEMPLATE template0")
        admin.execute(f"ALTER DATABASE {name} SET DateStyle = 'SQL, DMY'")
        url = urlunsplit(parts._replace(path=f"/{name}"))
        for each in (url, f"{url}?schema=s1"):
            app = App(each, strict=False)
            try:
                app.migrate()
                job = app.enqueue("t.x", ["é"], delay=5)
                got = app.get_job(job.id)
                assert got.args == ["é"] and got.run_at is not None and got.run_at.tzinfo is not None
            finally:
                app.close()
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
