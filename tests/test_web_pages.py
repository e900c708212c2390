"""Errors a person meets in the dashboard are HTML pages, not JSON: a real ``justonce
serve`` over a PostgreSQL cluster of its own, stopped under it (nothing shared is
stopped) and started again; and a 500 of a page in-process.

A person who opened the dashboard while the database was away got a problem+json
document (503) in the browser window. The JSON API keeps its problem documents."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from justonce import App
from justonce.web.app import create_app
from pgcluster import Cluster, own_cluster, wait_until
from test_dashboard_browser import chromium  # noqa: F401 (a fixture)
from test_web_api import assert_problem
from webserver import Server, serving

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
PASSWORD = "never-shown-pw-7f3a"
"""In the service's database URL: the trust cluster ignores it; no page may show it."""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    yield from own_cluster("stop")


def signed_in(server: Server) -> tuple[httpx.Client, str]:
    """A browser-like client signed in by the dashboard's own form, and its CSRF token."""
    c = server.client()
    r = c.post("/signin", data={"token": server.admin, "next": "/"})
    assert r.status_code == 303, r.text
    return c, c.cookies["justonce_csrf"]


def assert_unavailable_page(r: httpx.Response, *, refreshes: bool) -> None:
    """A 503 HTML page in the dashboard's style: says the database is away and that the
    page works again when it is back; asks to retry; no trace, no password."""
    assert r.status_code == 503, (r.request.url, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("text/html"), r.headers
    assert r.headers["retry-after"].isdigit()
    assert r.headers["cache-control"] == "no-store"
    text = r.text
    assert "The database is unavailable" in text and "work again" in text, text
    assert "/static/dashboard.css" in text
    assert ('http-equiv="refresh"' in text) is refreshes, text
    assert "Traceback" not in text and 'File "' not in text and PASSWORD not in text


def test_pages_say_the_database_is_away_as_html_and_work_again_when_it_is_back(
        cluster: Cluster, tmp_path: Path) -> None:
    """Stop the service's PostgreSQL server under a signed-in dashboard: its pages (with a
    browser's Accept header or none) answer a 503 HTML page that reloads itself, a form's
    action a 503 page that does not (a reload would send it again), the API and the
    snapshot JSON keep their problem documents. Started again, the same pages serve."""
    url = cluster.url.replace("postgres@", f"postgres:{PASSWORD}@")
    with serving(url, tmp_path / "serve.log") as server:
        job = App(url, strict=False).enqueue("pages.job").id
        browser, csrf = signed_in(server)
        api = server.client(server.admin)
        with closing(browser), closing(api):
            assert browser.get("/", headers={"accept": BROWSER_ACCEPT}).status_code == 200
            cluster.stop()
            assert_unavailable_page(browser.get("/", headers={"accept": BROWSER_ACCEPT}), refreshes=True)
            assert_unavailable_page(browser.get(f"/jobs/{job}"), refreshes=True)  # (Accept: */*)
            assert_unavailable_page(browser.get("/live/overview", headers={"accept": "text/html"}),
                                    refreshes=True)
            assert_unavailable_page(browser.post(f"/jobs/{job}/cancel", data={"csrf": csrf}),
                                    refreshes=False)
            body = assert_problem(api.get("/api/v1/queues", headers={"accept": BROWSER_ACCEPT}),
                                  503, "DatabaseUnavailable")
            assert PASSWORD not in body["detail"]
            assert_problem(browser.get("/dashboard/snapshot"), 503, "DatabaseUnavailable")
            assert_problem(browser.get("/dashboard/snapshot", headers={"accept": BROWSER_ACCEPT}),
                           503, "DatabaseUnavailable")
            page = browser.get("/jobs?state=ready", headers={"accept": BROWSER_ACCEPT})
            assert_unavailable_page(page, refreshes=True)
            assert 'href="/jobs?state=ready"' in page.text  # (its "try again" keeps the query)
            cluster.start()
            assert wait_until(lambda: browser.get("/").status_code == 200, timeout=60, interval=0.5)
            assert browser.get(f"/jobs/{job}").status_code == 200
            assert api.get("/api/v1/queues").status_code == 200
    assert PASSWORD not in (tmp_path / "serve.log").read_text(errors="replace")


def test_a_write_locked_sqlite_file_is_a_503_page_for_an_action_and_a_problem_on_the_api(
        tmp_path: Path) -> None:
    """Another process holds the service's SQLite file in an exclusive transaction longer
    than the service's busy timeout. Pages still read (WAL: readers are not blocked); an
    action of the dashboard answers a 503 HTML page that says the database is busy (one
    that does not reload itself: that would send the action again), the API's a 503
    problem; once the lock is let go, the same action succeeds."""
    path = tmp_path / "jobs.db"
    with serving(f"sqlite:///{path}?busy_timeout=600", tmp_path / "serve.log") as server:
        job = App(server.db_url, strict=False).enqueue("pages.locked").id
        browser, csrf = signed_in(server)
        api = server.client(server.admin)
        holder = sqlite3.connect(path, isolation_level=None)
        with closing(browser), closing(api), closing(holder):
            holder.execute("BEGIN EXCLUSIVE")
            assert browser.get("/jobs").status_code == 200
            r = browser.post(f"/jobs/{job}/cancel", data={"csrf": csrf},
                             headers={"accept": BROWSER_ACCEPT})
            assert r.status_code == 503 and r.headers["content-type"].startswith("text/html"), r.text[:300]
            assert r.headers["retry-after"].isdigit() and 'http-equiv="refresh"' not in r.text
            assert "The database is busy" in r.text and "Traceback" not in r.text
            assert_problem(api.post(f"/api/v1/jobs/{job}/cancel"), 503, "LockTimeout")
            holder.execute("ROLLBACK")
            assert browser.post(f"/jobs/{job}/cancel", data={"csrf": csrf}).status_code == 303
            assert api.get(f"/api/v1/jobs/{job}").json()["state"] == "cancelled"


def test_a_browser_shows_the_unavailable_page_and_the_dashboard_once_the_database_is_back(
        cluster: Cluster, tmp_path: Path, chromium: Any) -> None:  # noqa: F811
    """Headless Chromium, signed in, opens the overview while the database is stopped: it
    shows the page that says so (not JSON), which reloads itself; once the database is
    started again, a reload shows the dashboard, with nobody touching the browser."""
    with serving(cluster.url, tmp_path / "serve.log") as server:
        client, _ = signed_in(server)
        with closing(client):
            cookies = [{"name": k, "value": v, "url": server.url} for k, v in client.cookies.items()]
        context = chromium.new_context()
        try:
            context.add_cookies(cookies)
            page = context.new_page()
            cluster.stop()
            response = page.goto(server.url + "/")
            assert response is not None and response.status == 503
            assert page.get_by_text("The database is unavailable").is_visible()
            assert "work again" in page.inner_text("body")
            cluster.start()
            page.wait_for_selector("nav.side", timeout=60_000)  # the dashboard, reloaded by the page
            assert page.title().startswith("Overview")
        finally:
            context.close()


def test_an_unexpected_failure_of_a_page_is_an_html_500_without_its_cause(tmp_path: Path) -> None:
    """A page that fails for a reason nobody foresaw (a route of the application's own,
    here) answers an HTML 500 that says nothing of the cause; the same failure under the
    API's path stays a problem document. So do a path that is nowhere, and a browser's
    form over the body limit (refused before any route is chosen)."""
    app = App(f"sqlite:///{tmp_path / 'jobs.db'}", strict=False)
    app.migrate()
    web = create_app(app, max_body_bytes=1024)

    def broken() -> None:
        raise RuntimeError(f"secret cause {PASSWORD}")

    web.add_api_route("/broken", broken)
    web.add_api_route("/api/v1/broken", broken)
    from fastapi.testclient import TestClient

    with TestClient(web, raise_server_exceptions=False) as c:
        r = c.get("/broken", headers={"accept": BROWSER_ACCEPT})
        assert r.status_code == 500 and r.headers["content-type"].startswith("text/html"), r.text
        assert "Something went wrong" in r.text and "InternalError" in r.text
        assert PASSWORD not in r.text and "secret cause" not in r.text and "Traceback" not in r.text
        assert_problem(c.get("/api/v1/broken", headers={"accept": BROWSER_ACCEPT}), 500, "InternalError")
        assert_problem(c.get("/broken"), 500, "InternalError")  # (a program: Accept */*)
        r = c.get("/no/such/page", headers={"accept": BROWSER_ACCEPT})
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "no route GET /no/such/page" in r.text
        assert_problem(c.get("/no/such/page"), 404, "NotFound")
        form = {"content-type": "application/x-www-form-urlencoded"}
        r = c.post("/jobs/preview", content=b"x" * 2000, headers={**form, "accept": BROWSER_ACCEPT})
        assert r.status_code == 413 and r.headers["content-type"].startswith("text/html"), r.text
        assert "limited to 1024 bytes" in r.text
        assert_problem(c.post("/api/v1/jobs", content=b"x" * 2000, headers={"accept": BROWSER_ACCEPT}),
                       413, "BodyTooLarge")
    app.close()
