"""The tests' name for :mod:`justonce.testing.pgcluster` (the torture scenarios use it too),
and a cluster of a test's own to stop and start."""

import os
from collections.abc import Iterator

import pytest

from justonce.testing.pgcluster import DEFAULT_URL, Cluster, can_connect, free_port, pg_bin, wait_until

__all__ = ["DEFAULT_URL", "Cluster", "can_connect", "free_port", "own_cluster", "pg_bin", "wait_until"]


def own_cluster(purpose: str) -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster (``yield from`` it in a fixture), destroyed after; the
    test fails (JUSTONCE_REQUIRE_POSTGRES=1) or skips where initdb and pg_ctl are missing."""
    if pg_bin() is None:
        msg = f"initdb / pg_ctl not found: cannot start a PostgreSQL cluster to {purpose}"
        if os.environ.get("JUSTONCE_REQUIRE_POSTGRES") == "1":
            pytest.fail(msg + " (JUSTONCE_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip(msg)
    c = Cluster.create()
    try:
        yield c
    finally:
        c.destroy()
