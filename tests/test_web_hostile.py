"""A hostile client against a real ``justonce serve`` process (one per backend): every POST
route of the API and of the dashboard, thrown missing, wrong, revoked and read-only
credentials, forged CSRF and tampered cookies, malformed, oversize, mistyped, NUL-laden,
surrogate-laden and deeply nested bodies, unknown ids and path tricks. Each answer is a
clear 4xx (a problem document on the API), never a 5xx or a trace, the connection stays
usable, and the database is left exactly as it was."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from conftest import _drop_schema, mysql_database, mysql_or_skip, postgres_or_skip
from justonce import App
from justonce.web.app import create_app
from test_hostile_corpus import dump
from test_web_api import assert_problem
from webserver import Server, serving

FORM = {"content-type": "application/x-www-form-urlencoded"}
JSON = {"content-type": "application/json"}
FAKE_SECRET = "jo_deadbeef_" + "A" * 43
TOUCHED = ("justonce_api_tokens",)
"""Left out of the dump a refused request must leave alone: a token's last use is recorded
(at most once a minute) by any request, refused or not."""


@pytest.fixture(scope="module", params=["sqlite", "postgres", "mysql"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Server, Path]]:
    folder = tmp_path_factory.mktemp("hostile")
    log = folder / "serve.log"
    if request.param == "sqlite":
        with serving(f"sqlite:///{folder / 'jobs.db'}", log) as s:
            yield s, log
        return
    if request.param == "mysql":
        with mysql_database(mysql_or_skip()) as url, serving(url, log) as s:
            yield s, log
        return
    base = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with serving(f"{base}{'&' if '?' in base else '?'}schema={schema}", log) as s:
        yield s, log
    _drop_schema(base, schema)


@pytest.fixture(scope="module")
def server(served: tuple[Server, Path]) -> Server:
    return served[0]


@pytest.fixture(scope="module")
def lib(server: Server) -> Iterator[App]:
    a = App(server.db_url, strict=False)
    yield a
    a.close()


@pytest.fixture(scope="module")
def world(lib: App) -> dict[str, Any]:
    """Something for every action to change: a ready job, a dead job, an open batch with
    a group, a sealed list with a live reservation and a list still loading, and the ids
    of each."""
    ready = lib.enqueue("h.ready", args=[1])
    dead = lib.enqueue("h.dead")
    lib.cancel(dead.id)
    batch = lib.batches.open("hostile")
    group = lib.batches.add(batch.id, 3)
    lib.lists.create("hostile", items=[1, 2, 3])
    lib.lists.create("hostile-open", seal=False)
    res = lib.lists.reserve("hostile", 1, ttr=3600)
    assert res is not None
    return {"ready": ready.id, "dead": dead.id, "batch": batch.id,
            "item": f"{batch.id}:{group.group_id}:0", "list": "hostile", "open": "hostile-open",
            "token": res.token}


@pytest.fixture(scope="module")
def revoked(lib: App) -> str:
    info, secret = lib.tokens.create("hostile revoked", "admin")
    lib.tokens.revoke(info.id)
    return secret


def api_actions(w: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every state-changing API route with a body that an admin would get accepted."""
    lst, tok = f"/api/v1/lists/{w['list']}", w["token"]
    return [
        ("/api/v1/jobs", {"task": "h.new"}),
        ("/api/v1/jobs/bulk", {"jobs": [{"task": "h.new"}]}),
        (f"/api/v1/jobs/{w['ready']}/cancel", {}),
        (f"/api/v1/jobs/{w['dead']}/retry", {}),
        ("/api/v1/jobs/actions/apply", {"action": "cancel", "expected": 1}),
        ("/api/v1/batches", {"description": "x"}),
        (f"/api/v1/batches/{w['batch']}/groups", {"count": 2}),
        (f"/api/v1/batches/{w['batch']}/seal", {}),
        ("/api/v1/batches/acks", {"ids": [w["item"]]}),
        ("/api/v1/batches/fails", {"ids": [w["item"]], "reason": "no"}),
        ("/api/v1/effects/resolve", {"scope": "s", "key": "k", "done": True}),
        ("/api/v1/lists", {"name": "h-new", "items": [1]}),
        (f"/api/v1/lists/{w['open']}/items", [1, 2]),
        (f"/api/v1/lists/{w['open']}/seal", {}),
        (f"{lst}/reserve", {"k": 1}),
        (f"{lst}/touch", {"token": tok}),
        (f"{lst}/complete", {"token": tok}),
        (f"{lst}/release", {"token": tok}),
        (f"{lst}/bury", {"token": tok}),
        (f"{lst}/kick", {}),
        (f"{lst}/next", {}),
        ("/api/v1/queues/h-paused/pause", {}),
        ("/api/v1/queues/h-paused/resume", {}),
    ]


