"""The dashboard's read operations, one algorithm over each backend's ``dash_*`` statements
(like batchstore.py).

Every statement here is bounded on a big table: it walks a partial index, reads the
planner's statistics, or counts at most ``cap`` rows. The dashboard runs them once per
refresh interval per server process (web/snapshot.py), never once per viewer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dialect import Dialect

COUNT_CAP = 1_000
"""Capped counts stop after this many rows (and show as "1,000+", or as the statistics'
estimate when that is higher)."""

EXACT_BELOW = 10_000
"""Jobs tables smaller than this are counted exactly (a GROUP BY over at most this many
rows, which is also how a table whose statistics are stale is found to be bigger);
bigger ones are estimated and capped, never counted in full."""

MAX_QUEUES = 200
"""The dashboard lists at most this many queues with ready jobs."""


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


class DashOps:
    """The Backend protocol's ``dash_*`` operations over a dialect."""

    def __init__(self, d: Dialect) -> None:
        self.d = d

    def dash_counts(self) -> dict[tuple[str, str], Count]:
        """Jobs per (queue, state), bounded whatever the size of the table.

        Below EXACT_BELOW rows: exact (a GROUP BY that reads at most EXACT_BELOW rows; the
        planner's row estimate only decides whether to try it). Above: running jobs exact
        (as many as workers run); ready, scheduled and dead capped at COUNT_CAP per queue
        (partial indexes, in index order); succeeded and cancelled estimated from the
        planner's statistics (PostgreSQL's multivariate MCV list) or, without them, from
        the newest COUNT_CAP jobs scaled to the table's size. A capped count whose estimate
        is higher shows the estimate."""
        size = self._dash_estimate()
        if size < EXACT_BELOW:
            rows = self.d.read("dash_counts_exact", {"cap": EXACT_BELOW})
            if sum(int(n) for _, _, n in rows) < EXACT_BELOW:
                return {(q, s): Count(int(n)) for q, s, n in rows}
        estimates = self._dash_estimates(size)
        counts = {(q, s): Count(n, "estimate") for (q, s), n in estimates.items()
                  if s in ("succeeded", "cancelled") and n}
        for q, s, n in self.d.read("dash_counts_running", {}):
            counts[(q, s)] = Count(int(n))

        def capped(key: tuple[str, str], n: int, reached: bool) -> None:
            if not reached:
                counts[key] = Count(n)
            elif estimates.get(key, 0) > n:
                counts[key] = Count(estimates[key], "estimate")
            else:
                counts[key] = Count(n, "capped")

        rows = self.d.read("dash_counts_capped", {"cap": COUNT_CAP})
        per_state: dict[str, int] = {}
        for _, s, n in rows:
            per_state[s] = per_state.get(s, 0) + int(n)
        for q, s, n in rows:
            capped((q, s), int(n), per_state[s] >= COUNT_CAP)
        queues = [q for (q,) in self.d.read("dash_ready_queues", {"limit": MAX_QUEUES})]
        if queues:
            ready = self.d.read("dash_count_ready", {"queues": json.dumps(sorted(queues)),
                                                      "cap": COUNT_CAP})
            for q, n in ready:
                capped((q, "ready"), int(n), int(n) >= COUNT_CAP)
        return counts

    def _dash_estimate(self) -> int:
        """The planner's row count of the jobs table (PostgreSQL: pg_class.reltuples, -1
        before the first ANALYZE; SQLite: the span of ids). One catalog or rowid look-up."""
        rows = self.d.read("dash_jobs_estimate", {})
        return int(rows[0][0]) if rows and rows[0][0] is not None else -1

    def _dash_estimates(self, size: int) -> dict[tuple[str, str], int]:
        """Estimated jobs per (queue, state): the statistics, else a sample of the newest
        COUNT_CAP jobs scaled to the table's estimated size."""
        found = {(q, s): int(n) for q, s, n in self.d.read("dash_counts_estimated", {})}
        if found:
            return found
        rows = self.d.read("dash_counts_sample", {"cap": COUNT_CAP})
        seen = sum(int(n) for _, _, n in rows)
        scale = max(size, seen) / seen if seen else 0.0
        return {(q, s): round(int(n) * scale) for q, s, n in rows}

    def dash_finished_since(self, since: float) -> list[tuple[int, str, int]]:
        """(second since the epoch, 'succeeded' or 'dead', jobs) for jobs finished at or
        after ``since`` (epoch seconds), by the database's clock. Walks the finished-jobs
        index from ``since``: cost grows with the jobs finished since then, not the table."""
        return [(int(sec), str(st), int(n))
                for sec, st, n in self.d.read("dash_finished_since", {"since": since})]

    def dash_clock(self) -> float:
        """The database's now() in epoch seconds."""
        return float(self.d.read("dash_clock", {})[0][0])

    def dash_running(self, limit: int) -> list[JobLine]:
        """Running jobs, the soonest lease expiry first."""
        return [self._dash_line(r) for r in self.d.read("dash_running", {"limit": limit})]

    def dash_dead(self, limit: int) -> list[JobLine]:
        """Dead jobs, the newest first."""
        return [self._dash_line(r) for r in self.d.read("dash_dead", {"limit": limit})]

    def _dash_line(self, r: Any) -> JobLine:
        return JobLine(int(r[0]), r[1], r[2], r[3], int(r[4]), int(r[5]), r[6],
                       self.d.time(r[7]), self.d.time(r[8]), self.d.time(r[9]), r[10])
