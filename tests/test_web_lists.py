"""Lists over HTTP: a real ``justonce serve --app proc_app:app`` process per backend (one per
module), the whole reserve / touch / complete / release / bury / kick protocol, the stale
token refused with its own problem type, a lost answer replayed with its request id,
parallel ``POST /lists/{name}/next`` requests that each run a distinct position once (the
task writes a ledger row in the server process), bad input that changes nothing, and the
dashboard's Lists pages."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

import proc_app
from justonce import App
from justonce.web import api_lists
from test_web_api import assert_problem, snapshot
from webserver import Server, serving_with_ledger

API = "/api/v1/lists"


@pytest.fixture(scope="module", params=["sqlite", "postgres", "mysql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving_with_ledger(request.param, tmp_path_factory.mktemp("lists"),
                             "--app", "proc_app:app") as s:
        yield s


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def progress(c: httpx.Client, name: str) -> dict[str, int]:
    r = c.get(f"{API}/{name}/progress")
    assert r.status_code == 200, r.text
    return r.json()


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ledger(server: Server, event: str = "list") -> Counter[int]:
    return Counter(n for n, _, _ in proc_app.ledger_rows(server.db_url, event))


# -- loading ------------------------------------------------------------------------------
def test_create_append_as_array_and_as_json_lines_seal_and_read_back(admin: httpx.Client,
                                                                     reader: httpx.Client) -> None:
    name = fresh("load")
    r = admin.post(API, json={"name": name, "ttr": 30, "seal": False, "items": [{"n": 0}, {"n": 1}]})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["state"] == "loading" and made["progress"]["total"] == 2 and made["ttr"] == 30
    r = admin.post(f"{API}/{name}/items", json=[{"n": 2}, [3], "four"])
    assert r.json() == {"appended": 3, "total": 5}
    lines = b'{"n": 5}\n\n6\r\n"seven \\u00e9"\n'
    r = admin.post(f"{API}/{name}/items", content=lines, headers={"content-type": "application/x-ndjson"})
    assert r.json() == {"appended": 3, "total": 8}
    assert_problem(admin.post(f"{API}/{name}/reserve", json={"k": 1}), 409, "ListNotSealed")
    sealed = admin.post(f"{API}/{name}/seal").json()
    assert sealed["state"] == "sealed" and sealed["sealed_at"]
    assert admin.post(f"{API}/{name}/seal").json()["state"] == "sealed"  # again: nothing changes
    assert_problem(admin.post(f"{API}/{name}/items", json=[8]), 409, "ListSealed")
    shown = reader.get(f"{API}/{name}").json()
    assert shown["progress"] == {"total": 8, "ready": 8, "reserved": 0, "done": 0, "buried": 0}
    page = reader.get(f"{API}/{name}/items", params={"start": 0, "limit": 5}).json()
    assert [i["item"] for i in page["items"]] == [{"n": 0}, {"n": 1}, {"n": 2}, [3], "four"]
    assert page["next"] == 5
    rest = reader.get(f"{API}/{name}/items", params={"start": 5}).json()
    assert rest == {"items": [{"position": 5, "item": {"n": 5}}, {"position": 6, "item": 6},
                              {"position": 7, "item": "seven \u00e9"}], "next": None}
    assert name in [x["name"] for x in reader.get(API, params={"limit": 10_000}).json()["lists"]]


def test_post_lists_racing_seals_and_creates_of_its_name_happens_whole_or_not_at_all(
        server: Server, lib: App) -> None:
    """POST /lists committed the list, then loaded its items in another transaction: a seal
    in between sealed and completed the empty list (on_complete enqueued) and the create
    answered 409 ListSealed. Now: one create answers 201 with its items, the other 409
    ListExists, every seal finds no list (404) or the loaded one, and on_complete is
    enqueued only for an empty list, once."""
    for rnd in range(10):
        name, empty = fresh(f"cs{rnd}"), rnd % 3 == 0
        items = [] if empty else list(range(100))
        start = threading.Barrier(5)
        answers: list[tuple[str, httpx.Response]] = []

        def call(what: str, name: str = name, items: list[int] = items, start: threading.Barrier = start,
                 answers: list[tuple[str, httpx.Response]] = answers) -> None:
            with server.client(server.admin) as c:
                start.wait()
                if what == "create":
                    answers.append((what, c.post(API, json={
                        "name": name, "seal": False, "items": items, "on_complete": "proc_app.batch_done"})))
                    return
                for _ in range(400):
                    r = c.post(f"{API}/{name}/seal")
                    if r.status_code != 404:
                        answers.append((what, r))
                        return

        threads = [threading.Thread(target=call, args=(w,)) for w in ["create"] * 2 + ["seal"] * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        creates = sorted(r.status_code for w, r in answers if w == "create")
        assert creates == [201, 409], [(w, r.status_code, r.text[:200]) for w, r in answers]
        refused = [r.json()["error"] for w, r in answers if w == "create" and r.status_code == 409]
        assert refused == ["ListExists"]
        made = next(r.json() for w, r in answers if w == "create" and r.status_code == 201)
        seals = [r for w, r in answers if w == "seal"]
        assert len(seals) == 3 and all(r.status_code == 200 for r in seals), [r.text for r in seals]
        assert {r.json()["progress"]["total"] for r in seals} == {len(items)} == {made["progress"]["total"]}
        info = lib.lists.get(name)
        assert info.state == ("completed" if empty else "sealed") and info.progress.total == len(items)
        done = [j for j in lib.list_jobs(task="proc_app.batch_done", limit=1000)
                if j.kwargs.get("batch", {}).get("description") == f"list:{name}"]
        assert len(done) == (1 if empty else 0)


def test_an_answer_stops_its_items_at_the_size_budget(lib: App) -> None:
    name = fresh("budget")
    lib.lists.create(name, items=["x" * 100] * 300)  # 102 bytes of JSON each
    items, truncated = api_lists._items(lib, name, ((0, 300),), budget=10_000)
    assert truncated and [i.position for i in items] == list(range(98))  # 98 * 102 <= 10,000
    whole, cut = api_lists._items(lib, name, ((0, 10), (20, 50)))
    assert not cut and [i.position for i in whole] == [*range(10), *range(20, 50)]


def _mixed(n_small: int = 64, n_big: int = 100) -> list[Any]:
    """Tiny items first, then items of 250 KB of UTF-8: half ASCII, half 'é' (two bytes a
    character, so a budget counted in characters would pass the bound twice over)."""
    big = ["a" * 250_000 if i % 2 else "\u00e9" * 125_000 for i in range(n_big)]
    return [{"n": i} for i in range(n_small)] + big


def _text_bytes(items: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(i["item"], ensure_ascii=False, separators=(",", ":")).encode())
               for i in items)


def test_an_answer_never_passes_16_mib_of_item_text_whatever_the_mix_of_sizes(
        admin: httpx.Client, reader: httpx.Client, lib: App) -> None:
    """The next page was sized from the average item seen so far and the budget checked only
    after a whole page: 64 tiny items then 100 of 250 KiB gave a 25.6 MB answer with
    items_truncated false, for reserve and for GET items."""
    name = fresh("mixed")
    items = _mixed()
    lib.lists.create(name, items=items)
    bound = api_lists.ANSWER_ITEM_BYTES
    r = admin.post(f"{API}/{name}/reserve", json={"k": 164})
    assert r.status_code == 200 and len(r.content) < bound + 64 * 1024, len(r.content)
    res = r.json()
    got = res["items"]
    assert res["items_truncated"] is True and res["ranges"] == [[0, 164]]
    assert [i["position"] for i in got] == list(range(len(got)))
    assert bound - 262_144 < _text_bytes(got) <= bound
    while len(got) < 164:  # the rest, as the README says, with GET items?start=
        page = reader.get(f"{API}/{name}/items", params={"start": len(got), "limit": 164 - len(got)})
        assert page.status_code == 200 and len(page.content) < bound + 64 * 1024
        assert _text_bytes(page.json()["items"]) <= bound and page.json()["items"]
        got += page.json()["items"]
    assert [i["item"] for i in got] == items and [i["position"] for i in got] == list(range(164))
    assert admin.post(f"{API}/{name}/complete", json={"token": res["token"]}).json()["completed"] == 164
    page = reader.get(f"{API}/{name}/items", params={"limit": 164})
    assert len(page.content) < bound + 64 * 1024 and page.json()["next"] == len(page.json()["items"])


def test_the_database_stops_reading_items_at_the_byte_budget(lib: App) -> None:
    """The budget is the database's: list_items returns the longest prefix of the ranges'
    items whose UTF-8 bytes fit, and nothing of the positions between the ranges."""
    name = fresh("bytes")
    lib.lists.create(name, items=["\u00e9" * 99] * 50)  # 2 + 198 = 200 bytes of JSON each
    store = lib.backend.lists
    assert [p for p, _ in store.items(name, ((0, 50),), 1000)] == [0, 1, 2, 3, 4]
    assert [p for p, _ in store.items(name, ((0, 50),), 999)] == [0, 1, 2, 3]
    assert store.items(name, ((0, 50),), 199) == []
    assert [p for p, _ in store.items(name, ((3, 4), (10, 12), (49, 50)), 10**9)] == [3, 10, 11, 49]
    assert [p for p, _ in store.items(name, ((3, 4), (10, 12), (49, 50)), 600)] == [3, 10, 11]


# -- the reservation protocol -------------------------------------------------------------
def test_reserve_touch_complete_in_parts_until_the_list_completes(admin: httpx.Client, lib: App) -> None:
    name = fresh("proto")
    admin.post(API, json={"name": name, "items": [f"item {i}" for i in range(6)],
                          "on_complete": "proc_app.accept"})
    r = admin.post(f"{API}/{name}/reserve", json={"k": 4, "ttr": 20})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["ranges"] == [[0, 4]] and res["count"] == 4 and res["attempt"] == 1 and res["ttr"] == 20
    assert res["items"] == [{"position": i, "item": f"item {i}"} for i in range(4)]
    assert res["items_truncated"] is False
    token = res["token"]
    bare = admin.post(f"{API}/{name}/reserve", json={"k": 5, "items": False}).json()
    assert bare["ranges"] == [[4, 6]] and bare["items"] is None
    assert admin.post(f"{API}/{name}/reserve", json={"k": 1}).status_code == 204  # all held
    assert progress(admin, name) == {"total": 6, "ready": 0, "reserved": 6, "done": 0, "buried": 0}
    touched = admin.post(f"{API}/{name}/touch", json={"token": token, "ttr": 120}).json()
    assert when(touched["expires_at"]) > when(res["expires_at"])
    part = admin.post(f"{API}/{name}/complete", json={"token": token, "positions": [1, 2]}).json()
    assert part == {"completed": 2, "already": [], "list_completed": False}
    again = admin.post(f"{API}/{name}/complete", json={"token": token, "positions": [2]}).json()
    assert again == {"completed": 0, "already": [2], "list_completed": False}
    assert admin.post(f"{API}/{name}/complete", json={"token": token}).json()["completed"] == 2
    last = admin.post(f"{API}/{name}/complete", json={"token": bare["token"]}).json()
    assert last == {"completed": 2, "already": [], "list_completed": True}
    info = admin.get(f"{API}/{name}").json()
    assert info["state"] == "completed" and info["progress"]["done"] == 6 and info["finished_at"]
    assert len(lib.list_jobs(task="proc_app.accept", limit=100)) == 1  # on_complete, once
    assert admin.post(f"{API}/{name}/reserve", json={"k": 1}).status_code == 204


def test_a_lost_answer_is_replayed_with_the_same_request_id(server: Server, admin: httpx.Client) -> None:
    name = fresh("replay")
    admin.post(API, json={"name": name, "items": list(range(10))})
    first = admin.post(f"{API}/{name}/reserve", json={"k": 3, "request_id": "req-1"}).json()
    # The caller never saw that answer: it asks again, on a new connection, with the same id.
    with server.client(server.admin) as other:
        again = other.post(f"{API}/{name}/reserve", json={"k": 3, "request_id": "req-1"}).json()
    assert again == first
    other_id = admin.post(f"{API}/{name}/reserve", json={"k": 3, "request_id": "req-2"}).json()
    assert other_id["ranges"] == [[3, 6]] and other_id["token"] != first["token"]
    assert progress(admin, name)["reserved"] == 6
    admin.post(f"{API}/{name}/complete", json={"token": first["token"]})
    after = admin.post(f"{API}/{name}/reserve", json={"k": 3, "request_id": "req-1"}).json()
    assert after["token"] == first["token"] and after["ranges"] == first["ranges"]
    assert progress(admin, name) == {"total": 10, "ready": 4, "reserved": 3, "done": 3, "buried": 0}


def test_a_stale_token_is_refused_with_its_own_problem_and_changes_nothing(
        admin: httpx.Client, lib: App) -> None:
    name = fresh("stale")
    admin.post(API, json={"name": name, "items": list(range(4))})
    short = admin.post(f"{API}/{name}/reserve", json={"k": 2, "ttr": 0.3}).json()
    time.sleep(0.8)  # its time to run passes (by the database's clock)
    before = (progress(admin, name), snapshot(lib))
    for path, body in (("complete", {"token": short["token"]}), ("touch", {"token": short["token"]}),
                       ("release", {"token": short["token"]}), ("bury", {"token": short["token"]}),
                       ("complete", {"token": "1.0000000000000000"}),
                       ("complete", {"token": "not a token"})):
        problem = assert_problem(admin.post(f"{API}/{name}/{path}", json=body), 409, "StaleReservation")
        assert problem["type"] == "/problems/StaleReservation" and problem["detail"]
    assert (progress(admin, name), snapshot(lib)) == before
    # The timed-out positions come back first, to someone else, whose token works.
    taken = admin.post(f"{API}/{name}/reserve", json={"k": 2}).json()
    assert taken["ranges"] == short["ranges"] and taken["attempt"] == 2
    released = admin.post(f"{API}/{name}/release", json={"token": taken["token"]}).json()
    assert released == {"released": 2}
    assert_problem(admin.post(f"{API}/{name}/complete", json={"token": taken["token"]}), 409,
                   "StaleReservation")


def test_positions_outside_the_reservation_are_refused_and_change_nothing(admin: httpx.Client) -> None:
    name = fresh("outside")
    admin.post(API, json={"name": name, "items": list(range(6))})
    token = admin.post(f"{API}/{name}/reserve", json={"k": 2}).json()["token"]
    before = progress(admin, name)
    for path in ("complete", "release", "bury"):
        body = assert_problem(admin.post(f"{API}/{name}/{path}", json={"token": token, "positions": [0, 5]}),
                              409, "PositionNotReserved")
        assert "position 5" in body["detail"]
    assert progress(admin, name) == before


def test_release_with_a_delay_bury_list_buried_and_kick(admin: httpx.Client, reader: httpx.Client) -> None:
    name = fresh("bury")
    admin.post(API, json={"name": name, "items": list(range(5))})
    token = admin.post(f"{API}/{name}/reserve", json={"k": 5}).json()["token"]
    assert admin.post(f"{API}/{name}/release", json={"token": token, "positions": [0],
                                                     "delay": 60}).json() == {"released": 1}
    assert admin.post(f"{API}/{name}/bury", json={"token": token, "positions": [1, 2],
                                                  "reason": "poison <b>"}).json() == {"buried": 2}
    assert admin.post(f"{API}/{name}/bury", json={"token": token, "positions": [4]}).json() == {"buried": 1}
    assert progress(admin, name) == {"total": 5, "ready": 1, "reserved": 1, "done": 0, "buried": 3}
    buried = reader.get(f"{API}/{name}/buried").json()["buried"]
    assert [(b["ranges"], b["reason"]) for b in buried] == [([[1, 3]], "poison <b>"), ([[4, 5]], None)]
    assert admin.post(f"{API}/{name}/reserve", json={"k": 5}).status_code == 204  # 0 waits 60 s
    # Oldest first; a buried range goes back whole (the first one even past the limit).
    assert admin.post(f"{API}/{name}/kick", json={"limit": 2}).json() == {"kicked": 2}
    again = admin.post(f"{API}/{name}/reserve", json={"k": 5}).json()
    assert again["ranges"] == [[1, 3]] and again["attempt"] == 1  # attempts counted afresh
    assert admin.post(f"{API}/{name}/kick").json() == {"kicked": 1}  # the body is optional
    assert progress(admin, name)["buried"] == 0


# -- next: the task runs in the request -----------------------------------------------------
def test_next_runs_the_lists_task_and_answers_with_its_result(server: Server, admin: httpx.Client,
                                                              lib: App) -> None:
    name = fresh("next")
    admin.post(API, json={"name": name, "task": "proc_app.list_item", "items": [10, 11, 12],
                          "on_complete": "proc_app.accept"})
    runs = [admin.post(f"{API}/{name}/next").json() for _ in range(3)]
    assert [(r["position"], r["item"], r["outcome"], r["result"]) for r in runs] == [
        (0, 10, "completed", 20), (1, 11, "completed", 22), (2, 12, "completed", 24)]
    assert [r["list_completed"] for r in runs] == [False, False, True]
    assert admin.post(f"{API}/{name}/next", json={"ttr": 5}).status_code == 204
    assert all(ledger(server)[n] == 1 for n in (10, 11, 12))
    assert admin.get(f"{API}/{name}").json()["state"] == "completed"
    entries = admin.get("/api/v1/audit", params={"limit": 3}).json()["entries"]
    assert [e["action"] for e in entries] == ["list.next"] * 3


def test_next_answers_200_with_what_a_job_keeps_of_any_return_value(server: Server,
                                                                   admin: httpx.Client) -> None:
    """A task returning object(), bytes, a lone surrogate or 3,000-deep lists had its position
    completed, then the answer failed to serialise (400); NaN became null silently and a
    20 MB result came back whole."""
    from test_lists import ODD

    for kind, (want, note) in sorted(ODD.items()):
        name = fresh(f"odd-{kind.replace('_', '-')}")
        admin.post(API, json={"name": name, "task": "proc_app.list_odd_return", "items": [kind]})
        r = admin.post(f"{API}/{name}/next")
        assert r.status_code == 200 and len(r.content) < 70_000, (kind, r.status_code, r.text[:300])
        run = r.json()
        assert (run["outcome"], run["list_completed"], run["result"]) == ("completed", True, want), kind
        assert (run["note"] or "").startswith(note) if note else run["note"] is None, (kind, run)
        assert admin.get(f"{API}/{name}").json()["state"] == "completed"


def test_a_failing_item_is_released_then_buried_and_its_reason_kept(server: Server,
                                                                    admin: httpx.Client) -> None:
    name = fresh("fails")
    admin.post(API, json={"name": name, "task": "proc_app.list_odd_fails", "items": [7]})
    first = admin.post(f"{API}/{name}/next").json()
    assert (first["outcome"], first["attempt"], first["error"]) == ("released", 1, "ValueError: odd item 7")
    deadline = time.monotonic() + 10
    while (r := admin.post(f"{API}/{name}/next")).status_code == 204 and time.monotonic() < deadline:
        time.sleep(0.05)  # its backoff
    second = r.json()
    assert (second["outcome"], second["attempt"]) == ("buried", 2)
    buried = admin.get(f"{API}/{name}/buried").json()["buried"]
    assert buried[0]["ranges"] == [[0, 1]] and "odd item 7" in buried[0]["reason"]
    assert admin.post(f"{API}/{name}/next").status_code == 204


def test_parallel_next_requests_each_run_a_distinct_position_exactly_once(server: Server,
                                                                         admin: httpx.Client) -> None:
    n, threads = 240, 8
    name = fresh("parallel")
    items = list(range(100_000, 100_000 + n))
    admin.post(API, json={"name": name, "task": "proc_app.list_item", "items": items})
    seen: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def consume() -> None:
        with server.client(server.admin) as c:
            start.wait(30)
            while True:
                r = c.post(f"{API}/{name}/next")
                if r.status_code == 204:
                    return
                with lock:
                    if r.status_code != 200:
                        errors.append(r.text)
                        return
                    seen.append(r.json())

    pool = [threading.Thread(target=consume) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(300)
    assert not errors, errors[:3]
    positions = [r["position"] for r in seen]
    assert sorted(positions) == list(range(n)), "every position once, none twice"
    assert all(r["outcome"] == "completed" and r["item"] == items[r["position"]] for r in seen)
    assert sum(r["list_completed"] for r in seen) == 1
    runs = ledger(server)
    assert all(runs[x] == 1 for x in items), "the task ran once per item"
    assert progress(admin, name) == {"total": n, "ready": 0, "reserved": 0, "done": n, "buried": 0}


# -- who may, and bad input -----------------------------------------------------------------
def test_reads_need_a_token_and_changes_need_an_admin_token(server: Server, admin: httpx.Client,
                                                           reader: httpx.Client, lib: App) -> None:
    name = fresh("scopes")
    admin.post(API, json={"name": name, "task": "proc_app.list_item", "items": [1, 2]})
    token = admin.post(f"{API}/{name}/reserve", json={"k": 1}).json()["token"]
    for path in (API, f"{API}/{name}", f"{API}/{name}/progress", f"{API}/{name}/buried",
                 f"{API}/{name}/items"):
        assert reader.get(path).status_code == 200
        with server.client() as anon:
            assert_problem(anon.get(path), 401, "Unauthorized")
    before = (progress(admin, name), snapshot(lib))
    for path, body in ((API, {"name": fresh("nope")}), (f"{API}/{name}/items", [3]),
                       (f"{API}/{name}/seal", None), (f"{API}/{name}/reserve", {"k": 1}),
                       (f"{API}/{name}/touch", {"token": token}), (f"{API}/{name}/complete", {"token": token}),
                       (f"{API}/{name}/release", {"token": token}), (f"{API}/{name}/bury", {"token": token}),
                       (f"{API}/{name}/kick", {}), (f"{API}/{name}/next", {})):
        assert_problem(reader.post(path, json=body), 403, "Forbidden")
        with server.client() as anon:
            assert_problem(anon.post(path, json=body), 401, "Unauthorized")
    assert (progress(admin, name), snapshot(lib)) == before


def test_bad_input_is_a_typed_problem_and_changes_nothing(admin: httpx.Client, lib: App) -> None:
    name, loading, bare = fresh("bad"), fresh("loading"), fresh("bare")
    admin.post(API, json={"name": name, "items": [1, 2, 3]})
    admin.post(API, json={"name": loading, "seal": False})
    admin.post(API, json={"name": bare, "items": [1]})
    token = admin.post(f"{API}/{name}/reserve", json={"k": 1}).json()["token"]
    before = snapshot(lib)
    nd = {"content-type": "application/x-ndjson"}
    cases: list[tuple[httpx.Response, int, str]] = [
        (admin.post(f"{API}/{name}/reserve", json={"k": 0}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/reserve", json={"k": 10_001}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/reserve", json={"k": "2"}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/reserve", json={"k": 1, "ttr": 0}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/reserve", json={"k": 1, "request_id": ""}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/reserve", json={"k": 1, "request_id": "\u0000"}), 422, "InvalidOption"),
        (admin.post(f"{API}/nowhere/reserve", json={"k": 1}), 404, "ListNotFound"),
        (admin.post(f"{API}/{loading}/reserve", json={"k": 1}), 409, "ListNotSealed"),
        (admin.post(f"{API}/{name}/items", json=[4]), 409, "ListSealed"),
        (admin.post(API, json={"name": name}), 409, "ListExists"),
        (admin.post(API, json={"name": "bad name!"}), 422, "InvalidName"),
        (admin.post(API, json={"name": fresh("x"), "task": "no way"}), 422, "InvalidName"),
        (admin.post(API, json={"name": fresh("x"), "items": ["x" * 300_000]}), 413, "PayloadTooLarge"),
        (admin.post(API, json={"name": fresh("x"), "items": [1, ["\u0000"]]}), 422, "InvalidArguments"),
        (admin.post(f"{API}/{loading}/items", json=[1, "x" * 300_000]), 413, "PayloadTooLarge"),
        (admin.post(f"{API}/{loading}/items", content=b"[" * 70 + b"]" * 70,
                    headers={"content-type": "application/json"}), 422, "InvalidArguments"),
        (admin.post(f"{API}/{loading}/items", json=[]), 422, "RequestValidation"),
        (admin.post(f"{API}/{loading}/items", json={"items": [1]}), 422, "RequestValidation"),
        (admin.post(f"{API}/{loading}/items", content=b"1\n[2\n3\n", headers=nd), 400, "MalformedJson"),
        (admin.post(f"{API}/{loading}/items", content=b"[1", headers={"content-type": "application/json"}),
         400, "MalformedJson"),
        (admin.post(f"{API}/{loading}/items", content=b"1", headers={"content-type": "text/csv"}), 415,
         "UnsupportedMediaType"),
        (admin.post(f"{API}/{name}/complete", json={"token": token, "positions": [-1]}), 422,
         "RequestValidation"),
        (admin.post(f"{API}/{name}/complete", json={"token": token, "positions": [2**64]}), 422,
         "RequestValidation"),
        (admin.post(f"{API}/{name}/release", json={"token": token, "delay": -1}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/bury", json={"token": token, "reason": 7}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/kick", json={"limit": 0}), 422, "RequestValidation"),
        (admin.post(f"{API}/{name}/next"), 422, "InvalidOption"),  # a list without a task
        (admin.get(f"{API}/bad name"), 422, "InvalidName"),
        (admin.get(f"{API}/{name}/items", params={"start": -1}), 422, "RequestValidation"),
    ]
    for r, status, error in cases:
        body = assert_problem(r, status, error)
        assert body["detail"], body
    assert "line 2" in cases[18][0].json()["detail"]
    assert snapshot(lib) == before


def test_the_openapi_document_describes_the_list_routes(server: Server) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    for path in ("", "/{name}", "/{name}/items", "/{name}/seal", "/{name}/reserve", "/{name}/touch",
                 "/{name}/complete", "/{name}/release", "/{name}/bury", "/{name}/kick", "/{name}/next",
                 "/{name}/progress", "/{name}/buried"):
        assert f"/api/v1/lists{path}" in doc["paths"], path
    reserve = doc["paths"]["/api/v1/lists/{name}/reserve"]["post"]["responses"]
    assert "204" in reserve and "409" in reserve
    append = doc["paths"]["/api/v1/lists/{name}/items"]["post"]["requestBody"]["content"]
    assert set(append) == {"application/json", "application/x-ndjson", "application/jsonl",
                           "application/json-lines"}
    assert "415" in doc["paths"]["/api/v1/lists/{name}/items"]["post"]["responses"]


# -- the dashboard ------------------------------------------------------------------------
def test_the_dashboard_shows_each_lists_progress_and_kicks_with_its_csrf_token(
        server: Server, admin: httpx.Client, lib: App, tmp_path: Path) -> None:
    name = fresh("dash")
    admin.post(API, json={"name": name, "items": list(range(10))})
    token = admin.post(f"{API}/{name}/reserve", json={"k": 6}).json()["token"]
    admin.post(f"{API}/{name}/complete", json={"token": token, "positions": [0, 1, 2]})
    admin.post(f"{API}/{name}/bury", json={"token": token, "positions": [3, 4],
                                           "reason": "<script>alert(1)</script>"})
    with server.client() as browser:
        assert browser.post("/signin", data={"token": server.admin}).status_code == 303
        csrf = browser.cookies["justonce_csrf"]
        page = browser.get("/lists")
        assert page.status_code == 200 and f'data-list="{name}"' in page.text
        assert f'aria-valuenow="3" data-list="{name}"' in page.text
        assert 'title="3 done, 1 reserved, 2 buried, 4 ready of 10"' in page.text
        assert browser.get("/live/lists").status_code == 200
        detail = browser.get(f"/lists/{name}")
        assert "3–4" in detail.text and "&lt;script&gt;" in detail.text and "<script>alert" not in detail.text
        assert f'action="/lists/{name}/kick"' in detail.text
        assert browser.get(f"/live/lists/{name}").status_code == 200
        assert browser.get("/lists/no-such-list").status_code == 404
        assert browser.post(f"/lists/{name}/kick", data={"csrf": "forged"}).status_code == 403
        assert progress(admin, name)["buried"] == 2
        kicked = browser.post(f"/lists/{name}/kick", data={"csrf": csrf})
        assert kicked.status_code == 303 and kicked.headers["location"] == f"/lists/{name}?ok=kicked&n=2"
        assert "Kicked 2 buried positions" in browser.get(kicked.headers["location"]).text
    assert progress(admin, name)["buried"] == 0
    entry = admin.get("/api/v1/audit", params={"limit": 1}).json()["entries"][0]
    assert (entry["action"], entry["count"], entry["detail"]) == ("list.kick", 2, {"via": "dashboard"})
    with server.client() as browser:
        browser.post("/signin", data={"token": server.reader})
        page = browser.get(f"/lists/{name}")
        assert page.status_code == 200 and "/kick" not in page.text  # a read token has no buttons


def test_the_audit_names_reservations_but_never_their_secrets(admin: httpx.Client) -> None:
    name = fresh("audit")
    admin.post(API, json={"name": name, "items": [1]})
    res = admin.post(f"{API}/{name}/reserve", json={"k": 1, "request_id": "a-1"}).json()
    admin.post(f"{API}/{name}/complete", json={"token": res["token"]})
    entries = admin.get("/api/v1/audit", params={"limit": 3}).json()["entries"]
    assert [e["action"] for e in entries] == ["list.complete", "list.reserve", "list.create"]
    rid = int(res["token"].split(".")[0])
    assert entries[0]["detail"]["reservation"] == rid and entries[1]["detail"]["request_id"] == "a-1"
    secret = res["token"].split(".")[1]
    assert all(secret not in str(e) for e in entries)
