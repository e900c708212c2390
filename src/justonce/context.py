"""What a task can learn about the job it runs as: :func:`current_job`."""

from __future__ import annotations

from contextvars import ContextVar

from .models import ClaimedJob

_current: ContextVar[ClaimedJob | None] = ContextVar("justonce_current_job", default=None)


def current_job() -> ClaimedJob | None:
    """The job whose code is running here (its id, attempt, ``max_attempts``, queue, task,
    lease token, partition hash), or None outside a job. Set by the worker for the length
    of the task's call: in the slot thread for a sync task, in the task's own context for
    an ``async def`` one (so concurrent async jobs each see their own)."""
    return _current.get()
