"""The effect ledger, against every backend: once per (scope, key), release on failure,
in doubt after a crash (at most once) or redone (at least once), operator resolution,
lock timeouts, the caller's transaction, and bad input. 16-process races and kill -9 are
in the slow tests at the end."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import proc_app
from conftest import LONG, mysql_database, mysql_or_skip
from fleet import proc_app_on, wait_for
from justonce import (
    AT_LEAST_ONCE,
    App,
    EffectNotFound,
    InvalidName,
    InvalidOption,
    InvalidTransition,
    LockTimeout,
)


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    with proc_app_on(db_url) as a:
        proc_app.create_effect_log(db_url)
        yield a


def test_an_effect_runs_once_and_a_second_run_says_done(app: App) -> None:
    calls: list[str] = []
    first = app.effects.run("push:7", 42, lambda idem: calls.append(idem) or {"id": "m1"})
    again = app.effects.run("push:7", 42, lambda idem: calls.append(idem))
    assert (first.ran, first.state, first.result) == (True, "done", {"id": "m1"})
    assert (again.ran, again.state) == (False, "done")
    assert calls == ["push:7:42"]
    other = app.effects.run("push:8", 42, lambda idem: calls.append(idem))
    assert other.ran and calls == ["push:7:42", "push:8:42"]
    info = app.effects.get("push:7", 42)
    assert (info.state, info.attempts, info.result) == ("done", 1, {"id": "m1"})


def test_a_failed_effect_is_claimable_again(app: App) -> None:
    with pytest.raises(ConnectionError):
        app.effects.run("mail", "ada", lambda idem: (_ for _ in ()).throw(ConnectionError("smtp down")))
    info = app.effects.get("mail", "ada")
    assert info.state == "pending" and "smtp down" in (info.last_error or "")
    assert app.effects.run("mail", "ada", lambda idem: "sent").ran
    assert app.effects.get("mail", "ada").attempts == 2


def test_a_claim_whose_holder_died_is_in_doubt_under_at_most_once(app: App) -> None:
    claim = app.effects.claim("push:1", 5, lease=0.1)  # and then this "process" dies
    assert claim.claimed
    busy = app.effects.run("push:1", 5, lambda idem: "again")
    assert (busy.ran, busy.state) == (False, "running")
    time.sleep(0.2)
    doubt = app.effects.run("push:1", 5, lambda idem: "again")
    assert (doubt.ran, doubt.state) == (False, "in_doubt")
    assert [(e.scope, e.key, e.state) for e in app.effects.in_doubt()] == [("push:1", "5", "in_doubt")]
    assert app.effects.counts("push:1") == {"in_doubt": 1}
    resolved = app.effects.resolve("push:1", 5, done=True, note="the provider's log shows it sent")
    assert resolved.state == "done" and app.effects.in_doubt() == []
    with pytest.raises(InvalidTransition):
        app.effects.resolve("push:1", 5, done=False)


def test_an_operator_can_send_an_in_doubt_effect_back_to_be_redone(app: App) -> None:
    app.effects.claim("push:1", 6, lease=0.05)
    time.sleep(0.1)
    app.effects.resolve("push:1", 6, done=False)
    assert app.effects.run("push:1", 6, lambda idem: "redone").ran


def test_resolve_many_resolves_exactly_the_entries_in_doubt_and_names_them(app: App) -> None:
    for k in (1, 2, 3, 4):
        app.effects.claim("push:2", k, lease=0.05)          # their holders "die"
    app.effects.claim("push:2", 5, lease=60)                # alive
    app.effects.run("push:2", 6, lambda idem: "sent")       # done
    time.sleep(0.1)
    assert app.effects.resolve_many("push:2", [3, 1, 5, 6, 99, "1"], done=True, note="in the log") == ["1", "3"]
    assert app.effects.resolve_many("push:2", range(1, 7), done=False) == ["2", "4"]
    states = {k: app.effects.get("push:2", k).state for k in range(1, 7)}
    assert states == {1: "done", 2: "pending", 3: "done", 4: "pending", 5: "running", 6: "done"}
    assert app.effects.get("push:2", 1).last_error == "in the log"
    assert app.effects.resolve_many("push:2", [5], done=True, force=True) == ["5"]
    assert app.effects.run("push:2", 2, lambda idem: "redone").ran
    assert app.effects.resolve_many("push:2", [], done=True) == []


@pytest.mark.parametrize("call", [
    lambda app: app.effects.resolve_many("s", "12", done=True),
    lambda app: app.effects.resolve_many("s", [None], done=True),
    lambda app: app.effects.resolve_many("", [1], done=True),
    lambda app: app.effects.resolve_many("s", [1], done=True, note=7),
    lambda app: app.effects.resolve_many("s", ["\x00"], done=True),
])
def test_bad_resolve_many_input_is_refused_before_anything_is_written(app: App, call: Any) -> None:
    app.effects.claim("s", 1, lease=0.05)
    time.sleep(0.1)
    with pytest.raises((InvalidOption, InvalidName)):
        call(app)
    assert app.effects.get("s", 1).state == "in_doubt"


def test_at_least_once_redoes_an_expired_claim_and_fences_the_late_holder(app: App) -> None:
    late = app.effects.claim("charge", 9, lease=0.1, policy=AT_LEAST_ONCE)
    time.sleep(0.2)
    redo = app.effects.run("charge", 9, lambda idem: "redone", policy=AT_LEAST_ONCE)
    assert redo.ran
    assert late.done("late") is False  # its token is no longer the entry's
    info = app.effects.get("charge", 9)
    assert (info.state, info.result, info.attempts, info.token) == ("done", "redone", 2, 2)


def test_a_held_entry_makes_other_claims_wait_then_time_out(app: App, db_url: str) -> None:
    conn = proc_app.ledger_connect(db_url)
    try:
        with proc_app._Tx(conn) as c:
            claim = app.effects.claim("push:3", 1, conn=c)  # its row lock lasts until commit
            assert claim.claimed
            started = time.monotonic()
            with pytest.raises(LockTimeout):
                app.effects.run("push:3", 1, lambda idem: "twice?", lock_timeout=0.3)
            assert time.monotonic() - started >= 0.25
            claim.done("once")
        assert app.effects.run("push:3", 1, lambda idem: "twice?").state == "done"
    finally:
        conn.close()


def test_an_effect_on_the_callers_connection_commits_or_rolls_back_with_it(app: App, db_url: str) -> None:
    conn = proc_app.ledger_connect(db_url)
    sql = proc_app._sql(conn, "INSERT INTO effect_log (k, pid, event) VALUES (?, 0, 'credit')")
    try:
        with pytest.raises(RuntimeError), proc_app._Tx(conn) as c:
            app.effects.run("credit", 1, lambda idem: c.execute(sql, (idem,)) and None, conn=c)
            raise RuntimeError("the caller's own work failed after the effect")
        assert proc_app.effect_rows(db_url) == []
        with pytest.raises(EffectNotFound):
            app.effects.get("credit", 1)
        with proc_app._Tx(conn) as c:
            assert app.effects.run("credit", 1, lambda idem: c.execute(sql, (idem,)) and None, conn=c).ran
        assert proc_app.effect_rows(db_url) == [("credit:1", 0, "credit")]
        assert app.effects.run("credit", 1, lambda idem: None).state == "done"
    finally:
        conn.close()


def test_lock_row_locks_the_callers_row_with_a_timeout(app: App, db_url: str) -> None:
    setup = proc_app.ledger_connect(db_url)
    setup.execute("CREATE TABLE orders (id integer PRIMARY KEY, total integer)")
    setup.execute("INSERT INTO orders VALUES (1, 10)")
    holder, other = proc_app.ledger_connect(db_url), proc_app.ledger_connect(db_url)
    try:
        if not db_url.startswith("sqlite"):  # (SQLite opens the transaction itself)
            with pytest.raises(InvalidOption, match="transaction"):
                app.effects.lock_row(holder, "orders", "id", 1)  # a lock outside one holds nothing
        with proc_app._Tx(holder) as h:
            assert app.effects.lock_row(h, "orders", "id", 1)
            assert not app.effects.lock_row(h, "orders", "id", 2)
            if db_url.startswith("sqlite"):
                with pytest.raises(LockTimeout):
                    app.effects.lock_row(other, "orders", "id", 1, timeout=0.2)
            else:
                started = time.monotonic()
                with pytest.raises(LockTimeout), other.transaction():
                    app.effects.lock_row(other, "orders", "id", 1, timeout=0.2)
                if db_url.startswith("mysql"):  # innodb_lock_wait_timeout is whole seconds
                    assert 0.9 <= time.monotonic() - started < 5
        with proc_app._Tx(other) as o:
            assert app.effects.lock_row(o, "orders", "id", 1, timeout=0.2)
        for bad in (("orders; drop", "id"), ("orders", "id = 1 --")):
            with pytest.raises(InvalidName):
                app.effects.lock_row(other, bad[0], bad[1], 1)
    finally:
        for c in (holder, other, setup):
            c.close()


def test_one_effect_has_one_policy(app: App) -> None:
    app.effects.claim("charge", 1, lease=0.05)  # at most once, and its holder dies
    time.sleep(0.1)
    with pytest.raises(InvalidOption, match="at_most_once"):
        app.effects.run("charge", 1, lambda idem: "charged twice", policy=AT_LEAST_ONCE)
    assert app.effects.get("charge", 1).state == "in_doubt"


def _lock_setting(app: App, db_url: str) -> Any:
    """The lock wait setting of a connection of the library's own. On MySQL, where the
    claim changes a session setting, also which connection it is: the pool hands back the
    one used last, so the same connection id says it was put back, not thrown away. On
    PostgreSQL (SET LOCAL) and SQLite (the wait is the library's own retry loop) nothing
    outlives the claim's transaction: there this guards against a change that would."""
    with app.backend.transaction() as c:
        if db_url.startswith("mysql"):
            with c.cursor() as cur:
                cur.execute("SELECT @@innodb_lock_wait_timeout, CONNECTION_ID()")
                return cur.fetchone()
        query = "PRAGMA busy_timeout" if db_url.startswith("sqlite") else "SHOW lock_timeout"
        return c.execute(query).fetchone()[0]


def test_a_claims_lock_timeout_does_not_stay_on_the_librarys_own_connections(
        app: App, db_url: str) -> None:
    """The claim's lock wait (MySQL: innodb_lock_wait_timeout, set with the BEGIN and put
    back with the COMMIT, or when the connection goes back to the pool) is the claim's
    alone: after claims that succeed, find nothing to do or time out, the next use of the
    connection waits as long as before, and the timeouts took the claim's lock_timeout."""
    before = _lock_setting(app, db_url)
    assert app.effects.run("lt", 1, lambda idem: "sent", lock_timeout=2).ran
    assert _lock_setting(app, db_url) == before
    assert app.effects.run("lt", 1, lambda idem: "twice?", lock_timeout=2).state == "done"
    assert _lock_setting(app, db_url) == before
    assert app.effects.run_many("lt", [1, 2, 3], lambda idem: None, lock_timeout=3).done == 2
    assert _lock_setting(app, db_url) == before
    held = app.effects.claim("lt", 9)
    app.effects.claim("lt", 10, lease=0.05)  # dies: in doubt
    time.sleep(0.1)
    assert app.effects.run("lt", 10, lambda idem: "twice?").state == "in_doubt"
    assert _lock_setting(app, db_url) == before
    conn = proc_app.ledger_connect(db_url)
    try:
        with proc_app._Tx(conn) as c:
            eleven = app.effects.claim("lt", 11, conn=c)  # its row lock lasts until commit
            for attempt in (lambda: app.effects.run("lt", 11, lambda idem: "twice?", lock_timeout=0.3),
                            lambda: app.effects.run_many("lt", [12, 11], lambda idem: None,
                                                         lock_timeout=0.3)):
                started = time.monotonic()
                with pytest.raises(LockTimeout):
                    attempt()
                assert time.monotonic() - started < 5  # (MySQL: 1 s, its whole seconds)
            if not db_url.startswith("sqlite"):  # (SQLite: the holder has the file's write lock)
                assert _lock_setting(app, db_url) == before
            eleven.done("once")
        assert _lock_setting(app, db_url) == before
    finally:
        conn.close()
    held.done("once")
    assert app.effects.get("lt", 9).state == "done"
    assert app.effects.get("lt", 11).state == "done"
    assert _lock_setting(app, db_url) == before


@pytest.mark.alone
def test_mysql_puts_back_the_sessions_own_lock_wait_not_the_servers() -> None:
    """A session whose lock wait is not the server's (init_connect, a proxy's setting)
    keeps it across claims, whether they commit or time out: a claim puts back what the
    session had, not the global default. Made here by connecting while the global value is
    another, then putting the global back at once (other processes connecting to the same
    server meanwhile would get it too: the window is one claim long)."""
    import pymysql

    with mysql_database(mysql_or_skip()) as url:
        setup = App(url)
        setup.migrate()
        setup.close()
        admin = proc_app.ledger_connect(url)
        app = App(url)
        holder = proc_app.ledger_connect(url)
        try:
            server = int(admin.execute("SELECT @@GLOBAL.innodb_lock_wait_timeout").fetchone()[0])
            other = server + 7
            try:
                admin.execute(f"SET GLOBAL innodb_lock_wait_timeout = {other}")
            except pymysql.err.OperationalError as exc:
                if exc.args[0] == 1227:  # (a test user without SUPER)
                    pytest.skip("SET GLOBAL needs SUPER or SYSTEM_VARIABLES_ADMIN")
                raise
            try:  # (the app's first connections are made now)
                app.effects.claim("own", 0).done("made the connection")
                with app.backend.transaction() as c, c.cursor() as cur:
                    cur.execute("SELECT @@SESSION.innodb_lock_wait_timeout, CONNECTION_ID()")
                    session = cur.fetchone()
            finally:
                admin.execute(f"SET GLOBAL innodb_lock_wait_timeout = {server}")
            assert session[0] == other
            assert app.effects.run("own", 1, lambda idem: "sent", lock_timeout=2).ran
            assert app.effects.run_many("own", [2, 3], lambda idem: None, lock_timeout=3).done == 2
            with proc_app._Tx(holder) as h:  # a claim that times out: put back on return to the pool
                held = app.effects.claim("own", 4, conn=h)
                with pytest.raises(LockTimeout):
                    app.effects.run("own", 4, lambda idem: "twice?", lock_timeout=0.3)
                held.done("once")
            with app.backend.transaction() as c, c.cursor() as cur:
                cur.execute("SELECT @@SESSION.innodb_lock_wait_timeout, CONNECTION_ID()")
                assert cur.fetchone() == session
        finally:
            app.close()
            for conn in (admin, holder):
                conn.close()


def test_a_claim_on_the_callers_connection_leaves_its_lock_timeout_alone(app: App, db_url: str) -> None:
    conn = proc_app.ledger_connect(db_url)
    try:
        if db_url.startswith("sqlite"):  # SQLite's analogue: the connection's busy timeout
            conn.execute("PRAGMA busy_timeout = 1234")
            with proc_app._Tx(conn) as c:
                assert app.effects.claim("t", 1, conn=c, lock_timeout=0.25).claimed
            assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1234
            return
        if db_url.startswith("mysql"):  # MySQL's: the session's innodb_lock_wait_timeout
            conn.execute("SET SESSION innodb_lock_wait_timeout = 7")
            with conn.transaction():
                assert app.effects.claim("t", 1, conn=conn, lock_timeout=0.25).claimed
                assert conn.execute("SELECT @@innodb_lock_wait_timeout").fetchone()[0] == 7
            return
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '123ms'")
            assert app.effects.claim("t", 1, conn=conn, lock_timeout=0.25).claimed
            assert conn.execute("SHOW lock_timeout").fetchone()[0] == "123ms"
    finally:
        conn.close()


@pytest.mark.parametrize("call", [
    lambda app: app.effects.run("", 1, lambda i: None),
    lambda app: app.effects.run(None, 1, lambda i: None),
    lambda app: app.effects.run("s" * 201, 1, lambda i: None),
    lambda app: app.effects.run("s", None, lambda i: None),
    lambda app: app.effects.run("s", "", lambda i: None),
    lambda app: app.effects.run("s", 1.5, lambda i: None),
    lambda app: app.effects.run("s", 1, "not callable"),
    lambda app: app.effects.run("s", 1, lambda i: None, policy="exactly_once"),
    lambda app: app.effects.run("s", 1, lambda i: None, lease=0),
    lambda app: app.effects.run("s", 1, lambda i: None, lock_timeout=0),
    lambda app: app.effects.in_doubt(limit=0),
    lambda app: app.effects.resolve("s", 1, done=True, note=7),
    lambda app: app.effects.list("s", after=""),
    lambda app: app.effects.list("s", after=1.5),
    lambda app: app.effects.list("s", after=["k"]),
    lambda app: app.effects.list("s", after="k\x00"),
])
def test_bad_effect_input_is_refused_before_anything_is_written(app: App, call: Any) -> None:
    with pytest.raises((InvalidOption, InvalidName)):
        call(app)
    assert app.effects.in_doubt() == [] and proc_app.effect_rows(app.database_url) == []


def test_a_scope_read_a_page_at_a_time_gives_every_entry_once_in_key_order(app: App) -> None:
    keys = [str(k) for k in range(1, 251)] + ["a b", "Z", "é", "k:1", "zz"]
    app.effects.run_many("paged", keys, lambda k: k, chunk=40)
    app.effects.run_many("paged", ["p1", "p2", "p3"], lambda k: 1 / 0)  # pending again
    app.effects.run("other", "1", lambda k: None)  # another scope: never in the pages
    everything = app.effects.list("paged", limit=10_000)
    assert len(everything) == len(keys) + 3
    for state, size in ((None, 7), ("done", 1), ("done", 64), ("pending", 2)):
        pages, after = [], None
        while page := app.effects.list("paged", state, limit=size, after=after):
            assert len(page) <= size
            pages.append(page)
            after = page[-1].key
        read = [e.key for page in pages for e in page]
        assert read == [e.key for e in everything if state is None or e.state == state]
        assert len(set(read)) == len(read)
    assert [e.key for e in app.effects.list("paged", "pending", after="p1")] == ["p2", "p3"]
    assert app.effects.list("paged", after=everything[-1].key) == []
    # An int is the key it names, and the order is the database's (the whole list's)
    after_10 = app.effects.list("paged", limit=10_000, after=10)
    ordered = [e.key for e in everything]
    assert [e.key for e in after_10] == ordered[ordered.index("10") + 1:]


def test_unknown_effects_are_reported(app: App) -> None:
    with pytest.raises(EffectNotFound):
        app.effects.get("nope", 1)
    with pytest.raises(EffectNotFound):
        app.effects.resolve("nope", 1, done=True)


# -- real processes ------------------------------------------------------------------------


RACED_KEYS = 1000 if LONG else 400
"""Keys the 16 processes race for (each tries every one): 400 in CI's short form."""


@pytest.mark.slow
def test_16_processes_racing_for_the_same_effects_do_each_once(app: App, db_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    keys = list(range(RACED_KEYS))
    procs = [ctx.Process(target=proc_app.race_effects, args=(db_url, "race", keys, start, results))
             for _ in range(16)]
    for p in procs:
        p.start()
    try:
        time.sleep(1.0)
        start.set()
        ran = [results.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    sent = Counter(k for k, _, _ in proc_app.effect_rows(db_url))
    assert len(sent) == RACED_KEYS and set(sent.values()) == {1}
    assert sum(n for _, n in ran) == RACED_KEYS
    assert sum(1 for _, n in ran if n) > 1  # the work was shared
    assert app.effects.counts("race") == {"done": RACED_KEYS}


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["at_most_once", "at_least_once"])
def test_kill_9_mid_effect_leaves_it_in_doubt_or_it_is_redone_exactly_once(
    app: App, db_url: str, policy: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    victim = ctx.Process(target=proc_app.hang_in_effect, args=(db_url, "kill", 1, policy, 1.0))
    victim.start()
    try:
        wait_for(lambda: proc_app.effect_rows(db_url), 60, "the effect to start")
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
    finally:
        if victim.is_alive():
            victim.kill()
    time.sleep(1.2)  # the dead holder's lease runs out
    start, results = ctx.Event(), ctx.Queue()
    racers = [ctx.Process(target=proc_app.race_effects, args=(db_url, "kill", [1], start, results))
              for _ in range(4)] if policy == "at_most_once" else []
    for p in racers:
        p.start()
    if racers:
        start.set()
        ran = [results.get(timeout=120)[1] for _ in racers]
        for p in racers:
            p.join(30)
        assert ran == [0, 0, 0, 0]  # nobody redoes an effect in doubt
        assert [(e.key, e.state) for e in app.effects.in_doubt("kill")] == [("1", "in_doubt")]
        assert [e for _, _, e in proc_app.effect_rows(db_url)] == ["start"]
        return
    outcomes = []
    import threading

    def redo() -> None:
        outcomes.append(app.effects.run("kill", 1, lambda idem: "redone", policy=policy, lock_timeout=30).ran)

    threads = [threading.Thread(target=redo) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [False, False, False, True]
    info = app.effects.get("kill", 1)
    assert (info.state, info.attempts, info.result) == ("done", 2, "redone")


def test_an_integer_key_is_measured_before_it_is_written_out(app: App) -> None:
    """A key is at most 512 characters, an int key's digits (and sign) included: past that
    every entry refuses it with InvalidName, even an int too long for str() (past 4,300
    digits str() raises a ValueError of its own, which once escaped). Nothing is written."""
    for key in (10**512, -(10**511), 10**5000, -(10**5000)):
        for call in (lambda k: app.effects.run("huge", k, lambda _: None),
                     lambda k: app.effects.run_many("huge", [1, k], lambda _: None),
                     lambda k: app.effects.get("huge", k),
                     lambda k: app.effects.resolve_many("huge", [k], done=True),
                     lambda k: app.enqueue("proc_app.noop", key=k),
                     lambda k: app.enqueue("proc_app.noop", partition_key=k)):
            with pytest.raises(InvalidName):
                call(key)
    assert app.effects.counts("huge") == {} and app.list_jobs() == []
    longest = 10**512 - 1  # 512 digits
    assert app.effects.run("huge", longest, lambda k: k).ran
    assert app.effects.get("huge", longest).state == "done"


def test_a_callers_connection_that_cannot_see_the_schema_gets_a_clear_error(app: App, db_url: str) -> None:
    """With ?schema=, justonce's statements on your connection resolve its tables through
    your search_path. A connection without the schema on it gets InvalidOption naming the
    two ways to put it there (not the server's "relation does not exist"), and nothing is
    claimed; with the schema set for the transaction, the same calls work."""
    if not db_url.startswith("postgres"):
        pytest.skip("?schema= is Postgres's")
    import psycopg

    from justonce.backends.postgres.backend import parse_postgres_url

    conninfo, schema, _ = parse_postgres_url(db_url)
    assert schema
    lease = app.partitions.try_acquire("schema-fence", 1, lease=30)
    assert lease is not None
    with psycopg.connect(conninfo) as conn:  # the default search_path: no justonce schema
        for call in (lambda: app.effects.run("sc", 1, lambda k: 1, conn=conn),
                     lambda: app.effects.claim("sc", 2, conn=conn),
                     lambda: lease.fence(conn),
                     lambda: app.enqueue("proc_app.noop", conn=conn)):
            with pytest.raises(InvalidOption, match="search_path"):
                call()
            conn.rollback()
        with conn.transaction():
            conn.execute("SELECT set_config('search_path', %s, true)", (schema,))
            assert app.effects.run("sc", 1, lambda k: 1, conn=conn).ran
            lease.fence(conn)
            app.enqueue("proc_app.noop", conn=conn)
    assert app.effects.counts("sc") == {"done": 1} and len(app.list_jobs()) == 1
    lease.release()
