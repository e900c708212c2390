"""Leaf types shared by every module: job and batch states and the JSON alias."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypeAlias

JSON: TypeAlias = Any
"""A value that ``json.dumps`` accepts without a ``default`` hook."""


class JobState(StrEnum):
    """Where a job is in its life.

    ``scheduled`` → ``ready`` → ``running`` → ``succeeded`` | ``scheduled``/``ready`` (retry)
    | ``dead`` (attempts exhausted or not retryable) | ``cancelled``.
    """

    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def is_live(self) -> bool:
        """Live jobs hold their ``key``; finished ones do not."""
        return self in (JobState.SCHEDULED, JobState.READY, JobState.RUNNING)


class BatchState(StrEnum):
    """Where a batch is in its life.

    ``open`` (items may be added) → ``sealed`` (no more items) → ``completed`` (every item
    acked or failed; the callbacks were enqueued). An open batch with no activity for its
    ``expire_after`` becomes ``expired``: an orphan, whose callbacks never run.
    """

    OPEN = "open"
    SEALED = "sealed"
    COMPLETED = "completed"
    EXPIRED = "expired"


LIVE_STATES = tuple(s.value for s in JobState if s.is_live)
FINISHED_STATES = tuple(s.value for s in JobState if not s.is_live)
