"""The torture scenarios' short form (python -m justonce.testing.torture): kill -9 and
SIGSTOP at random, a kill at every failpoint, and a poison job, on every backend, with the
history checked. JUSTONCE_TORTURE_MINUTES sets the time with faults (shared among the runs;
each gets at least 5 s); the long form is the command itself, for as long as you like:
``python -m justonce.testing.torture --minutes 60``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from conftest import LONG, REQUIRE_MYSQL, REQUIRE_PG, mysql_or_skip, postgres_or_skip
from justonce.testing.netns import unavailable as netns_unavailable
from justonce.testing.torture import ONLY_ON, SCENARIOS, missing_tool

pytestmark = pytest.mark.slow

MINUTES = os.environ.get("JUSTONCE_TORTURE_MINUTES", "3" if LONG else "0.1")
"""The short form (CI, under a minute): chaos (random kill -9 and SIGSTOP) on every
backend, a kill at every failpoint on SQLite, a worker host cut off from Postgres, and
SQLite's disk filled and freed under its workers.
JUSTONCE_LONG_TESTS=1 runs every scenario on every backend (failpoints, poison, skew, crowd,
pgbouncer, pg-restart, cut-off, full-disk too)."""


def test_every_scenario_on_every_backend_ends_with_no_violation() -> None:
    env = dict(os.environ)
    backends = ["sqlite"]
    pg = _url(postgres_or_skip, REQUIRE_PG)
    if pg is not None:
        backends.append("postgres")
        env["JUSTONCE_TEST_POSTGRES_URL"] = pg  # a throwaway cluster's, when it is one
    my = _url(mysql_or_skip, REQUIRE_MYSQL)
    if my is not None:
        backends.append("mysql")
        env["JUSTONCE_TEST_MYSQL_URL"] = my
    runs = ([(list(SCENARIOS), backends)] if LONG else
            [(["chaos"], backends), (["failpoints"], ["sqlite"])])
    if not LONG:
        why = missing_tool("full-disk")
        if why is None:
            runs.append((["full-disk"], ["sqlite"]))
        elif os.environ.get("CI"):
            pytest.fail(f"the full-disk scenario cannot run here: {why}")
        else:
            print(f"SKIPPED the full-disk scenario: {why}", file=sys.stderr)
    if not LONG and pg is not None:
        why = netns_unavailable()
        if why is None:
            runs.append((["cut-off"], ["postgres"]))
        elif REQUIRE_PG:
            pytest.fail(f"the cut-off scenario cannot run here: {why}")
        else:
            print(f"SKIPPED the cut-off scenario: {why}", file=sys.stderr)
    for scenarios, on in runs:
        table = _torture(scenarios, on, env)
        expected = [(sc, b) for b in on for sc in scenarios if b in ONLY_ON.get(sc, {b})]
        assert len(table) == len(expected), table
        for row in table:
            scenario, backend, faults = (c.strip() for c in row.strip("|").split("|")[:3])
            # The faults happened (the run cannot pass vacuously); each point was reached.
            assert faults != "none", row
            if scenario == "failpoints":
                assert "not reached" not in faults and "exited" not in faults, row
            if scenario == "pg-restart":
                assert "postgres stopped -m immediate" in faults, row
            if scenario == "cut-off":
                assert "link cut" in faults, row
            if scenario == "full-disk":
                assert "disk full" in faults, row


def _torture(scenarios: list[str], backends: list[str], env: dict[str, str]) -> list[str]:
    """Run the command; its table's rows (after checking it ended with 0 violations)."""
    seed = int(os.environ.get("JUSTONCE_TORTURE_SEED", "20261125"))
    out = subprocess.run(
        [sys.executable, "-m", "justonce.testing.torture", "--minutes", MINUTES, "--seed",
         str(seed), "--backends", ",".join(backends), "--scenarios", ",".join(scenarios),
         "--require-all"],
        capture_output=True, text=True, timeout=1800, env=env)
    print(out.stdout[-20000:])
    print(out.stderr[-5000:], file=sys.stderr)
    lines = out.stdout.strip().splitlines()
    assert lines and lines[-1] == "violations: 0", out.stdout[-5000:] + out.stderr[-3000:]
    assert out.returncode == 0
    return [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| scenario")]


def _url(probe: Callable[[], str], required: bool) -> str | None:
    """The server's URL, or None when it does not answer (a failure when required)."""
    if required:
        return probe()
    try:
        return probe()
    except BaseException:  # noqa: BLE001 - pytest.skip is a BaseException
        return None
