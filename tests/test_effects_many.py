"""Effects in bulk (``app.effects.run_many``), against every backend: each claimable key's
effect once, the reasons for skipping the others, failures released and the run going on,
overtaken claims under at least once, interruptions, the caller's transaction, bad input.
Then real processes: six racing over overlapping key sets with one killed mid-chunk, and
``kill -9`` inside ``fn`` leaving exactly the current chunk's unmarked keys in doubt."""

from __future__ import annotations

import functools
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import proc_app
from conftest import LONG
from effects_many_procs import read_logs, send_many
from fleet import Procs, proc_app_on, wait_for
from justonce import (
    AT_LEAST_ONCE,
    AT_MOST_ONCE,
    App,
    EffectNotFound,
    EffectsOutcome,
    InvalidName,
    InvalidOption,
    LockTimeout,
)


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    with proc_app_on(db_url) as a:
        proc_app.create_effect_log(db_url)
        yield a


def states(app: App, scope: str) -> dict[str, str]:
    return {e.key: e.state for e in app.effects.list(scope, limit=100_000)}


def test_run_many_does_each_claimable_key_once_and_counts_why_it_skipped_the_others(app: App) -> None:
    app.effects.run("push", 3, lambda idem: "sent before")           # done
    app.effects.claim("push", 5, lease=60)                             # running, live lease
    app.effects.claim("push", 7, lease=0.05)                           # its holder "died"
    time.sleep(0.1)                                                    # ... in doubt
    calls: list[str] = []
    keys = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 8, "8", 0]                  # duplicates collapse
    out = app.effects.run_many("push", keys, lambda idem: calls.append(idem) or {"id": idem},
                               chunk=4)
    assert isinstance(out, EffectsOutcome)
    assert (out.keys, out.chunks, out.done, out.redone, out.ran) == (10, 3, 7, 0, 7)
    assert out.skipped == {"done": 1, "running": 1, "in_doubt": 1}
    assert (out.failed, out.overtaken) == ({}, ())
    # Chunks in the order given ([9 8 7 6] [5 4 3 2] [1 0]), fn in key order within each.
    assert calls == [f"push:{k}" for k in ("6", "8", "9", "2", "4", "0", "1")]
    assert app.effects.get("push", 9).result == {"id": "push:9"}
    assert app.effects.counts("push") == {"done": 8, "running": 1, "in_doubt": 1}
    assert "7 done" in str(out) and "1 in_doubt" in str(out)
    again = app.effects.run_many("push", range(10), lambda idem: calls.append(idem))
    assert (again.done, again.ran, again.skipped["done"]) == (0, 0, 8)
    assert len(calls) == 7


def test_held_names_the_keys_another_live_claim_had_so_a_caller_can_look_again(app: App) -> None:
    app.effects.claim("push", 5, lease=60)
    held = app.effects.claim("push", 6, lease=60)
    out = app.effects.run_many("push", [4, 5, 6, 7], lambda idem: None)
    assert sorted(out.held) == ["5", "6"] and out.skipped["running"] == 2 and out.done == 2
    held.done()
    again = app.effects.run_many("push", out.held, lambda idem: None)
    assert again.held == ("5",) and again.skipped == {"done": 1, "running": 1, "in_doubt": 0}


HOSTILE_KEYS = ['a"b', "c\\d", "e,f", "{g}", "NULL", "null", " h ", "i'j", "k\n", "é", "日本", "💥",
                "(l)", "[m]", "%s", ":n", "$1"]


def test_keys_with_quotes_backslashes_commas_braces_and_null_words_round_trip(app: App) -> None:
    # The bulk statements send their key lists as one text (an array literal on Postgres, a
    # JSON document elsewhere): every key must come back exactly as it was given.
    seen: list[str] = []
    out = app.effects.run_many("odd", HOSTILE_KEYS, lambda idem: seen.append(idem) or idem, chunk=5)
    assert out.done == len(HOSTILE_KEYS) and sorted(seen) == sorted(f"odd:{k}" for k in HOSTILE_KEYS)
    for key in HOSTILE_KEYS:
        info = app.effects.get("odd", key)
        assert (info.key, info.state, info.result) == (key, "done", f"odd:{key}")
    again = app.effects.run_many("odd", HOSTILE_KEYS, lambda idem: seen.append(idem))
    assert again.skipped["done"] == len(HOSTILE_KEYS) and again.done == 0


def test_fn_raising_for_some_keys_releases_them_and_the_run_goes_on(app: App) -> None:
    def send(idem: str) -> str:
        if int(idem.rsplit(":", 1)[1]) % 3 == 0:
            raise ConnectionError(f"smtp refused {idem}")
        return "sent"

    out = app.effects.run_many("mail", range(10), send, chunk=3)
    assert (out.done, out.chunks) == (6, 4)
    assert out.failed == {k: f"ConnectionError: smtp refused mail:{k}" for k in ("0", "3", "6", "9")}
    assert states(app, "mail") == {str(k): "pending" if k % 3 == 0 else "done" for k in range(10)}
    assert "smtp refused mail:3" in (app.effects.get("mail", 3).last_error or "")
    retry = app.effects.run_many("mail", range(10), lambda idem: "sent")
    assert (retry.done, retry.skipped["done"], retry.failed) == (4, 6, {})
    assert app.effects.get("mail", 3).attempts == 2


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


def test_a_key_failing_with_a_long_or_unprintable_error_fails_alone_on_every_backend(app: App) -> None:
    """A 70,000-character message (MariaDB's TEXT column takes 64 KiB) used to fail the
    whole chunk's finish there: the 9 keys that were sent stayed running and, at least
    once, were sent again by the next run. Error text is kept to 4,000 characters (head
    and tail), and an exception whose __str__ raises is kept by its type's name."""
    sent: Counter[str] = Counter()

    def send(idem: str) -> str:
        sent[idem] += 1
        k = idem.rsplit(":", 1)[1]
        if sent[idem] == 1 and k == "5":
            raise RuntimeError("x" * 70_000 + "the end")
        if sent[idem] == 1 and k == "6":
            raise _Unprintable()
        return "sent"

    out = app.effects.run_many("long", range(10), send, chunk=10, lease=1, policy=AT_LEAST_ONCE)
    assert (out.done, set(out.failed)) == (8, {"5", "6"}), out
    kept = app.effects.get("long", 5).last_error or ""
    assert len(kept) <= 4000 and kept.startswith("RuntimeError: xxx") and kept.endswith("the end")
    assert app.effects.get("long", 6).last_error == "_Unprintable"
    assert states(app, "long") == {str(k): "pending" if k in (5, 6) else "done" for k in range(10)}
    time.sleep(1.2)  # past the lease: nothing may be in doubt and sent again
    again = app.effects.run_many("long", range(10), send, chunk=10, policy=AT_LEAST_ONCE)
    assert (again.done, again.skipped["done"]) == (2, 8), again
    assert all(n == 1 for k, n in sent.items() if not k.endswith((":5", ":6"))), sent
    # One at a time: run() releases with the kept text, and so does an explicit release.
    def loud(idem: str) -> None:
        raise RuntimeError("y" * 70_000)

    with pytest.raises(RuntimeError):
        app.effects.run("long1", "a", loud)
    assert app.effects.get("long1", "a").state == "pending"
    claim = app.effects.claim("long1", "b")
    assert claim.release("😀" * 100_000)
    info = app.effects.get("long1", "b")
    assert info.state == "pending" and len(info.last_error or "") <= 4000
    with pytest.raises(InvalidOption):
        app.effects.claim("long1", "c").release(42)  # type: ignore[arg-type]


