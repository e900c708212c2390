"""Housekeeping: promote due scheduled jobs, re-offer expired leases, prune old jobs,
expire orphaned batches and remove old ones, and forget finished list reservations that
were kept for their request ids.

Every worker runs the loop; a row per duty in ``justonce_maintenance`` makes exactly one
of them do each round (no session locks, so it works behind PgBouncer too).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends import Backend
from ..events import Event, emit
from ..models import BatchPruneReport, HousekeepingReport


@dataclass
class Maintenance:
    backend: Backend
    owner: str
    interval: float = 1.0
    prune_interval: float = 60.0
    keep_succeeded: float = 86400.0
    keep_dead: float = 7 * 86400.0
    batch_retention: float = 7 * 86400.0
    request_retention: float = 86400.0
    """A finished list reservation is kept this long for its request id (a caller whose
    answer was lost may ask again), then forgotten."""

    def run_once(self, force: bool = False) -> HousekeepingReport:
        """One round. ``force`` skips the "is it my turn" check (tests, the CLI)."""
        promoted = rescued = dead = pruned = 0
        batches = BatchPruneReport()
        if force or self.backend.maintenance_try("rescue", self.interval, self.owner):
            report = self.backend.jobs_rescue()
            rescued, dead = report.rescued, report.dead
            promoted = self.backend.jobs_promote()
        if force or self.backend.maintenance_try("prune", self.prune_interval, self.owner):
            pruned = self.backend.jobs_prune(self.keep_succeeded, self.keep_dead)
            batches = self.backend.batches_prune(self.batch_retention)
            self.backend.lists.prune(self.request_retention)
        if rescued or dead:
            emit(Event.LEASES_RESCUED, "expired leases re-offered", rescued=rescued, dead=dead)
        if batches.expired:
            emit(Event.BATCHES_EXPIRED, "idle batches expired", expired=batches.expired)
        return HousekeepingReport(promoted=promoted, rescued=rescued, dead=dead, pruned=pruned,
                                  batches_expired=batches.expired, batches_removed=batches.removed)
