"""The service's operations of every backend: API tokens, the audit trail and actions on
all matching jobs, written once over each backend's SQL (the ``token_*``, ``audit_*`` and
``jobs_*_matching`` statements), like batchstore.py.

An action on all matching jobs runs in chunks of ``limit`` jobs, one transaction each, in
id order: a long action never holds thousands of row locks at once, and a worker's claim
waits for at most one chunk. Each chunk starts after the last job the one before took
(``after``): a job is acted on at most once per action, even one that a worker sends back
into the matching states meanwhile (retried, then dead again before the next chunk).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidOption, KeyConflict
from ..models import AuditEntry, JobFilter, TokenInfo
from ..validate import shown
from .batchstore import BatchOps
from .dialect import Dialect

ACTIONS = ("cancel", "retry")
KEY_ROUNDS = 5
"""Tries of a retry chunk that a newly enqueued key keeps failing."""


def _chunk_taken(rows: Sequence[Any], after: int) -> tuple[int, int]:
    """A chunk's answer: how many jobs it took, and the highest id (``after`` if none)."""
    return len(rows), max((int(r[0]) for r in rows), default=after)


class ServiceOps:
    """The Backend protocol's token, audit and matching-action operations over a dialect
    (cancelling a job fails its batch item: through ``batches``)."""

    def __init__(self, d: Dialect, batches: BatchOps) -> None:
        self.d = d
        self.batches = batches

    # -- actions on all matching jobs -----------------------------------------------------
    def filter_params(self, where: JobFilter) -> dict[str, Any]:
        return {
            "state": where.state, "queue": where.queue, "task": where.task,
            "created_after": self.d.at_bound(where.created_after),
            "created_before": self.d.at_bound(where.created_before),
            "max_id": where.max_id, "channel": self.d.channel,
        }

    def jobs_count_matching(self, action: str, where: JobFilter) -> tuple[int, int | None]:
        if action not in ACTIONS:
            raise InvalidOption(f"action must be one of {ACTIONS}, not {shown(action)}")
        count, max_id = self.d.read(f"jobs_count_{action}", self.filter_params(where))[0]
        return int(count), (int(max_id) if max_id is not None else None)

    def jobs_cancel_matching(self, where: JobFilter, limit: int, after: int = 0,
                             conn: Any = None) -> tuple[int, int]:
        """Cancel one chunk of the matching jobs with ids above ``after``: (how many, the
        highest id taken, or ``after`` when none was)."""
        params = {**self.filter_params(where), "limit": limit, "after": after}

        def run(c: Any) -> tuple[int, int]:
            rows = self.d.rows(c, "jobs_cancel_matching", params)
            self.batches.resolve_job_items(c, [r[1] for r in rows], "cancelled")
            return _chunk_taken(rows, after)

        return self.d.tx(conn, run)

    def jobs_retry_matching(self, where: JobFilter, limit: int, after: int = 0,
                            conn: Any = None) -> tuple[int, int]:
        """Retry one chunk (see :meth:`jobs_cancel_matching`). A keyed job is left out while
        a live job holds its key; one enqueued after that check and before the chunk's
        update fails the chunk on the key's unique index: the chunk is tried again, and
        then sees it."""
        params = {**self.filter_params(where), "limit": limit, "after": after}

        def run(c: Any) -> tuple[int, int]:
            return _chunk_taken(self.d.rows(c, "jobs_retry_matching", params), after)

        for _ in range(KEY_ROUNDS):
            try:
                return self.d.tx(conn, run)  # (with conn: under a savepoint, tried again)
            except Exception as exc:
                if not self.d.is_unique_violation(exc):
                    raise
                taken = exc
        raise KeyConflict("a job's key was taken by a new live job each time this chunk was "
                          "tried: preview again") from taken

    # -- tokens -------------------------------------------------------------------------
    def _token(self, r: Any) -> TokenInfo:
        return TokenInfo(
            id=int(r[0]), name=r[1], scope=r[2], prefix=r[3],
            created_at=self.d.time(r[4]),  # type: ignore[arg-type]
            last_used_at=self.d.time(r[5]), revoked_at=self.d.time(r[6]),
        )

    def token_create(self, name: str, scope: str, secret_hash: str, prefix: str) -> TokenInfo:
        params = {"name": name, "scope": scope, "secret_hash": secret_hash, "prefix": prefix}
        return self._token(self.d.tx(None, lambda c: self.d.rows(c, "token_create", params))[0])

    def token_find_by_hash(self, secret_hash: str) -> tuple[TokenInfo, str] | None:
        rows = self.d.read("token_find_by_hash", {"secret_hash": secret_hash})
        return (self._token(rows[0]), rows[0][7]) if rows else None

    def token_get(self, token_id: int) -> TokenInfo | None:
        rows = self.d.read("token_get", {"id": token_id})
        return self._token(rows[0]) if rows else None

    def token_list(self) -> list[TokenInfo]:
        return [self._token(r) for r in self.d.read("token_list", {})]

    def token_revoke(self, token_id: int) -> bool:
        return bool(self.d.tx(None, lambda c: self.d.rows(c, "token_revoke", {"id": token_id})))

    def token_touch(self, token_id: int) -> None:
        self.d.tx(None, lambda c: self.d.rows(c, "token_touch", {"id": token_id}))

    # -- audit --------------------------------------------------------------------------
    def audit_record(self, token_id: int | None, actor: str, action: str, target: str | None,
                     count: int | None, detail: dict[str, Any], conn: Any = None) -> int:
        params = {"token_id": token_id, "actor": actor, "action": action, "target": target,
                  "count": count, "detail": json.dumps(detail, separators=(",", ":"), default=str)}
        return int(self.d.tx(conn, lambda c: self.d.rows(c, "audit_record", params))[0][0])

    def audit_list(self, cursor: int | None, limit: int) -> list[AuditEntry]:
        rows = self.d.read("audit_list", {"cursor": cursor, "limit": limit})
        return [AuditEntry(
            id=int(r[0]), at=self.d.time(r[1]), token_id=r[2], actor=r[3],  # type: ignore[arg-type]
            action=r[4], target=r[5], count=None if r[6] is None else int(r[6]),
            detail=self.d.json(r[7]) or {},
        ) for r in rows]