def late_chunk_beside(app: App, redo_keys: list[int]) -> tuple[Any, Any]:
    """A run_many over charge 1-3 (at least once, 0.3 s lease) whose last fn call (key 3:
    no fn starts past the lease, so a chunk can only be late in its last call) outlives
    the lease, and, while it hangs, another run_many that redoes ``redo_keys``: (the late
    chunk's outcome, the redo's)."""
    started = threading.Event()
    outcomes: dict[str, Any] = {}

    def slow(idem: str) -> str:
        if idem.endswith(":3"):
            started.set()
            time.sleep(0.8)  # the chunk outlives its 0.3 s lease
        return "late"

    def late_holder() -> None:
        outcomes["late"] = app.effects.run_many("charge", [1, 2, 3], slow, policy=AT_LEAST_ONCE,
                                                lease=0.3)

    t = threading.Thread(target=late_holder)
    t.start()
    assert started.wait(30)
    time.sleep(0.4)
    redo = app.effects.run_many("charge", redo_keys, lambda idem: "redone", policy=AT_LEAST_ONCE)
    t.join(30)
    return outcomes["late"], redo


def test_at_least_once_redoes_entries_in_doubt_and_a_late_chunk_is_overtaken(app: App) -> None:
    late, redo = late_chunk_beside(app, [1, 2, 3, 4])
    assert (redo.done, redo.redone) == (4, 3)
    assert (late.done, late.overtaken, late.ran) == (0, ("1", "2", "3"), 3)
    for k in (1, 2, 3):
        info = app.effects.get("charge", k)
        assert (info.state, info.result, info.token) == ("done", "redone", 2)


def test_a_chunk_partly_overtaken_marks_the_rest_done_and_only_the_rest(app: App) -> None:
    """Keys 1 and 3 are still the late chunk's when it finishes; key 2 was redone by another
    caller meanwhile. The late chunk's done mark lands on 1 and 3 only: 2 left the chunk
    when it was taken."""
    late, redo = late_chunk_beside(app, [2])
    assert (redo.done, redo.redone) == (1, 1)
    assert (late.done, late.overtaken) == (2, ("2",))
    infos = [app.effects.get("charge", k) for k in (1, 2, 3)]
    assert [(i.state, i.result, i.token) for i in infos] == [
        ("done", "late", 1), ("done", "redone", 2), ("done", "late", 1)]


def test_a_chunk_done_reads_as_done_on_each_entry_everywhere(app: App) -> None:
    """A chunk whose keys all returned one result is marked done on its own row; every read
    of its entries (get, list by state, counts, in doubt) sees them done, with that result.
    A key that failed was released on its own entry; a result that differs per key is kept
    per key."""
    out = app.effects.run_many("c1", range(1, 11), lambda idem: "sent")
    assert (out.done, out.chunks) == (10, 1)
    info = app.effects.get("c1", 7)
    assert (info.state, info.result, info.lease_expires_at) == ("done", "sent", None)
    assert info.done_at is not None and info.done_at >= info.created_at
    assert [e.key for e in app.effects.list("c1", state="done")] == sorted(str(k) for k in range(1, 11))
    assert app.effects.list("c1", state="running") == []
    assert app.effects.counts("c1") == {"done": 10}
    assert app.effects.in_doubt("c1") == []

    def third_fails(idem: str) -> str:
        if idem.endswith(":3"):
            raise RuntimeError("no")
        return "sent"

    out = app.effects.run_many("c2", [1, 2, 3, 4], third_fails)
    assert (out.done, sorted(out.failed)) == (3, ["3"])
    assert app.effects.counts("c2") == {"done": 3, "pending": 1}
    assert app.effects.get("c2", 3).last_error == "RuntimeError: no"
    again = app.effects.run_many("c2", [1, 2, 3, 4], lambda idem: "second")
    assert (again.done, again.skipped["done"]) == (1, 3)
    assert [app.effects.get("c2", k).result for k in (1, 3)] == ["sent", "second"]
    mixed = app.effects.run_many("c3", [1, 2, 3], lambda idem: idem)
    assert mixed.done == 3
    assert [app.effects.get("c3", k).result for k in (1, 2, 3)] == ["c3:1", "c3:2", "c3:3"]
    assert app.effects.counts("c3") == {"done": 3}


def test_a_chunk_is_marked_done_only_when_every_key_it_holds_returned(app: App) -> None:
    """The chunk's one done mark stands for every entry it still holds: a finish that
    leaves a claimed key neither done nor failed (a bug in a caller of the backend) must
    not mark it done with the others. The finish refuses, nothing is marked, and the
    chunk's entries stay running (then in doubt, when its lease runs out). With all keys
    returned, the count the finish checks instead of reading the keys back matches."""
    backend = app.backend
    chunk, claims = backend.effect_claim_many("g", ["a", "b", "c"], AT_MOST_ONCE, "o", 60.0, 5.0)
    tokens = {k: t for k, _, t in claims}
    with pytest.raises(AssertionError, match="not finished"):
        backend.effect_finish_many("g", chunk, [("a", tokens["a"], None), ("b", tokens["b"], None)], [])
    assert states(app, "g") == {"a": "running", "b": "running", "c": "running"}
    # Each marked by itself (results differ), c left out: refused too.
    with pytest.raises(AssertionError, match="not finished"):
        backend.effect_finish_many("g", chunk, [("a", tokens["a"], '"x"'), ("b", tokens["b"], '"y"')], [])
    with pytest.raises(AssertionError, match="twice"):
        backend.effect_finish_many("g", chunk, [("a", tokens["a"], None)] * 2 + [("b", tokens["b"], None)], [])
    assert states(app, "g") == {"a": "running", "b": "running", "c": "running"}
    # Released c, then the rest together: marked exactly a and b, by the count alone (the
    # chunk's keys are not read back).
    read: list[str] = []
    rows = backend.d.rows
    backend.d.rows = lambda c, name, params: read.append(name) or rows(c, name, params)  # type: ignore[method-assign]
    try:
        done = [("a", tokens["a"], None), ("b", tokens["b"], None)]
        assert backend.effect_finish_many("g", chunk, done, [("c", tokens["c"], "boom")]) == ({"a", "b"}, {"c"})
    finally:
        del backend.d.rows
    assert "effect_chunk_held" in read and "effect_chunk_keys" not in read
    assert states(app, "g") == {"a": "done", "b": "done", "c": "pending"}


def test_a_stale_or_forged_token_moves_no_entry_that_a_chunk_holds(app: App) -> None:
    """A chunk's entries are marked by their chunk, not by a token: a single claim's done or
    release carrying an entry's token (stale, or forged from what get() shows) changes
    nothing, while the chunk runs and after it is done; the effect is not done twice."""
    from justonce.effects import EffectClaim

    forged: dict[str, bool] = {}

    def fn(idem: str) -> str:
        if idem.endswith(":2"):
            token = app.effects.get("f", 1).token
            assert app.effects.get("f", 1).state == "running"
            claim = EffectClaim(app.effects, "f", "1", "new", token, None)
            forged["release_running"] = claim.release("forged")
            forged["done_running"] = claim.done("forged")
        return "ok"

    assert app.effects.run_many("f", [1, 2, 3], fn).done == 3
    assert forged == {"release_running": False, "done_running": False}
    info = app.effects.get("f", 1)
    claim = EffectClaim(app.effects, "f", "1", "new", info.token, None)
    assert claim.release("forged") is False and claim.done("forged") is False
    assert (app.effects.get("f", 1).state, app.effects.get("f", 1).result) == ("done", "ok")
    calls: list[str] = []
    assert app.effects.run_many("f", [1, 2, 3], calls.append).skipped["done"] == 3
    assert calls == []


