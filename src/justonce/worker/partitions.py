"""A partitioned worker's slots: keep up to ``want`` slots of one set, renew them with the
job leases, take free or expired slots as a standby, and drop the ones taken over."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ..errors import LeaseLost

if TYPE_CHECKING:
    from ..partitions import PartitionLease, Partitions

log = logging.getLogger("justonce.worker")


class PartitionKeeper:
    """Called from the worker's supervisor every heartbeat (``run_once``); the producer
    reads :meth:`slots` before each claim. A worker that holds no slot claims nothing from
    the partitioned queue and waits as a standby."""

    def __init__(self, partitions: Partitions, set_name: str, n: int, want: int,
                 lease: float, owner: str) -> None:
        self.partitions = partitions
        self.set_name, self.n, self.want = set_name, n, want
        self.lease, self.owner = lease, owner
        self._held: list[PartitionLease] = []
        self._lock = threading.Lock()

    def slots(self) -> tuple[int, ...]:
        """The slots to claim jobs for: held, and renewed recently enough by this process's
        own clock (a worker that cannot reach the database to renew stops claiming before
        its lease can have run out)."""
        with self._lock:
            return tuple(sorted(le.slot for le in self._held if le.alive))

    def run_once(self) -> None:
        """Renew what is held (dropping slots taken over), then try to take more."""
        for lease in list(self._held):
            try:
                lease.renew()
            except LeaseLost:
                with self._lock:
                    self._held.remove(lease)
                log.warning("partition slot lost: another worker took it over", extra={
                    "event": "partition.lost", "set": self.set_name, "slot": lease.slot,
                    "token": lease.token})
            except Exception as exc:  # noqa: BLE001 - the others still need renewing
                log.warning("partition renewal failed", extra={
                    "event": "partition.renew_error", "slot": lease.slot, "error": str(exc)})
        while len(self._held) < self.want:
            got = self.partitions.try_acquire(self.set_name, self.n, lease=self.lease,
                                              owner=self.owner)
            if got is None:
                return
            with self._lock:
                self._held.append(got)

    def release_all(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for lease in held:
            try:
                lease.release()
            except Exception as exc:  # noqa: BLE001 - it will expire on its own
                log.warning("partition release failed", extra={
                    "event": "partition.release_error", "slot": lease.slot, "error": str(exc)})