def dash_actions(w: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """Every state-changing dashboard form."""
    return [
        ("/jobs/preview", {"action": "cancel"}),
        ("/jobs/apply", {"action": "cancel", "max_id": str(w["ready"]), "expected": "1"}),
        (f"/jobs/{w['ready']}/cancel", {}),
        (f"/jobs/{w['dead']}/retry", {}),
        ("/effects/resolve", {"state": "done", "scope": "s", "key": "k"}),
        (f"/lists/{w['list']}/kick", {}),
        ("/queues/h-paused/pause", {}),
        ("/queues/h-paused/resume", {}),
    ]


def refused(r: httpx.Response, *statuses: int) -> None:
    """A clear 4xx: the expected status, no trace, a problem document when JSON."""
    assert r.status_code in statuses, (r.status_code, r.text[:300])
    assert "Traceback" not in r.text and 'File "' not in r.text
    if r.headers.get("content-type", "").startswith("application/"):
        assert r.headers["content-type"].startswith("application/problem+json"), r.headers
        assert r.json()["status"] == r.status_code


def sign_in(server: Server, secret: str) -> tuple[httpx.Client, str]:
    """A fresh client signed in with ``secret`` by cookie, and its CSRF token."""
    c = server.client().__enter__()
    r = c.post("/api/v1/session", json={"token": secret})
    assert r.status_code == 200, r.text
    return c, r.json()["csrf"]


# -- who may act ------------------------------------------------------------------------
def test_every_action_refuses_missing_wrong_revoked_and_read_only_credentials(
        server: Server, lib: App, world: dict[str, Any], revoked: str) -> None:
    before = dump(lib, skip=TOUCHED)
    for token, status in ((None, 401), (FAKE_SECRET, 401), ("garbage", 401), (revoked, 401),
                          (server.reader, 403)):
        with server.client(token) as c:
            for path, body in api_actions(world):
                refused(c.post(path, json=body), status)
            for path, form in dash_actions(world):
                refused(c.post(path, data=form), status)
    for scheme in ("Basic eDp5", f"Token {server.admin}", "Bearer", f"Bearer  {server.admin}x"):
        with server.client() as c:
            refused(c.post("/api/v1/jobs", json={"task": "h.new"}, headers={"Authorization": scheme}), 401)
    # A session signed in with a token revoked since ends at once, CSRF token or not.
    info, secret = lib.tokens.create("hostile short-lived", "admin")
    browser, csrf = sign_in(server, secret)
    with closing(browser):
        lib.tokens.revoke(info.id)
        for path, body in api_actions(world):
            refused(browser.post(path, json=body, headers={"X-CSRF-Token": csrf}), 401)
        for path, form in dash_actions(world):
            refused(browser.post(path, data={**form, "csrf": csrf}), 401)
    # A read-only session with its own valid CSRF token still may not act.
    browser, csrf = sign_in(server, server.reader)
    with closing(browser):
        for path, body in api_actions(world):
            refused(browser.post(path, json=body, headers={"X-CSRF-Token": csrf}), 403)
        for path, form in dash_actions(world):
            refused(browser.post(path, data={**form, "csrf": csrf}), 403)
    assert dump(lib, skip=TOUCHED) == before


def test_every_cookie_post_needs_the_sessions_own_csrf_token(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    browser, csrf = sign_in(server, server.admin)
    other, other_csrf = sign_in(server, server.admin)
    other.close()
    before = dump(lib, skip=TOUCHED)
    with closing(browser):
        changed = ("y" if csrf[0] == "x" else "x") + csrf[1:]  # never csrf itself
        for forged in (None, "", changed, other_csrf, csrf + "x", "\u00e9" * 10):
            headers = {} if forged is None else {"X-CSRF-Token": forged.encode()}
            for path, body in api_actions(world):
                refused(browser.post(path, json=body, headers=headers), 403)
            for path, form in dash_actions(world):
                refused(browser.post(path, data=form if forged is None else {**form, "csrf": forged}), 403)
            refused(browser.post("/api/v1/session/end", headers=headers), 403)
            refused(browser.post("/signout", data={} if forged is None else {"csrf": forged}), 403)
        # Still signed in: a sign-out without the token did not end the session.
        assert browser.get("/api/v1/session").status_code == 200
        assert dump(lib, skip=TOUCHED) == before
        out = browser.post("/signout", data={"csrf": csrf})
        assert out.status_code == 303
        refused(browser.get("/api/v1/session"), 401)
    browser, csrf = sign_in(server, server.admin)
    with closing(browser):
        assert browser.post("/api/v1/session/end", headers={"X-CSRF-Token": csrf}).status_code == 204
        refused(browser.get("/api/v1/session"), 401)
    # The token as a form field, on the API (once a 500 for every such POST: the form parser
    # needed a package the service does not install): a urlencoded form's csrf field is
    # read; a multipart body is not (its token goes in the header); a wrong, empty, doubled
    # or undecodable field is refused; an oversized form too.
    browser, csrf = sign_in(server, server.admin)
    with closing(browser):
        form = {"content-type": "application/x-www-form-urlencoded"}
        for bad, status in [("csrf=", 403), (f"csrf={csrf}x", 403), ("csrf=%ff%fe", 403),
                            ("other=" + csrf, 403), (f"csrf=wrong&csrf={csrf}", 403),  # the first counts
                            (b"csrf=\xff", 400), ("x" * 20_000 + f"&csrf={csrf}", 413)]:
            body = bad if isinstance(bad, bytes) else bad.encode()
            refused(browser.post("/api/v1/session/end", content=body, headers=form), status)
        for path, _ in api_actions(world):  # multipart: 415 where the route reads a JSON body
            refused(browser.post(path, files={"csrf": (None, csrf)}), 403, 415)
        assert browser.get("/api/v1/session").status_code == 200
        assert dump(lib, skip=TOUCHED) == before
        assert browser.post("/api/v1/session/end", data={"csrf": csrf}).status_code == 204
        refused(browser.get("/api/v1/session"), 401)
    with server.client() as anon:
        refused(anon.post("/api/v1/session/end"), 401)
    assert dump(lib, skip=TOUCHED) == before


def test_session_cookies_are_httponly_strict_rooted_and_tampering_signs_out(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    with server.client() as c:
        r = c.post("/signin", data={"token": server.admin, "next": "/jobs"})
        assert r.status_code == 303
        cookies = {h.split("=", 1)[0]: h for h in r.headers.get_list("set-cookie")}
        session, csrf_cookie = cookies["justonce_session"], cookies["justonce_csrf"]
        for flag in ("HttpOnly", "Path=/", "SameSite=strict"):
            assert flag.lower() in session.lower()
        assert "httponly" not in csrf_cookie.lower() and "samesite=strict" in csrf_cookie.lower()
        assert server.admin not in r.text and all(server.admin not in h for h in r.headers.values())
        value = c.cookies["justonce_session"]
        token_id, issued, nonce, sig = value.split(".")
        csrf = c.cookies["justonce_csrf"]
    before = dump(lib, skip=TOUCHED)
    tampered = [f"{int(token_id) + 1}.{issued}.{nonce}.{sig}", f"{token_id}.{int(issued) + 1}.{nonce}.{sig}",
                f"{token_id}.{issued}.{nonce}x.{sig}", f"{token_id}.{issued}.{nonce}.{sig[:-2]}",
                f"{token_id}.{issued}.{nonce}", "", "....", "1.1.1.1", "\u00ff" * 50, "x" * 4000,
                f"{token_id}.99999999999999999999.{nonce}.{sig}"]
    for bad in tampered:
        with server.client() as c:
            cookie = {"Cookie": f"justonce_session={bad}; justonce_csrf={csrf}".encode()}
            refused(c.get("/api/v1/session", headers=cookie), 401)
            refused(c.post("/api/v1/jobs", json={"task": "h.new"},
                           headers={**cookie, "X-CSRF-Token": csrf}), 401)
            refused(c.post(f"/jobs/{world['ready']}/cancel", data={"csrf": csrf}, headers=cookie), 401)
            refused(c.post("/signout", data={"csrf": csrf}, headers=cookie), 401)
            # pages send the browser to sign in
            assert c.get("/jobs", headers=cookie).status_code == 303
    assert dump(lib, skip=TOUCHED) == before


# -- what is sent -------------------------------------------------------------------------
def hostile_json(w: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(route, raw body) pairs: every kind of bad JSON on every route that takes one."""
    deep = b"[" * 5000 + b"]" * 5000
    nested = json.dumps(json.loads("[" * 400 + "]" * 400)).encode()
    routes = [p for p, body in api_actions(w) if body] + ["/api/v1/jobs/actions/preview", "/api/v1/session"]
    generic = [b"", b"{", b"nul", b"[]", b'"x"', b"null", b"1e999", b"\xff\xfe", b'{"a":1}',
               b"{" + b'"a":' * 3000 + b"1" + b"}" * 3000, deep, b'{"task": NaN}']
    out = [(p, body) for p in routes for body in generic]
    # A pause's body is optional: none (or null) is no note; anything else bad is refused.
    out += [("/api/v1/queues/h-q/pause", body) for body in generic if body not in (b"", b"null")]
    job = {"task": "h.new"}
    specific: list[tuple[str, Any]] = [
        ("/api/v1/jobs", {"task": "a\u0000b"}), ("/api/v1/jobs", {**job, "args": ["\u0000"]}),
        ("/api/v1/jobs", {**job, "kwargs": {"\u0000": 1}}), ("/api/v1/jobs", {**job, "key": "k\u0000"}),
        ("/api/v1/jobs", {**job, "queue": "q\u0000"}), ("/api/v1/jobs", {**job, "partition_key": "\u0000"}),
        ("/api/v1/jobs", {**job, "priority": 10**30}), ("/api/v1/jobs", {**job, "priority": -(10**30)}),
        ("/api/v1/jobs", {**job, "max_attempts": 0}), ("/api/v1/jobs", {**job, "max_attempts": 2**64}),
        ("/api/v1/jobs", {**job, "delay": 1e308}), ("/api/v1/jobs", {**job, "delay": -1}),
        ("/api/v1/jobs", {**job, "timeout": 1e308}), ("/api/v1/jobs", {**job, "timeout": 0}),
        ("/api/v1/jobs", {**job, "partition_key": 2**64}), ("/api/v1/jobs", {**job, "args": {"a": 1}}),
        ("/api/v1/jobs", {**job, "run_at": "9999-12-31T23:59:59+00:00"}),
        ("/api/v1/jobs", {**job, "run_at": "0001-01-01T00:00:00+14:00"}),
        ("/api/v1/jobs", {**job, "run_at": "2030-01-01T00:00:00"}),
        ("/api/v1/jobs", {**job, "args": ["x" * 300_000]}), ("/api/v1/jobs", {**job, "key": "k" * 600}),
        ("/api/v1/jobs", {"task": "<script>"}), ("/api/v1/jobs", {"task": ["h.new"]}),
        ("/api/v1/jobs", {"task": True}), ("/api/v1/jobs", {**job, "priority": 1.5}),
        ("/api/v1/jobs", {**job, "priority": "1"}),
        ("/api/v1/jobs/bulk", {"jobs": []}), ("/api/v1/jobs/bulk", {"jobs": [job] * 10_001}),
        ("/api/v1/jobs/bulk", {"jobs": [job, {"task": "\u0000"}]}), ("/api/v1/jobs/bulk", {"jobs": job}),
        ("/api/v1/jobs/actions/apply", {"action": "drop", "expected": 0}),
        ("/api/v1/jobs/actions/apply", {"action": "cancel", "expected": -1}),
        ("/api/v1/jobs/actions/apply", {"action": "cancel", "expected": 0, "max_id": 2**64}),
        ("/api/v1/jobs/actions/apply", {"action": "cancel", "expected": 0, "max_id": -5}),
        ("/api/v1/jobs/actions/apply", {"action": "cancel", "expected": 0, "filter": {"queue": "\u0000"}}),
        ("/api/v1/jobs/actions/apply", {"action": "cancel", "expected": 0, "filter": {"state": "zz"}}),
        ("/api/v1/jobs/actions/apply", {"action": "retry", "expected": 0, "tolerance": 10**30}),
        ("/api/v1/jobs/actions/preview", {"action": "cancel", "filter": {"task": "\u0000"}}),
        ("/api/v1/batches", {"expire_after": 1e308}), ("/api/v1/batches", {"expire_after": -1}),
        ("/api/v1/batches", {"description": "\u0000"}), ("/api/v1/batches", {"on_complete": "no way"}),
        ("/api/v1/batches", {"description": "d" * 5000}),
        (f"/api/v1/batches/{w['batch']}/groups", {"count": 0}),
        (f"/api/v1/batches/{w['batch']}/groups", {"count": 10**30}),
        (f"/api/v1/batches/{w['batch']}/groups", {"count": "3"}),
        ("/api/v1/batches/acks", {"ids": []}), ("/api/v1/batches/acks", {"ids": "x"}),
        ("/api/v1/batches/acks", {"ids": [w["item"], f"{w['batch']}:zz:0"]}),
        ("/api/v1/batches/acks", {"ids": [w["item"], f"{w['batch'] + 1000}:a:0"]}),
        ("/api/v1/batches/acks", {"ids": [w["item"], w["item"][:-1] + "999"]}),
        ("/api/v1/batches/acks", {"ids": [w["item"], w["item"] + "\u0000"]}),
        ("/api/v1/batches/acks", {"ids": [w["item"], f"{10**30}:a:0"]}),
        ("/api/v1/batches/acks", {"ids": [w["item"], "-1:a:0"]}),
        ("/api/v1/batches/fails", {"ids": [w["item"]], "reason": "\u0000"}),
        ("/api/v1/batches/fails", {"ids": [w["item"]]}),
        ("/api/v1/effects/resolve", {"scope": "\u0000", "key": "k", "done": True}),
        ("/api/v1/effects/resolve", {"scope": "s", "key": "\u0000", "done": True}),
        ("/api/v1/effects/resolve", {"scope": "s", "key": 10**30, "done": True}),
        ("/api/v1/effects/resolve", {"scope": "s", "key": "k", "done": "yes please"}),
        ("/api/v1/effects/resolve", {"scope": "s", "key": "k", "done": True, "note": "\u0000"}),
        ("/api/v1/queues/h-q/pause", {"note": "\u0000"}), ("/api/v1/queues/h-q/pause", {"note": 7}),
        ("/api/v1/queues/h-q/pause", {"note": "n" * 4001}), ("/api/v1/queues/h-q/pause", {"why": "x"}),
        ("/api/v1/queues/h-q/pause", ["x"]), ("/api/v1/queues/bad%20name/pause", {}),
        ("/api/v1/queues/%00/pause", {}), ("/api/v1/queues/" + "q" * 64 + "/pause", {}),
        ("/api/v1/queues/-q/resume", {}), ("/api/v1/queues/%ED%A0%80/resume", {}),
        ("/api/v1/session", {"token": "\u0000"}), ("/api/v1/session", {"token": 7}),
        ("/api/v1/session", {"token": "jo_" + "a" * 100_000}),
        *list_bodies(w),
    ]
    out += [(p, json.dumps(b).encode()) for p, b in specific]
    surrogates = [("/api/v1/jobs", b'{"task": "\\ud800"}'),
                  ("/api/v1/jobs", b'{"task": "t", "args": ["\\udfff"]}'),
                  ("/api/v1/jobs", b'{"task": "t", "key": "\\udfff"}'),
                  ("/api/v1/jobs", b'{"task": "t", "queue": "\\ud800"}'),
                  ("/api/v1/jobs", b'{"task": "t", "partition_key": "\\ud800"}'),
                  ("/api/v1/batches", b'{"description": "\\ud800"}'),
                  ("/api/v1/batches/acks", b'{"ids": ["\\ud800"]}'),
                  ("/api/v1/batches/fails", b'{"ids": ["' + w["item"].encode() + b'"], "reason": "\\ud800"}'),
                  ("/api/v1/effects/resolve", b'{"scope": "s", "key": "\\udfff", "done": true}'),
                  ("/api/v1/effects/resolve", b'{"scope": "s", "key": "k", "done": true, "note": "\\ud800"}'),
                  ("/api/v1/session", b'{"token": "\\ud800"}'),
                  ("/api/v1/jobs", b'{"task": "t", "args": ' + nested + b"}"),
                  ("/api/v1/jobs", b'{"task": "t", "kwargs": {"a": ' + nested + b"}}"),
                  ("/api/v1/jobs/bulk", b'{"jobs": [{"task": "t", "args": ' + nested + b"}]}"),
                  ("/api/v1/lists", b'{"name": "\\ud800"}'),
                  ("/api/v1/lists", b'{"name": "h-s", "items": ["\\udfff"]}'),
                  ("/api/v1/lists", b'{"name": "h-s", "task": "\\ud800"}'),
                  (f"/api/v1/lists/{w['open']}/items", b'["\\ud800"]'),
                  (f"/api/v1/lists/{w['open']}/items", b'[1, {"\\udfff": 2}]'),
                  (f"/api/v1/lists/{w['open']}/items", b"[" + nested + b"]"),
                  (f"/api/v1/lists/{w['open']}/items", b"[NaN]"),
                  (f"/api/v1/lists/{w['list']}/reserve", b'{"k": 1, "request_id": "\\ud800"}'),
                  (f"/api/v1/lists/{w['list']}/bury", b'{"token": "' + w["token"].encode()
                   + b'", "reason": "\\ud800"}'),
                  (f"/api/v1/lists/{w['list']}/complete", b'{"token": "\\ud800"}')]
    return out + surrogates


def list_bodies(w: dict[str, Any]) -> list[tuple[str, Any]]:
    """Bad bodies for the list routes: each refused with a 4xx, nothing changed."""
    lst, opened, tok = f"/api/v1/lists/{w['list']}", f"/api/v1/lists/{w['open']}", w["token"]
    new = {"name": "h-new"}
    return [
        ("/api/v1/lists", {"name": "bad name!"}), ("/api/v1/lists", {"name": "\u0000"}),
        ("/api/v1/lists", {"name": "x" * 100}), ("/api/v1/lists", {"name": ""}),
        ("/api/v1/lists", {**new, "ttr": 0}), ("/api/v1/lists", {**new, "ttr": 1e308}),
        ("/api/v1/lists", {**new, "max_attempts": 0}), ("/api/v1/lists", {**new, "max_attempts": 2**64}),
        ("/api/v1/lists", {**new, "items": ["x" * 300_000]}), ("/api/v1/lists", {**new, "items": [1] * 10_001}),
        ("/api/v1/lists", {**new, "items": [{"\u0000": 1}]}), ("/api/v1/lists", {**new, "items": "abc"}),
        ("/api/v1/lists", {**new, "task": "no way"}), ("/api/v1/lists", {**new, "on_complete": "no way"}),
        ("/api/v1/lists", {**new, "seal": "yes"}), ("/api/v1/lists", {"name": w["list"]}),
        (f"{opened}/items", ["x" * 300_000]), (f"{opened}/items", [1] * 10_001),
        (f"{opened}/items", ["\u0000"]), (f"{opened}/items", {"items": [1]}), (f"{lst}/items", [4]),
        (f"{lst}/reserve", {"k": 0}), (f"{lst}/reserve", {"k": 10**30}), (f"{lst}/reserve", {"k": 1.5}),
        (f"{lst}/reserve", {"k": "1"}), (f"{lst}/reserve", {"k": 1, "ttr": -1}),
        (f"{lst}/reserve", {"k": 1, "request_id": "\u0000"}),
        (f"{lst}/reserve", {"k": 1, "request_id": "x" * 201}),
        (f"{lst}/reserve", {"k": 1, "items": "no"}), (f"{opened}/reserve", {"k": 1}),
        ("/api/v1/lists/no-such-list/reserve", {"k": 1}), ("/api/v1/lists/%00/reserve", {"k": 1}),
        (f"{lst}/touch", {"token": "1.0000000000000000"}), (f"{lst}/touch", {"token": tok, "ttr": 1e308}),
        (f"{lst}/touch", {"token": 7}), (f"{lst}/touch", {"token": "x" * 1000}), (f"{lst}/touch", {}),
        (f"{lst}/complete", {"token": tok, "positions": [10**30]}),
        (f"{lst}/complete", {"token": tok, "positions": [-1]}),
        (f"{lst}/complete", {"token": tok, "positions": "x"}),
        (f"{lst}/complete", {"token": tok, "positions": [999]}),
        (f"{lst}/complete", {"token": tok, "positions": [0] * 10_001}),
        (f"{lst}/complete", {"token": "\u0000"}), (f"{lst}/complete", {"token": tok[:-1]}),
        (f"{lst}/release", {"token": tok, "delay": 1e308}), (f"{lst}/release", {"token": tok, "delay": -1}),
        (f"{lst}/bury", {"token": tok, "reason": "\u0000"}),
        (f"{lst}/bury", {"token": tok, "reason": "r" * 5000}),
        (f"{lst}/kick", {"limit": 0}), (f"{lst}/kick", {"limit": 10**30}), (f"{lst}/kick", {"limit": "5"}),
        (f"{lst}/next", {"ttr": 0}), (f"{lst}/next", {"ttr": "1"}), (f"{lst}/next", {"x": 1}),
        (f"{lst}/next", {}),  # a list without a task: nothing to run here
    ]


def test_hostile_json_on_every_api_route_is_a_4xx_problem_and_changes_nothing(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    before = dump(lib, skip=TOUCHED)
    with server.client(server.admin) as c:
        for path, body in hostile_json(world):
            r = c.post(path, content=body, headers=JSON)
            refused(r, 400, 401, 404, 409, 413, 422)
            assert r.headers["content-type"].startswith("application/problem+json"), (path, body[:80])
        # Still one usable keep-alive connection, and everything still reads back.
        assert c.get("/api/v1/jobs").status_code == 200
        assert c.get(f"/api/v1/jobs/{world['ready']}").status_code == 200
    assert dump(lib, skip=TOUCHED) == before


def test_bodies_over_the_limit_are_413_with_or_without_a_length(server: Server, lib: App) -> None:
    before = dump(lib, skip=TOUCHED)
    limit = 8 * 1024 * 1024

    def chunks() -> Iterator[bytes]:
        for _ in range(limit // (1024 * 1024) + 1):
            yield b"x" * (1024 * 1024)

    with server.client(server.admin) as c:
        for path, headers in (("/api/v1/jobs", JSON), ("/api/v1/batches/acks", JSON),
                              ("/jobs/apply", FORM), ("/signin", FORM)):
            assert_problem(c.post(path, content=b"x" * (limit + 1), headers=headers), 413, "BodyTooLarge")
        for path, headers in (("/api/v1/jobs", JSON), ("/jobs/preview", FORM), ("/api/v1/session", JSON)):
            r = c.post(path, content=chunks(), headers=headers)
            assert "content-length" not in r.request.headers
            assert_problem(r, 413, "BodyTooLarge")
    with server.client(server.admin) as c:
        refused(c.post("/jobs/apply", content=b"a=" + b"x" * 20_000, headers=FORM), 413)
    assert dump(lib, skip=TOUCHED) == before


def test_head_answers_as_get_without_the_body_and_changes_nothing(server: Server, lib: App) -> None:
    """HEAD on a GET resource got a 405 (the routes are declared for GET only)."""
    before = dump(lib, skip=TOUCHED)
    with server.client(server.admin) as c:
        for path in ("/api/v1/jobs?limit=5", "/api/v1/queues", "/openapi.json", "/metrics"):
            got, head = c.get(path), c.head(path)
            assert (head.status_code, head.content) == (got.status_code, b""), path
            assert head.headers.get("content-type") == got.headers.get("content-type")
            # (the same length where the answer cannot change between two reads: queues
            # carry the head's age, metrics their own counters)
            if path in ("/api/v1/jobs?limit=5", "/openapi.json"):
                assert head.headers.get("content-length") == str(len(got.content)), path
            else:
                assert (head.headers.get("content-length") or "").isdigit(), path
        for path in ("/api/v1/jobs/bulk", "/api/v1/jobs/0", "/no/such/page"):  # as GET answers
            assert c.head(path).status_code == c.get(path).status_code >= 400, path
    with server.client() as c:
        assert c.head("/api/v1/jobs").status_code == 401
    assert dump(lib, skip=TOUCHED) == before


def dash_forms(w: dict[str, Any]) -> list[tuple[str, dict[str, str] | bytes]]:
    """(route, form) pairs: bad forms on every dashboard action."""
    big = str(10**30)
    return [
        ("/jobs/apply", {"action": "cancel", "max_id": big, "expected": "0"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "-5", "expected": "0"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "1", "expected": big}),
        ("/jobs/apply", {"action": "cancel", "max_id": "1", "expected": "-1"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "9" * 5000, "expected": "0"}),
        ("/jobs/apply", {"action": "drop", "max_id": "1", "expected": "0"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "x", "expected": "0"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "1_0", "expected": "0"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "1", "expected": " 1"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "1", "expected": "0", "queue": "\u0000"}),
        ("/jobs/apply", {"action": "cancel", "max_id": "1", "expected": "0", "state": "zz"}),
        ("/jobs/preview", {"action": "cancel", "queue": "\u0000"}),
        ("/jobs/preview", {"action": "cancel", "task": "<script>alert(1)</script>"}),
        ("/jobs/preview", {"action": "x"}),
        ("/jobs/preview", {"action": "cancel", "state": "zz"}),
        ("/effects/resolve", {"state": "done", "scope": "\u0000", "key": "k"}),
        ("/effects/resolve", {"state": "maybe", "scope": "s", "key": "k"}),
        ("/effects/resolve", {"state": "done", "scope": "s", "key": "k"}),
        ("/effects/resolve", b"state=done&scope=%ED%A0%80&key=%ED%A0%80"),
        ("/effects/resolve", b"state=done&scope=\xff&key=k"),
        ("/effects/resolve", b"&".join(b"f%d=1" % i for i in range(100))),
        ("/jobs/999999999/retry", {}), (f"/jobs/{big}/retry", {}), ("/jobs/-1/cancel", {}),
        ("/jobs/0/cancel", {}), ("/jobs/%00/cancel", {}), ("/jobs/abc/retry", {}),
        (f"/jobs/{w['ready']}/retry", {}), (f"/jobs/{w['dead']}/cancel", {}),
        ("/signin", {"token": FAKE_SECRET}), ("/signin", {"token": "\u0000"}),
        ("/signin", b"token=%ED%A0%80"), ("/signin", b"token=\xff"),
        ("/lists/no-such-list/kick", {}), ("/lists/%00/kick", {}), ("/lists/" + "x" * 100 + "/kick", {}),
        ("/lists/a%2F..%2F..%2Fetc/kick", {}),
        ("/queues/%00/pause", {}), ("/queues/bad%20name/resume", {}), ("/queues/" + "q" * 64 + "/pause", {}),
        ("/queues/h-q/drop", {}), ("/queues/a%2F..%2F..%2Fetc/pause", {}),
    ]


def test_hostile_forms_on_every_dashboard_route_are_4xx_and_change_nothing(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    before = dump(lib, skip=TOUCHED)
    forms = dash_forms(world)
    with server.client(server.admin) as c:
        for path, form in forms:
            r = (c.post(path, content=form, headers=FORM) if isinstance(form, bytes)
                 else c.post(path, data=form))
            assert r.status_code != 303, (path, form)
            refused(r, 400, 401, 404, 405, 409, 413, 422)
        assert c.get("/api/v1/jobs").status_code == 200
    assert dump(lib, skip=TOUCHED) == before


def test_unknown_ids_methods_and_path_tricks_are_problem_documents(server: Server, lib: App) -> None:
    before = dump(lib, skip=TOUCHED)
    with server.client(server.admin) as c:
        for path in ("/api/v1/jobs/999999999/cancel", "/api/v1/jobs/999999999/retry",
                     "/api/v1/batches/999999999/seal", "/api/v1/batches/999999999/groups",
                     "/api/v1/lists/no-such-list/seal"):
            refused(c.post(path, json={"count": 1}), 404)
        for path in ("/api/v1/jobs/0/cancel", "/api/v1/jobs/-1/cancel", f"/api/v1/jobs/{2**64}/retry",
                     "/api/v1/jobs/abc/retry", "/api/v1/batches/1.5/seal"):
            assert_problem(c.post(path), 422, "RequestValidation")
        for path in ("/api/v1/nope", "/api/v1/jobs/1/nope", "/api/v1/../../etc/passwd",
                     "/api/v1/jobs/1%2F..%2F..%2Fetc", "/static/../../../../etc/passwd",
                     "/static/%2e%2e/%2e%2e/pyproject.toml", "/api/v1/jobs/%00/cancel",
                     "/api/v1/lists/%00/seal", "/api/v1/lists/..%2F..%2Fetc/seal", "/api/v1/lists/a/b/seal"):
            r = c.post(path)
            refused(r, 404, 405, 422)
            assert "root:" not in r.text
        assert_problem(c.delete("/api/v1/jobs"), 405, "MethodNotAllowed")
        assert_problem(c.put("/api/v1/jobs/1/cancel"), 405, "MethodNotAllowed")
        assert_problem(c.get("/api/v1/nope"), 404, "NotFound")
        assert_problem(c.get("/api/v1/jobs/0"), 422, "RequestValidation")
        r = c.get("/static/../../../../etc/passwd")
        assert r.status_code == 404 and "root:" not in r.text
    assert dump(lib, skip=TOUCHED) == before


def test_a_malformed_id_in_a_path_never_names_another_job(server: Server, lib: App,
                                                         world: dict[str, Any]) -> None:
    """int() reads "1_5" as 15, " 01" as 1 and Arabic-Indic digits as digits: an id in a
    path is taken only in plain digits, so none of these reaches the job they spell."""
    before = dump(lib, skip=TOUCHED)
    rid, bid = str(world["ready"]), str(world["batch"])

    def forged(n: str) -> list[str]:
        under = f"{n[0]}_{n[1:]}" if len(n) > 1 else f"0_{n}"
        arabic = quote("".join(chr(0x660 + int(d)) for d in n))
        return ["0" + n, "+" + n, "%20" + n, n + "%20", under, arabic, n + ".0", "%2B" + n]

    with server.client(server.admin) as c:
        for f in forged(rid):
            assert_problem(c.post(f"/api/v1/jobs/{f}/cancel"), 422, "RequestValidation")
            assert_problem(c.get(f"/api/v1/jobs/{f}"), 422, "RequestValidation")
            refused(c.post(f"/jobs/{f}/cancel", data={}), 403, 404)  # (no CSRF: a bearer client)
        for f in forged(bid):
            assert_problem(c.post(f"/api/v1/batches/{f}/seal"), 422, "RequestValidation")
            assert_problem(c.get(f"/api/v1/batches/{f}"), 422, "RequestValidation")
        assert c.get(f"/api/v1/jobs/{rid}").json()["state"] == "ready"
        # Numbers in a query string too: a cursor of "1_5" paged from job 15.
        lst = world["list"]
        for f in forged("15"):
            for url in (f"/api/v1/jobs?cursor={f}", f"/api/v1/jobs?limit={f}",
                        f"/api/v1/audit?cursor={f}", f"/api/v1/batches?limit={f}",
                        f"/api/v1/lists/{lst}/items?start={f}", f"/api/v1/lists?limit={f}"):
                assert_problem(c.get(url), 422, "RequestValidation")
        assert c.get(f"/api/v1/lists/{lst}/items?start=0&limit=1").status_code == 200
        assert c.get("/api/v1/jobs?cursor=15&limit=2").status_code == 200
    browser, csrf = sign_in(server, server.admin)
    with closing(browser):
        for f in forged(rid):
            refused(browser.post(f"/jobs/{f}/cancel", data={"csrf": csrf}), 404)
            refused(browser.get(f"/jobs/{f}"), 404)
        for f in forged(bid):
            refused(browser.get(f"/batches/{f}"), 404)
    assert lib.get_job(world["ready"]).state == "ready"
    assert dump(lib, skip=TOUCHED) == before


# -- every route ---------------------------------------------------------------------------
MARK = "<hostile-mark>"
"""A value that must never come back unescaped (nor at all, in a page's flash message)."""


def get_cases(w: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(path and query, the statuses allowed): hostile values in the path and the query of
    every GET route. API routes answer 4xx problems; dashboard pages 4xx pages; a page
    that takes only the codes of its flash message ignores the rest (200, nothing shown)."""
    big, huge, q = str(2**63), str(10**30), "q" * 5_000
    bid, lst = w["batch"], w["list"]
    no = (400, 404, 422)
    api = [
        "/api/v1/jobs?state=zz", "/api/v1/jobs?queue=%00", f"/api/v1/jobs?queue={q}", "/api/v1/jobs?task=a%20b",
        "/api/v1/jobs?task=%ED%A0%80", "/api/v1/jobs?cursor=0", f"/api/v1/jobs?cursor={big}",
        "/api/v1/jobs?limit=0", "/api/v1/jobs?limit=abc", "/api/v1/jobs?created_after=2024-01-01T00:00:00",
        "/api/v1/jobs?created_before=yesterday", "/api/v1/jobs/0", "/api/v1/jobs/abc", f"/api/v1/jobs/{huge}",
        "/api/v1/jobs/999999999", "/api/v1/batches?state=zz", "/api/v1/batches?limit=0", "/api/v1/batches/0",
        f"/api/v1/batches/{big}", "/api/v1/batches/999999999", "/api/v1/batches/0/failures",
        "/api/v1/batches/999999999/failures", f"/api/v1/batches/{bid}/failures?limit=0",
        "/api/v1/partitions?set=a%20b", "/api/v1/partitions?set=%00", f"/api/v1/partitions?set={q}",
        "/api/v1/partitions?set=no-such-set", "/api/v1/effects/in-doubt?scope=%00",
        f"/api/v1/effects/in-doubt?scope={q}", "/api/v1/effects/in-doubt?limit=0", "/api/v1/audit?cursor=0",
        f"/api/v1/audit?cursor={big}", "/api/v1/audit?limit=0", "/api/v1/lists?limit=0",
        "/api/v1/lists/a%20b", "/api/v1/lists/%00", "/api/v1/lists/no-such-list", f"/api/v1/lists/{q}",
        "/api/v1/lists/a%20b/progress", "/api/v1/lists/no-such-list/progress", "/api/v1/lists/%00/buried",
        f"/api/v1/lists/{lst}/buried?limit=0", "/api/v1/lists/no-such-list/items",
        f"/api/v1/lists/{lst}/items?start=-1", f"/api/v1/lists/{lst}/items?start={huge}",
        f"/api/v1/lists/{lst}/items?limit=0", f"/api/v1/lists/{lst}/items?limit=10001",
    ]
    pages = [
        "/jobs?queue=%00", "/jobs?state=zz", f"/jobs?task={q}", "/jobs?before=abc", f"/jobs?before={big}",
        "/jobs/abc", "/jobs/0", f"/jobs/{huge}", "/jobs/999999999", "/batches/abc", "/batches/999999999",
        "/live/batches/abc", "/live/batches/999999999", "/lists/a%20b", "/lists/no-such-list",
        f"/lists/{q}", "/live/lists/%00", "/live/lists/no-such-list",
    ]
    flash = f"?ok={MARK}&id={MARK}&n={huge}&err={MARK}"
    ignored = ["/", "/live/overview", "/dashboard/snapshot", "/batches", "/live/batches", "/lists",
               "/live/lists", "/partitions", "/live/partitions", "/effects", "/live/effects",
               f"/signin?next=//evil.example/{MARK}"]
    return ([(p, no) for p in api + pages] + [(p + (flash if "?" not in p else ""), (200,)) for p in ignored])


def credential_cases() -> list[str]:
    """GET routes whose only input is who is calling: asked with a forged bearer token."""
    return ["/api/v1/queues", "/api/v1/session", "/metrics"]


ROUTE_NO_INPUT = {
    # The service describing itself: the same document for everyone, nothing to refuse.
    ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc"),
}


def route_table() -> dict[tuple[str, str], re.Pattern[str]]:
    """Every (method, path template) the service routes, with a pattern of its paths."""
    api = create_app(App("sqlite:///never-opened.db", strict=False))
    table: dict[tuple[str, str], re.Pattern[str]] = {}

    def walk(routes: list[Any], prefix: str) -> None:
        for route in routes:
            inner = getattr(route, "original_router", None)
            if inner is not None:  # FastAPI keeps an included router whole (0.16x)
                walk(inner.routes, prefix + route.include_context.prefix)
                continue
            path = prefix + route.path
            pattern = "".join("[^/]*" if part.startswith("{") else re.escape(part)
                              for part in re.split(r"(\{[^}]+\})", path))
            methods = getattr(route, "methods", None)
            if methods is None:  # a mount (the static files)
                pattern, methods = pattern + "(/.*)?", {"GET"}
            for method in set(methods) - {"HEAD"}:
                table[(method, path)] = re.compile(f"^{pattern}$")

    walk(api.routes, "")
    return table


def routes_hit(table: dict[tuple[str, str], re.Pattern[str]], method: str, path: str) -> set[tuple[str, str]]:
    """The route a request goes to (a fixed path wins over a template that also matches)."""
    path = path.split("?", 1)[0]
    found = [key for key, pattern in table.items() if key[0] == method and pattern.match(path)]
    return set(sorted(found, key=lambda key: key[1].count("{"))[:1])


def test_hostile_path_and_query_values_on_every_get_route_are_refused_and_change_nothing(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    before = dump(lib, skip=TOUCHED)
    with server.client(server.admin) as c:
        for path, statuses in get_cases(world):
            r = c.get(path)
            assert r.status_code in statuses, (path[:100], r.status_code, r.text[:300])
            assert "Traceback" not in r.text and MARK not in r.text, path[:100]
            if r.status_code >= 400 and path.startswith("/api/"):
                assert r.headers["content-type"].startswith("application/problem+json"), path[:100]
    with server.client(FAKE_SECRET) as c:
        for path in credential_cases():
            refused(c.get(path), 401)
    assert dump(lib, skip=TOUCHED) == before


def test_every_route_is_in_the_hostile_corpus(world: dict[str, Any]) -> None:
    """Each route of the service (the API, the dashboard, /metrics, the static files) gets
    hostile input from one of the tests of this module: a new route fails here until it
    does (or ROUTE_NO_INPUT says why it takes none)."""
    table = route_table()
    requests = [("POST", p) for p, _ in api_actions(world) + hostile_json(world)]
    requests += [("POST", p) for p, _ in dash_actions(world) + dash_forms(world)]
    requests += [("GET", p) for p, _ in get_cases(world)] + [("GET", p) for p in credential_cases()]
    requests += [("POST", "/signout"), ("POST", "/api/v1/session/end"),  # the CSRF test
                 ("GET", "/static/../../../../etc/passwd")]  # the path tricks
    hit = set().union(*(routes_hit(table, m, p) for m, p in requests))
    missing = set(table) - hit - ROUTE_NO_INPUT
    assert not missing, f"routes the hostile corpus does not cover: {sorted(missing)}"
    assert not ROUTE_NO_INPUT - set(table), f"stale exclusions: {sorted(ROUTE_NO_INPUT - set(table))}"
    assert len(table) >= 60, len(table)


# -- where the browser goes, and what it is shown ------------------------------------------
def test_sign_in_and_actions_never_redirect_off_site(server: Server, world: dict[str, Any]) -> None:
    evil = ["//evil.example", "https://evil.example/", "/\\evil.example", "\\\\evil.example",
            "/\t/evil.example", "javascript:alert(1)", "///evil.example", " //evil.example",
            "/%2f%2fevil.example", "http:evil.example", "/\r\nSet-Cookie: x=1", "/\\/evil.example"]
    for nxt in evil:
        with server.client() as c:
            r = c.post("/signin", data={"token": server.admin, "next": nxt})
            assert r.status_code == 303
            loc = r.headers["location"]
            assert loc.startswith("/") and not loc.startswith("//") and "\\" not in loc, (nxt, loc)
            assert "\r" not in loc and "\n" not in loc and "\t" not in loc
            page = c.get("/signin", params={"next": nxt})
            assert 'value="//' not in page.text and 'value="/\t' not in page.text
            assert 'value="http' not in page.text and 'value="javascript' not in page.text
    with server.client(server.admin) as c:
        job = c.post("/api/v1/jobs", json={"task": "h.redirect"}).json()["id"]
        for nxt in evil:
            r = c.post(f"/jobs/{job}/cancel", data={"next": nxt}, headers={"Referer": "https://evil.example/x"})
            if r.status_code == 303:
                loc = r.headers["location"]
                assert loc.startswith("/") and not loc.startswith("//") and "\\" not in loc, (nxt, loc)
            c.post(f"/api/v1/jobs/{job}/retry")


def test_hostile_text_is_escaped_on_every_page(server: Server, lib: App) -> None:
    xss = "<script>alert(1)</script>"
    with server.client(server.admin) as c:
        job = c.post("/api/v1/jobs", json={"task": "h.x<img>", "args": [xss], "kwargs": {xss: xss},
                                           "key": f"k{xss}"}).json()
        c.post(f"/api/v1/jobs/{job['id']}/cancel")
        batch = c.post("/api/v1/batches", json={"description": xss}).json()
        c.post("/api/v1/lists", json={"name": "h-xss", "items": [xss]})
        token = c.post("/api/v1/lists/h-xss/reserve", json={"k": 1}).json()["token"]
        c.post("/api/v1/lists/h-xss/bury", json={"token": token, "reason": xss})
        pages = [c.get("/jobs"), c.get(f"/jobs/{job['id']}"), c.get("/batches"),
                 c.get(f"/batches/{batch['id']}"), c.get("/jobs", params={"task": xss}),
                 c.get("/lists"), c.get("/lists/h-xss"), c.get(f"/lists/{xss}"),
                 c.get("/signin", params={"next": f"/{xss}"}), c.get(f"/jobs/{xss}"),
                 c.post("/jobs/preview", data={"action": "cancel", "task": "h.x<img>"})]
        for page in pages:
            assert page.status_code < 500
            if not page.headers["content-type"].startswith("text/html"):
                continue
            assert "<script>alert" not in page.text and "<img>" not in page.text, page.url


def test_token_secrets_are_never_echoed_or_logged(served: tuple[Server, Path], lib: App) -> None:
    server, log = served
    with server.client() as c:
        r = c.post("/api/v1/session", json={"token": server.admin})
        assert server.admin not in r.text
        bad = server.admin[:-1] + ("A" if server.admin[-1] != "A" else "B")
        r = c.post("/api/v1/session", json={"token": bad})
        assert bad not in r.text
        r = c.post("/signin", data={"token": bad})
        assert r.status_code == 401 and bad not in r.text
    with server.client(server.admin) as c:
        for path in ("/api/v1/audit", "/api/v1/session", "/metrics"):
            assert server.admin not in c.get(path).text
    text = log.read_text(errors="replace")
    for secret in (server.admin, server.reader, bad):
        assert secret not in text and secret[12:] not in text
    assert "Traceback" not in text


WRONG_TYPES: list[str | None] = [
    "text/plain", "application/x-www-form-urlencoded", None, "application/json; charset=latin-1",
    'application/json;charset="ISO-8859-1"', "application/json; charset*=utf-8''latin-1",
    "application/json; charset=", "application/jsonx", "application/json+x", "text/json",
    "multipart/form-data; boundary=x", "application/+json", "text/x+json", "json", "", "application/",
]
"""Content-Type values (None: no header) of a body no route of the API reads."""


def typed(content_type: str | None) -> dict[str, str]:
    return {} if content_type is None else {"content-type": content_type}


def test_a_body_of_a_type_the_route_does_not_read_is_415_on_every_route_and_changes_nothing(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    """FastAPI read a body it did not take for JSON as bytes and answered 422 ("Input
    should be a valid dictionary"), blaming fields it never read; a JSON body declared
    latin-1 was read as UTF-8. Every route that reads a body (its OpenAPI operation has a
    requestBody) answers 415 UnsupportedMediaType to any other type, or none, before
    credentials; a route that reads none ignores one as before."""
    doc = httpx.get(f"{server.url}/openapi.json").json()
    table = route_table()
    routes = api_actions(world) + [("/api/v1/jobs/actions/preview", {"action": "cancel"}),
                                   ("/api/v1/session", {"token": server.admin})]
    before = dump(lib, skip=TOUCHED)
    reading = 0
    with server.client(server.admin) as c, server.client() as anon:
        for path, body in routes:
            (_, template), = routes_hit(table, "POST", path)
            operation = doc["paths"][template]["post"]
            if "requestBody" not in operation:  # (cancel, retry, seal, resume: no body read)
                assert "415" not in operation["responses"], template
                continue
            reading += 1
            assert "415" in operation["responses"], template
            accepted = sorted(operation["requestBody"]["content"])
            for kind in WRONG_TYPES:
                for raw in (json.dumps(body).encode(), b"{not json", b"x=1&y=2"):
                    for client in (c, anon):  # the same answer with or without credentials
                        r = client.post(path, content=raw, headers=typed(kind))
                        problem = assert_problem(r, 415, "UnsupportedMediaType")
                        assert sorted(problem["accepted"]) == accepted, (path, kind)
                        assert "application/json" in problem["detail"], problem
                        assert set(r.headers["accept-post"].split(", ")) == set(accepted)
        assert dump(lib, skip=TOUCHED) == before
        # An empty body is no body, whatever its type says (curl -X POST, curl -d ''):
        # the pause's body is optional; an enqueue needs one (422, as before).
        for kind in ("application/x-www-form-urlencoded", "text/plain", None):
            r = c.post("/api/v1/queues/h-media/pause", content=b"", headers=typed(kind))
            assert r.status_code == 200, (kind, r.text)
            assert c.post("/api/v1/queues/h-media/resume").status_code == 200
            # (an empty chunked body too: its length is known only once read)
            r = c.post("/api/v1/queues/h-media/pause", content=iter([b""]), headers=typed(kind))
            assert r.status_code == 200, (kind, r.text)
            assert c.post("/api/v1/queues/h-media/resume").status_code == 200
            assert_problem(c.post("/api/v1/jobs", content=b"", headers=typed(kind)), 422, "RequestValidation")
        assert c.get("/api/v1/jobs").status_code == 200  # (the connection is still usable)
    assert reading >= 18, reading
    with server.client(server.admin) as c:  # the types that are read: JSON in UTF-8, any case
        for kind in ("application/json", "application/json; charset=utf-8",
                     'Application/JSON;charset="UTF-8"', "application/json; foo=bar",
                     "application/json; charset=utf8", "application/vnd.api+json",
                     "application/merge-patch+json; charset=UTF_8"):
            r = c.post("/api/v1/jobs/actions/preview", content=b'{"action": "cancel"}', headers=typed(kind))
            assert r.status_code == 200, (kind, r.text)


def test_a_form_of_the_dashboard_sent_as_another_type_is_a_415_page_and_changes_nothing(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    """Every form of the dashboard (and the sign-in) reads an urlencoded body only: any
    other type is a 415 HTML page (the dashboard's errors are pages), nothing changed."""
    before = dump(lib, skip=TOUCHED)
    with server.client(server.admin) as c:
        for path, form in [*dash_actions(world), ("/signin", {"token": server.admin}),
                           ("/signout", {})]:
            for kind in ("application/json", "text/plain", None, "multipart/form-data; boundary=x",
                         "application/x-www-form-urlencoded; charset=latin-1"):
                raw = (json.dumps(form) if kind == "application/json" else "&".join(
                    f"{k}={v}" for k, v in form.items()) or "x=1").encode()
                r = c.post(path, content=raw, headers=typed(kind))
                assert r.status_code == 415, (path, kind, r.status_code, r.text[:200])
                assert r.headers["content-type"].startswith("text/html"), (path, kind)
                assert "Unsupported Media Type" in r.text and "Traceback" not in r.text
    assert dump(lib, skip=TOUCHED) == before


def test_odd_but_harmless_requests_are_answered_without_a_5xx_and_change_nothing(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    """What the corpus above lacked, tried once on every backend (none gave a 5xx): huge
    and many headers, numbers past 2**63 and past Python's 4,300-digit limit, times at the
    ends of the calendar, duplicate query parameters, astral characters in path segments,
    and Range headers on the static files."""
    before = dump(lib, skip=TOUCHED)
    digits, big, emoji = "1" * 5000, 2**63, quote("\U0001F600")
    lst, opened = f"/api/v1/lists/{world['list']}", f"/api/v1/lists/{world['open']}"
    gets = [f"/api/v1/jobs?limit={digits}", f"/api/v1/jobs?cursor={big}", "/api/v1/jobs?limit=-1",
            "/api/v1/jobs?limit=1&limit=0", "/api/v1/jobs?state=dead&state=zz", "/api/v1/jobs?limit=%EF%BC%91",
            "/api/v1/jobs?created_after=0001-01-01T00:00:00%2B14:00",
            "/api/v1/jobs?created_before=9999-12-31T23:59:59-14:00", f"/api/v1/lists/{emoji}",
            f"{lst}/items?start={big - 2}&limit=10000", f"/api/v1/partitions?set={emoji}",
            f"/jobs/{big}", f"/batches/{big}", f"/live/batches/{big}", f"/jobs?before={big}",
            f"/jobs?before={digits}", "/jobs?state=dead&state=zz", f"/lists/{emoji}", "/live/lists/%ff",
            "/jobs?queue=%ff"]
    posts: list[tuple[str, Any]] = [
        ("/api/v1/jobs", {"task": "t", "run_at": "0001-01-01T00:00:00+14:00"}),
        ("/api/v1/jobs", {"task": "t", "run_at": "9999-12-31T23:59:59-14:00"}),
        ("/api/v1/jobs/actions/apply", {"action": "cancel", "max_id": big, "expected": 0}),
        ("/api/v1/batches/acks", {"ids": [f"{big}:1:0"]}), (f"/api/v1/queues/{emoji}/pause", {}),
        ("/api/v1/effects/resolve", {"scope": "s" * 100_000, "key": "k", "done": True})]
    raw = [("/api/v1/jobs", '{"task": "t", "priority": ' + digits + "}"), (f"{opened}/items", f"[{digits}]"),
           ("/api/v1/jobs", '{"task": "t", "delay": 1e999}'),
           ("/api/v1/jobs", '{"task": "t", "args": [1e999]}')]
    with server.client(server.admin) as c:
        for path in gets:
            r = c.get(path)
            assert 200 <= r.status_code < 500, (path[:80], r.status_code, r.text[:200])
            assert "Traceback" not in r.text
        for path, body in posts + [(p, b.encode()) for p, b in raw]:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            refused(c.post(path, content=content, headers=JSON), 400, 404, 409, 422)
        for headers in ({"X-Big": "a" * 100_000}, {f"X-H{i}": "v" for i in range(500)},
                        {"Cookie": "justonce_session=" + "a." * 5000}, {"X-CSRF-Token": "\xe9".encode()}):
            for path in ("/api/v1/jobs", "/jobs"):
                assert c.get(path, headers=headers).status_code == 200, (path, list(headers)[:1])
        for rng in ("bytes=999999999999999999999999-", "bytes=-0", "bytes=a-b", "bytes=5-1",
                    "bytes=" + ",".join(["0-0"] * 2000), "items=0-1"):
            assert c.get("/static/dashboard.css", headers={"Range": rng}).status_code in (200, 206, 400, 416)
        assert c.get("/api/v1/jobs").status_code == 200
    assert dump(lib, skip=TOUCHED) == before


def test_json_nested_10000_deep_is_a_malformed_json_problem_on_every_route(
        server: Server, lib: App, world: dict[str, Any]) -> None:
    """A body nested past the parser's recursion limit was FastAPI's "There was an error
    parsing the body" (a BadRequest that did not say what was wrong), not the problem the
    service answers for any other malformed JSON."""
    before = dump(lib, skip=TOUCHED)
    bodies = [b"[" * 10_000 + b"]" * 10_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
              b'{"task": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"]
    routes = [p for p, body in api_actions(world) if body] + ["/api/v1/jobs/actions/preview", "/api/v1/session"]
    with server.client(server.admin) as c:
        for path in routes:
            for body in bodies:
                assert_problem(c.post(path, content=body, headers=JSON), 400, "MalformedJson")
        assert_problem(c.post(f"/api/v1/lists/{world['open']}/items", content=bodies[0] + b"\n",
                              headers={"content-type": "application/x-ndjson"}), 400, "MalformedJson")
        assert c.get("/api/v1/jobs").status_code == 200
    assert dump(lib, skip=TOUCHED) == before


def test_applying_a_preview_that_found_no_job_leaves_jobs_enqueued_since_alone(
        server: Server, lib: App) -> None:
    """The dashboard's apply of a preview that found no job carries max_id 0. Applying it
    changes nothing, even for jobs of the filter that arrived after the preview and fit
    the expected count (0 once meant "no bound", and such a job was cancelled)."""
    browser, csrf = sign_in(server, server.admin)
    with closing(browser):
        late = lib.enqueue("h.late", queue="late-after-preview")
        r = browser.post("/jobs/apply", data={"csrf": csrf, "action": "cancel", "queue": "late-after-preview",
                                              "max_id": "0", "expected": "1"})
        assert r.status_code == 303 and "n=0" in r.headers["location"], (r.status_code, r.text[:300])
        assert lib.get_job(late.id).state == "ready"
        refused(browser.post("/jobs/apply", data={"csrf": csrf, "action": "explode", "max_id": "0",
                                                   "expected": "0"}), 400, 422)
