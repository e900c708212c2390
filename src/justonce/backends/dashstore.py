"""The dashboard's read operations, one algorithm over each backend's ``dash_*`` statements
(like batchstore.py).

Every statement here is bounded on a big table: it walks a partial index, reads the
planner's statistics, or counts at most ``cap`` rows. The dashboard runs them once per
refresh interval per server process (web/snapshot.py), never once per viewer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

COUNT_CAP = 10_000
"""Capped counts stop after this many rows (and show as "10,000+")."""

EXACT_BELOW = 100_000
"""Jobs tables estimated smaller than this are counted exactly (a GROUP BY over at most
this many rows); bigger ones are estimated from the planner's statistics."""


@dataclass(frozen=True, slots=True)
class Count:
    """A number of jobs: ``exact``, ``capped`` (at least ``n``, counting stopped there) or
    ``estimate`` (the planner's statistics: close, not exact)."""

    n: int
    kind: str = "exact"


@dataclass(frozen=True, slots=True)
class JobLine:
    """One line of a dashboard table: a job without its arguments and result."""

    id: int
    queue: str
    task: str
    state: str
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None


class DashboardStore:
    """Mixin: the Backend protocol's ``dash_*`` operations."""

    def dash_counts(self) -> dict[tuple[str, str], Count]:
        """Jobs per (queue, state). Exact while the table is small (below EXACT_BELOW by
        the planner's row estimate); above, the planner's statistics for each pair, except
        running (exact: a partial index, as many rows as workers run), ready per queue and
        dead (capped counts over their partial indexes). Never a full count of a big table."""
        estimate = self._dash_estimate()
        if estimate < EXACT_BELOW:
            rows = self._b_read("queue_counts", {})
            return {(q, s): Count(int(n)) for q, s, n in rows}
        recounted = ("running", "ready", "dead")
        estimated = self._b_read("dash_counts_estimated", {})
        queues = sorted({q for q, _, _ in estimated})
        counts = {(q, s): Count(int(n), "estimate") for q, s, n in estimated
                  if n and s not in recounted}
        for q, s, n in self._b_read("dash_counts_running", {}):
            counts[(q, s)] = Count(int(n))
        # Dead jobs are rare and often missing from ANALYZE's sample: count them (capped).
        dead = self._b_read("dash_counts_dead", {"cap": COUNT_CAP + 1})
        capped = sum(int(n) for _, n in dead) > COUNT_CAP
        for q, n in dead:
            counts[(q, "dead")] = Count(int(n), "capped" if capped else "exact")
        for q in queues:
            n = int(self._b_read("dash_count_ready", {"queue": q, "cap": COUNT_CAP + 1})[0][0])
            counts[(q, "ready")] = Count(min(n, COUNT_CAP), "capped" if n > COUNT_CAP else "exact")
        return {k: v for k, v in counts.items() if v.n or v.kind != "exact"}

    def _dash_estimate(self) -> int:
        """The planner's row count of the jobs table (Postgres: pg_class.reltuples; SQLite:
        the span of ids); before the first ANALYZE, a count capped at EXACT_BELOW."""
        rows = self._b_read("dash_jobs_estimate", {})
        n = int(rows[0][0]) if rows and rows[0][0] is not None else -1
        if n < 0:
            n = int(self._b_read("dash_jobs_capped", {"cap": EXACT_BELOW})[0][0])
        return n

    def dash_finished_since(self, since: float) -> list[tuple[int, str, int]]:
        """(second since the epoch, 'succeeded' or 'dead', jobs) for jobs finished at or
        after ``since`` (epoch seconds), by the database's clock. Walks the finished-jobs
        index from ``since``: cost grows with the jobs finished since then, not the table."""
        return [(int(sec), str(st), int(n))
                for sec, st, n in self._b_read("dash_finished_since", {"since": since})]

    def dash_clock(self) -> float:
        """The database's now() in epoch seconds."""
        return float(self._b_read("dash_clock", {})[0][0])

    def dash_running(self, limit: int) -> list[JobLine]:
        """Running jobs, the soonest lease expiry first."""
        return [self._dash_line(r) for r in self._b_read("dash_running", {"limit": limit})]

    def dash_dead(self, limit: int) -> list[JobLine]:
        """Dead jobs, the newest first."""
        return [self._dash_line(r) for r in self._b_read("dash_dead", {"limit": limit})]

    def _dash_line(self, r: Any) -> JobLine:
        return JobLine(int(r[0]), r[1], r[2], r[3], int(r[4]), int(r[5]), r[6],
                       self._b_time(r[7]), self._b_time(r[8]), self._b_time(r[9]), r[10])

    # Provided by the backend (see batchstore.py).
    def _b_read(self, name: str, params: dict[str, Any]) -> list[Any]:
        raise NotImplementedError

    def _b_time(self, value: Any) -> datetime | None:
        raise NotImplementedError