def test_an_operators_verdict_on_an_entry_of_a_chunk_in_doubt_overtakes_its_late_finisher(
    app: App
) -> None:
    """At most once: a chunk outlives its lease inside fn; an operator resolves one of its
    entries in doubt (redo) meanwhile. The late finisher marks the others done and reports
    that one overtaken; the next run sends it once."""
    started, resolved = threading.Event(), threading.Event()
    outcomes: dict[str, Any] = {}

    def slow(idem: str) -> str:
        if idem.endswith(":3"):  # (the last: no fn starts past the lease)
            started.set()
            assert resolved.wait(30)
        return "late"

    t = threading.Thread(target=lambda: outcomes.update(
        late=app.effects.run_many("op", [1, 2, 3], slow, lease=0.2)))
    t.start()
    assert started.wait(30)
    time.sleep(0.3)
    assert sorted(e.key for e in app.effects.in_doubt("op")) == ["1", "2", "3"]
    assert app.effects.counts("op") == {"in_doubt": 3}
    assert app.effects.resolve_many("op", [2, 9], done=False, note="not sent") == ["2"]
    resolved.set()
    t.join(30)
    late = outcomes["late"]
    assert (late.done, late.overtaken) == (2, ("2",))
    assert [app.effects.get("op", k).state for k in (1, 2, 3)] == ["done", "pending", "done"]
    again = app.effects.run_many("op", [1, 2, 3], lambda idem: "redo")
    assert (again.done, again.skipped["done"]) == (1, 2)
    assert app.effects.resolve_many("op", [1, 2, 3], done=True, force=True) == []


def test_an_entry_whose_chunk_row_was_deleted_is_in_doubt_to_a_claim_and_resolvable(
    app: App
) -> None:
    """Someone removed chunk rows by hand (retention done in the wrong order) while a
    chunk's entries stayed: nobody can mark them done any more, so a claim treats them as
    in doubt (never redone at most once), and an operator's verdict settles them."""
    # A chunk claimed, and its holder gone without finishing (as if killed).
    _chunk, claims = app.backend.effect_claim_many("gone", ["1", "2"], AT_MOST_ONCE, "dead", 60.0, 5.0)
    assert [found for _, found, _ in claims] == ["new", "new"]
    with app.backend.transaction() as conn:
        sql = "DELETE FROM justonce_effect_chunks WHERE scope = 'gone'"
        if hasattr(conn, "execute"):
            conn.execute(sql)
        else:
            with conn.cursor() as cur:
                cur.execute(sql)
    out = app.effects.run_many("gone", [1, 2, 3], lambda idem: None)
    assert (out.done, out.skipped["in_doubt"]) == (1, 2)
    assert app.effects.resolve_many("gone", [1, 2], done=False) == ["1", "2"]
    assert app.effects.run_many("gone", [1, 2, 3], lambda idem: None).done == 2


@pytest.mark.parametrize("policy", [AT_MOST_ONCE, AT_LEAST_ONCE])
@pytest.mark.parametrize("many", [False, True], ids=["run", "run_many"])
def test_a_claim_that_waited_for_an_entry_sees_the_chunk_that_took_it_meanwhile(
    app: App, policy: str, many: bool
) -> None:
    """Claimer A has locked k2 and not yet taken it into its new chunk; B's claim waits for
    k2's lock. When A commits, k2 is held by a chunk B's first statement could not see: B
    must find it running (A's lease is live), not in doubt — at least once it took k2 and
    ran its effect beside A's (found in review). k1, in a chunk whose holder died, comes
    first in B's list (on MariaDB it opened the read view that hid A's chunk)."""
    be, d = app.backend, app.backend.effects.d
    _chunk, claims = be.effect_claim_many("w", ["k1"], policy, "dead", 0.01, 5.0)
    assert claims[0][2] is not None

    def boom(idem: str) -> None:
        raise RuntimeError("x")

    app.effects.run_many("w", ["k2"], boom, policy=policy)  # k2: pending
    time.sleep(0.05)
    out: dict[str, Any] = {}

    def claimer_b() -> None:
        if many:
            out["b"] = dict((k, (f, t)) for k, f, t in
                            be.effect_claim_many("w", ["k1", "k2"], policy, "B", 60.0, 20.0)[1])
        else:
            out["b"] = {"k2": be.effect_claim("w", "k2", policy, "B", 60.0, 20.0)}

    with be.transaction() as a:
        chunk = int(d.rows(a, "effect_chunk_open", {"scope": "w", "lease": 60.0})[0][0])
        p = {"scope": "w", "keys": d.array(["k2"]), "policy": policy, "owner": "A", "chunk": chunk}
        assert [r[0] for r in d.rows(a, "effect_lock_many", p)] == ["k2"]
        b = threading.Thread(target=claimer_b)
        b.start()
        time.sleep(0.5)  # B is waiting for k2 (on SQLite, for the write lock)
        assert [r[0] for r in d.rows(a, "effect_take_many", p)] == ["k2"]
    b.join(30)
    assert out["b"]["k2"] == ("running", None)
    if many:
        assert out["b"]["k1"][0] == "in_doubt"
        assert (out["b"]["k1"][1] is not None) == (policy == AT_LEAST_ONCE)
    info = app.effects.get("w", "k2")
    assert (info.state, info.owner) == ("running", "A")


def test_an_entry_in_doubt_is_not_redone_at_most_once_and_one_of_another_policy_refuses_the_chunk(
    app: App
) -> None:
    app.effects.claim("charge", 2, lease=0.05)  # at most once; its holder dies
    time.sleep(0.1)
    out = app.effects.run_many("charge", [1, 2, 3], lambda idem: None)
    assert (out.done, out.skipped["in_doubt"]) == (2, 1)
    with pytest.raises(InvalidOption, match="at_most_once"):
        app.effects.run_many("charge", [4, 2, 5], lambda idem: None, policy=AT_LEAST_ONCE)
    with pytest.raises(EffectNotFound):  # the refused chunk's claim was rolled back whole
        app.effects.get("charge", 4)
    assert app.effects.get("charge", 2).state == "in_doubt"


def test_a_keyboard_interrupt_keeps_what_returned_releases_the_rest_of_its_chunk_and_is_raised(
    app: App
) -> None:
    calls: list[str] = []

    def fn(idem: str) -> None:
        calls.append(idem)
        if len(calls) == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        app.effects.run_many("push", range(12), fn, chunk=5)
    # Chunk [0-4] done; in chunk [5-9] 5 returned, 6 was interrupted, 7-9 never ran;
    # chunk [10, 11] untouched.
    got = states(app, "push")
    assert got == {**{str(k): "done" for k in range(6)}, **{str(k): "pending" for k in range(6, 10)}}
    assert app.effects.get("push", 6).last_error == "interrupted: KeyboardInterrupt"
    assert app.effects.in_doubt("push") == []


