"""The tests' name for :mod:`justonce.testing.pgcluster` (the torture scenarios use it too)."""

from justonce.testing.pgcluster import DEFAULT_URL, Cluster, can_connect, free_port, pg_bin, wait_until

__all__ = ["DEFAULT_URL", "Cluster", "can_connect", "free_port", "pg_bin", "wait_until"]
