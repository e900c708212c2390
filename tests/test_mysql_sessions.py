"""A caller's MySQL session (``conn=``) and what the server does to it: session settings
that would make justonce's statements parse or encode differently are refused before
anything is written; a call in the caller's transaction leaves all of its writes or none;
a statement the server interrupts or refuses comes back as one of justonce's errors.

Statements are held up on the real server with a trigger that sleeps on a marked row, so
that a KILL from another session lands while they run (no timing guess)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from justonce import App, DatabaseUnavailable, InvalidOption, JustonceError

pytestmark = pytest.mark.mysql

WEIRD = ["a'b", "back\\slash", "", 'q"uote', "x\\' OR 1=1 -- ", "é😀", "new\nline"]


@pytest.fixture
def myapp() -> Iterator[tuple[App, str]]:
    from conftest import mysql_database, mysql_or_skip

    with mysql_database(mysql_or_skip()) as url:
        app = App(url, strict=False)

        @app.task(name="t")
        def t(*args: Any, **kwargs: Any) -> None:
            pass

        app.migrate()
        try:
            yield app, url
        finally:
            app.close()


def _connect(url: str, *setup: str, autocommit: bool = False) -> Any:
    import pymysql

    from justonce.backends.mysql.backend import parse_mysql_url

    kwargs, _ = parse_mysql_url(url)
    c = pymysql.connect(**kwargs, charset="utf8mb4", autocommit=autocommit)
    with c.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        for statement in setup:
            cur.execute(statement)
    return c


def _count(url: str, where: str = "1=1") -> int:
    c = _connect(url, autocommit=True)
    try:
        with c.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM justonce_jobs WHERE {where}")
            return int(cur.fetchone()[0])
    finally:
        c.close()


def _calls(app: App, c: Any) -> dict[str, Callable[[], Any]]:
    return {
        "enqueue": lambda: app.enqueue("t", ["x"], key="k", conn=c),
        "enqueue_calls": lambda: app.enqueue_calls("t", [[w] for w in WEIRD] + [{"k": w} for w in WEIRD],
                                                   conn=c),
        "batches.open": lambda: app.batches.open("d", conn=c),
        "effects.run": lambda: app.effects.run("s", "k", lambda idem: 1, conn=c),
        "lists.create": lambda: app.lists.create("L", items=[{"w": 1}], conn=c),
    }


@pytest.mark.parametrize("mode", ["NO_BACKSLASH_ESCAPES", "ORACLE", "SIMULTANEOUS_ASSIGNMENT",
                                  "EMPTY_STRING_IS_NULL", "ANSI,NO_BACKSLASH_ESCAPES"])
def test_a_conn_whose_sql_mode_changes_how_statements_parse_is_refused_before_writing(
        myapp: tuple[App, str], mode: str) -> None:
    """Under NO_BACKSLASH_ESCAPES a bulk enqueue's rendered rows stored invalid JSON or
    broke the statement at a quote (an injection risk); under ORACLE every statement was a
    raw 1064. Each call is refused, naming the mode, and nothing is written."""
    app, url = myapp
    c = _connect(url, f"SET SESSION sql_mode = '{mode}'")
    try:
        with c.cursor() as cur:
            cur.execute("START TRANSACTION")  # (ORACLE parses a plain BEGIN as a PL/SQL block)
        for name, call in _calls(app, c).items():
            with pytest.raises(InvalidOption, match=f"sql_mode {mode.split(',')[-1]}") as got:
                call()
            assert "SET SESSION sql_mode" in str(got.value), name
        c.rollback()
    finally:
        c.close()
    assert _count(url) == 0


@pytest.mark.parametrize("mode", ["", "ANSI", "TRADITIONAL", "PAD_CHAR_TO_FULL_LENGTH",
                                  "PIPES_AS_CONCAT,IGNORE_SPACE,HIGH_NOT_PRECEDENCE"])
def test_a_conn_in_a_harmless_sql_mode_stores_every_argument_as_given(
        myapp: tuple[App, str], mode: str) -> None:
    app, url = myapp
    c = _connect(url, f"SET SESSION sql_mode = '{mode}'")
    try:
        calls: list[Any] = [[w] for w in WEIRD] + [{"k": w} for w in WEIRD]
        c.begin()
        ids = app.enqueue_calls("t", calls, conn=c)
        single = [app.enqueue("t", [w], {"k": w}, key=f"key{w}", conn=c).id for w in WEIRD]
        c.commit()
    finally:
        c.close()
    for job_id, call in zip(ids, calls, strict=True):
        job = app.get_job(job_id)
        assert (job.args, job.kwargs) == ((call, {}) if isinstance(call, list) else ([], call))
    for job_id, w in zip(single, WEIRD, strict=True):
        job = app.get_job(job_id)
        assert (job.args, job.kwargs, job.key) == ([w], {"k": w}, f"key{w}")


def test_our_own_connections_pin_a_sql_mode_whatever_the_session_began_with(
        myapp: tuple[App, str]) -> None:
    """A server whose global sql_mode (or init_connect) has NO_BACKSLASH_ESCAPES must not
    break justonce: its connections set their own mode at connect. (The session's start
    is set here with PyMySQL's init_command, as a global setting would: the shared test
    server's own global may not change.)"""
    _, url = myapp
    app = App(url, strict=False)
    try:
        app.backend.mysql._connect_kwargs["init_command"] = (  # type: ignore[attr-defined]
            "SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES,ORACLE'")
        calls: list[Any] = [[w] for w in WEIRD] + [{"k": w} for w in WEIRD]
        ids = app.enqueue_calls("t", calls)
        for job_id, call in zip(ids, calls, strict=True):
            job = app.get_job(job_id)
            assert (job.args, job.kwargs) == ((call, {}) if isinstance(call, list) else ([], call))
        with app.backend.mysql.transaction() as c, c.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute("SELECT @@SESSION.sql_mode")
            assert "NO_BACKSLASH_ESCAPES" not in cur.fetchone()[0]
    finally:
        app.close()


@pytest.mark.parametrize("setting, variable", [
    ("SET NAMES latin1", "character_set_client"),
    ("SET NAMES utf8mb3", "character_set_client"),
    ("SET character_set_results = latin1", "character_set_results"),
    ("SET character_set_connection = latin1", "character_set_connection"),
])
def test_a_conn_whose_session_character_set_is_not_utf8mb4_is_refused(
        myapp: tuple[App, str], setting: str, variable: str) -> None:
    """Only PyMySQL's own charset was checked: SET NAMES latin1 stored mojibake, utf8mb3
    gave raw errors, character_set_results = latin1 a UnicodeDecodeError and a broken
    connection. Refused, naming the variable; the connection stays usable."""
    app, url = myapp
    c = _connect(url, setting)
    try:
        c.begin()
        for name, call in _calls(app, c).items():
            with pytest.raises(InvalidOption, match=f"{variable} = .*not utf8mb4") as got:
                call()
            assert "SET NAMES utf8mb4" in str(got.value), name
        with c.cursor() as cur:
            cur.execute("SET NAMES utf8mb4")
        job = app.enqueue("t", ["héllo 😀"], conn=c)
        c.commit()
    finally:
        c.close()
    assert app.get_job(job.id).args == ["héllo 😀"]
    assert _count(url) == 1


def test_a_read_only_transaction_on_conn_gets_a_clear_refusal(myapp: tuple[App, str]) -> None:
    """SET SESSION TRANSACTION READ ONLY gave the server's raw 1792 on every call."""
    app, url = myapp
    for autocommit in (False, True):
        c = _connect(url, "SET SESSION TRANSACTION READ ONLY", autocommit=autocommit)
        try:
            for call in _calls(app, c).values():
                with pytest.raises(InvalidOption, match="read-only"):
                    call()
        finally:
            c.close()
    assert _count(url) == 0


# -- statements held up on the server, and killed -----------------------------------------------

def _slow_inserts(url: str) -> None:
    """Inserts of a job whose arguments say 'sleepy', or of an effect whose key does, sleep
    on the server until killed (a trigger: the real statement, held up)."""
    c = _connect(url, autocommit=True)
    try:
        with c.cursor() as cur:
            cur.execute("CREATE TRIGGER slow_jobs BEFORE INSERT ON justonce_jobs FOR EACH ROW "
                        "BEGIN IF NEW.args LIKE '%sleepy%' THEN DO SLEEP(60); END IF; END")
            cur.execute("CREATE TRIGGER slow_effects BEFORE INSERT ON justonce_effects FOR EACH "
                        "ROW BEGIN IF NEW.`key` LIKE 'sleepy%' THEN DO SLEEP(60); END IF; END")
    finally:
        c.close()


@contextmanager
def _killer(url: str, how: str, where: str = "STATE = 'User sleep'") -> Iterator[list[int]]:
    """Kills (``how``: QUERY or CONNECTION) each session found sleeping in a trigger (or
    matching ``where``) while the block runs; the ids it killed."""
    killed: list[int] = []
    stop = threading.Event()
    c = _connect(url, autocommit=True)

    def watch() -> None:
        while not stop.is_set():
            with c.cursor() as cur:
                # (this test's database only: a test beside it on the same server, another
                # xdist worker's, has sessions of its own sleeping in its triggers)
                cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE "
                            f"{where} AND ID <> CONNECTION_ID() AND DB = DATABASE()")
                for (pid,) in cur.fetchall():
                    cur.execute(f"KILL {how} {int(pid)}")
                    killed.append(int(pid))
            stop.wait(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join()
        c.close()


def test_a_bulk_enqueue_cut_into_statements_leaves_none_of_its_jobs_when_one_is_killed(
        myapp: tuple[App, str]) -> None:
    """A bulk enqueue on the caller's open transaction, cut into several statements (the
    server's packet limit, made small here): its second statement killed, the call raised,
    and the first statement's jobs went in with the caller's COMMIT (83 of 200, in the
    adversarial run). MySQL undoes only the failed statement: the call is now under a
    savepoint, and the caller's own write before it stays."""
    app, url = myapp
    _slow_inserts(url)
    app.backend.mysql.statement_bytes = 4000  # type: ignore[attr-defined]
    calls = [["bulk", i, "x" * 300] for i in range(40)]
    calls[30] = ["bulk", 30, "sleepy"]
    c = _connect(url)
    try:
        c.begin()
        app.enqueue("t", ["mine"], conn=c)
        with _killer(url, "QUERY") as killed, pytest.raises(DatabaseUnavailable, match="interrupted"):
            app.enqueue_calls("t", calls, conn=c)
        assert killed
        c.commit()  # the caller goes on, taking the error for "not enqueued"
    finally:
        c.close()
    assert _count(url, "args LIKE '[\"bulk\"%'") == 0
    assert _count(url, "args = '[\"mine\"]'") == 1


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_killed_statement_on_conn_is_a_justonce_error_and_leaves_nothing(
        myapp: tuple[App, str], autocommit: bool) -> None:
    """KILL QUERY gave the raw pymysql OperationalError 1317 to callers of enqueue,
    enqueue_many and effects.run_many."""
    from justonce import Enqueue

    app, url = myapp
    _slow_inserts(url)
    c = _connect(url, autocommit=autocommit)
    try:
        for call in (lambda: app.enqueue("t", ["sleepy"], conn=c),
                     lambda: app.enqueue_many([Enqueue("t", args=("a",), key="a"),
                                               Enqueue("t", args=("sleepy",), priority=3)], conn=c),
                     lambda: app.effects.run_many("s", ["a", "sleepy1"], lambda idem: 1, conn=c)):
            with _killer(url, "QUERY") as killed, pytest.raises(DatabaseUnavailable,
                                                                match="interrupted"):
                call()
            assert killed
        if not autocommit:
            c.commit()
    finally:
        c.close()
    assert _count(url) == 0


def test_a_killed_connection_or_statement_of_ours_is_a_justonce_error(
        myapp: tuple[App, str]) -> None:
    """On justonce's own connections too: a KILL QUERY or KILL CONNECTION is
    DatabaseUnavailable, and the next call works on a new connection."""
    app, url = myapp
    _slow_inserts(url)
    for how in ("QUERY", "CONNECTION"):
        with _killer(url, how) as killed, pytest.raises(DatabaseUnavailable):
            app.enqueue("t", ["sleepy"])
        assert killed
    assert app.enqueue("t", ["awake"]).args == ["awake"]
    assert _count(url) == 1


def test_a_killed_callers_connection_is_database_unavailable(myapp: tuple[App, str]) -> None:
    app, url = myapp
    _slow_inserts(url)
    c = _connect(url)
    try:
        c.begin()
        with _killer(url, "CONNECTION"), pytest.raises(DatabaseUnavailable) as got:
            app.enqueue_calls("t", [["sleepy"], ["b"]], conn=c)
        assert isinstance(got.value, JustonceError)
    finally:
        c.close()
    assert _count(url) == 0


def test_a_killed_batch_or_list_call_on_conn_is_a_justonce_error(myapp: tuple[App, str]) -> None:
    """batches.ack, lists.reserve and lists.complete on the caller's connection, each held
    up by tables another session locked and its statement killed there: the raw 1317
    became DatabaseUnavailable; the caller's transaction stays open and usable."""
    app, url = myapp
    group = app.batches.open("b").add(2)
    app.lists.create("L", items=[{"n": 1}, {"n": 2}])
    held = app.lists.reserve("L")
    assert held is not None
    c = _connect(url)
    blocker = _connect(url, autocommit=True)
    try:
        c.begin()
        app.enqueue("t", ["mine"], conn=c)
        waiting = f"ID = {c.thread_id()} AND STATE LIKE 'Waiting for table%'"
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLES justonce_batches WRITE, justonce_batch_chunks WRITE, "
                        "justonce_lists WRITE, justonce_list_items WRITE, "
                        "justonce_list_reservations WRITE")
        for name, call in (("ack", lambda: app.batches.ack(group.item_id(0), conn=c)),
                           ("reserve", lambda: app.lists.reserve("L", conn=c)),
                           ("complete", lambda: app.lists.complete(held, conn=c))):
            with _killer(url, "QUERY", waiting) as killed, pytest.raises(
                    DatabaseUnavailable, match="interrupted"):
                call()
            assert killed, name
        with blocker.cursor() as cur:
            cur.execute("UNLOCK TABLES")
        c.commit()
    finally:
        c.close()
        blocker.close()
    assert _count(url, "args = '[\"mine\"]'") == 1
    assert app.batches.get(group.batch_id).acked == 0