def test_run_many_on_the_callers_connection_commits_or_rolls_back_with_it(app: App, db_url: str) -> None:
    conn = proc_app.ledger_connect(db_url)
    sql = proc_app._sql(conn, "INSERT INTO effect_log (k, pid, event) VALUES (?, 0, 'credit')")
    try:
        with pytest.raises(RuntimeError), proc_app._Tx(conn) as c:
            out = app.effects.run_many("credit", [1, 2, 3], lambda idem: c.execute(sql, (idem,)) and None,
                                       conn=c, chunk=2)
            assert (out.done, out.chunks) == (3, 1)  # one chunk: the whole call
            raise RuntimeError("the caller's own work failed after the effects")
        assert proc_app.effect_rows(db_url) == [] and app.effects.list("credit") == []
        with proc_app._Tx(conn) as c:
            out = app.effects.run_many("credit", [1, 2, 3], lambda idem: c.execute(sql, (idem,)) and None,
                                       conn=c)
        assert sorted(k for k, _, _ in proc_app.effect_rows(db_url)) == ["credit:1", "credit:2", "credit:3"]
        assert app.effects.counts("credit") == {"done": 3}
    finally:
        conn.close()


def test_a_failing_fn_in_your_transaction_leaves_none_of_its_writes(app: App, db_url: str) -> None:
    """With conn=, fn writes in your transaction; one that wrote and then raised left its
    write behind while its entry was released, and your commit kept both (the next run
    wrote it again). Each fn now runs under a savepoint of its own."""
    conn = proc_app.ledger_connect(db_url)
    sql = proc_app._sql(conn, "INSERT INTO effect_log (k, pid, event) VALUES (?, 0, 'credit')")

    def write_then_fail_on_2(c: Any) -> Any:
        def fn(idem: str) -> None:
            c.execute(sql, (idem,))
            if idem.endswith(":2"):
                raise ValueError("the provider refused it")
        return fn

    try:
        with proc_app._Tx(conn) as c:
            out = app.effects.run_many("partial", [1, 2, 3], write_then_fail_on_2(c), conn=c)
            assert out.done == 2 and list(out.failed) == ["2"]
            with pytest.raises(ValueError):
                app.effects.run("partial-one", 2, write_then_fail_on_2(c), conn=c)
            assert app.effects.run("partial-one", 1, write_then_fail_on_2(c), conn=c).state == "done"
        assert sorted(k for k, _, _ in proc_app.effect_rows(db_url)) == [
            "partial-one:1", "partial:1", "partial:3"]
        assert [app.effects.get("partial", k).state for k in (1, 2, 3)] == ["done", "pending", "done"]
        assert app.effects.get("partial-one", 2).state == "pending"

        def nested(c: Any) -> Any:
            # An effect inside another's fn, on the same connection (its own savepoint: on
            # MySQL a savepoint of the same name replaced the outer one, whose release then
            # failed); key 2's outer fn fails after its inner effect: both roll back.
            def fn(idem: str) -> None:
                c.execute(sql, (idem,))
                app.effects.run("inner", idem, lambda i: c.execute(sql, (i,)) and None, conn=c)
                if idem.endswith(":2"):
                    raise ValueError("after the inner effect")
            return fn

        def writes_then_coroutine(c: Any) -> Any:
            def fn(idem: str) -> Any:
                c.execute(sql, (idem,))
                return _async_send(idem)
            return fn

        with proc_app._Tx(conn) as c:
            out = app.effects.run_many("outer", [1, 2, 3], nested(c), conn=c)
            assert (out.done, list(out.failed)) == (2, ["2"])
            with pytest.raises(InvalidOption, match="never ran"):
                app.effects.run("coro-tx", 1, writes_then_coroutine(c), conn=c)
        rows = sorted(k for k, _, _ in proc_app.effect_rows(db_url) if "outer" in k or "coro" in k)
        assert rows == ["inner:outer:1", "inner:outer:3", "outer:1", "outer:3"]
        assert app.effects.counts("inner") == {"done": 2}
        assert app.effects.get("coro-tx", 1).state == "pending"
    finally:
        conn.close()


@pytest.mark.parametrize("found_rows", [False, True], ids=["rows-changed", "rows-found"])
def test_a_chunk_of_new_and_existing_keys_claims_exactly_the_new_and_the_claimable(
        app: App, db_url: str, found_rows: bool) -> None:
    """The claim inserts the new keys claimed and tells them from the existing ones by its
    insert's count (all new, none new) or else by the keys its chunk does not hold; on MySQL
    a caller's connection that counts rows found (CLIENT_FOUND_ROWS) must not be trusted
    with the count, and goes the second way every time."""
    flag = 0
    if found_rows:
        if not db_url.startswith(("mysql", "mariadb")):
            pytest.skip("CLIENT_FOUND_ROWS is a MySQL connection flag")
        from pymysql.constants import CLIENT

        flag = CLIENT.FOUND_ROWS
    app.effects.run("push", 3, lambda idem: "before")                  # done
    app.effects.claim("push", 5, lease=60)                             # running, live lease
    assert app.effects.claim("push", 6, lease=60).release()            # pending: claimable
    app.effects.run("push", "é 1", lambda idem: "before")              # done
    conn = proc_app.ledger_connect(db_url, client_flag=flag)
    calls: list[str] = []
    try:
        with proc_app._Tx(conn) as c:
            # All new, none new, a mix; and a mix of keys that only a byte-exact comparison
            # tells apart (an existing "é 1" beside a new "e 1", "E 1 " and "é 1 ").
            for keys in ([10, 11, 12], [3, 5], range(9), ["é 1", "e 1", "E 1 ", "é 1 "]):
                app.effects.run_many("push", keys, lambda idem: calls.append(idem), conn=c)
    finally:
        conn.close()
    new = (10, 11, 12, 0, 1, 2, 4, 6, 7, 8, "e 1", "E 1 ", "é 1 ")
    assert sorted(calls) == sorted(f"push:{k}" for k in new)
    assert app.effects.counts("push") == {"done": 15, "running": 1}


