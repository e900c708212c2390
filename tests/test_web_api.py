"""The JSON API over real HTTP: a real ``justonce serve`` process per backend (one per
module), a keep-alive client, and every class of bad input answered with a clear 4xx
problem document that changes nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from conftest import _drop_schema, mysql_database, mysql_or_skip, postgres_or_skip
from justonce import App
from webserver import Server, justonce, serving


@pytest.fixture(scope="module", params=["sqlite", "postgres", "mysql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve")
    if request.param == "sqlite":
        with serving(f"sqlite:///{folder / 'jobs.db'}", folder / "serve.log") as s:
            yield s
        return
    if request.param == "mysql":
        with mysql_database(mysql_or_skip()) as url, serving(url, folder / "serve.log") as s:
            yield s
        return
    base = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with serving(f"{base}{'&' if '?' in base else '?'}schema={schema}", folder / "serve.log") as s:
        yield s
    _drop_schema(base, schema)


def snapshot(lib: App) -> Any:
    """What a refused request must leave as it was."""
    return (sorted((c.queue, c.state.value, c.count) for c in lib.queue_counts()),
            [(b.id, b.state.value, b.total, b.acked, b.failed) for b in lib.batches.list(limit=1000)],
            [(x.name, x.state, x.progress) for x in lib.lists.list(10_000)],
            len(lib.audit.list(limit=10_000)))


def assert_problem(r: httpx.Response, status: int, error: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["status"] == status and body["error"] == error and body["type"] == f"/problems/{error}"
    assert body["title"] and "Traceback" not in r.text
    return body


def test_a_service_started_before_migrate_says_so_answers_503_then_serves(db_url: str, tmp_path: Path) -> None:
    """Like a worker, the service may start before ``justonce migrate`` (a deploy's order):
    it says so at its start, answers 503 SchemaError meanwhile (not a 401 that blames the
    token), and serves once the tables are there. The embedded SQLite file migrates itself."""
    fake = "jo_00000000_" + "A" * 43
    with serving(db_url, tmp_path / "serve.log", migrate=False) as s, s.client(fake) as client:
        said = (tmp_path / "serve.log").read_text()
        if db_url.startswith("sqlite"):
            assert "schema" not in said, said
        else:
            assert "this version needs" in said and "justonce migrate" in said, said
            body = assert_problem(client.get("/api/v1/queues"), 503, "SchemaError")
            assert "justonce migrate" in body["detail"], body
            justonce("migrate", "--database-url", db_url)
        assert_problem(client.get("/api/v1/queues"), 401, "Unauthorized")
        admin = justonce("tokens", "create", "--name", "late admin", "--scope", "admin",
                         "--database-url", db_url).stdout.strip()
        with s.client(admin) as ok:
            assert ok.get("/api/v1/queues").status_code == 200


def test_serve_names_its_database_without_the_password(tmp_path: Path) -> None:
    """Its first line named the whole URL but its options: the password with it."""
    server = postgres_or_skip()
    parts = urlsplit(server)
    secret = parts.password or "SECRETPW"  # (a server that trusts its clients ignores it)
    netloc = f"{parts.username or 'postgres'}:{secret}@{parts.netloc.rsplit('@', 1)[-1]}"
    with serving(urlunsplit(parts._replace(netloc=netloc)), tmp_path / "serve.log", migrate=False):
        said = (tmp_path / "serve.log").read_text()
    assert "justonce serving postgresql://" in said and ":***@" in said, said
    assert secret not in said, said


def test_serve_refuses_a_host_python_cannot_encode_before_it_starts(tmp_path: Path) -> None:
    """The idna codec's UnicodeError (an empty label) came out of uvicorn as a traceback."""
    r = justonce("serve", "--host", "a..b", "--database-url", f"sqlite:///{tmp_path / 'x.db'}", ok=False)
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--host" in lines[-1] and "is not a host name" in lines[-1], lines
    assert not (tmp_path / "x.db").exists()  # (refused before it opened the database)


# -- bad input: a clear 4xx, nothing changed ----------------------------------------------
def test_bad_credentials_and_scopes_are_refused_and_change_nothing(server: Server, lib: App,
                                                                    reader: httpx.Client) -> None:
    before = snapshot(lib)
    job = {"task": "mail.send", "args": [1]}
    with server.client() as anon:
        assert_problem(anon.post("/api/v1/jobs", json=job), 401, "Unauthorized")
        assert_problem(anon.get("/api/v1/jobs"), 401, "Unauthorized")
        assert_problem(anon.post("/api/v1/jobs", json=job, headers={"Authorization": "Basic eDp5"}),
                       401, "Unauthorized")
    fake = "jo_00000000_" + "A" * 43
    with server.client(fake) as wrong:
        r = wrong.post("/api/v1/jobs", json=job)
        assert_problem(r, 401, "Unauthorized")
        assert r.headers["www-authenticate"].startswith("Bearer")
    with server.client(server.admin[:-1] + ("B" if server.admin[-1] != "B" else "C")) as near:
        assert_problem(near.post("/api/v1/jobs", json=job), 401, "Unauthorized")
    body = assert_problem(reader.post("/api/v1/jobs", json=job), 403, "Forbidden")
    assert "read scope" in body["detail"]
    assert_problem(reader.post("/api/v1/jobs/actions/apply",
                               json={"action": "cancel", "expected": 0}), 403, "Forbidden")
    assert snapshot(lib) == before


def test_a_revoked_token_stops_working_at_once(server: Server, lib: App) -> None:
    secret = justonce("tokens", "create", "--name", "short-lived", "--scope", "admin",
                      "--database-url", server.db_url).stdout.strip()
    with server.client(secret) as c:
        assert c.get("/api/v1/queues").status_code == 200
        token_id = next(t.id for t in lib.tokens.list() if t.name == "short-lived")
        justonce("tokens", "revoke", str(token_id), "--database-url", server.db_url)
        before = snapshot(lib)
        assert_problem(c.post("/api/v1/jobs", json={"task": "x"}), 401, "Unauthorized")
        assert snapshot(lib) == before
    listing = justonce("tokens", "list", "--database-url", server.db_url).stdout
    assert secret[3:11] in listing and secret[12:] not in listing  # the prefix, never the secret


def test_malformed_oversize_and_mistyped_bodies_are_refused_and_change_nothing(
        lib: App, admin: httpx.Client) -> None:
    before = snapshot(lib)
    headers = {"content-type": "application/json"}
    assert_problem(admin.post("/api/v1/jobs", content=b'{"task": ', headers=headers), 400, "MalformedJson")
    assert_problem(admin.post("/api/v1/jobs/bulk", content=b"\xff\xfe", headers=headers), 400,
                   "MalformedJson")
    big = b'{"ids": ["' + b"x" * (9 * 1024 * 1024) + b'"]}'
    assert_problem(admin.post("/api/v1/batches/acks", content=big, headers=headers), 413, "BodyTooLarge")
    for bad in ({"task": 7}, {"task": "t", "args": "not a list"}, {"task": "t", "priority": "high"},
                {"task": "t", "delay": -1}, {"task": "t", "unknown": 1}, {}):
        body = assert_problem(admin.post("/api/v1/jobs", json=bad), 422, "RequestValidation")
        assert body["errors"] and body["detail"]
    assert_problem(admin.post("/api/v1/jobs", json={"task": "bad name!"}), 422, "InvalidName")
    assert_problem(admin.post("/api/v1/jobs", json={"task": "t", "queue": "x" * 500}), 422, "InvalidName")
    assert_problem(admin.post("/api/v1/jobs/bulk", json={"jobs": [{"task": "ok"}, {"task": "no way"}]}),
                   422, "InvalidName")
    assert_problem(admin.get("/api/v1/jobs", params={"state": "sleeping"}), 422, "RequestValidation")
    assert_problem(admin.get("/api/v1/jobs/abc"), 422, "RequestValidation")
    assert_problem(admin.get("/api/v1/jobs", params={"created_after": "2024-01-01T00:00:00"}), 422,
                   "RequestValidation")  # a time without its zone is ambiguous
    assert snapshot(lib) == before


def test_unknown_ids_and_routes_are_404_and_change_nothing(lib: App, admin: httpx.Client) -> None:
    before = snapshot(lib)
    assert_problem(admin.get("/api/v1/jobs/999999999"), 404, "JobNotFound")
    assert_problem(admin.post("/api/v1/jobs/999999999/cancel"), 404, "JobNotFound")
    assert_problem(admin.post("/api/v1/jobs/999999999/retry"), 404, "JobNotFound")
    assert_problem(admin.get("/api/v1/batches/999999999"), 404, "BatchNotFound")
    assert_problem(admin.post("/api/v1/batches/999999999/groups", json={"count": 3}), 404, "BatchNotFound")
    assert_problem(admin.post("/api/v1/batches/999999999/seal"), 404, "BatchNotFound")
    assert_problem(admin.post("/api/v1/effects/resolve", json={"scope": "s", "key": "k", "done": True}),
                   404, "EffectNotFound")
    assert_problem(admin.get("/api/v1/nothing-here"), 404, "NotFound")
    assert_problem(admin.delete("/api/v1/jobs"), 405, "MethodNotAllowed")
    assert snapshot(lib) == before


def test_forged_and_malformed_batch_item_ids_refuse_the_whole_ack(lib: App, admin: httpx.Client) -> None:
    batch = admin.post("/api/v1/batches", json={"description": "forgery"}).json()
    group = admin.post(f"/api/v1/batches/{batch['id']}/groups", json={"count": 4}).json()
    good = f"{batch['id']}:{group['group']}:0"
    before = snapshot(lib)
    for forged, error in ((f"{batch['id']}:000000000000:0", "ItemNotFound"),
                          (f"{batch['id']}:{group['group']}:4", "ItemNotFound"),
                          ("999999:abcdefabcdef:0", "BatchNotFound"),
                          ("not-an-id", "InvalidItemId"),
                          (f"{batch['id']}:{group['group']}:-1", "InvalidItemId")):
        r = admin.post("/api/v1/batches/acks", json={"ids": [good, forged]})
        assert 400 <= r.status_code < 500
        assert_problem(r, r.status_code, error)
    assert_problem(admin.post("/api/v1/batches/acks", json={"ids": []}), 422, "RequestValidation")
    assert snapshot(lib) == before
    assert lib.batches.get(batch["id"]).acked == 0


# -- happy paths ------------------------------------------------------------------------
def test_enqueue_one_bulk_and_keyed_then_read_them_back(admin: httpx.Client) -> None:
    r = admin.post("/api/v1/jobs", json={"task": "mail.send", "args": [1], "kwargs": {"to": "a"},
                                         "queue": "mail", "priority": 3, "delay": 60})
    assert r.status_code == 201
    job = r.json()
    assert job["state"] == "scheduled" and job["queue"] == "mail" and job["priority"] == 3
    got = admin.get(f"/api/v1/jobs/{job['id']}").json()
    assert got["kwargs"] == {"to": "a"} and got["errors"] == []
    r1 = admin.post("/api/v1/jobs", json={"task": "report", "key": "daily-1"})
    r2 = admin.post("/api/v1/jobs", json={"task": "report", "key": "daily-1"})
    k1, k2 = r1.json(), r2.json()
    assert k2["id"] == k1["id"] and k2["duplicate"] and not k1["duplicate"]
    assert (r1.status_code, r2.status_code) == (201, 200)  # (the second created nothing)
    bulk = admin.post("/api/v1/jobs/bulk", json={"jobs": [{"task": "bulk.t", "args": [i], "queue": "bulk"}
                                                          for i in range(500)]})
    assert bulk.status_code == 201
    ids = bulk.json()["ids"]
    assert len(ids) == len(set(ids)) == 500
    assert admin.get(f"/api/v1/jobs/{ids[123]}").json()["args"] == [123]
    assert admin.get("/api/v1/audit", params={"limit": 1}).json()["entries"][0]["count"] == 500
    # Keys a live job holds, and a key twice in one call: the audit counts the new jobs only.
    mixed = admin.post("/api/v1/jobs/bulk", json={"jobs": [
        {"task": "report", "key": "daily-1"}, {"task": "report", "key": "daily-2", "args": [1]},
        {"task": "report", "key": "daily-2", "args": [2]}]}).json()["ids"]
    assert mixed[0] == k1["id"] and mixed[1] == mixed[2] != k1["id"]
    entry = admin.get("/api/v1/audit", params={"limit": 1}).json()["entries"][0]
    assert (entry["action"], entry["count"]) == ("jobs.enqueue_bulk", 1)


def test_list_pages_with_a_cursor_and_filters(admin: httpx.Client) -> None:
    start = datetime.now(UTC) - timedelta(seconds=1)
    ids = admin.post("/api/v1/jobs/bulk", json={"jobs": [{"task": "page.t", "args": [i], "queue": "paged"}
                                                         for i in range(25)]}).json()["ids"]
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"queue": "paged", "limit": 10}
        if cursor:
            params["cursor"] = cursor
        page = admin.get("/api/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)
    only = admin.get("/api/v1/jobs", params={"task": "page.t", "state": "ready",
                                             "created_after": start.isoformat(), "limit": 1000}).json()
    assert {j["id"] for j in only["jobs"]} == set(ids)
    none = admin.get("/api/v1/jobs", params={"queue": "paged", "created_before": start.isoformat()}).json()
    assert none == {"jobs": [], "next_cursor": None}
    queues = {q["queue"]: q for q in admin.get("/api/v1/queues").json()["queues"]}
    assert queues["paged"]["counts"]["ready"] == 25 and queues["paged"]["oldest_ready_age"] >= 0
    assert queues["paged"]["estimated"] is False


def test_cancel_and_retry_one_job_are_audited(admin: httpx.Client, lib: App) -> None:
    job = admin.post("/api/v1/jobs", json={"task": "one.t"}).json()
    assert admin.post(f"/api/v1/jobs/{job['id']}/cancel").json()["state"] == "cancelled"
    assert_problem(admin.post(f"/api/v1/jobs/{job['id']}/cancel"), 409, "InvalidTransition")
    assert admin.post(f"/api/v1/jobs/{job['id']}/retry").json()["state"] == "ready"
    entries = admin.get("/api/v1/audit", params={"limit": 5}).json()["entries"]
    assert [e["action"] for e in entries[:2]] == ["job.retry", "job.cancel"]
    assert entries[0]["actor"] == "test admin" and entries[0]["target"] == f"job:{job['id']}"


def test_a_queue_paused_over_http_is_shown_skipped_and_resumed_and_audited(
        admin: httpx.Client, reader: httpx.Client, lib: App) -> None:
    job = admin.post("/api/v1/jobs", json={"task": "pause.t", "queue": "held"}).json()
    before = snapshot(lib)
    assert_problem(reader.post("/api/v1/queues/held/pause"), 403, "Forbidden")
    assert_problem(admin.post("/api/v1/queues/held/pause", json={"note": "\u0000"}), 422, "InvalidOption")
    assert_problem(admin.post("/api/v1/queues/held%20q/pause"), 422, "InvalidName")
    assert snapshot(lib) == before and lib.paused_queues() == []
    r = admin.post("/api/v1/queues/held/pause", json={"note": "mail server down"})
    assert r.status_code == 200, r.text
    pause = r.json()
    assert (pause["queue"], pause["note"], pause["actor"], pause.pop("already")) == (
        "held", "mail server down", "test admin", False)
    again = admin.post("/api/v1/queues/held/pause").json()
    assert again.pop("already") is True and again == pause  # the first pause stays
    queues = {q["queue"]: q for q in reader.get("/api/v1/queues").json()["queues"]}
    assert queues["held"]["paused"] == pause and queues["held"]["counts"]["ready"] == 1
    assert all(q["paused"] is None for name, q in queues.items() if name != "held")
    assert lib.backend.job_claim("held", 10, "http-test", 30) == []
    assert admin.post("/api/v1/queues/held/resume").json() == {"queue": "held", "resumed": True}
    assert admin.post("/api/v1/queues/held/resume").json() == {"queue": "held", "resumed": False}
    assert [j.id for j in lib.backend.job_claim("held", 10, "http-test", 30)] == [job["id"]]
    entries = admin.get("/api/v1/audit", params={"limit": 4}).json()["entries"]
    assert [e["action"] for e in entries] == ["queue.resume", "queue.resume", "queue.pause", "queue.pause"]
    assert {e["target"] for e in entries} == {"queue:held"}
    assert [e["detail"] for e in entries] == [{"resumed": False}, {"resumed": True}, {"already": True},
                                              {"already": False}]


def test_preview_then_apply_to_all_matching_counts_and_audits(admin: httpx.Client, reader: httpx.Client,
                                                              lib: App) -> None:
    ids = admin.post("/api/v1/jobs/bulk", json={"jobs": [{"task": "sweep.t", "queue": "sweep"}
                                                         for _ in range(2500)]}).json()["ids"]
    flt = {"queue": "sweep"}
    preview = reader.post("/api/v1/jobs/actions/preview", json={"action": "cancel", "filter": flt}).json()
    assert preview["count"] == 2500 and preview["max_id"] == max(ids)
    admin.post("/api/v1/jobs", json={"task": "sweep.t", "queue": "sweep"})  # after the preview
    before = snapshot(lib)
    assert_problem(admin.post("/api/v1/jobs/actions/apply", json={
        "action": "cancel", "filter": flt, "expected": 2000}), 409, "CountChanged")
    assert snapshot(lib) == before
    done = admin.post("/api/v1/jobs/actions/apply", json={
        "action": "cancel", "filter": flt, "max_id": preview["max_id"], "expected": 2500}).json()
    assert done == {"action": "cancel", "previewed": 2500, "applied": 2500}
    counts = {q["queue"]: q["counts"] for q in admin.get("/api/v1/queues").json()["queues"]}["sweep"]
    assert counts == {"cancelled": 2500, "ready": 1}  # the job made after the preview is left alone
    retry = reader.post("/api/v1/jobs/actions/preview", json={"action": "retry", "filter": flt}).json()
    assert retry["count"] == 2500
    again = admin.post("/api/v1/jobs/actions/apply", json={
        "action": "retry", "filter": flt, "max_id": retry["max_id"], "expected": 2500}).json()
    assert again["applied"] == 2500
    # One audit row per chunk of 1,000, committed with it (newest first).
    entries = admin.get("/api/v1/audit", params={"limit": 6}).json()["entries"]
    assert [(e["action"], e["count"], e["detail"]["chunk"]) for e in entries] == [
        ("jobs.retry_matching", 500, 3), ("jobs.retry_matching", 1000, 2), ("jobs.retry_matching", 1000, 1),
        ("jobs.cancel_matching", 500, 3), ("jobs.cancel_matching", 1000, 2), ("jobs.cancel_matching", 1000, 1)]
    assert {e["detail"]["filter"]["queue"] for e in entries} == {"sweep"}
    assert_problem(admin.post("/api/v1/jobs/actions/preview", json={
        "action": "retry", "filter": {"state": "ready"}}), 422, "InvalidOption")


def test_a_batch_built_client_side_completes_once_with_bulk_acks(admin: httpx.Client, lib: App) -> None:
    batch = admin.post("/api/v1/batches", json={"description": "fan-out"}).json()
    assert batch["state"] == "open"
    group = admin.post(f"/api/v1/batches/{batch['id']}/groups", json={"count": 3000}).json()
    ids = [f"{batch['id']}:{group['group']}:{i}" for i in range(group["count"])]
    assert group["first_id"] == ids[0]
    t0 = time.perf_counter()
    first = admin.post("/api/v1/batches/acks", json={"ids": ids[:1000]}).json()
    assert time.perf_counter() - t0 < 5
    assert first == {"resolved": 1000, "already": [], "completed": []}
    again = admin.post("/api/v1/batches/acks", json={"ids": ids[:2]}).json()
    assert again["resolved"] == 0 and again["already"] == ids[:2]
    admin.post("/api/v1/batches/acks", json={"ids": ids[1000:2999]})
    failed = admin.post("/api/v1/batches/fails", json={"ids": [ids[2999]], "reason": "bounced"}).json()
    assert failed["resolved"] == 1 and failed["completed"] == []  # not sealed yet
    seal = admin.post(f"/api/v1/batches/{batch['id']}/seal").json()
    assert seal["completed"] and seal["state"] == "completed"
    assert not admin.post(f"/api/v1/batches/{batch['id']}/seal").json()["completed"]
    progress = admin.get(f"/api/v1/batches/{batch['id']}").json()
    assert (progress["acked"], progress["failed"], progress["pending"]) == (2999, 1, 0)
    fails = admin.get(f"/api/v1/batches/{batch['id']}/failures").json()["failures"]
    assert [(f["item"], f["reason"]) for f in fails] == [(ids[2999], "bounced")]
    listed = admin.get("/api/v1/batches", params={"state": "completed"}).json()["batches"]
    assert batch["id"] in [b["id"] for b in listed]
    assert_problem(admin.post(f"/api/v1/batches/{batch['id']}/groups", json={"count": 1}), 409,
                   "InvalidTransition")


def test_partitions_and_effects_in_doubt_can_be_seen_and_resolved(admin: httpx.Client, reader: httpx.Client,
                                                                  lib: App) -> None:
    lease = lib.partitions.try_acquire("shards", 4, lease=60, owner="host-a")
    assert lease is not None
    sets = {s["set_name"]: s for s in reader.get("/api/v1/partitions").json()["sets"]}
    assert sets["shards"]["n"] == 4 and sets["shards"]["held"] == 1
    assert [s["owner"] for s in sets["shards"]["slots"] if s["held"]] == ["host-a"]
    claim = lib.effects.claim("push:7", "user-1", lease=0.05)
    assert claim.claimed
    time.sleep(0.3)
    doubt = reader.get("/api/v1/effects/in-doubt", params={"scope": "push:7"}).json()["effects"]
    assert [(e["key"], e["state"]) for e in doubt] == [("user-1", "in_doubt")]
    assert_problem(reader.post("/api/v1/effects/resolve", json={"scope": "push:7", "key": "user-1",
                                                                "done": True}), 403, "Forbidden")
    done = admin.post("/api/v1/effects/resolve", json={"scope": "push:7", "key": "user-1", "done": True,
                                                       "note": "provider says sent"}).json()
    assert done["state"] == "done"
    assert reader.get("/api/v1/effects/in-doubt", params={"scope": "push:7"}).json()["effects"] == []
    entry = admin.get("/api/v1/audit", params={"limit": 1}).json()["entries"][0]
    assert entry["action"] == "effect.resolve" and entry["detail"]["done"] is True


def wrong(token: str) -> str:
    """The token with its first character changed (never the token itself)."""
    return ("y" if token[0] == "x" else "x") + token[1:]


def test_a_cookie_session_needs_its_csrf_token_for_actions(server: Server, lib: App) -> None:
    with server.client() as browser:
        assert_problem(browser.post("/api/v1/session", json={"token": "jo_bad"}), 401, "Unauthorized")
        r = browser.post("/api/v1/session", json={"token": server.admin})
        assert r.status_code == 200
        set_cookie = r.headers.get_list("set-cookie")
        session = next(c for c in set_cookie if c.startswith("justonce_session="))
        assert "HttpOnly" in session and "SameSite=strict" in session.replace("Strict", "strict")
        csrf = r.json()["csrf"]
        assert browser.get("/api/v1/queues").status_code == 200
        before = snapshot(lib)
        assert_problem(browser.post("/api/v1/jobs", json={"task": "c.t"}), 403, "CsrfFailed")
        assert_problem(browser.post("/api/v1/jobs", json={"task": "c.t"},
                                    headers={"X-CSRF-Token": wrong(csrf)}), 403, "CsrfFailed")
        assert snapshot(lib) == before
        ok = browser.post("/api/v1/jobs", json={"task": "c.t"}, headers={"X-CSRF-Token": csrf})
        assert ok.status_code == 201
        browser.cookies.set("justonce_session", "1.1.x.forged")
        assert_problem(browser.get("/api/v1/queues"), 401, "Unauthorized")


def test_the_openapi_document_describes_every_route(server: Server) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    paths = set(doc["paths"])
    for p in ("/api/v1/jobs", "/api/v1/jobs/bulk", "/api/v1/jobs/{job_id}", "/api/v1/jobs/actions/apply",
              "/api/v1/queues", "/api/v1/batches/acks", "/api/v1/partitions", "/api/v1/effects/in-doubt",
              "/api/v1/audit"):
        assert p in paths
    assert "/" not in paths and "/metrics" not in paths


def test_an_unexpected_failure_is_a_500_problem_without_a_trace(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from justonce.web.app import create_app

    lib = App(f"sqlite:///{tmp_path / 'jobs.db'}", strict=False)
    api = create_app(lib)

    @api.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals at /srv/app.py line 12")

    with TestClient(api, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    body = assert_problem(r, 500, "InternalError")
    assert body["detail"] is None and "secret" not in r.text
    lib.close()


def test_metrics_need_a_read_token_and_show_the_queues_without_job_ids(
    server: Server, reader: httpx.Client, admin: httpx.Client
) -> None:
    """/metrics is Prometheus's text format for any valid token (Prometheus sends it as a
    bearer token); without one it is a 401 problem like every other route."""
    job = admin.post("/api/v1/jobs", json={"task": "metrics.probe", "queue": "metered"}).json()
    with server.client() as anonymous:
        assert_problem(anonymous.get("/metrics"), 401, "Unauthorized")
    r = reader.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'justonce_queue_jobs{queue="metered",state="ready"}' in r.text
    assert "justonce_database_up 1.0" in r.text
    assert f'"{job["id"]}"' not in r.text
