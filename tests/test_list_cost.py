"""A reserve does not get dearer as the list grows (issue 12: O(1), no scan).

Timings are the benchmark's business (bench/lists_bench.py measures reserve+complete rates
at 10,000 and 10,000,000 items); a test must not assert them. What a test can hold
deterministically is the work the database does per reserve + complete, counted by the
database itself: SQLite's virtual-machine instructions (a progress handler on the
backend's connection), MariaDB's handler reads of the session (one pooled connection),
and Postgres' tuples read per table (pg_stat_user_tables, flushed when the backends exit).
An O(N) step (a scan of the items or of the reservations) would multiply that work by the
size ratio; the assertion allows 20 %, plus a few rows for plans that differ on tiny tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

import proc_app
from conftest import LONG
from justonce import App

pytestmark = pytest.mark.slow

SMALL = 10_000
BIG = 10_000_000 if LONG else 100_000
OPS = 200


def workload(app: App, name: str) -> None:
    """OPS reserve+complete of one position, and 20 of 100 (one re-offered after its TTR)."""
    for _ in range(OPS):
        res = app.lists.reserve(name, 1)
        assert res is not None
        app.lists.complete(res)
    late = app.lists.reserve(name, 100, ttr=0.05)
    assert late is not None
    time.sleep(0.1)
    for _ in range(20):
        res = app.lists.reserve(name, 100)
        assert res is not None
        app.lists.complete(res)


def load(url: str, name: str, n: int) -> None:
    app = App(url)
    try:
        app.lists.create(name, items=range(n))
    finally:
        app.close()


def cost_sqlite(url: str, name: str) -> int:
    app = App(url)
    try:
        conn = app.backend.sqlite._conn()  # type: ignore[attr-defined]
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        conn.set_progress_handler(count, 10)
        workload(app, name)
        conn.set_progress_handler(None, 0)
        return steps[0] * 10
    finally:
        app.close()


def _handler_reads(c: Any) -> int:
    with c.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        return sum(int(v) for _, v in cur.fetchall())


def cost_mysql(url: str, name: str) -> int:
    sep = "&" if "?" in url else "?"
    app = App(f"{url}{sep}pool_size=1")
    try:
        backend = app.backend.mysql  # type: ignore[attr-defined]
        with backend._connection() as c:
            before = _handler_reads(c)
        workload(app, name)
        with backend._connection() as c:
            return _handler_reads(c) - before
    finally:
        app.close()


def _tuples_read(url: str) -> int:
    schema = dict(parse_qsl(urlsplit(url).query))["schema"]
    conn = proc_app.ledger_connect(url)
    try:
        row = conn.execute(
            "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)"
            "  FROM pg_stat_user_tables WHERE schemaname = %s", (schema,)).fetchone()
        return int(row[0])
    finally:
        conn.close()


def _settled(read: Callable[[], int]) -> int:
    """The counter once it stops moving (backends flush their stats as they exit)."""
    last, stable_since = read(), time.monotonic()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = read()
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 1.0:
            break
    return last


def cost_postgres(url: str, name: str) -> int:
    before = _settled(lambda: _tuples_read(url))
    app = App(url)
    try:
        workload(app, name)
    finally:
        app.close()  # the pool's backends exit and flush their table statistics
    return _settled(lambda: _tuples_read(url)) - before


COST = {"sqlite": cost_sqlite, "mysql": cost_mysql, "postgres": cost_postgres}


def test_reserve_and_complete_cost_the_same_on_a_small_and_a_big_list(db_url: str) -> None:
    kind = db_url.split(":", 1)[0].replace("postgresql", "postgres")
    App(db_url).migrate()
    load(db_url, "small", SMALL)
    load(db_url, "big", BIG)
    if kind == "postgres":
        conn = proc_app.ledger_connect(db_url)
        conn.execute("ANALYZE")
        conn.close()
    small = COST[kind](db_url, "small")
    big = COST[kind](db_url, "big")
    ops = OPS + 21
    print(f"\n{kind}: work per reserve+complete {small / ops:.1f} at {SMALL} items, "
          f"{big / ops:.1f} at {BIG}")
    assert small > 0
    assert big <= small * 1.2 + 5 * ops, (
        f"{kind}: {big} units of work for {ops} reserve+complete on {BIG} items, "
        f"{small} on {SMALL}")
