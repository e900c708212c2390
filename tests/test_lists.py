"""Lists, against every backend: load and seal, reserve in cursor steps, completion by
fencing token, re-offer of timed-out positions (only their unfinished ones, before fresh
ones), touch, release, bury and kick, lost answers replayed by request id, run_next,
exactly-once completion with threads racing, bookkeeping size, and bad input."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from justonce import (
    App,
    InvalidArguments,
    InvalidName,
    InvalidOption,
    JustonceError,
    ListExists,
    ListNotFound,
    ListNotSealed,
    ListSealed,
    PayloadTooLarge,
    PositionNotReserved,
    Reservation,
    StaleReservation,
    UnknownTask,
    ValidationError,
)
from justonce.items import CHUNK_BITS
from justonce.lists import MAX_RESERVE


def callbacks(app: App) -> list[dict[str, Any]]:
    """The on_complete jobs enqueued so far (their batch summaries)."""
    return [j.kwargs["batch"] for j in app.list_jobs(task="list_done", limit=100)]


@pytest.fixture
def lapp(app: App) -> App:
    @app.task(name="list_done")
    def list_done(batch: dict[str, Any]) -> None:
        pass

    return app


def drain(app: App, name: str, k: int = 100) -> int:
    n = 0
    while (res := app.lists.reserve(name, k)) is not None:
        n += app.lists.complete(res).completed
    return n


# -- loading and the lifecycle -------------------------------------------------------------------
def test_a_list_is_loaded_sealed_handed_out_in_order_and_completes_once(lapp: App) -> None:
    info = lapp.lists.create("people", items=({"n": i} for i in range(2500)), on_complete="list_done")
    assert (info.state, info.progress.total, info.progress.ready) == ("sealed", 2500, 2500)
    first = lapp.lists.reserve("people", 3)
    assert first is not None and first.ranges == ((0, 3),) and first.attempt == 1
    assert lapp.lists.items(first) == [(0, {"n": 0}), (1, {"n": 1}), (2, {"n": 2})]
    second = lapp.lists.reserve("people", 1000)
    assert second is not None and second.ranges == ((3, 1003),)
    p = lapp.lists.progress("people")
    assert (p.ready, p.reserved, p.done, p.buried) == (1497, 1003, 0, 0)
    assert lapp.lists.complete(first).completed == 3
    assert lapp.lists.complete(second, positions=range(3, 500)).completed == 497
    assert lapp.lists.complete(second).completed == 503  # the rest it holds
    assert callbacks(lapp) == []
    assert drain(lapp, "people", 700) == 1497
    done = lapp.lists.get("people")
    assert done.state == "completed" and done.finished_at is not None
    assert (done.progress.done, done.progress.ready, done.progress.reserved) == (2500, 0, 0)
    [summary] = callbacks(lapp)
    assert summary["description"] == "list:people" and summary["total"] == 2500
    assert lapp.lists.reserve("people", 5) is None


def test_an_empty_list_completes_when_it_is_sealed(lapp: App) -> None:
    info = lapp.lists.create("nobody", items=[], on_complete="list_done")
    assert info.state == "completed" and info.progress.total == 0
    assert len(callbacks(lapp)) == 1
    assert lapp.lists.reserve("nobody") is None


def test_appends_come_before_the_seal_and_none_after(lapp: App) -> None:
    lapp.lists.create("open", seal=False)
    assert lapp.lists.append("open", [1, 2]) == 2
    assert lapp.lists.append("open", iter([3])) == 1
    with pytest.raises(ListNotSealed):
        lapp.lists.reserve("open")
    assert lapp.lists.get("open").state == "loading"
    assert lapp.lists.seal("open").progress.total == 3
    assert lapp.lists.seal("open").state == "sealed"  # again: nothing changes
    with pytest.raises(ListSealed):
        lapp.lists.append("open", [4])
    res = lapp.lists.reserve("open", 10)
    assert res is not None and [i for _, i in lapp.lists.items(res)] == [1, 2, 3]


def test_names_are_unique_and_unknown_names_are_refused_everywhere(lapp: App) -> None:
    lapp.lists.create("once", items=[1])
    with pytest.raises(ListExists):
        lapp.lists.create("once", items=[2])
    assert lapp.lists.get("once").progress.total == 1
    calls = [
        lambda: lapp.lists.get("ghost"), lambda: lapp.lists.reserve("ghost"),
        lambda: lapp.lists.append("ghost", [1]), lambda: lapp.lists.append("ghost", []),
        lambda: lapp.lists.seal("ghost"), lambda: lapp.lists.kick("ghost"),
        lambda: lapp.lists.buried("ghost"), lambda: lapp.lists.run_next("ghost"),
    ]
    for call in calls:
        with pytest.raises(ListNotFound):
            call()
    with pytest.raises(StaleReservation):
        lapp.lists.complete("ghost", "1.0123456789abcdef")
    assert lapp.lists.drop("once") and not lapp.lists.drop("once")
    lapp.lists.create("once", items=[3])  # the name is free again
    assert [i.name for i in lapp.lists.list()] == ["once"]


# -- time to run, re-offers, fencing ----------------------------------------------------------------
def test_a_timed_out_reservation_is_refused_and_only_its_unfinished_positions_come_back_first(
    lapp: App,
) -> None:
    lapp.lists.create("ttr", items=range(100))
    old = lapp.lists.reserve("ttr", 10, ttr=0.3)
    assert old is not None
    assert lapp.lists.complete(old, positions=[0, 4, 9]).completed == 3
    time.sleep(0.5)
    before = lapp.lists.progress("ttr")
    assert (before.reserved, before.done, before.ready) == (0, 3, 97)
    for write in (lambda: lapp.lists.complete(old), lambda: lapp.lists.touch(old),
                  lambda: lapp.lists.release(old), lambda: lapp.lists.bury(old)):
        with pytest.raises(StaleReservation, match="timed out"):
            write()
    assert lapp.lists.progress("ttr") == before
    # Re-offered before fresh positions, k at a time, without the done ones.
    a = lapp.lists.reserve("ttr", 4)
    b = lapp.lists.reserve("ttr", 4)
    c = lapp.lists.reserve("ttr", 4)
    assert a is not None and b is not None and c is not None
    assert (a.positions, b.positions, c.positions) == ([1, 2, 3, 5], [6, 7, 8], [10, 11, 12, 13])
    assert (a.attempt, b.attempt, c.attempt) == (2, 2, 1)
    with pytest.raises(StaleReservation):  # the old token stays refused after the re-offer
        lapp.lists.complete(old, positions=[1])
    assert lapp.lists.complete(a).completed == 4


def test_touch_extends_the_time_to_run(lapp: App) -> None:
    lapp.lists.create("touch", items=range(5))
    res = lapp.lists.reserve("touch", 2, ttr=0.4)
    assert res is not None
    until = lapp.lists.touch(res, ttr=30)
    assert until > res.expires_at
    time.sleep(0.6)
    assert lapp.lists.reserve("touch", 2).positions == [2, 3]  # not 0, 1: still held
    assert lapp.lists.complete(res).completed == 2


def test_release_gives_positions_back_now_or_after_a_delay(lapp: App) -> None:
    lapp.lists.create("rel", items=range(20))
    res = lapp.lists.reserve("rel", 5)
    assert res is not None
    assert lapp.lists.complete(res, positions=[0]).completed == 1
    assert lapp.lists.release(res, positions=[3, 4]) == 2
    assert lapp.lists.reserve("rel", 10).positions == [3, 4]  # at once, before fresh ones
    assert lapp.lists.release(res, delay=0.5) == 2  # the rest (1, 2); the token dies
    with pytest.raises(StaleReservation, match="given back"):
        lapp.lists.complete(res, positions=[1])
    assert lapp.lists.reserve("rel", 2).positions == [5, 6]  # 1, 2 wait for their delay
    time.sleep(0.7)
    again = lapp.lists.reserve("rel", 10)
    assert again is not None and again.positions == [1, 2] and again.attempt == 2


def test_buried_positions_wait_for_a_kick_and_hold_the_list_open(lapp: App) -> None:
    lapp.lists.create("bury", items=range(6), on_complete="list_done")
    res = lapp.lists.reserve("bury", 6)
    assert res is not None
    assert lapp.lists.bury(res, positions=[2], reason="poison") == 1
    with pytest.raises(PositionNotReserved):
        lapp.lists.complete(res, positions=[2])  # it left the reservation
    assert lapp.lists.complete(res).completed == 5
    info = lapp.lists.get("bury")
    assert (info.state, info.progress.buried, info.progress.done) == ("sealed", 1, 5)
    assert lapp.lists.reserve("bury") is None and callbacks(lapp) == []
    [parked] = lapp.lists.buried("bury")
    assert (parked.ranges, parked.reason) == (((2, 3),), "poison")
    assert lapp.lists.kick("bury") == 1
    back = lapp.lists.reserve("bury")
    assert back is not None and back.positions == [2] and back.attempt == 1
    assert lapp.lists.complete(back).list_completed
    assert len(callbacks(lapp)) == 1 and lapp.lists.buried("bury") == []


def test_a_lost_answer_is_the_same_reservation_when_asked_again_with_its_request_id(lapp: App) -> None:
    lapp.lists.create("req", items=range(50))
    first = lapp.lists.reserve("req", 7, request_id="req-1")
    again = lapp.lists.reserve("req", 7, request_id="req-1")
    assert first == again and first is not None
    other = lapp.lists.reserve("req", 7, request_id="req-2")
    assert other is not None and other.positions == list(range(7, 14))
    assert lapp.lists.complete(again).completed == 7
    assert lapp.lists.reserve("req", 7, request_id="req-1") == first  # after it finished too
    # Racing threads with one request id: one reservation.
    got: list[Reservation | None] = []
    threads = [threading.Thread(target=lambda: got.append(
        lapp.lists.reserve("req", 3, request_id="race"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.token for r in got if r is not None}) == 1 and len(got) == 6
    assert lapp.lists.progress("req").reserved == 7 + 3


def test_forged_malformed_and_foreign_tokens_are_refused_and_change_nothing(lapp: App) -> None:
    lapp.lists.create("a", items=range(10))
    lapp.lists.create("b", items=range(10))
    res = lapp.lists.reserve("a", 4)
    other = lapp.lists.reserve("b", 4)
    assert res is not None and other is not None
    row_id, secret = res.token.split(".")
    before = lapp.lists.progress("a")
    forged = [f"{row_id}.{'0' * 16 if secret != '0' * 16 else '1' * 16}", "1.abc", "abc",
              f"{int(row_id) + 1000}.{secret}", other.token, f"{row_id}.{secret.upper()}"]
    for token in forged:
        for write in (lambda t=token: lapp.lists.complete("a", t),
                      lambda t=token: lapp.lists.touch("a", t),
                      lambda t=token: lapp.lists.release("a", t),
                      lambda t=token: lapp.lists.bury("a", t)):
            with pytest.raises(StaleReservation):
                write()
    with pytest.raises(StaleReservation):
        lapp.lists.complete("b", res.token)  # a's token names a's list only
    assert lapp.lists.progress("a") == before
    with pytest.raises(PositionNotReserved):
        lapp.lists.complete(res, positions=[0, 4])  # 4 is not its: nothing is completed
    assert lapp.lists.progress("a") == before
    assert lapp.lists.complete(res, positions=[1, 1, 2]).completed == 2
    again = lapp.lists.complete(res, positions=[1, 2, 3])
    assert (again.completed, again.already) == (1, (1, 2))
    # The completion that finishes the reservation leaves its token holding nothing: a
    # repeat (with or without a request id) is refused and changes nothing (README, Lists).
    assert lapp.lists.complete(res).completed == 1
    done = lapp.lists.progress("a")
    with pytest.raises(StaleReservation, match="finished, or never existed"):
        lapp.lists.complete(res)
    kept = lapp.lists.reserve("a", 2, request_id="kept")
    assert kept is not None and lapp.lists.complete(kept).completed == 2
    with pytest.raises(StaleReservation, match="was finished"):
        lapp.lists.complete(kept)
    assert lapp.lists.progress("a").done == done.done + 2


# -- run_next ----------------------------------------------------------------------------------------
def test_run_next_runs_the_task_completes_retries_and_buries(lapp: App) -> None:
    seen: list[Any] = []

    @lapp.task(name="visit", max_attempts=2)
    def visit(item: dict[str, Any]) -> Any:
        seen.append(item["n"])
        if item.get("bad"):
            raise RuntimeError(f"bad item {item['n']}")
        return item["n"] * 10

    lapp.lists.create("run", task="visit", items=[{"n": 0}, {"n": 1, "bad": True}, {"n": 2}],
                      on_complete="list_done")
    assert lapp.lists.get("run").max_attempts == 2
    ok = lapp.lists.run_next("run")
    assert ok is not None and (ok.position, ok.outcome, ok.result) == (0, "completed", 0)
    bad = lapp.lists.run_next("run")
    assert bad is not None and (bad.outcome, bad.attempt) == ("released", 1)
    assert "bad item 1" in (bad.error or "")
    runs = list(lapp.lists.drain("run", poll=0.05))
    outcomes = Counter((r.position, r.outcome) for r in runs)
    assert outcomes[(2, "completed")] == 1 and outcomes[(1, "buried")] == 1
    info = lapp.lists.get("run")
    assert (info.progress.done, info.progress.buried, info.state) == (2, 1, "sealed")
    assert lapp.lists.kick("run") == 1
    visit_ok = lapp.tasks["visit"]
    object.__setattr__(visit_ok, "fn", lambda item: "fixed")
    last = lapp.lists.run_next("run")
    assert last is not None and (last.outcome, last.list_completed) == ("completed", True)
    assert len(callbacks(lapp)) == 1
    assert lapp.lists.run_next("run") is None


def test_a_task_failing_with_a_long_message_on_its_last_attempt_is_buried(lapp: App) -> None:
    """The bury refused the run's own error text past 4,000 characters: the position stayed
    reserved, was handed out again after its time to run, and was never buried."""
    runs: list[int] = []

    @lapp.task(name="loud", max_attempts=1)
    def loud(item: int) -> None:
        runs.append(item)
        raise RuntimeError("y" * 10_000)

    lapp.lists.create("loud", task="loud", items=[7], ttr=0.3)
    r = lapp.lists.run_next("loud")
    assert r is not None and r.outcome == "buried" and len(r.error or "") <= 4000, r
    time.sleep(0.5)
    assert lapp.lists.run_next("loud") is None and runs == [7]
    (b,) = lapp.lists.buried("loud")
    assert (b.reason or "").startswith("RuntimeError: yyy")


def test_list_calls_in_one_transaction_see_that_transaction(lapp: App) -> None:
    """With conn=, the reads a call makes (does the list exist, its progress, a request
    id's reservation) go through that transaction: they went through another connection,
    saw no list created earlier in the transaction (ListNotFound) and reserved=0 after a
    reserve in it, and took a second pooled connection while the first was held."""
    with lapp.backend.transaction() as conn:
        info = lapp.lists.create("same-tx", items=[1, 2, 3], conn=conn)
        assert (info.state, info.progress.total) == ("sealed", 3)
        assert lapp.lists.kick("same-tx", conn=conn) == 0
        res = lapp.lists.reserve("same-tx", 3, request_id="r1", conn=conn)
        assert res is not None and res.count == 3
        again = lapp.lists.reserve("same-tx", 3, request_id="r1", conn=conn)
        assert again is not None and again.token == res.token
        assert lapp.lists.reserve("same-tx", 1, conn=conn) is None  # all held: no ListNotFound
        assert lapp.lists._get("same-tx", conn).progress.reserved == 3
    assert lapp.lists.get("same-tx").progress.reserved == 3


def test_run_next_starts_no_task_on_a_reservation_whose_time_ran_out_first(lapp: App) -> None:
    """A process paused between its reserve and the task (here: a slow read of the item)
    past the time to run ran the task anyway, on a position another reserver may hold by
    then. It gives the reservation back instead ("late"), and the next run does it."""
    runs: list[int] = []
    lapp.task(name="note", max_attempts=5)(lambda item: runs.append(item))
    lapp.lists.create("paused", task="note", items=[1], ttr=0.3)
    real_items = lapp.lists.items
    stalls, stall = [1], [0.35]  # past the time to run

    def slow_items(res: Any) -> Any:
        got = real_items(res)
        if stalls[0]:
            stalls[0] -= 1
            time.sleep(stall[0])
        return got

    lapp.lists.items = slow_items  # type: ignore[method-assign]
    late = lapp.lists.run_next("paused")
    assert late is not None and (late.outcome, runs) == ("late", [])
    again = lapp.lists.run_next("paused")
    assert again is not None and (again.outcome, again.list_completed, runs) == ("completed", True, [1])
    # Late on its last attempt: buried, as a failure would be (a time to run shorter than
    # a reserve takes handed the position out for ever).
    lapp.task(name="once", max_attempts=1)(lambda item: runs.append(item))
    lapp.lists.create("paused-once", task="once", items=[2], ttr=2.0)
    stalls[0], stall[0] = 1, 1.7  # past 2 s less its fifth, not past 2 s: still buriable
    last = lapp.lists.run_next("paused-once")
    assert last is not None and last.outcome == "buried" and "ran out" in (last.error or "")
    assert runs == [1] and lapp.lists.run_next("paused-once") is None


ODD = {
    # what a job keeps of each of proc_app.ODD_RETURNS: (result, the note's start)
    "object": (None, "result dropped: not JSON"), "bytes": (None, "result dropped: not JSON"),
    "set": (None, "result dropped: not JSON"), "nan": (None, "result dropped: not JSON"),
    "surrogate": (None, "result dropped: it contains a NUL"),
    "nul": (None, "result dropped: it contains a NUL"),
    "deep": (None, "result dropped: "), "big": (None, "result dropped: 20971522 bytes"),
    "tuple": ([1, "two"], None), "int_keys": ({"1": "a"}, None), "float_1e16": (1e16, None),
}


@pytest.mark.parametrize("kind", sorted(ODD))
def test_run_next_answers_what_a_job_keeps_of_a_result_and_completes_the_position(
        lapp: App, kind: str) -> None:
    """The run's result was the task's raw return value (object(), bytes, NaN, 20 MB): the
    position was completed, then the HTTP answer failed to serialise (400)."""
    from proc_app import ODD_RETURNS

    lapp.task(name="odd")(lambda item: ODD_RETURNS[item]())
    lapp.lists.create("odd", task="odd", items=[kind], on_complete="list_done")
    run = lapp.lists.run_next("odd")
    want, note = ODD[kind]
    assert run is not None and (run.outcome, run.list_completed) == ("completed", True)
    assert run.result == want and type(run.result) is type(want)
    assert (run.note or "").startswith(note) if note else run.note is None, run.note
    assert lapp.lists.get("odd").state == "completed" and len(callbacks(lapp)) == 1


def test_run_next_needs_a_task_that_is_registered(lapp: App) -> None:
    lapp.lists.create("bare", items=[1])
    with pytest.raises(InvalidOption):
        lapp.lists.run_next("bare")
    other = App(lapp.database_url, strict=False)
    try:
        other.lists.create("elsewhere", task="not.here", items=[1])
        with pytest.raises(UnknownTask):
            other.lists.run_next("elsewhere")
    finally:
        other.close()


# -- concurrency ----------------------------------------------------------------------------------
def test_a_create_racing_seals_and_creates_of_its_name_happens_whole_or_not_at_all(lapp: App) -> None:
    """A create committed its list row, then loaded the items in a second transaction: a seal
    in between sealed (and completed, on_complete enqueued) an empty list while the create
    failed with ListSealed. Now the list and its first items are one transaction: a seal finds
    no list or the loaded one, and of creates racing for a name one wins whole."""
    for rnd in range(12):
        name, empty = f"cs{rnd}", rnd % 3 == 0
        items = [] if empty else list(range(100))
        start = threading.Barrier(5)
        made: list[Any] = []
        refused: list[Exception] = []
        seals: list[str] = []

        def create(items: list[int] = items, name: str = name, start: threading.Barrier = start,
                   made: list[Any] = made, refused: list[Exception] = refused) -> None:
            start.wait()
            try:
                made.append(lapp.lists.create(name, items=items, seal=False, on_complete="list_done"))
            except ListExists as exc:
                refused.append(exc)

        def seal(name: str = name, start: threading.Barrier = start, seals: list[str] = seals) -> None:
            start.wait()
            for _ in range(400):
                try:
                    seals.append(lapp.lists.seal(name).state)
                    return
                except ListNotFound:
                    time.sleep(0.001)

        threads = [threading.Thread(target=create) for _ in range(2)]
        threads += [threading.Thread(target=seal) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(made) == 1 and len(refused) == 1, (made, refused)
        info = lapp.lists.get(name)
        assert info.progress.total == len(items) and made[0].progress.total == len(items)
        assert len(seals) == 3 and set(seals) <= {"sealed", "completed"}
        done = [b for b in callbacks(lapp) if b["description"] == f"list:{name}"]
        # Only an empty list completes here, once; and only one its creator was told exists.
        assert len(done) == (1 if empty else 0) and info.state == ("completed" if empty else "sealed")


def test_threads_racing_with_random_k_complete_every_position_exactly_once(lapp: App) -> None:
    total = 6000
    lapp.lists.create("race", items=range(total), on_complete="list_done")
    accepted: Counter[int] = Counter()
    handed: list[list[int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def consumer(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while (res := lapp.lists.reserve("race", rnd.randint(1, 300), ttr=30)) is not None:
                split = rnd.randint(0, res.count)
                first, rest = res.positions[:split], res.positions[split:]
                done = []
                for part in (first, rest):
                    if part:
                        got = lapp.lists.complete(res, positions=part)
                        done += [p for p in part if p not in got.already]
                with lock:
                    handed.append(res.positions)
                    accepted.update(done)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=consumer, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(accepted) == list(range(total)) and set(accepted.values()) == {1}
    flat = [p for h in handed for p in h]
    assert len(flat) == len(set(flat)) == total  # no position handed to two reservations
    assert lapp.lists.get("race").state == "completed" and len(callbacks(lapp)) == 1


# -- bookkeeping ------------------------------------------------------------------------------------
def test_bookkeeping_is_bits_not_rows_per_position(lapp: App, db_url: str) -> None:
    import proc_app

    n = 3 * CHUNK_BITS + 5
    lapp.lists.create("bits", items=range(n))
    assert drain(lapp, "bits", 1000) == n
    info = lapp.lists.get("bits")
    conn = proc_app.ledger_connect(db_url)
    try:
        chunks = conn.execute("SELECT count(*) FROM justonce_batch_chunks WHERE batch_id = "
                              f"{info.batch_id}").fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM justonce_list_reservations").fetchone()[0]
    finally:
        conn.close()
    assert chunks == 4 and rows == 0


# -- bad input ------------------------------------------------------------------------------------
def test_bad_input_gets_a_typed_error_and_changes_nothing(lapp: App) -> None:
    lapp.lists.create("good", items=range(10))
    res = lapp.lists.reserve("good", 2)
    assert res is not None
    before = lapp.lists.progress("good")
    bad: list[tuple[type[BaseException], Any]] = [
        (InvalidName, lambda: lapp.lists.create("")),
        (InvalidName, lambda: lapp.lists.create("has space")),
        (InvalidName, lambda: lapp.lists.create("x" * 64)),
        (InvalidName, lambda: lapp.lists.reserve(None)),  # type: ignore[arg-type]
        (InvalidOption, lambda: lapp.lists.create("n1", items="abc")),
        (InvalidOption, lambda: lapp.lists.create("n2", items={"a": 1})),
        (InvalidOption, lambda: lapp.lists.create("n3", ttr=0)),
        (InvalidOption, lambda: lapp.lists.create("n4", ttr=float("nan"))),
        (InvalidOption, lambda: lapp.lists.create("n5", max_attempts=0)),
        (InvalidOption, lambda: lapp.lists.create("n6", seal="yes")),  # type: ignore[arg-type]
        (InvalidOption, lambda: lapp.lists.reserve("good", 0)),
        (InvalidOption, lambda: lapp.lists.reserve("good", -1)),
        (InvalidOption, lambda: lapp.lists.reserve("good", MAX_RESERVE + 1)),
        (InvalidOption, lambda: lapp.lists.reserve("good", True)),
        (InvalidOption, lambda: lapp.lists.reserve("good", "2")),
        (InvalidOption, lambda: lapp.lists.reserve("good", 1, ttr=-1)),
        (InvalidOption, lambda: lapp.lists.reserve("good", 1, request_id="")),
        (InvalidOption, lambda: lapp.lists.reserve("good", 1, request_id="x" * 201)),
        (InvalidOption, lambda: lapp.lists.complete(res, positions=[-1])),
        (InvalidOption, lambda: lapp.lists.complete(res, positions=[True])),
        (InvalidOption, lambda: lapp.lists.complete(res, positions="01")),
        (InvalidOption, lambda: lapp.lists.complete(res, positions=[1.0])),
        (InvalidOption, lambda: lapp.lists.complete(res, token=res.token)),
        (InvalidOption, lambda: lapp.lists.complete("good")),
        (InvalidOption, lambda: lapp.lists.complete("good", 12)),  # type: ignore[arg-type]
        (InvalidOption, lambda: lapp.lists.release(res, delay=-1)),
        (InvalidOption, lambda: lapp.lists.touch(res, ttr=0)),
        (InvalidOption, lambda: lapp.lists.kick("good", -1)),
        (InvalidOption, lambda: lapp.lists.items("good")),  # type: ignore[arg-type]
        (PositionNotReserved, lambda: lapp.lists.complete(res, positions=[5])),
        (PositionNotReserved, lambda: lapp.lists.release(res, positions=[9])),
        (PositionNotReserved, lambda: lapp.lists.bury(res, positions=[0, 9])),
    ]
    for kind, call in bad:
        with pytest.raises(kind):
            call()
    assert lapp.lists.progress("good") == before
    assert [i.name for i in lapp.lists.list()] == ["good"]
    # Items are checked before their transaction: a bad item appends nothing of its chunk.
    lapp.lists.create("items", seal=False)
    for kind, items in [(InvalidArguments, [1, object()]), (PayloadTooLarge, [1, "x" * 300_000]),
                        (InvalidArguments, [1, {"a": float("nan")}]),
                        (InvalidArguments, [1, "\udc00"]), (InvalidArguments, [1, "a\x00b"])]:
        with pytest.raises(kind):
            lapp.lists.append("items", items)
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidArguments):
        lapp.lists.append("items", [deep])
    assert lapp.lists.get("items").progress.total == 0
    assert issubclass(PositionNotReserved, ValueError) and issubclass(InvalidOption, ValidationError)


def test_housekeeping_forgets_finished_reservations_kept_for_their_request_ids(lapp: App) -> None:
    from justonce.worker.maintenance import Maintenance

    lapp.lists.create("kept", items=range(4))
    res = lapp.lists.reserve("kept", 2, request_id="r-1")
    assert res is not None and lapp.lists.complete(res).completed == 2
    Maintenance(lapp.backend, "test").run_once(force=True)  # kept for a day by default
    assert lapp.lists.reserve("kept", 2, request_id="r-1") == res
    Maintenance(lapp.backend, "test", request_retention=0).run_once(force=True)
    after = lapp.lists.reserve("kept", 2, request_id="r-1")  # forgotten: a new reservation
    assert after is not None and after.positions == [2, 3]
    assert lapp.lists.prune(0) == 0


def test_a_bad_item_deep_in_a_streamed_load_keeps_the_chunks_before_it_and_says_so(lapp: App) -> None:
    from justonce.lists import LOAD_CHUNK

    items = [*range(LOAD_CHUNK + 3), object(), 1]
    with pytest.raises(InvalidArguments) as err:
        lapp.lists.create("partial", items=iter(items))
    assert any("not sealed" in note for note in getattr(err.value, "__notes__", []))
    info = lapp.lists.get("partial")
    assert (info.state, info.progress.total) == ("loading", LOAD_CHUNK)
    lapp.lists.append("partial", [1, 2])
    assert lapp.lists.seal("partial").progress.total == LOAD_CHUNK + 2


def test_a_bad_item_anywhere_in_a_list_of_items_leaves_no_list_behind(lapp: App) -> None:
    """Items given as a list are all there: every one is checked before anything is
    written. A bad one after the first 10,000 left a list half loaded (loading), and the
    corrected call then failed with ListExists."""
    from justonce.lists import LOAD_CHUNK

    items: list[Any] = [*range(3 * LOAD_CHUNK), object()]
    with pytest.raises(InvalidArguments):
        lapp.lists.create("whole", items=items)
    with pytest.raises(ListNotFound):
        lapp.lists.get("whole")
    items[-1] = 1
    info = lapp.lists.create("whole", items=tuple(items))
    assert (info.state, info.progress.total) == ("sealed", 3 * LOAD_CHUNK + 1)
    res = lapp.lists.reserve("whole", 2)
    assert res is not None and [v for _, v in lapp.lists.items(res)] == [0, 1]


def test_a_load_goes_on_only_into_the_list_it_began_with(lapp: App) -> None:
    """A load appends chunk by chunk by name: a list dropped and made again under the name
    during the load got the rest of the load (290,000 of 300,000 items in the new list,
    sealed by the first loader). The rest is refused now (ListNotFound), and the new list
    is left as its maker made it; append and seal take the list's id for loads of several
    calls."""
    from justonce.lists import LOAD_CHUNK

    def stream() -> Any:
        yield from range(LOAD_CHUNK + 5)  # (the list is made with the first chunk)
        lapp.lists.drop("aba")
        lapp.lists.create("aba", items=["B's"], seal=False)
        yield from range(LOAD_CHUNK + 5, 2 * LOAD_CHUNK + 5)

    with pytest.raises(ListNotFound, match="dropped during this load"):
        lapp.lists.create("aba", items=stream())
    info = lapp.lists.get("aba")
    assert (info.state, info.progress.total) == ("loading", 1)
    with pytest.raises(ListNotFound, match="dropped"):
        lapp.lists.append("aba", [1], list_id=info.id + 1)
    with pytest.raises(ListNotFound, match="dropped"):
        lapp.lists.seal("aba", list_id=info.id + 1)
    assert lapp.lists.append("aba", [2, 3], list_id=info.id) == 2
    assert lapp.lists.seal("aba", list_id=info.id).progress.total == 3
    with pytest.raises(InvalidOption):
        lapp.lists.append("aba", [4], list_id=0)


@pytest.mark.parametrize("bad", [object(), "a\ud800b", "a\x00b", float("nan"), "x" * 300_000],
                         ids=["object", "lone-surrogate", "nul", "nan", "oversize"])
def test_a_bad_item_in_the_first_chunk_leaves_no_list_behind(lapp: App, bad: Any) -> None:
    from justonce.lists import LOAD_CHUNK

    for items in ([bad], [1, 2, bad], [*range(LOAD_CHUNK - 1), bad]):
        with pytest.raises(JustonceError):
            lapp.lists.create("refused", items=iter(items))
        with pytest.raises(ListNotFound):
            lapp.lists.get("refused")
    assert [i.name for i in lapp.lists.list()] == []


def test_the_largest_position_a_caller_may_name_is_refused_as_not_held_and_changes_nothing(app: App) -> None:
    """Positions are 0 <= p < 2**63 at every entry; 2**63-1 is never held (no list is that
    long). Refused like any position the reservation does not hold, alone or beside held
    ones, by each ending operation (on Postgres the one-statement completion once sent it
    as the range [2**63-1, 2**63): a bigint overflow and a 500 from the service)."""
    app.lists.create("big-pos", items=range(10))
    reservation = app.lists.reserve("big-pos", 3)
    assert reservation is not None
    for op in (app.lists.complete, app.lists.release, app.lists.bury):
        for positions in ([2**63 - 1], [0, 2**63 - 1]):
            with pytest.raises(PositionNotReserved):
                op(reservation, positions=positions)
    progress = app.lists.progress("big-pos")
    assert (progress.reserved, progress.done, progress.buried) == (3, 0, 0)
    assert app.lists.complete(reservation).completed == 3
