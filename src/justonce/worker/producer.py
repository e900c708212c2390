"""Claims: which queue to ask next and how many jobs to lease at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..backends import Backend
from ..models import ClaimedJob, Completion, SlotFence


class Producer:
    """Claims one queue per statement (so each claim walks the claim index in order),
    starting from a different queue each time so that no queue starves another.

    The batch size adapts to how long jobs take: enough to keep the slots busy for about
    ``horizon`` seconds, at most ``prefetch``. Slow jobs are claimed one per free slot (no
    hoarding while other workers idle); fast ones in batches, so a claim round trip is paid
    once per batch instead of once per job.
    """

    def __init__(
        self, backend: Backend, queues: Sequence[str], owner: str, lease: float,
        prefetch: int, horizon: float = 0.05,
        partitions: Callable[[], SlotFence] | None = None,
    ) -> None:
        self.backend = backend
        self.queues = list(queues)
        self.owner = owner
        self.lease = lease
        self.prefetch = prefetch
        self.horizon = horizon
        self._next = 0
        self._avg: float | None = None
        self.partitions = partitions
        """The fence of the slots held now: a partitioned worker claims only their jobs."""

    def observe(self, duration: float) -> None:
        """Feed the duration of a finished job into the moving average."""
        self._avg = duration if self._avg is None else 0.9 * self._avg + 0.1 * duration

    def batch_size(self, free_slots: int) -> int:
        extra = 0
        if self._avg is not None:
            extra = int(self.horizon / max(self._avg, 1e-6))
        return max(1, min(self.prefetch, free_slots + extra))

    def claim(
        self, limit: int, done: Sequence[Completion] = ()
    ) -> tuple[set[int], list[ClaimedJob]]:
        """Record ``done`` and claim up to ``limit`` jobs; the first queue's claim shares
        the completions' transaction. Returns (accepted completion ids, claimed jobs)."""
        got: list[ClaimedJob] = []
        accepted: set[int] = set()
        part = None if self.partitions is None else self.partitions()
        n = len(self.queues)
        start = self._next
        self._next = (self._next + 1) % n
        for i in range(n):
            queue = self.queues[(start + i) % n]
            if i == 0:
                accepted, jobs = self.backend.job_complete_and_claim(
                    done, queue, limit, self.owner, self.lease, part
                )
            else:
                try:
                    jobs = self.backend.job_claim(queue, limit - len(got), self.owner, self.lease,
                                                  part)
                except Exception:
                    # Keep what the first statement committed (completions and claims);
                    # the next fetch tries this queue again.
                    if got or accepted:
                        break
                    raise
            got.extend(jobs)
            if len(got) >= limit:
                break
        return accepted, got
