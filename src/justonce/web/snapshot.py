"""The dashboard's live data: one snapshot per server process, shared by every viewer.

However many dashboards are open, the database sees one refresh per ``interval`` seconds
per server process: viewers read the cached snapshot; the first viewer to find it stale
refreshes it under a lock while the others keep reading the previous one. A refresh that
costs more than a tenth of the interval spaces the next one out (at most 10 % of one
connection's time goes to the dashboard). The throughput series is built from successive
refreshes: each one asks only for the jobs finished in the last few seconds.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..backends.dashstore import Count, JobLine
from ..models import BatchInfo, EffectInfo, QueuePause, SlotInfo

if TYPE_CHECKING:
    from ..app import App

STATES = ("scheduled", "ready", "running", "succeeded", "dead", "cancelled")
OVERLAP = 5
"""Seconds of the series asked for again on each refresh: a job whose transaction began
before the previous refresh (its finished_at is its transaction's start) but committed
after it is counted when it becomes visible."""


@dataclass(frozen=True)
class QueueRow:
    queue: str
    counts: dict[str, Count]
    paused: QueuePause | None = None


@dataclass(frozen=True)
class Snapshot:
    """What the dashboard shows, as of ``now`` (the database's clock, epoch seconds)."""

    now: float
    queues: list[QueueRow]
    totals: dict[str, Count]
    series_start: int
    succeeded: list[int]
    failed: list[int]
    running: list[JobLine]
    dead: list[JobLine]
    batches: list[BatchInfo]
    slots: list[SlotInfo]
    in_doubt: list[EffectInfo]
    cost_ms: float
    """Wall time of the refresh that made this snapshot (its database round trips)."""
    refreshes: int

    @property
    def kinds(self) -> set[str]:
        """The kinds of count shown ("exact", "capped", "estimate"): the footnotes needed."""
        return {c.kind for q in self.queues for c in q.counts.values()}

    def as_json(self) -> dict[str, Any]:
        """The snapshot as JSON (GET /dashboard/snapshot)."""
        return {
            "now": self.now, "cost_ms": round(self.cost_ms, 2), "refreshes": self.refreshes,
            "totals": {s: _count(c) for s, c in self.totals.items()},
            "queues": [{"queue": q.queue, "counts": {s: _count(c) for s, c in q.counts.items()},
                        "paused_at": None if q.paused is None else q.paused.paused_at.timestamp()}
                       for q in self.queues],
            "throughput": {"start": self.series_start, "succeeded": self.succeeded,
                           "failed": self.failed},
            "running": [_line(j) for j in self.running],
            "dead": [_line(j) for j in self.dead],
            "batches": [{"id": b.id, "state": str(b.state), "description": b.description,
                         "total": b.total, "acked": b.acked, "failed": b.failed,
                         "pending": b.pending} for b in self.batches],
            "slots": [{"set": s.set_name, "n": s.n, "slot": s.slot, "owner": s.owner,
                       "token": s.token, "held": s.held,
                       "expires_at": s.expires_at.timestamp() if s.expires_at else None}
                      for s in self.slots],
            "in_doubt": [{"scope": e.scope, "key": e.key, "owner": e.owner,
                          "attempts": e.attempts} for e in self.in_doubt],
        }


def _count(c: Count) -> dict[str, Any]:
    return {"n": c.n, "kind": c.kind}


def _line(j: JobLine) -> dict[str, Any]:
    def ts(v: Any) -> float | None:
        return v.timestamp() if v is not None else None

    return {"id": j.id, "queue": j.queue, "task": j.task, "state": j.state,
            "attempts": j.attempts, "max_attempts": j.max_attempts, "lease_owner": j.lease_owner,
            "lease_expires_at": ts(j.lease_expires_at), "finished_at": ts(j.finished_at),
            "last_error": j.last_error}


@dataclass
class _Series:
    """Jobs finished per second (succeeded, dead) over the last ``window`` seconds."""

    window: int
    buckets: dict[int, list[int]] = field(default_factory=dict)
    fetched_to: int | None = None

    def since(self, now: float) -> float:
        start = math.floor(now) - self.window
        return start if self.fetched_to is None else max(start, self.fetched_to - OVERLAP)

    def update(self, since: float, now: float, rows: list[tuple[int, str, int]]) -> None:
        for sec in range(math.floor(since), math.floor(now) + 1):
            self.buckets[sec] = [0, 0]
        for sec, state, n in rows:
            b = self.buckets.setdefault(sec, [0, 0])
            b[0 if state == "succeeded" else 1] = n
        self.fetched_to = math.floor(now)
        oldest = math.floor(now) - self.window
        for sec in [s for s in self.buckets if s < oldest]:
            del self.buckets[sec]

    def arrays(self, now: float) -> tuple[int, list[int], list[int]]:
        # The current second is still filling up: the series ends at the last full one.
        end = math.floor(now) - 1
        start = end - self.window + 1
        rows = [self.buckets.get(s, [0, 0]) for s in range(start, end + 1)]
        return start, [r[0] for r in rows], [r[1] for r in rows]


class Snapshots:
    """The per-process cache of :class:`Snapshot` (thread-safe)."""

    def __init__(self, app: App, interval: float = 1.0, window: int = 300,
                 list_limit: int = 50) -> None:
        self.app = app
        self.interval = interval
        self.list_limit = list_limit
        self._series = _Series(window)
        self._lock = threading.Lock()
        self._current: Snapshot | None = None
        self._due = 0.0
        self.refreshes = 0

    def expire(self) -> None:
        """Refresh at the next ``get`` (after an action that changed what is shown)."""
        self._due = 0.0

    def get(self) -> Snapshot:
        """The current snapshot; refreshes it first when it is due, unless another thread
        is refreshing right now (then the previous one is returned at once)."""
        current = self._current
        if current is not None and time.monotonic() < self._due:
            return current
        if not self._lock.acquire(blocking=current is None):
            return current  # type: ignore[return-value]  # not None: we did not block
        try:
            if self._current is None or time.monotonic() >= self._due:
                self._current = self._refresh()
            return self._current
        finally:
            self._lock.release()

    def _refresh(self) -> Snapshot:
        started = time.monotonic()
        b = self.app.backend
        now = b.dash_clock()
        since = self._series.since(now)
        self._series.update(since, now, b.dash_finished_since(since))
        counts = b.dash_counts()
        running = b.dash_running(self.list_limit)
        dead = b.dash_dead(self.list_limit)
        batches = b.batch_list(None, 20)
        slots = b.lease_list(None)
        in_doubt = b.effects_in_doubt(None, self.list_limit)
        pauses = {p.queue: p for p in b.queue_pauses()}
        cost = time.monotonic() - started
        self.refreshes += 1
        self._due = time.monotonic() + max(self.interval, 10 * cost)
        by_queue: dict[str, dict[str, Count]] = {}
        totals: dict[str, Count] = {}
        for (q, s), c in sorted(counts.items()):
            by_queue.setdefault(q, {})[s] = c
            t = totals.get(s)
            kind = c.kind if t is None or t.kind == "exact" else t.kind
            totals[s] = Count((t.n if t else 0) + c.n, kind)
        for q in pauses:  # (a paused queue is shown, jobs or not: it can be resumed)
            by_queue.setdefault(q, {})
        start, ok, failed = self._series.arrays(now)
        return Snapshot(
            now=now, queues=[QueueRow(q, cs, pauses.get(q)) for q, cs in sorted(by_queue.items())],
            totals=totals,
            series_start=start, succeeded=ok, failed=failed, running=running, dead=dead,
            batches=batches, slots=slots, in_doubt=in_doubt, cost_ms=cost * 1000,
            refreshes=self.refreshes,
        )
