"""The partition-lease operations, written once over every dialect (the ``lease_*``
statements of its ``queries.sql``), like batchstore.py.

An acquire runs in one transaction: it takes the set's row (so acquires of one set take
turns, and a change of ``n`` is checked and made atomically), makes sure the slot rows
exist, then takes the first free or expired slot with a new token. Slot rows are never
deleted, so a slot's token only ever grows: a token once fenced out stays fenced out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..errors import PartitionConflict
from ..models import SlotInfo
from .dialect import Dialect


class LeaseOps:
    """The Backend protocol's ``lease_*`` operations over a dialect."""

    def __init__(self, d: Dialect) -> None:
        self.d = d

    def lease_acquire(self, set_name: str, n: int, owner: str,
                      lease: float) -> tuple[int, int, datetime] | None:
        params = {"set": set_name, "n": n, "owner": owner, "lease": lease}

        def run(c: Any) -> tuple[int, int, datetime] | None:
            current = self.d.rows(c, "lease_set_lock", params)[0][0]
            if current != n:
                held = self.d.rows(c, "lease_set_held", params)[0][0]
                if held:
                    raise PartitionConflict(
                        f"partition set {set_name!r} has {current} slots and {held} of them are "
                        f"held: n can become {n} only when no slot is held (stop its holders, "
                        "or wait for their leases to expire)"
                    )
                self.d.rows(c, "lease_set_fence_all", params)
                self.d.rows(c, "lease_set_resize", params)
            self.d.rows(c, "lease_slots_ensure", params)
            rows = self.d.rows(c, "lease_take", params)
            if not rows:
                return None
            slot, token, expires = rows[0]
            return int(slot), int(token), self.d.time(expires)  # type: ignore[return-value]

        return self.d.tx(None, run)

    # Renew and release wait at most LOCK_WAIT for the slot's row: a holder that renews or
    # releases while its own fenced transaction (on another connection) holds that row must
    # get an error, not wait for itself for ever.
    LOCK_WAIT = 2.0

    def lease_renew(self, set_name: str, slot: int, token: int, lease: float) -> datetime | None:
        params = {"set": set_name, "slot": slot, "token": token, "lease": lease}

        def run(c: Any) -> list[Any]:
            # Lock first, then test the expiry in a statement of its own: a test made in
            # the statement that waited for the row is made by the clock of before the wait
            # (MySQL's NOW() is the statement's start; Postgres re-checks a row only if it
            # changed, not if it was merely locked), so a renewal that waited behind the
            # holder's fenced transaction revived a lease that had expired meanwhile.
            if not self.d.rows(c, "lease_hold", params):
                return []
            return self.d.rows(c, "lease_renew", params)

        rows = self.d.locked_tx(None, self.LOCK_WAIT, run)
        return self.d.time(rows[0][0]) if rows else None

    def lease_release(self, set_name: str, slot: int, token: int) -> bool:
        params = {"set": set_name, "slot": slot, "token": token}
        return bool(self.d.locked_tx(None, self.LOCK_WAIT,
                                      lambda c: self.d.rows(c, "lease_release", params)))

    def lease_fence(self, conn: Any, set_name: str, slot: int, token: int, lease: float) -> bool:
        c = self.d.fence_connection(conn)
        # The fence holds the slot's row until the caller's transaction ends, so a holder
        # frozen inside that transaction would keep every standby out for as long as it is
        # frozen: where it can be done for the transaction alone, the server ends it once
        # idle for a lease (by then the lease has run out anyway).
        def run(c: Any) -> bool:
            self.d.guard_fence(c, lease)
            return bool(self.d.rows(c, "lease_fence", {"set": set_name, "slot": slot, "token": token}))

        return self.d.on(c, run)  # (on the caller's connection, as every conn= call runs)

    def lease_list(self, set_name: str | None) -> list[SlotInfo]:
        rows: Sequence[Any] = self.d.read("lease_list", {"set": set_name})
        return [SlotInfo(r[0], int(r[1]), int(r[2]), r[3], int(r[4]), self.d.time(r[5]), bool(r[6]))
                for r in rows]
