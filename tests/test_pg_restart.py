"""A worker process survives a PostgreSQL restart (a throwaway cluster of its own)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import proc_app
from justonce import App, DatabaseUnavailable, Enqueue
from pgcluster import Cluster, own_cluster
from test_processes import Fleet, ledger, state_counts, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    yield from own_cluster("restart")


def _app_and_fleet(url: str, tmp_path: Path) -> tuple[App, Fleet]:
    """proc_app's App on the cluster, migrated, with its ledger table, and a Fleet of
    worker processes for it."""
    app = proc_app.app
    app.use_database(url)
    app.migrate()
    proc_app.create_ledger(url)
    return app, Fleet(url, tmp_path)


@pytest.mark.parametrize("down", [0.0, 3.0], ids=["restart", "down_3s"])
def test_postgres_restart_under_a_running_worker_it_reconnects_and_all_jobs_succeed(
    cluster: Cluster, tmp_path: Path, down: float
) -> None:
    """Restart the PostgreSQL server (pg_ctl stop -m fast; start) under a running worker
    process, while slow jobs run; at once, or after 3 s down (longer than the 2 s lease,
    so the worker's heartbeats and writes fail meanwhile). The worker is not restarted: it
    reconnects by itself, and every job queued before and after the restart ends
    succeeded, each in the ledger."""
    url = cluster.url
    app, fleet = _app_and_fleet(url, tmp_path)
    try:
        w = fleet.start(concurrency=2)
        before = app.enqueue_many(Enqueue(proc_app.record, args=(n,)) for n in range(100))
        before += app.enqueue_many(Enqueue(proc_app.slow_record, args=(n, 1.5))
                                   for n in range(100, 102))
        wait_for(lambda: state_counts(app)["succeeded"] >= 100 and len(ledger(url, "start")) >= 1,
                 30, "the first jobs to run")

        if down:
            cluster.stop("fast")
            time.sleep(down)
            cluster.start()
        else:
            cluster.restart()

        # The app's pooled connections died with the server: an enqueue may fail until the
        # pool has replaced them (each failure is a clear DatabaseUnavailable).
        failures = 0
        deadline = time.monotonic() + 30
        while True:
            try:
                after = app.enqueue_many(Enqueue(proc_app.record, args=(n,)) for n in range(200, 300))
                break
            except DatabaseUnavailable:
                failures += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

        total = len(before) + len(after)
        wait_for(lambda: state_counts(app)["succeeded"] == total, 60,
                 f"all {total} jobs to succeed (now {dict(state_counts(app))})", interval=0.2)
        expected = set(range(102)) | set(range(200, 300))
        assert {n for n, _, _ in ledger(url)} == expected
        assert w.popen.poll() is None, "the worker died:\n" + w.tail()
        assert {pid for _, pid, _ in ledger(url)} == {w.pid}
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0, w.tail()
        print(f"enqueue failures after the restart: {failures}")
    finally:
        fleet.kill_all()
        app.close()


def unavailable(app: App, calls: int) -> int:
    """How many of ``calls`` plain reads failed with DatabaseUnavailable."""
    failures = 0
    for _ in range(calls):
        try:
            app.queue_counts()
        except DatabaseUnavailable:
            failures += 1
    return failures


def test_after_a_restart_no_call_fails_on_a_dead_pooled_connection(cluster: Cluster) -> None:
    """Every connection of the pool was open before the restart. Idle past IDLE_CHECK, each
    is checked before it is lent (a dead one is replaced), so once the server answers no
    call fails; and a failure on a dead connection makes the pool check the others, so a
    burst of calls fails at most once."""
    import threading

    from justonce import App

    app = App(cluster.url + "?pool_size=4")
    app.migrate()
    try:
        def busy() -> None:
            for _ in range(20):
                app.queue_counts()

        threads = [threading.Thread(target=busy) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cluster.restart()
        failures = unavailable(app, 12)
        assert failures == 0

        # Used just before the server went away (not idle long enough to be checked).
        for t in [threading.Thread(target=busy) for _ in range(4)]:
            t.start()
            t.join()
        cluster.stop("immediate")
        cluster.start()
        failures = unavailable(app, 12)
        assert failures <= 1

        # Connections the pool made but never lent (it grows in the background while
        # callers wait, and may end with one nobody used): checked before their first use.
        pool = app.backend.pg._get_pool()  # type: ignore[attr-defined]
        made = [pool.getconn() for _ in range(4)]
        for conn in made:
            pool.putconn(conn)
        cluster.restart()
        assert unavailable(app, 12) == 0
    finally:
        app.close()


OUTAGE = 17.0
"""How long the server stays down, counted from the first call that finds it gone. psycopg's
pool retries a failed connection after ~1, 2, 4, 8, 16 s... (±10 %): from that call its
tries fall ~15 s and ~31 s in. The server comes back ~17.5 s in, between the two: an
uncapped backoff would leave the pool waiting ~10 s more, a capped one finds it in ~1 s."""


def test_after_a_long_outage_the_app_and_a_worker_reconnect_within_seconds(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Stop the server for OUTAGE seconds under an App and a running worker process, both
    of which find it gone. Once the server accepts connections again, a call through the
    App succeeds within 3 s, and the worker runs newly queued jobs within 5 s: the pools
    try again at least every second, whatever the outage's length."""
    url = cluster.url
    app, fleet = _app_and_fleet(url, tmp_path)
    try:
        w = fleet.start(concurrency=2)
        before = app.enqueue_many(Enqueue(proc_app.record, args=(n,)) for n in range(10))
        wait_for(lambda: state_counts(app)["succeeded"] >= len(before), 30, "the first jobs to run")

        cluster.stop("fast")
        gone = time.monotonic()
        # The App's pool finds its connections dead and starts reconnecting here (the
        # worker's does within a heartbeat).
        with pytest.raises(DatabaseUnavailable):
            app.queue_counts()
        time.sleep(max(0.0, gone + OUTAGE - time.monotonic()))
        cluster.start()  # returns once the server accepts connections
        back = time.monotonic()

        failures = 0
        while True:
            try:
                after = app.enqueue_many(Enqueue(proc_app.record, args=(n,)) for n in range(100, 110))
                break
            except DatabaseUnavailable:
                failures += 1
                if time.monotonic() - back > 30:
                    raise
                time.sleep(0.1)
        app_lag = time.monotonic() - back
        total = len(before) + len(after)
        wait_for(lambda: state_counts(app)["succeeded"] == total, 30,
                 f"all {total} jobs to succeed (now {dict(state_counts(app))})", interval=0.1)
        worker_lag = time.monotonic() - back
        print(f"outage {back - gone:.1f} s; the App's first call succeeded {app_lag:.2f} s after "
              f"the server was back ({failures} failed); the worker's jobs done {worker_lag:.2f} s after")
        assert app_lag < 3.0, f"the App reconnected {app_lag:.1f} s after the server was back"
        assert worker_lag < 5.0, f"the worker ran new jobs {worker_lag:.1f} s after the server was back"
        assert {n for n, _, _ in ledger(url)} == set(range(10)) | set(range(100, 110))
        assert w.popen.poll() is None, "the worker died:\n" + w.tail()
    finally:
        fleet.kill_all()
        app.close()