def test_a_mysql_claim_whose_read_of_the_existing_keys_disagrees_with_its_count_reads_back(
        app: App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """MySQL tells a mixed chunk's new keys from the existing ones by the keys its chunk
    does not hold; should that read ever disagree with the insert's count (a comparison
    that is not byte-exact, say), the rows inserted are read back instead: a key taken for
    new by mistake would run its effect a second time."""
    if not db_url.startswith(("mysql", "mariadb")):
        pytest.skip("MySQL's claim without RETURNING")
    app.effects.run("push", 2, lambda idem: "before")
    dialect = app.backend.mysql  # type: ignore[attr-defined]
    real = dialect._run

    def losing_the_existing(c: Any, name: str, params: dict[str, Any], *a: Any, **k: Any) -> Any:
        return [] if name == "effect_claim_new_others" else real(c, name, params, *a, **k)

    monkeypatch.setattr(dialect, "_run", losing_the_existing)
    calls: list[str] = []
    out = app.effects.run_many("push", [1, 2, 3], calls.append)
    assert calls == ["push:1", "push:3"] and out.skipped["done"] == 1
    assert app.effects.get("push", 2).result == "before"


def test_the_in_doubt_index_holds_only_entries_with_a_lease_of_their_own(app: App, db_url: str) -> None:
    """An entry a chunk holds has no lease of its own (the chunk's is its lease), and keeps
    state 'running' after its chunk is done: the partial index the in-doubt listing reads
    leaves such entries out (schema v9), so a bulk run writes no entry of it per key, and
    the listing still finds both kinds of entry in doubt."""
    if db_url.startswith(("mysql", "mariadb")):
        pytest.skip("MySQL has no partial indexes: its in-doubt index holds every entry")
    app.effects.run_many("bulk", range(3000), lambda idem: None)        # 3,000 held by done chunks
    app.effects.claim("one", 1, lease=0.05)                            # a lease of its own
    chunk, _ = app.backend.effect_claim_many("late", ["a", "b"], AT_MOST_ONCE, "gone", 0.05, 5.0)
    time.sleep(0.1)                                                    # both in doubt now
    assert sorted(f"{e.scope}:{e.key}" for e in app.effects.in_doubt()) == ["late:a", "late:b", "one:1"]
    assert app.effects.counts("bulk") == {"done": 3000}
    conn = proc_app.ledger_connect(db_url)
    try:
        if db_url.startswith("sqlite"):
            cells = conn.execute("SELECT sum(ncell) FROM dbstat WHERE name = 'justonce_effects_running' "
                                 "AND pagetype = 'leaf'").fetchone()[0]
            assert cells == 1  # one:1 alone
        else:
            size = conn.execute("SELECT pg_relation_size('justonce_effects_running')").fetchone()[0]
            assert size <= 2 * 8192  # the meta page and one leaf (3,000 entries: 10 pages and more)
    finally:
        conn.close()


def test_a_v8_ledger_migrates_to_the_narrow_in_doubt_index_and_its_entries_read_the_same(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema v9 rebuilds the in-doubt index of a ledger written by v8: entries of done,
    running and abandoned chunks and of single claims read as they did, and the listing
    finds the same entries in doubt."""
    if db_url.startswith(("mysql", "mariadb")):
        pytest.skip("v9 changes the partial index of Postgres and SQLite only")
    from justonce.backends.postgres import backend as pg_backend
    from justonce.backends.sqlite import backend as sqlite_backend

    module = sqlite_backend if db_url.startswith("sqlite") else pg_backend
    old = App(db_url)
    dialect = old.backend.sqlite if db_url.startswith("sqlite") else old.backend.pg  # type: ignore[attr-defined]
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", [x for x in module.MIGRATIONS if x[0] <= 8])
        m.setattr(dialect, "latest", 8)
        old.migrate()
        assert old.backend.schema_version() == 8
        old.effects.run_many("bulk", range(2000), lambda idem: None, chunk=500)
        old.effects.run_many("mixed", range(10), lambda idem: idem)        # a result each
        old.effects.claim("one", 1, lease=0.05)
        old.effects.claim("one", 2, lease=3600)
        old.backend.effect_claim_many("late", ["a", "b"], AT_MOST_ONCE, "gone", 0.05, 5.0)
        time.sleep(0.1)
        before = {s: old.effects.counts(s) for s in ("bulk", "mixed", "one", "late")}
        doubt = sorted(f"{e.scope}:{e.key}" for e in old.effects.in_doubt())
    old.close()
    app = App(db_url)
    try:
        assert app.migrate() == ["0009_in_doubt_index", "0010_queue_pauses"]
        assert {s: app.effects.counts(s) for s in before} == before
        assert before["bulk"] == {"done": 2000} and before["one"] == {"in_doubt": 1, "running": 1}
        assert doubt == ["late:a", "late:b", "one:1"]
        assert sorted(f"{e.scope}:{e.key}" for e in app.effects.in_doubt()) == doubt
        assert app.effects.get("mixed", 3).result == "mixed:3"
    finally:
        app.close()


def test_a_chunk_whose_entry_stays_locked_times_out_and_claims_nothing(app: App, db_url: str) -> None:
    conn = proc_app.ledger_connect(db_url)
    try:
        with proc_app._Tx(conn) as c:
            assert app.effects.claim("push", 2, conn=c).claimed  # its lock lasts until commit
            with pytest.raises(LockTimeout):
                app.effects.run_many("push", [1, 2, 3], lambda idem: None, lock_timeout=0.3)
        assert states(app, "push") == {"2": "running"}
    finally:
        conn.close()


def test_a_function_that_hands_back_a_coroutine_does_no_effect_and_nothing_is_marked_done(
    app: App, recwarn: pytest.WarningsRecorder
) -> None:
    """An async function behind a plain one (a lambda, a wrapper) returns a coroutine that
    never runs: the entry was marked done and the effect lost for good. Refused at run
    time: the entry is given back, nothing is done, no "never awaited" warning."""
    with pytest.raises(InvalidOption, match="never ran"):
        app.effects.run("coro", 1, lambda idem: _async_send(idem))
    assert app.effects.get("coro", 1).state == "pending"
    sent: list[str] = []

    def first_plain_then_async(idem: str) -> Any:
        if idem.endswith(":1"):
            sent.append(idem)
            return None
        return _async_send(idem)

    with pytest.raises(InvalidOption, match="never ran"):
        app.effects.run_many("coro-many", [1, 2, 3], first_plain_then_async)
    assert sent == ["coro-many:1"]
    assert [app.effects.get("coro-many", k).state for k in (1, 2, 3)] == ["done", "pending", "pending"]
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_a_chunk_of_big_results_is_marked_done_on_every_backend(app: App, db_url: str) -> None:
    """500 keys whose fn returns a distinct ~40 KB result (the limit is 64 KiB): the chunk's
    done marks were one ~40 MB statement, past MariaDB's max_allowed_packet; the finish
    failed after every fn had run and left the whole chunk in doubt. Now cut into
    statements of the same transaction."""
    n = 500 if LONG or db_url.startswith("mysql") else 100  # (the limit is MySQL's)
    out = app.effects.run_many("big-results", range(n),
                               lambda idem: idem + ":" + "r\"é" * 13_000)
    assert (out.done, out.chunks, dict(out.failed)) == (n, 1, {})
    for k in (0, n // 2, n - 1):
        assert app.effects.get("big-results", k).result == f"big-results:{k}:" + "r\"é" * 13_000
    assert app.effects.counts("big-results") == {"done": n}


def test_long_unicode_keys_are_cut_into_chunks_a_claim_can_send(app: App) -> None:
    """2,500 keys of 512 emoji (the longest key) asked for as one chunk: ~15 MB of JSON in
    one claim, refused by MariaDB's max_allowed_packet before anything ran. A chunk now
    also ends at 2 MiB of keys."""
    keys = [f"{i:04d}" + "😀" * 508 for i in range(2500)]
    sent: list[str] = []
    out = app.effects.run_many("long-keys", keys, sent.append, chunk=2500)
    assert out.done == 2500 and out.chunks > 1 and len(set(sent)) == 2500
    assert app.effects.counts("long-keys") == {"done": 2500}


@pytest.mark.mysql
def test_mysql_cuts_a_chunks_done_marks_under_any_packet_size(app: App, db_url: str) -> None:
    if not db_url.startswith("mysql"):
        pytest.skip("MySQL's max_allowed_packet")
    app.backend.d.statement_bytes = 400_000  # ~100 KB a piece: many pieces
    out = app.effects.run_many("cut", range(60), lambda idem: idem + "x" * 40_000)
    assert (out.done, dict(out.failed)) == (60, {})
    assert all(app.effects.get("cut", k).result == f"cut:{k}" + "x" * 40_000 for k in range(60))
    failing = app.effects.run_many("cut-failed", range(60),
                                   lambda idem: (_ for _ in ()).throw(ValueError("e" * 3000)))
    assert len(failing.failed) == 60
    assert app.effects.counts("cut-failed") == {"pending": 60}


def test_no_keys_is_an_empty_outcome(app: App) -> None:
    out = app.effects.run_many("push", iter(()), lambda idem: None)
    assert (out.keys, out.chunks, out.ran, out.per_second) == (0, 0, 0, 0.0)


def _bad_at_the_end() -> Iterator[Any]:
    yield from range(100)
    yield ""


async def _async_send(idem: str) -> None:
    return None


def _generator_send(idem: str) -> Any:
    yield idem


class _AsyncCallable:
    async def __call__(self, idem: str) -> None:
        return None


@pytest.mark.parametrize("call", [
    lambda app: app.effects.run_many("", [1], lambda i: None),
    lambda app: app.effects.run_many(None, [1], lambda i: None),
    lambda app: app.effects.run_many("s" * 201, [1], lambda i: None),
    lambda app: app.effects.run_many("s", "12345", lambda i: None),
    lambda app: app.effects.run_many("s", b"12345", lambda i: None),
    lambda app: app.effects.run_many("s", 12345, lambda i: None),
    lambda app: app.effects.run_many("s", [1, None], lambda i: None),
    lambda app: app.effects.run_many("s", [1, ""], lambda i: None),
    lambda app: app.effects.run_many("s", [1, 1.5], lambda i: None),
    lambda app: app.effects.run_many("s", [1, "x" * 513], lambda i: None),
    lambda app: app.effects.run_many("s", _bad_at_the_end(), lambda i: None),
    lambda app: app.effects.run_many("s", [1], "not callable"),
    lambda app: app.effects.run_many("s", [1], _async_send),
    lambda app: app.effects.run_many("s", [1], functools.partial(_async_send)),
    lambda app: app.effects.run_many("s", [1], _AsyncCallable()),
    lambda app: app.effects.run_many("s", [1], _generator_send),
    lambda app: app.effects.run("s", 1, _async_send),
    lambda app: app.effects.run("s", 1, _generator_send),
    lambda app: app.effects.run_many("s", [1], lambda i: None, chunk=0),
    lambda app: app.effects.run_many("s", [1], lambda i: None, chunk=10_001),
    lambda app: app.effects.run_many("s", [1], lambda i: None, chunk=True),
    lambda app: app.effects.run_many("s", [1], lambda i: None, chunk=2.5),
    lambda app: app.effects.run_many("s", [1], lambda i: None, policy="exactly_once"),
    lambda app: app.effects.run_many("s", [1], lambda i: None, lease=0),
    lambda app: app.effects.run_many("s", [1], lambda i: None, lock_timeout=0),
])
def test_bad_run_many_input_is_refused_before_anything_is_written(app: App, call: Any) -> None:
    with pytest.raises((InvalidOption, InvalidName)):
        call(app)
    assert app.effects.list("s") == [] and proc_app.effect_rows(app.database_url) == []


# -- real processes ------------------------------------------------------------------------




def test_six_processes_racing_over_overlapping_keys_do_each_effect_at_most_once(
    app: App, db_url: str, procs: Procs, tmp_path: Path
) -> None:
    """6 processes, 3,000 keys, each process a random 60 % of them in a shuffled order and
    its own chunk size; the first one kills itself (SIGKILL) on its 60th effect. Every
    effect is logged (flushed) before fn returns. Afterwards: no key is in two logs or twice
    in one; every key a survivor asked for is done or in doubt; only the dead process's keys
    are in doubt, at most one chunk of them; every done key was logged."""
    lease, chunks = 1.5, [50, 100, 37, 150, 64, 200]
    start, results, ready = procs.ctx.Event(), procs.ctx.Queue(), procs.ctx.Queue()
    asked: list[set[int]] = []
    for i in range(6):
        rng = random.Random(i)
        keys = rng.sample(range(3000), 1800)  # (a sample is shuffled)
        asked.append(set(keys))
        procs.start(send_many, db_url, "race", keys, chunks[i], AT_MOST_ONCE, lease, str(tmp_path), start,
                    results, 60 if i == 0 else 0, ready)
    for _ in range(6):  # all connected: a late spawn (a loaded machine) must not find its
        ready.get(timeout=120)  # keys done by the others and never reach its 60th effect
    start.set()
    victim = procs.procs[0]
    victim.join(120)
    assert victim.exitcode is not None and victim.exitcode < 0  # it died by the signal
    survivors = [results.get(timeout=120) for _ in range(5)]
    time.sleep(lease + 0.2)  # the dead holder's lease runs out

    logs = read_logs(str(tmp_path))
    sent = Counter(k for keys in logs.values() for k in keys)
    assert sent and max(sent.values()) == 1, "an effect happened twice"
    got = states(app, "race")
    in_doubt = {e.key for e in app.effects.in_doubt("race", limit=10_000)}
    for _, done, skipped, failed, overtaken, n in survivors:
        assert n == 1800 and failed == overtaken == 0
        assert done + sum(skipped.values()) == 1800
    for keys in asked[1:]:
        for k in keys:
            assert got[str(k)] == "done" or str(k) in in_doubt, (k, got[str(k)])
    assert in_doubt <= {str(k) for k in asked[0]} and len(in_doubt) <= chunks[0]
    done = {k for k, s in got.items() if s == "done"}
    assert done <= set(sent)                     # marked done only after fn returned
    assert set(sent) - done <= in_doubt          # logged and not done: the victim's last chunk
    assert sum(d for _, d, *_ in survivors) > 1000  # the work was shared


@pytest.mark.parametrize("policy", [AT_MOST_ONCE, AT_LEAST_ONCE])
def test_kill_9_inside_fn_leaves_exactly_its_chunks_unmarked_keys_in_doubt(
    app: App, db_url: str, procs: Procs, tmp_path: Path, policy: str
) -> None:
    """One process, 400 keys in chunks of 50, kills itself (SIGKILL) on its 130th effect
    (chunk 2, 30 effects in). Then the 50 keys of chunk 2 are in doubt, chunks 0-1 done,
    chunks 3-7 untouched. At most once: a second run redoes none of them. At least once:
    after the lease, a second run redoes each of them once and does the rest."""
    keys = random.Random(7).sample(range(10_000), 400)
    lease, chunk = 1.0, 50
    results = procs.ctx.Queue()
    (tmp_path / "victim").mkdir()
    victim = procs.start(send_many, db_url, "kill", keys, chunk, policy, lease, str(tmp_path / "victim"),
                         None, results, 130)
    victim.join(60)
    assert victim.exitcode is not None and victim.exitcode < 0
    (victim_log,) = read_logs(str(tmp_path / "victim")).values()
    assert len(victim_log) == 130
    current = {str(k) for k in keys[2 * chunk:3 * chunk]}
    wait_for(lambda: len(app.effects.in_doubt("kill")) == chunk, 10, "the dead holder's lease to run out")
    assert {e.key for e in app.effects.in_doubt("kill")} == current
    got = states(app, "kill")
    assert {k for k, s in got.items() if s == "done"} == {str(k) for k in keys[:2 * chunk]}
    assert set(got) == {str(k) for k in keys[:3 * chunk]}  # later chunks untouched

    redone: list[str] = []
    redo = app.effects.run_many("kill", keys, lambda idem: redone.append(idem.rsplit(":", 1)[1]),
                                policy=policy, chunk=chunk)
    if policy == AT_MOST_ONCE:
        assert (redo.done, redo.skipped) == (250, {"done": 100, "running": 0, "in_doubt": 50})
        assert not current & set(redone)
        assert {e.key for e in app.effects.in_doubt("kill")} == current
    else:
        assert (redo.done, redo.redone, redo.skipped["done"]) == (300, 50, 100)
        assert Counter(redone) == Counter({k: 1 for k in current} | {str(k): 1 for k in keys[3 * chunk:]})
        assert app.effects.counts("kill") == {"done": 400}


def test_a_process_woken_after_an_operator_redid_its_chunk_starts_none_of_it(
    app: App, db_url: str, procs: Procs, tmp_path: Path
) -> None:
    """At most once, one chunk of 40, 1 s lease: the holder is SIGSTOPped on its 5th
    effect. Its chunk goes in doubt; the operator resolves the 5 sent as done and the 35
    not sent as not done, and another caller sends those 35. Woken, the holder used to
    go on through its chunk and send the 35 again; now it starts no fn past its lease:
    every key sent exactly once."""
    keys = list(range(100, 140))
    results = procs.ctx.Queue()
    (tmp_path / "victim").mkdir()
    victim = procs.start(send_many, db_url, "woken", keys, 40, AT_MOST_ONCE, 1.0,
                         str(tmp_path / "victim"), None, results, stop_at=5)
    log_file = tmp_path / "victim" / f"{victim.pid}.log"
    wait_for(lambda: log_file.exists() and len(log_file.read_text().split()) == 5, 60,
             "the holder to stop on its 5th effect")
    wait_for(lambda: len(app.effects.in_doubt("woken")) == 40, 10,
             "the stopped holder's lease to run out")
    sent = set(log_file.read_text().split())
    assert app.effects.resolve_many("woken", sent, done=True) == sorted(sent)
    rest = [str(k) for k in keys if str(k) not in sent]
    assert app.effects.resolve_many("woken", rest, done=False) == sorted(rest)
    other: list[str] = []
    out = app.effects.run_many("woken", keys, lambda idem: other.append(idem.rsplit(":", 1)[1]),
                               lease=30)
    assert (out.done, out.skipped["done"]) == (35, 5)
    os.kill(victim.pid, signal.SIGCONT)
    victim.join(60)
    assert victim.exitcode == 0
    _, v_done, v_skipped, v_failed, v_overtaken, _ = results.get(timeout=10)
    assert (v_done, v_skipped["done"], v_failed) == (0, 35, 0) and v_overtaken == 5
    everything = Counter(log_file.read_text().split()) + Counter(other)
    assert everything == Counter(str(k) for k in keys)  # each exactly once
    assert app.effects.counts("woken") == {"done": 40}


def test_a_chunk_slower_than_its_lease_goes_on_in_smaller_chunks_and_nothing_goes_in_doubt(
    app: App
) -> None:
    """20 keys of 0.1 s each under a 1 s lease: no fn starts in the lease's last fifth; the
    keys not started are given back with the chunk's finish and claimed again with a fresh
    lease. (They all ran in one chunk past its lease, in doubt from the first second.)"""
    calls: list[str] = []
    doubts: list[int] = []

    def slow(idem: str) -> None:
        doubts.append(len(app.effects.in_doubt("slow")))
        calls.append(idem)
        time.sleep(0.1)

    out = app.effects.run_many("slow", range(20), slow, lease=1.0, chunk=20)
    assert (out.done, out.late, out.overtaken, dict(out.failed)) == (20, (), (), {})
    assert out.chunks >= 3 and sorted(Counter(calls).values()) == [1] * 20
    assert set(doubts) == {0} and app.effects.counts("slow") == {"done": 20}
    assert "late" not in str(out)


def test_claims_on_your_connection_in_autocommit_mode_keep_to_their_lease(
        app: App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a connection in autocommit mode a claim commits at once (everyone sees it, its
    lease runs): fn must not start past the lease's margin there either. conn= skipped the
    check, as if every conn= were an open transaction: an operator's redo of the chunk in
    doubt and its holder's later calls did 6 of 12 at-most-once effects twice."""
    conn = proc_app.ledger_connect(db_url)  # (autocommit)
    calls: list[str] = []
    doubts: list[int] = []

    def slow(idem: str) -> None:
        doubts.append(len(app.effects.in_doubt("ac")))
        calls.append(idem)
        time.sleep(0.1)

    try:
        assert not app.backend.caller_in_transaction(conn)
        out = app.effects.run_many("ac", range(20), slow, lease=1.0, conn=conn)
        assert (out.done, out.late, out.overtaken, dict(out.failed)) == (20, (), (), {})
        assert out.chunks >= 3 and sorted(Counter(calls).values()) == [1] * 20
        assert set(doubts) == {0} and app.effects.counts("ac") == {"done": 20}

        stalls = [0]
        real_claim = app.effects.claim

        def claim_then_stall(*args: Any, **kwargs: Any) -> Any:
            c = real_claim(*args, **kwargs)
            stalls[0] += 1
            time.sleep(0.25)  # past the 0.2 s lease's last fifth, every time
            return c

        monkeypatch.setattr(app.effects, "claim", claim_then_stall)
        out1 = app.effects.run("ac-one", 1, calls.append, lease=0.2, conn=conn)
        assert (out1.ran, out1.state, stalls[0]) == (False, "late", 3)
        assert "ac-one:1" not in calls and app.effects.get("ac-one", 1).state == "pending"
        # In your open transaction nobody sees the claims before you commit: no deadline.
        with proc_app._Tx(conn) as c:
            out1 = app.effects.run("ac-one", 2, calls.append, lease=0.2, conn=c)
        assert (out1.ran, out1.state) == (True, "done")
    finally:
        conn.close()


@pytest.mark.parametrize("policy", [AT_MOST_ONCE, AT_LEAST_ONCE])
def test_an_effect_whose_outcome_is_unknown_is_left_in_doubt_not_released(app: App, policy: str) -> None:
    """A send whose answer was lost (the mail server took the message and dropped the
    connection) may have happened: released, it was sent again (a user got two emails).
    fn raising EffectInDoubt leaves its entry claimed, in doubt once the lease runs out,
    as if the process had died there; the keys that returned are marked done."""
    from justonce import EffectInDoubt

    calls: list[str] = []

    def send(idem: str) -> None:
        calls.append(idem)
        if idem.endswith((":2", ":5")):
            raise EffectInDoubt("the server dropped the connection after DATA")

    out = app.effects.run_many("lost", range(8), send, policy=policy, lease=1.5)
    assert (out.done, out.left_in_doubt, dict(out.failed), out.ran) == (6, ("2", "5"), {}, 8)
    assert "2 left in doubt" in str(out)
    states = {k: app.effects.get("lost", k).state for k in range(8)}
    assert states == {k: "running" if k in (2, 5) else "done" for k in range(8)}
    with pytest.raises(EffectInDoubt):
        app.effects.run("lost-one", 1, lambda idem: (_ for _ in ()).throw(EffectInDoubt("?")),
                        policy=policy, lease=1.5)
    assert app.effects.get("lost-one", 1).state == "running"
    time.sleep(1.6)
    assert {i.key for i in app.effects.in_doubt("lost")} == {"2", "5"}
    assert [i.key for i in app.effects.in_doubt("lost-one")] == ["1"]
    again = app.effects.run_many("lost", range(8), send, policy=policy)
    if policy == AT_MOST_ONCE:  # never redone until an operator says
        assert (again.done, again.skipped["in_doubt"], again.skipped["done"]) == (0, 2, 6)
        assert sorted(Counter(calls).values()) == [1] * 8
    else:  # redone after the lease, and left in doubt again
        assert (again.done, again.left_in_doubt, again.skipped["done"]) == (0, ("2", "5"), 6)


def test_keys_given_back_late_and_claimed_anew_still_count_as_redone(app: App) -> None:
    """At least once, two entries in doubt redone by one chunk whose first fn outlasts the
    lease's margin: the second key is given back and claimed anew (as pending, now); it
    was counted done but not redone."""
    for k in (1, 2):
        assert app.effects.claim("redo-late", k, policy=AT_LEAST_ONCE, lease=0.05).claimed
    time.sleep(0.1)

    def first_slow(idem: str) -> None:
        if idem.endswith(":1"):
            time.sleep(0.45)  # past 0.5 s less its fifth

    out = app.effects.run_many("redo-late", [1, 2], first_slow, policy=AT_LEAST_ONCE, lease=0.5)
    assert (out.done, out.redone, out.chunks, out.late) == (2, 2, 2, ())


def test_run_gives_back_a_claim_whose_lease_ran_out_before_fn_could_start(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process is paused between the claim and fn (here: the claim's lock wait eats the
    lease): fn must not start on a claim in doubt; the claim is given back and taken anew."""
    import justonce.effects as effects_module

    real_claim = app.effects.claim
    slow_claims = [0]

    def claim_then_stall(*args: Any, **kwargs: Any) -> Any:
        c = real_claim(*args, **kwargs)
        if slow_claims[0] < 2:
            slow_claims[0] += 1
            time.sleep(0.65)  # past the 0.6 s lease's last fifth (a loaded machine's claim
            # takes well over 0.2 s: a lease that short left the third claim late too)
        return c

    monkeypatch.setattr(app.effects, "claim", claim_then_stall)
    calls: list[str] = []
    out = app.effects.run("pause", 1, calls.append, lease=0.6)
    assert (out.ran, out.state, calls) == (True, "done", ["pause:1"]) and slow_claims[0] == 2
    slow_claims[0] = -1  # three late claims in a row: not run, left claimable
    out = app.effects.run("pause", 2, calls.append, lease=0.6)
    assert (out.ran, out.state, calls) == (False, "late", ["pause:1"])
    assert app.effects.get("pause", 2).state == "pending"
    assert effects_module.LATE_ROUNDS == 3


@pytest.mark.parametrize("policy", [AT_MOST_ONCE, AT_LEAST_ONCE])
def test_a_process_stopped_inside_fn_past_its_lease_resumes_without_a_second_done_mark(
    app: App, db_url: str, procs: Procs, tmp_path: Path, policy: str
) -> None:
    """One process, 400 keys in chunks of 50, SIGSTOPped on its 130th effect (chunk 2, 30
    effects in) and left stopped past its 1 s lease while another caller runs over the same
    keys; then SIGCONT. At most once: the other caller leaves chunk 2 alone (in doubt) and
    does chunks 3-7; the resumed process finishes chunk 2 and marks it done (its claim was
    never taken over), skips the rest: every key sent exactly once, all done. At least
    once: the other caller redoes chunk 2 and does chunks 3-7; the resumed process's late
    done marks for chunk 2 are refused (all 50 overtaken) and it skips the rest."""
    keys = random.Random(11).sample(range(10_000), 400)
    lease, chunk = 1.0, 50
    results = procs.ctx.Queue()
    (tmp_path / "victim").mkdir()
    victim = procs.start(send_many, db_url, "stop", keys, chunk, policy, lease, str(tmp_path / "victim"),
                         None, results, stop_at=130)
    log_file = tmp_path / "victim" / f"{victim.pid}.log"
    wait_for(lambda: log_file.exists() and len(log_file.read_text().split()) == 130, 60,
             "the victim to stop on its 130th effect")
    current = {str(k) for k in keys[2 * chunk:3 * chunk]}
    wait_for(lambda: {e.key for e in app.effects.in_doubt("stop")} == current, 10,
             "the stopped holder's lease to run out")

    other: list[str] = []
    out = app.effects.run_many("stop", keys, lambda idem: other.append(idem.rsplit(":", 1)[1]),
                               policy=policy, chunk=chunk, lease=30)
    os.kill(victim.pid, signal.SIGCONT)
    victim.join(60)
    assert victim.exitcode == 0
    _, v_done, v_skipped, v_failed, v_overtaken, _ = results.get(timeout=10)
    victim_log = log_file.read_text().split()
    later = Counter(str(k) for k in keys[3 * chunk:])
    if policy == AT_MOST_ONCE:
        assert (out.done, out.skipped) == (250, {"done": 100, "running": 0, "in_doubt": 50})
        assert Counter(other) == later
        assert (v_done, v_skipped["done"], v_failed, v_overtaken) == (150, 250, 0, 0)
        sent = Counter(victim_log) + Counter(other)
        assert set(sent.values()) == {1} and set(sent) == {str(k) for k in keys}
    else:
        # The 30 sent before the stop are overtaken; the 20 not started are not sent
        # by the resumed process (its lease had run out: given back, then found done).
        assert (out.done, out.redone, out.skipped["done"]) == (300, 50, 100)
        assert Counter(other) == Counter(current) + later
        assert (v_done, v_skipped["done"], v_failed, v_overtaken) == (100, 270, 0, 30)
        sent_of_chunk_2 = sorted(current)[:30]  # (a chunk's fn calls go in key order)
        assert Counter(victim_log) == Counter([str(k) for k in keys[:100]] + sent_of_chunk_2)
    assert app.effects.counts("stop") == {"done": 400}
    assert app.effects.in_doubt("stop") == []


def test_an_operators_verdict_waits_for_a_locked_chunk_no_longer_than_its_lock_timeout(
    app: App, db_url: str
) -> None:
    """A holder frozen inside its chunk's finish (SIGSTOP mid-transaction) keeps the chunk's
    row locked; the verdict on its keys in doubt waited for that lock with no limit (the
    CLI hung, and the service's request with it). Bounded now as a claim is: LockTimeout,
    nothing written; given once the lock is gone."""
    from justonce import EffectInDoubt

    def unsure(idem: str) -> None:
        raise EffectInDoubt("the answer was lost")

    out = app.effects.run_many("frozen", [1, 2, 3], unsure, lease=0.6)
    assert out.left_in_doubt == ("1", "2", "3")
    time.sleep(0.7)
    assert {i.key for i in app.effects.in_doubt("frozen")} == {"1", "2", "3"}
    conn = proc_app.ledger_connect(db_url)
    try:
        with proc_app._Tx(conn) as c:  # what the frozen finisher holds
            c.execute("UPDATE justonce_effect_chunks SET lease_expires_at = lease_expires_at")
            with pytest.raises(LockTimeout):
                app.effects.resolve_many("frozen", [1, 2, 3], done=False, lock_timeout=0.3)
            with pytest.raises(LockTimeout):
                app.effects.resolve("frozen", 1, done=True, lock_timeout=0.3)
        assert states(app, "frozen") == {"1": "in_doubt", "2": "in_doubt", "3": "in_doubt"}
        assert app.effects.resolve_many("frozen", [1, 2], done=False, lock_timeout=0.3) == ["1", "2"]
        assert app.effects.resolve("frozen", 3, done=True, lock_timeout=0.3).state == "done"
    finally:
        conn.close()
