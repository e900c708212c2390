"""Value objects passed across the storage boundary. All frozen."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .types import JSON, JobState


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job to insert. Built by :class:`justonce.App`, never by hand.

    ``args_json`` / ``kwargs_json`` are already serialised (and size-checked), so the
    backends never see a Python object they could fail to encode. Exactly one of
    ``delay`` (seconds from the database's ``now()``) and ``run_at`` is used.
    """

    task: str
    queue: str
    args_json: str
    kwargs_json: str
    priority: int
    max_attempts: int
    timeout: float
    delay: float = 0.0
    run_at: datetime | None = None
    key: str | None = None
    partition_key: str | None = None

    @property
    def scheduled(self) -> bool:
        return self.run_at is not None or self.delay > 0

    def with_arguments(self, args_json: str, kwargs_json: str) -> NewJob:
        """The same job options with other (already validated) arguments."""
        return NewJob(self.task, self.queue, args_json, kwargs_json, self.priority,
                      self.max_attempts, self.timeout, self.delay, self.run_at, self.key,
                      self.partition_key)

    def same_options(self, other: NewJob) -> bool:
        """True when only the arguments differ (and no key makes rows unique)."""
        return (self.key is None and other.key is None and self.task == other.task
                and self.queue == other.queue and self.priority == other.priority
                and self.max_attempts == other.max_attempts and self.timeout == other.timeout
                and self.delay == other.delay and self.run_at == other.run_at
                and self.partition_key == other.partition_key)


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one job row. Look it up again with ``App.get_job(id)``."""

    id: int
    queue: str
    task: str
    args: list[JSON]
    kwargs: dict[str, JSON]
    state: JobState
    priority: int
    attempts: int
    max_attempts: int
    timeout: float
    run_at: datetime
    created_at: datetime
    key: str | None = None
    partition_key: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    result: JSON = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    duplicate: bool = False
    """True when ``enqueue`` found a live job holding the key and returned it instead."""


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job leased to one worker. ``lease_token`` fences every write the worker makes."""

    id: int
    queue: str
    task: str
    args: list[JSON]
    kwargs: dict[str, JSON]
    attempts: int
    max_attempts: int
    timeout: float
    lease_token: int


@dataclass(frozen=True, slots=True)
class Completion:
    """A successful run to record: the result is already JSON text (or None)."""

    id: int
    lease_token: int
    result_json: str | None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed run to record. ``retry_in`` is None for a final failure (→ ``dead``)."""

    id: int
    lease_token: int
    error: str
    retry_in: float | None


@dataclass(frozen=True, slots=True)
class HousekeepingReport:
    promoted: int = 0
    rescued: int = 0
    dead: int = 0
    pruned: int = 0


@dataclass(frozen=True, slots=True)
class QueueCount:
    queue: str
    state: JobState
    count: int
