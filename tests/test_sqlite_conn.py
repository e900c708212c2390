"""A caller's own sqlite3 connection (``conn=``) in the states an adversarial tester found:
each call leaves the connection as it found it when it fails or writes nothing, is all or
nothing, reads its rows whatever the connection's factories, and fails with justonce's
error saying what happened. Real files; a second process or connection where it is about
another writer."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from justonce import (
    App,
    ConfigurationError,
    Enqueue,
    InvalidOption,
    JobNotFound,
    LockTimeout,
)


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[tuple[App, str]]:
    """An App on a fresh SQLite file (migrated, one task ``noop``) and the file's path."""
    path = str(tmp_path / "jobs.db")
    app = App(f"sqlite:///{path}")
    app.migrate()

    @app.task(name="test_sqlite_conn.noop")
    def noop(*args: Any) -> None:
        return None

    try:
        yield app, path
    finally:
        app.close()


def _count(path: str, query: str = "SELECT count(*) FROM justonce_jobs") -> int:
    c = sqlite3.connect(path)
    try:
        return int(c.execute(query).fetchone()[0])
    finally:
        c.close()


def _other_process_can_write(path: str) -> str:
    """What another process sees when it takes the file's write lock (waiting 0.5 s)."""
    code = textwrap.dedent(f"""
        import sqlite3
        c = sqlite3.connect({path!r}, timeout=0.5, isolation_level=None)
        try:
            c.execute("BEGIN IMMEDIATE"); c.execute("ROLLBACK"); print("yes")
        except sqlite3.OperationalError as exc:
            print("no:", exc)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("isolation", ["", "DEFERRED", "IMMEDIATE", "EXCLUSIVE"])
def test_refused_call_on_a_default_connection_leaves_no_transaction_nor_lock(
        lite: tuple[App, str], isolation: str) -> None:
    """sqlite3.connect()'s default connection (isolation_level "", not autocommit): a call
    refused (JobNotFound), or one that changed nothing (resume of a queue not paused),
    left the BEGIN IMMEDIATE it ran itself open, so the file's write lock stayed held and
    every other process's writes waited for a transaction the caller never began."""
    app, path = lite
    c = sqlite3.connect(path, isolation_level=isolation)
    try:
        with pytest.raises(JobNotFound):
            app.cancel(424242, conn=c)
        assert not c.in_transaction
        assert _other_process_can_write(path) == "yes"
        assert app.resume_queue("never-paused", conn=c) is False
        assert not c.in_transaction
        assert app.effects.lock_row(c, "justonce_jobs", "id", -5) is False
        assert not c.in_transaction
        assert _other_process_can_write(path) == "yes"
        # A call that writes still leaves its writes to the caller's COMMIT.
        app.enqueue("test_sqlite_conn.noop", [1], conn=c)
        assert c.in_transaction and _count(path) == 0
        c.commit()
        assert _count(path) == 1
    finally:
        c.close()


def test_refused_call_inside_the_callers_transaction_keeps_it_and_its_writes(
        lite: tuple[App, str]) -> None:
    """With the caller's transaction open, a refused call rolls back to justonce's savepoint
    only: the caller's own earlier write and transaction stay."""
    app, path = lite
    c = sqlite3.connect(path)
    try:
        c.execute("CREATE TABLE mine (id INTEGER PRIMARY KEY)")
        c.commit()
        c.execute("INSERT INTO mine VALUES (1)")
        assert c.in_transaction
        with pytest.raises(JobNotFound):
            app.cancel(424242, conn=c)
        assert c.in_transaction
        c.commit()
        assert _count(path, "SELECT count(*) FROM mine") == 1
    finally:
        c.close()


def _batch(n: int, tag: str) -> list[Enqueue]:
    # Options differ job to job: the path of several INSERTs (not one templated statement).
    return [Enqueue("test_sqlite_conn.noop", [i], priority=i % 7, key=f"{tag}-{i}")
            for i in range(n)]


def test_enqueue_many_on_an_autocommit_connection_is_all_or_nothing(
        lite: tuple[App, str]) -> None:
    """isolation_level=None: each INSERT of an enqueue_many committed by itself, so a
    failure midway (here: the second statement cannot take the write lock another
    connection holds) left part of the jobs committed."""
    app, path = lite
    c = sqlite3.connect(path, isolation_level=None)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        c.execute("CREATE TABLE gate (n INTEGER)")
        # The caller's own trigger stands for "something makes the call fail midway": its
        # second INSERT raises. Without the call's own transaction, the first stayed.
        c.execute("CREATE TRIGGER stop BEFORE INSERT ON justonce_jobs "
                  "WHEN NEW.priority = 3 BEGIN SELECT RAISE(ABORT, 'midway'); END")
        with pytest.raises(InvalidOption, match="midway"):
            app.enqueue_many(_batch(6, "a"), conn=c)
        assert not c.in_transaction
        assert _count(path) == 0
        c.execute("DROP TRIGGER stop")
        # And with another connection holding the write lock, nothing is written either.
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(LockTimeout):
            app.effects.run("s", 1, lambda k: k, conn=c, lock_timeout=0.3)
        holder.execute("ROLLBACK")
        assert app.enqueue_many(_batch(6, "b"), conn=c)
        assert not c.in_transaction and _count(path) == 6
    finally:
        c.close()
        holder.close()


def test_enqueue_many_refused_in_the_callers_transaction_keeps_its_writes(
        lite: tuple[App, str]) -> None:
    """Inside the caller's transaction (autocommit connection, explicit BEGIN): a failed
    enqueue_many leaves none of its jobs and all of the caller's earlier writes."""
    app, path = lite
    c = sqlite3.connect(path, isolation_level=None)
    try:
        c.execute("CREATE TABLE mine (id INTEGER PRIMARY KEY)")
        c.execute("CREATE TRIGGER stop BEFORE INSERT ON justonce_jobs "
                  "WHEN NEW.priority = 3 BEGIN SELECT RAISE(ABORT, 'midway'); END")
        c.execute("BEGIN")
        c.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(InvalidOption, match="midway"):
            app.enqueue_many(_batch(6, "a"), conn=c)
        assert c.in_transaction
        c.execute("COMMIT")
        assert _count(path) == 0
        assert _count(path, "SELECT count(*) FROM mine") == 1
    finally:
        c.close()


def test_a_file_that_is_not_a_database_is_a_configuration_error(tmp_path: Path) -> None:
    """``sqlite3.DatabaseError: file is not a database`` escaped as a raw traceback (only
    OperationalError was mapped); the CLI prints one line."""
    path = tmp_path / "x.db"
    path.write_text("hello\n" * 200)
    app = App(f"sqlite:///{path}")
    try:
        with pytest.raises(ConfigurationError, match="not a database"):
            app.queue_counts()
    finally:
        app.close()
    out = subprocess.run([sys.executable, "-m", "justonce", "status", "--database-url",
                          f"sqlite:///{path}"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr + out.stdout
    assert "not a database" in out.stderr + out.stdout


def _dict_factory(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    """The sqlite3 documentation's dict_factory recipe."""
    return {d[0]: v for d, v in zip(cur.description, row, strict=True)}


@pytest.mark.parametrize("setup", ["dict_row_factory", "list_row_factory", "bytes_text"])
def test_connection_factories_do_not_change_what_justonce_reads(
        lite: tuple[App, str], setup: str) -> None:
    """A dict row_factory failed every call with ``KeyError: 1``; text_factory=bytes read
    the file's name as bytes and refused the connection as another file's. The caller's
    factories are theirs again after the call."""
    app, path = lite
    c = sqlite3.connect(path)
    factory: Any = {"dict_row_factory": _dict_factory,
                    "list_row_factory": lambda cur, row: list(row)}.get(setup)
    if factory is not None:
        c.row_factory = factory
    if setup == "bytes_text":
        c.text_factory = bytes
    try:
        job = app.enqueue("test_sqlite_conn.noop", [1, "é"], key="k", conn=c)
        again = app.enqueue("test_sqlite_conn.noop", [1, "é"], key="k", conn=c)
        assert again.id == job.id and again.duplicate
        app.enqueue_many(_batch(3, "m"), conn=c)
        batch = app.batches.open("d", conn=c)
        app.batches.add(batch.id, 2, conn=c)
        out = app.effects.run("s", 1, lambda k: {"k": k}, conn=c)
        assert out.ran
        assert app.effects.lock_row(c, "justonce_jobs", "id", job.id)
        c.commit()
        assert app.get_job(job.id).args == [1, "é"]  # type: ignore[union-attr]
        assert c.row_factory is factory
        assert c.text_factory is (bytes if setup == "bytes_text" else str)
    finally:
        c.close()


def test_lock_timeout_bounds_every_statement_inside_the_callers_deferred_begin(
        lite: tuple[App, str]) -> None:
    """Inside the caller's deferred BEGIN (nothing read yet), effects.run's write waited
    the connection's own busy timeout, not lock_timeout; and its error said the caller's
    transaction had read before another writer committed, which it had not."""
    app, path = lite
    holder = sqlite3.connect(path, isolation_level=None)
    c = sqlite3.connect(path, isolation_level=None, timeout=20)
    try:
        holder.execute("BEGIN IMMEDIATE")
        c.execute("BEGIN")
        with pytest.raises(LockTimeout) as err:
            app.effects.run("s", 1, lambda k: k, conn=c, lock_timeout=0.3)
        assert "read before" not in str(err.value)
        assert "lock_timeout" in str(err.value)
        assert c.in_transaction  # (the caller's: theirs to end)
        assert c.execute("PRAGMA busy_timeout").fetchone()[0] == 20_000
        c.execute("ROLLBACK")
    finally:
        holder.close()
        c.close()


@pytest.mark.parametrize("how", ["query_only", "mode_ro"])
def test_read_only_connection_is_invalid_option(lite: tuple[App, str], how: str) -> None:
    """A read-only connection got DatabaseUnavailable ("transient, retry"); it is the
    caller's connection that cannot write, as a read-only transaction on Postgres/MySQL."""
    app, path = lite
    if how == "mode_ro":
        c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    else:
        c = sqlite3.connect(path, isolation_level=None)
        c.execute("PRAGMA query_only=ON")
    try:
        with pytest.raises(InvalidOption, match="cannot write"):
            app.enqueue("test_sqlite_conn.noop", [1], conn=c)
        with pytest.raises(InvalidOption, match="cannot write"):
            app.batches.open("d", conn=c)
        with pytest.raises(InvalidOption, match="cannot write"):
            app.effects.run("s", 1, lambda k: k, conn=c)
        assert not c.in_transaction
    finally:
        c.close()


def test_sqlite_errors_on_the_callers_connection_are_justonces(lite: tuple[App, str]) -> None:
    """An IntegrityError out of justonce's statement (a function of the caller's under
    SQLite's name made a NOT NULL column NULL) escaped raw; so did SAVEPOINT/COMMIT
    errors of a connection that threads shared."""
    app, path = lite
    c = sqlite3.connect(path, isolation_level=None)
    try:
        c.create_function("coalesce", -1, lambda *a: None)
        with pytest.raises(InvalidOption, match="NOT NULL"):
            app.enqueue("test_sqlite_conn.noop", [1], conn=c)
        assert not c.in_transaction
    finally:
        c.close()
    shared = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    raw: list[BaseException] = []
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        for i in range(100):
            try:
                app.effects.run("shared", i % 20, lambda k: k, conn=shared)
            except InvalidOption:
                pass  # the connection is in another thread's call: said as such
            except BaseException as exc:  # noqa: BLE001 - what the test looks for
                raw.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared.close()
    assert raw == []


@pytest.mark.parametrize("isolation", ["", None])
def test_an_enqueue_per_row_of_a_returning_cursor_still_being_read_works(
        lite: tuple[App, str], isolation: str | None) -> None:
    """An enqueue for each row of the caller's UPDATE … RETURNING, read as it goes: SQLite
    refuses a SAVEPOINT while that statement runs, and a call of one write statement took
    one (every enqueue raised "cannot open savepoint - SQL statements in progress")."""
    app, path = lite
    c = sqlite3.connect(path, isolation_level=isolation)
    try:
        c.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")
        c.executemany("INSERT INTO orders (id, state) VALUES (?, 'new')", [(1,), (2,), (3,)])
        if isolation is not None:
            c.commit()
        for (oid,) in c.execute("UPDATE orders SET state = 'queued' RETURNING id"):
            app.enqueue("test_sqlite_conn.noop", [oid], conn=c)
        if c.in_transaction:
            c.commit()
    finally:
        c.close()
    assert _count(path) == 3
    assert _count(path, "SELECT count(*) FROM orders WHERE state = 'queued'") == 3


def test_run_many_that_finds_every_key_done_leaves_no_transaction_behind(lite: tuple[App, str]) -> None:
    """run_many on a default connection whose keys are all done already: its chunk's row was
    written and dropped, which counted as a change, so the transaction the call began
    stayed open and held the file's write lock against every other process."""
    app, path = lite
    app.effects.run_many("done-all", [1, 2, 3], lambda idem: None)
    c = sqlite3.connect(path)  # (isolation_level "": sqlite3 begins before a write)
    try:
        out = app.effects.run_many("done-all", [1, 2, 3], lambda idem: None, conn=c)
        assert out.skipped["done"] == 3
        assert not c.in_transaction
        assert _other_process_can_write(path) == "yes"
    finally:
        c.close()
