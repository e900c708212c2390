"""The dashboard in a real browser: a real `justonce serve` process and headless Chromium
(Debian's package, driven by Playwright's Python package through its executable_path).

Without Chromium or Playwright the tests skip with a loud reason, except under CI (the
CI environment variable set, as .ci/run does), where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from justonce import App
from justonce.models import Failure
from pgcluster import free_port

CHROMIUM = os.environ.get("JUSTONCE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
XSS = "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\"> SMTP 421"
ROOT = Path(__file__).resolve().parent.parent


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the browser test must run)", pytrace=False)
    pytest.skip(f"BROWSER TEST NOT RUN: {reason}")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[dev]')")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[tuple[str, App]]:
    """`justonce serve` on a free loopback port over a migrated database."""
    app = App(db_url, strict=False)
    app.migrate()
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "justonce", "serve", "--port", str(port), "--database-url", db_url],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "JUSTONCE_SECRET_KEY": "test-key"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(base + "/signin", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"serve did not start: {(tmp_path / 'serve.log').read_text()}") from None
            time.sleep(0.1)
    try:
        yield base, app
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        app.close()


def _sign_in(browser: Any, base: str, secret: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(base + "/")
    assert "/signin" in page.url, "an anonymous visitor is sent to the sign-in page"
    page.fill("input[name=token]", secret)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")
    return page


def _dead_job(app: App, error: str) -> int:
    job = app.enqueue("shop.tasks.send_receipt", [1, "ada@example.com"], queue="mail")
    [claimed] = app.backend.job_claim("mail", 1, "worker-1@host-a:4242", 300)
    assert claimed.id == job.id
    app.backend.job_fail(Failure(job.id, claimed.lease_token, error, None))
    return job.id


def test_admin_signs_in_watches_a_batch_retries_a_dead_job_and_cancels_all_matching(
        chromium: Any, server: tuple[str, App], tmp_path: Path) -> None:
    base, app = server
    _, secret = app.tokens.create("ada", "admin")
    dead_id = _dead_job(app, XSS)
    for i in range(20):
        app.enqueue("shop.tasks.refresh", [i], queue="default")
    bulk = [app.enqueue("shop.tasks.reindex", [i], queue="bulk").id for i in range(7)]
    batch = app.batches.open(description="catalog import")
    group = batch.add(200)
    batch.seal()

    page = _sign_in(chromium, base, secret)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.wait_for_selector(f"tr[data-job='{dead_id}']")
    page.screenshot(path=str(tmp_path / "overview.png"))

    # An error message with markup is shown as text: no script ran, no element was made.
    row = page.locator(f"tr[data-job='{dead_id}'] td.err")
    assert "<script>" in row.inner_text()
    assert page.evaluate("window.__xss") is None and dialogs == []
    assert page.locator("td.err script, td.err img").count() == 0

    # A message in the URL is only ever one of the dashboard's own: crafted text is not shown.
    page.goto(f"{base}/jobs?err=Your+session+expired,+sign+in+at+evil.example")
    assert "evil.example" not in page.content() and page.locator(".flash").count() == 0
    page.goto(f"{base}/jobs?err=count_changed")
    assert "changed since the preview" in page.locator(".flash").inner_text()

    # The jobs page pages backwards by id: "older →" follows the cursor.
    page.goto(f"{base}/jobs?queue=default")
    assert page.locator("a.older").count() == 0  # 20 jobs: one page
    page.goto(f"{base}/jobs?queue=default&before={bulk[0]}")
    shown = [int(x) for x in page.locator("tr[data-job]").evaluate_all(
        "rows => rows.map(r => r.dataset.job)")]
    assert shown and all(i < bulk[0] for i in shown) and shown == sorted(shown, reverse=True)

    # The batch's bar moves while items are acked, without a reload.
    page.goto(f"{base}/batches/{batch.id}")
    bar = page.locator(f"[role=progressbar][data-batch='{batch.id}']")
    assert bar.get_attribute("aria-valuenow") == "0"
    page.evaluate("window.__same_page = true")
    ids = group.item_ids()

    def ack() -> None:
        for start in range(0, 200, 25):
            app.batches.ack(ids[start:start + 25])
            time.sleep(0.4)

    acker = threading.Thread(target=ack)
    acker.start()
    seen = [0]
    deadline = time.monotonic() + 20
    while seen[-1] < 200 and time.monotonic() < deadline:
        now = int(bar.get_attribute("aria-valuenow") or 0)
        if now != seen[-1]:
            seen.append(now)
        time.sleep(0.2)
    acker.join()
    page.screenshot(path=str(tmp_path / "batch.png"))
    assert seen[-1] == 200, f"the bar ended at {seen[-1]} of 200"
    assert len(seen) >= 3 and seen == sorted(seen), f"the bar moved in steps: {seen}"
    assert page.evaluate("window.__same_page") is True, "the page was not reloaded"
    width = bar.locator(".ok").evaluate("e => e.style.width")
    assert width == "100%"

    # Retry a dead job with its button: it is ready again.
    page.goto(base + "/")
    page.locator(f"tr[data-job='{dead_id}'] button", has_text="Retry").click()
    page.wait_for_selector("text=is ready again")
    assert app.get_job(dead_id).state == "ready"

    # Cancel all matching: the count shown first is the number of matching jobs.
    page.goto(f"{base}/jobs?queue=bulk&state=ready")
    page.get_by_role("button", name="Cancel all matching…").click()
    text = page.locator("#confirm-text").inner_text()
    assert text == "Cancel 7 matching jobs?", text
    assert sum(1 for j in app.list_jobs(queue="bulk", state="ready", limit=100)) == 7
    page.screenshot(path=str(tmp_path / "cancel-preview.png"))
    page.get_by_role("button", name="Cancel 7").click()
    page.wait_for_selector("text=Cancelled 7 jobs.")
    assert {app.get_job(j).state for j in bulk} == {"cancelled"}
    assert app.get_job(dead_id).state == "ready", "a job outside the filter is untouched"

    # Pause a queue from the overview: workers stop taking its jobs; resume it.
    page.goto(base + "/")
    page.locator("tr[data-queue='default'] button", has_text="Pause").click()
    page.wait_for_selector("text=The queue is paused")
    assert [p.queue for p in app.paused_queues()] == ["default"]
    assert page.locator("tr[data-queue='default'] .paused").inner_text() == "paused"
    assert app.backend.job_claim("default", 5, "worker-1@host-a:4242", 60) == []
    page.locator("tr[data-queue='default'] button", has_text="Resume").click()
    page.wait_for_selector("text=The queue is resumed")
    assert app.paused_queues() == []
    assert page.locator("tr[data-queue='default'] .paused").count() == 0

    # A POST without the session's CSRF token is refused, even with an admin session.
    forged = page.request.post(f"{base}/jobs/{dead_id}/cancel", form={"csrf": "forged"})
    assert forged.status == 403
    assert app.get_job(dead_id).state == "ready"
    page.goto(base + "/")
    page.wait_for_timeout(2500)  # one live refresh
    page.screenshot(path=str(tmp_path / "overview-after.png"))
    if os.environ.get("JUSTONCE_UPDATE_SCREENSHOT") and "sqlite" in app.database_url:
        shutil.copy(tmp_path / "overview.png", ROOT / "docs" / "dashboard.png")


def test_read_only_token_sees_no_buttons_and_its_forged_posts_are_refused(
        chromium: Any, server: tuple[str, App], tmp_path: Path) -> None:
    base, app = server
    _, secret = app.tokens.create("viewer", "read")
    dead_id = _dead_job(app, "boom")
    live = app.enqueue("shop.tasks.refresh", [1], queue="default")

    page = _sign_in(chromium, base, secret)
    page.wait_for_selector(f"tr[data-job='{dead_id}']")
    assert page.locator("main button").count() == 0, "no action buttons for a read token"
    page.goto(f"{base}/jobs/{dead_id}")
    assert page.locator("main button").count() == 0
    page.goto(f"{base}/jobs")
    assert page.get_by_role("button", name="Cancel all matching…").count() == 0
    page.screenshot(path=str(tmp_path / "read-only.png"))

    # Forged actions, with the session's own CSRF token even: 403, nothing changes.
    csrf = page.context.cookies()
    token = next(c["value"] for c in csrf if c["name"] == "justonce_csrf")
    for path, form in ((f"/jobs/{dead_id}/retry", {}), (f"/jobs/{live.id}/cancel", {}),
                       ("/jobs/apply", {"action": "cancel", "max_id": "0", "expected": "1"}),
                       ("/queues/default/pause", {})):
        r = page.request.post(base + path, form={"csrf": token, **form})
        assert r.status == 403, (path, r.status)
    assert app.paused_queues() == []
    assert app.get_job(dead_id).state == "dead"
    assert app.get_job(live.id).state == "ready"

    # Signed out, every page sends the browser back to the sign-in page.
    page.goto(base + "/")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/signin")
    page.goto(f"{base}/jobs/{dead_id}")
    assert "/signin" in page.url
