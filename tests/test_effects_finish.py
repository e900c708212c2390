"""A done mark lost with its connection, against every backend: the fn of each key returned
in a live process, so a finish that fails with the database away (a connection killed in
the middle of it, or after its COMMIT landed and before the reply came back) is tried
again while the chunk's lease lasts, and its keys end done, not in doubt. Failpoints place
the loss exactly (``effect.in_finish``: inside the transaction; ``effect.after_finish``: a
reply lost after the commit); on Postgres and MariaDB the server also really kills the
connection of a finish held open by a failpoint's sleep."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from justonce import App, failpoints
from justonce.failpoints import FailpointError


@pytest.fixture(autouse=True)
def _no_failpoints_left() -> Iterator[None]:
    yield
    failpoints.configure(None)


def states(app: App, scope: str) -> dict[str, str]:
    return {e.key: e.state for e in app.effects.list(scope, limit=100_000)}


def retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if getattr(r, "event", None) == "effect.finish_retry")


def fn_for(results: dict[str, Any], fail: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
    calls: list[str] = []

    def fn(idem: str) -> Any:
        calls.append(idem)
        key = idem.split(":", 1)[1]
        if key in fail:
            raise RuntimeError(f"provider refused {key}")
        return results.get(key)
    fn.calls = calls  # type: ignore[attr-defined]
    return fn


@pytest.mark.parametrize("point", ["effect.in_finish", "effect.after_finish"])
@pytest.mark.parametrize("shape", ["one result", "results differ", "one failed"])
def test_a_chunk_finish_lost_once_is_retried_and_every_key_ends_done(
        app: App, caplog: pytest.LogCaptureFixture, point: str, shape: str) -> None:
    # in_finish: the first try rolls back, the retry writes the marks. after_finish: the
    # first try committed and its reply was "lost": the retry finds the marks made and
    # must report them as this chunk's, not as taken over.
    keys = [str(k) for k in range(12)]
    results = {k: ({"n": k} if shape == "results differ" else None) for k in keys}
    fail = {"7"} if shape == "one failed" else set()
    fn = fn_for(results, fail)
    failpoints.configure(f"{point}=1*raise")
    with caplog.at_level(logging.WARNING, logger="justonce"):
        out = app.effects.run_many("mail", keys, fn, chunk=20, lease=30)
    assert out.done == len(keys) - len(fail)
    assert out.overtaken == ()
    assert set(out.failed) == fail
    assert retries(caplog) == 1
    want = {k: ("pending" if k in fail else "done") for k in keys}
    assert states(app, "mail") == want
    assert app.effects.in_doubt("mail") == []
    assert sorted(fn.calls) == sorted(f"mail:{k}" for k in keys)
    # A second run sends nothing again but the released key.
    again = fn_for(results)
    out2 = app.effects.run_many("mail", keys, again, chunk=20, lease=30)
    assert again.calls == [f"mail:{k}" for k in sorted(fail)]
    assert out2.skipped["done"] == len(keys) - len(fail)


@pytest.mark.parametrize("point", ["effect.in_finish", "effect.after_finish"])
def test_a_finish_with_a_key_left_in_doubt_is_retried_and_leaves_only_that_key(
        app: App, point: str) -> None:
    from justonce import EffectInDoubt

    def fn(idem: str) -> str:
        if idem.endswith(":3"):
            raise EffectInDoubt("the answer was lost")
        return "sent"
    failpoints.configure(f"{point}=1*raise")
    out = app.effects.run_many("mail", range(6), fn, chunk=10, lease=0.8)
    assert (out.done, out.overtaken, out.left_in_doubt) == (5, (), ("3",))
    time.sleep(1.0)  # the chunk's lease runs out: key 3, and only it, is in doubt
    assert [e.key for e in app.effects.in_doubt("mail")] == ["3"]


def test_run_retries_a_done_mark_whose_reply_was_lost_and_reports_done(
        app: App, caplog: pytest.LogCaptureFixture) -> None:
    failpoints.configure("effect.after_finish=1*raise")  # (committed; the reply "lost")
    with caplog.at_level(logging.WARNING, logger="justonce"):
        out = app.effects.run("mail", 1, lambda idem: {"id": idem}, lease=30)
    assert (out.ran, out.state) == (True, "done")
    assert retries(caplog) == 1
    assert app.effects.get("mail", 1).state == "done"


def test_retries_end_with_the_lease_and_the_error_is_raised(app: App) -> None:
    # The database stays away (every try fails): the finish raises as it did before the
    # retries, once they run out; the chunk is in doubt when its lease has run out.
    failpoints.configure("effect.in_finish=raise")
    with pytest.raises(FailpointError):
        app.effects.run_many("mail", range(4), lambda idem: None, chunk=10, lease=0.8)
    failpoints.configure(None)
    time.sleep(1.0)
    assert sorted(e.key for e in app.effects.in_doubt("mail")) == ["0", "1", "2", "3"]


def test_a_finish_failing_for_another_reason_is_not_retried() -> None:
    # Only the database being away is retried: a refused write, a bug, is raised at once.
    from justonce.effects import _finishing

    tries: list[bool] = []

    def write(again: bool) -> None:
        tries.append(again)
        raise ValueError("not transient")
    with pytest.raises(ValueError):
        _finishing(write, time.monotonic() + 30, "mail", 1)
    assert tries == [False]


# -- a real connection kill in the middle of the finish ------------------------------------

def _kill_finishing_connection(db_url: str) -> int:
    """Kill, from outside, the server connection that holds the finish's open transaction
    (held there by the ``effect.in_finish`` failpoint's sleep): how many were killed."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if db_url.startswith("postgresql"):
            import psycopg

            server = db_url.split("?")[0]
            with psycopg.connect(server, autocommit=True) as c:
                rows = c.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE state = 'idle in transaction' AND pid <> pg_backend_pid() "
                    "AND query LIKE '%%json_array_elements%%justonce_effects%%'").fetchall()
        else:
            from urllib.parse import urlparse

            import pymysql

            u = urlparse(db_url)
            c = pymysql.connect(host=u.hostname, port=u.port or 3306, user=u.username or "root",
                                password=u.password or "", autocommit=True)
            try:
                with c.cursor() as cur:
                    cur.execute(
                        "SELECT p.ID FROM information_schema.PROCESSLIST p JOIN "
                        "information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID "
                        "WHERE p.DB = %s AND p.COMMAND = 'Sleep'", (u.path.lstrip("/"),))
                    rows = cur.fetchall()
                    for (pid,) in rows:
                        cur.execute(f"KILL CONNECTION {int(pid)}")
            finally:
                c.close()
        if rows:
            return len(rows)
        time.sleep(0.05)
    return 0


def test_a_finish_whose_connection_the_server_kills_is_retried(
        db_url: str, app: App, caplog: pytest.LogCaptureFixture) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite has no server connection to kill (the failpoint tests cover it)")
    failpoints.configure("effect.in_finish=1*sleep(4000)")
    keys = [str(k) for k in range(30)]
    fn = fn_for({k: ({"n": k} if k == "4" else None) for k in keys}, {"9"})
    box: dict[str, Any] = {}

    def send() -> None:
        try:
            box["out"] = app.effects.run_many("mail", keys, fn, chunk=50, lease=60)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            box["error"] = exc

    with caplog.at_level(logging.WARNING, logger="justonce"):
        t = threading.Thread(target=send)
        t.start()
        killed = _kill_finishing_connection(db_url)
        t.join(60)
    assert killed == 1
    assert "error" not in box, box.get("error")
    out = box["out"]
    assert (out.done, out.overtaken, set(out.failed)) == (29, (), {"9"})
    assert retries(caplog) >= 1
    assert states(app, "mail") == {k: ("pending" if k == "9" else "done") for k in keys}
    assert app.effects.in_doubt("mail") == []
