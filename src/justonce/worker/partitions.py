"""A partitioned worker's slots: keep up to ``want`` slots of one set, renew them with the
job leases, take free or expired slots as a standby, and drop the ones taken over."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..errors import LeaseLost
from ..events import Event, emit
from ..models import SlotFence

if TYPE_CHECKING:
    from ..partitions import PartitionLease, Partitions



class PartitionKeeper:
    """Called from the worker's supervisor every heartbeat (``run_once``); the producer
    asks for :meth:`fence` before each claim and the slots ask :meth:`holds` before they
    start a job. A worker that holds no slot claims nothing from the partitioned queue and
    waits as a standby.

    Both answers use this process's monotonic clock with a ``margin``: a slot counts as
    held only while its lease, measured from before the last renewal was sent, has more
    than ``margin`` seconds left, so the worker stops claiming and starting jobs for a
    slot before another process can have taken it, even when it cannot reach the database
    to learn that it lost it. The claim itself is fenced in SQL (see SlotFence)."""

    def __init__(self, partitions: Partitions, set_name: str, n: int, want: int,
                 lease: float, owner: str, margin: float = 0.0) -> None:
        self.partitions = partitions
        self.set_name, self.n, self.want = set_name, n, want
        self.lease, self.owner, self.margin = lease, owner, margin
        self._held: list[PartitionLease] = []
        self._lock = threading.Lock()
        self._round = threading.Lock()  # one round at a time (supervisor, or a fetch after a pause)

    def _live(self) -> list[PartitionLease]:
        with self._lock:
            return [le for le in self._held if le.alive_for(self.margin)]

    def slots(self) -> tuple[int, ...]:
        """The slots held, with more than ``margin`` s of lease left by this process's clock."""
        return tuple(sorted(le.slot for le in self._live()))

    def fence(self) -> SlotFence:
        """What the next claim is fenced by: the live slots with their tokens."""
        return SlotFence(self.set_name, self.n,
                         tuple(sorted((le.slot, le.token) for le in self._live())))

    def holds(self, partition_hash: int) -> bool:
        """Whether the slot of a job (by its partition hash) is still live."""
        slot = partition_hash % self.n
        return any(le.slot == slot for le in self._live())

    def run_once(self) -> set[int]:
        """Renew what is held (dropping slots expired or taken over), then try to take
        more. Returns the slots lost in this round."""
        with self._round:
            return self._run_once()

    def _run_once(self) -> set[int]:
        lost: set[int] = set()
        for lease in list(self._held):
            try:
                lease.renew()
            except LeaseLost:
                with self._lock:
                    self._held.remove(lease)
                lost.add(lease.slot)
                emit(Event.PARTITION_LOST, "partition slot lost: its lease expired or another "
                     "worker took it over", set=self.set_name, slot=lease.slot, token=lease.token)
            except Exception as exc:  # noqa: BLE001 - the others still need renewing
                emit(Event.PARTITION_RENEW_ERROR, "partition renewal failed", slot=lease.slot,
                     error=str(exc))
        with self._lock:
            # A lease past its time by our own clock is as good as lost: its renewal can
            # only fail now. Drop it so that the slot can be acquired anew below.
            for lease in [le for le in self._held if not le.alive]:
                self._held.remove(lease)
                lease.lost = True
                lost.add(lease.slot)
        while len(self._held) < self.want:
            got = self.partitions.try_acquire(self.set_name, self.n, lease=self.lease,
                                              owner=self.owner)
            if got is None:
                break
            with self._lock:
                self._held.append(got)
        return lost

    def release_all(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for lease in held:
            try:
                lease.release()
            except Exception as exc:  # noqa: BLE001 - it will expire on its own
                emit(Event.PARTITION_RELEASE_ERROR, "partition release failed", slot=lease.slot,
                     error=str(exc))
