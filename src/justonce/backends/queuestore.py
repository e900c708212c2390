"""Paused queues, written once over every dialect (the ``queue_pause*`` statements of its
``queries.sql``), like leasestore.py.

A pause is a row of ``justonce_queue_pauses``. The claim statements read the table
themselves (``job_claim``, ``job_claim_partitioned``, and the idle looks for work), so
there is no flag for a worker to poll: a claim that starts after the row commits skips the
queue. Resuming deletes the row (and, on Postgres, wakes the workers that listen).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import DatabaseUnavailable
from ..models import QueuePause
from .dialect import Dialect

ROUNDS = 5
"""A pause found in place and resumed before it could be read is made again, this often."""


class QueueOps:
    """The Backend protocol's ``queue_pause``, ``queue_resume`` and ``queue_pauses``."""

    def __init__(self, d: Dialect) -> None:
        self.d = d

    def _pause(self, r: Any) -> QueuePause:
        return QueuePause(r[0], self.d.time(r[1]), r[2], r[3])  # type: ignore[arg-type]

    def queue_pause(self, queue: str, actor: str | None, note: str | None,
                    conn: Any = None) -> QueuePause:
        def run(c: Any) -> QueuePause:
            for _ in range(ROUNDS):
                # A row back: this call made the pause (none: the queue was paused already).
                made = self.d.rows(c, "queue_pause", {"queue": queue, "actor": actor, "note": note})
                rows = self.d.rows(c, "queue_pause_get", {"queue": queue})
                if rows:
                    return replace(self._pause(rows[0]), already=not made)
                # The pause we found in place was resumed before we read it: pause again.
            raise DatabaseUnavailable(f"could not pause queue {queue!r}")  # pragma: no cover

        return self.d.tx(conn, run)

    def queue_resume(self, queue: str, conn: Any = None) -> bool:
        params = {"queue": queue, "channel": self.d.channel}
        return bool(self.d.tx(conn, lambda c: self.d.rows(c, "queue_resume", params)))

    def queue_pauses(self) -> list[QueuePause]:
        return [self._pause(r) for r in self.d.read("queue_pauses", {})]
