"""Value objects passed across the storage boundary. All frozen."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .types import JSON, BatchState, JobState


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
    partition_hash: int | None = None
    """The partition key as a number (the integer key, or the CRC-32 of a text key): a
    worker holding slot k of n runs the job when partition_hash mod n = k."""
    batch_item: str | None = None
    """The batch item this job resolves: acked when it succeeds, failed when it ends dead
    or is cancelled. Set by the backend when jobs are enqueued into a batch."""

    @property
    def scheduled(self) -> bool:
        return self.run_at is not None or self.delay > 0

    def with_arguments(self, args_json: str, kwargs_json: str) -> NewJob:
        """The same job options with other (already validated) arguments."""
        return NewJob(self.task, self.queue, args_json, kwargs_json, self.priority,
                      self.max_attempts, self.timeout, self.delay, self.run_at, self.key,
                      self.partition_key, self.partition_hash, self.batch_item)

    def bound_to(self, batch_item: str) -> NewJob:
        """The same job as the given batch item."""
        return NewJob(self.task, self.queue, self.args_json, self.kwargs_json, self.priority,
                      self.max_attempts, self.timeout, self.delay, self.run_at, self.key,
                      self.partition_key, self.partition_hash, batch_item)

    def same_options(self, other: NewJob) -> bool:
        """True when only the arguments differ (and no key or batch item makes rows unique)."""
        return (self.key is None and other.key is None and self.batch_item is None
                and other.batch_item is None and self.task == other.task
                and self.queue == other.queue and self.priority == other.priority
                and self.max_attempts == other.max_attempts and self.timeout == other.timeout
                and self.delay == other.delay and self.run_at == other.run_at
                and self.partition_key == other.partition_key)  # hence the same hash


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
    batch_item: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    result: JSON = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    duplicate: bool = False
    """True when ``enqueue`` found a live job holding the key and returned it instead."""
    undecodable: str | None = None
    """Set when a stored JSON column of the row does not decode (or ``args`` is not a list,
    ``kwargs`` not an object): which column and why, with the start of the stored text.
    The library never stores such a row; a hand edit or a session with other SQL modes
    can. ``args``/``kwargs`` are then ``[]``/``{}`` (``result`` the stored text, ``errors``
    ``[]``) so that the job can still be read, listed and deleted; a worker that claims it
    fails it at once, for good (``undecodable``)."""


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
    batch_item: str | None = None
    partition_hash: int | None = None
    """Set on partitioned jobs: the slot is ``partition_hash mod n``."""
    queue_wait: float | None = None
    """Seconds the job had been ready (since its ``run_at``) when this claim took it, by
    the database's clock: the wait that the ``justonce_job_queue_wait_seconds`` metric
    shows."""
    started_at: float | None = None
    """When the worker started this attempt (``time.time()`` of its process): the moment of
    its last check, just before calling the task, that the job's lease (and a partitioned
    job's slot) was still held. Set on the job that :func:`justonce.current_job` returns;
    None on a claimed job not started yet. A task whose code begins long after it (its
    process was paused in between) knows that its lease may have run out meanwhile."""
    undecodable: str | None = None
    """Set when the row's stored ``args``/``kwargs`` do not decode as a list and an object
    (then they are ``[]``/``{}``): the worker fails the job at once, for good, instead of
    calling its task (see :attr:`Job.undecodable`)."""


@dataclass(frozen=True, slots=True)
class SlotFence:
    """What a partitioned claim is fenced by: set ``set_name`` of ``n`` slots, and the
    (slot, token) pairs the claimer holds. The claim statement takes jobs only of slots
    whose current token is still the given one and whose lease has not expired by the
    database's clock, so no claim commits for a slot that changed hands."""

    set_name: str
    n: int
    slots: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Completion:
    """A successful run to record: the result is already JSON text (or None). A job that
    is a batch item names it, and the backend acks it in the completion's transaction."""

    id: int
    lease_token: int
    result_json: str | None
    note: str | None = None
    batch_item: str | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed run to record. ``retry_in`` is None for a final failure (→ ``dead``); a
    job that ends dead marks its batch item (if any) failed in the same transaction."""

    id: int
    lease_token: int
    error: str
    retry_in: float | None
    batch_item: str | None = None


@dataclass(frozen=True, slots=True)
class SettledJob:
    """A job that still carries the lease token a worker asked about and is no longer
    running (``Backend.job_settled``): nobody has claimed it since that claim. What settled
    it was that claim's holder (a success or a failure it wrote), the lease's expiry, or an
    operator (cancel, retry): ``state``, ``attempts`` and ``last_error`` tell them apart."""

    id: int
    state: JobState
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class HousekeepingReport:
    promoted: int = 0
    rescued: int = 0
    dead: int = 0
    pruned: int = 0
    batches_expired: int = 0
    batches_removed: int = 0


@dataclass(frozen=True, slots=True)
class QueueCount:
    queue: str
    state: JobState
    count: int


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What the database knows beside the counts: per queue with ready jobs, the age in
    seconds of the longest-waiting job at the head of each priority (the jobs the next
    claims take; a job deeper in the queue that became due earlier, e.g. a promoted
    scheduled job, is not looked at), and the batches not finished (open or sealed)."""

    oldest_ready: dict[str, float]
    batches_open: int


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A snapshot of one batch and its progress. ``pending`` = total − acked − failed."""

    id: int
    state: BatchState
    description: str | None
    total: int
    acked: int
    failed: int
    groups: int
    expire_after: float
    created_at: datetime
    updated_at: datetime
    sealed_at: datetime | None = None
    finished_at: datetime | None = None
    on_complete: str | None = None
    """Task name of the completion callback (runs once when the batch completes)."""
    on_success: str | None = None
    """Task name of the success callback (runs once if it completes with no failures)."""

    @property
    def pending(self) -> int:
        return self.total - self.acked - self.failed


@dataclass(frozen=True, slots=True)
class AckResult:
    """What an ``ack`` (or ``fail``) call did.

    ``resolved``: items this call acked (or marked failed) now. ``already``: ids given that
    were resolved before (a second ack of an item changes nothing), in the order given.
    ``completed``: batches this call completed; their callbacks were enqueued in the same
    transaction, and no other call will ever report them completed.
    """

    resolved: int
    already: tuple[str, ...] = ()
    completed: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SealResult:
    """What ``seal`` did. ``completed``: this seal completed the batch (every item was
    resolved already, or it has none). ``already_sealed``: it was sealed before (a repeated
    seal is harmless and changes nothing)."""

    batch_id: int
    state: BatchState
    completed: bool
    already_sealed: bool = False


@dataclass(frozen=True, slots=True)
class ItemFailure:
    item: str
    reason: str
    failed_at: datetime


@dataclass(frozen=True, slots=True)
class BatchPruneReport:
    expired: int = 0
    """Open batches that had no activity for their expire_after."""
    removed: int = 0
    """Completed or expired batches past the retention, deleted with their items."""


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """One slot of a set, as ``justonce partitions list`` shows it."""

    set_name: str
    n: int
    slot: int
    owner: str | None
    token: int
    expires_at: datetime | None
    held: bool
    """An owner whose lease has not expired by the database's clock."""


@dataclass(frozen=True, slots=True)
class EffectInfo:
    """One entry of the effect ledger. ``state``: pending (claimable), running (claimed,
    lease live), in_doubt (claimed, lease expired: the holder died or is late), done."""

    scope: str
    key: str
    state: str
    policy: str
    token: int
    owner: str | None
    attempts: int
    lease_expires_at: datetime | None
    last_error: str | None
    result: JSON
    created_at: datetime
    updated_at: datetime
    done_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a listing or an "apply to all matching" action covers. Every field is
    optional (None = any); times are compared with ``created_at``: ``created_after``
    inclusive, ``created_before`` exclusive. ``max_id`` bounds an action to the jobs that
    existed when its preview counted them."""

    state: str | None = None
    queue: str | None = None
    task: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    max_id: int | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's jobs by state, and how long its next ready job has waited.

    ``estimated``: the counts come from a sample of the table (it is past the exact-count
    threshold), not from a full count. ``oldest_ready_age``: seconds since ``run_at`` of the
    ready job the queue hands out next (lowest priority, then oldest id); None when nothing
    is ready."""

    queue: str
    counts: dict[str, int]
    oldest_ready_age: float | None
    estimated: bool = False
    paused: QueuePause | None = None
    """The queue's pause, while it is paused (its ready jobs wait: no worker claims them)."""


@dataclass(frozen=True, slots=True)
class QueuePause:
    """A paused queue: no claim that starts after the pause committed takes a job of it
    (jobs already claimed finish). Jobs are still enqueued into it; they wait."""

    queue: str
    paused_at: datetime
    actor: str | None = None
    """Who paused it (the service's token name, ``cli``, or what the caller passed)."""
    note: str | None = None
    already: bool = False
    """In ``pause_queue``'s answer: the queue was paused before this call, which changed
    nothing (the pause returned is the earlier one). False in listings."""


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """An API token as stored: never its secret (only a hash of it is kept)."""

    id: int
    name: str
    scope: str
    """``read`` (see everything, change nothing) or ``admin`` (also act)."""
    prefix: str
    """The secret's first characters, ``jo_<prefix>``, to recognise a token in a list."""
    created_at: datetime
    last_used_at: datetime | None = None
    """Updated at most once a minute."""
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One action taken through the service: who (token), what, on what, on how many."""

    id: int
    at: datetime
    token_id: int | None
    actor: str
    action: str
    target: str | None
    count: int | None
    detail: dict[str, Any]


Ranges = tuple[tuple[int, int], ...]
"""Positions as sorted, disjoint half-open ranges ``((lo, hi), ...)``: ``lo <= p < hi``."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """Positions of a list handed to one caller until ``expires_at`` (its time to run).

    ``token`` is the fencing token: every complete, touch, release or bury names it, and is
    refused (:class:`~justonce.errors.StaleReservation`) once the reservation no longer
    holds its positions. ``ranges`` are the positions handed out (a re-offer leaves out
    those done already); ``attempt`` counts how often these positions were handed out."""

    list: str
    token: str
    ranges: Ranges
    expires_at: datetime
    attempt: int
    ttr: float
    request_id: str | None = None

    @property
    def count(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    @property
    def positions(self) -> builtins.list[int]:
        return [p for lo, hi in self.ranges for p in range(lo, hi)]


@dataclass(frozen=True, slots=True)
class ListProgress:
    """Where a list's positions are. ``ready``: not handed out, or due to be handed out
    again (timed out, released, kicked); ``reserved``: held by a live reservation;
    ``done``; ``buried``: parked until kicked. They add up to ``total``."""

    total: int
    ready: int
    reserved: int
    done: int
    buried: int


@dataclass(frozen=True, slots=True)
class ListInfo:
    """A snapshot of one list. ``state``: loading (items can be appended), sealed
    (positions are handed out), completed (every position done; ``on_complete`` ran)."""

    id: int
    name: str
    task: str | None
    state: str
    progress: ListProgress
    ttr: float
    max_attempts: int
    created_at: datetime
    sealed_at: datetime | None = None
    finished_at: datetime | None = None
    on_complete: str | None = None
    batch_id: int | None = None


@dataclass(frozen=True, slots=True)
class ListCompletion:
    """What a ``complete`` did: ``completed`` positions were marked done by this call,
    ``already`` were done before (a repeat of the same completion), and ``list_completed``
    says this call finished the whole list (its ``on_complete`` was enqueued with it)."""

    completed: int
    already: tuple[int, ...] = ()
    list_completed: bool = False


@dataclass(frozen=True, slots=True)
class BuriedRange:
    """Positions parked by ``bury``, with the reason given."""

    ranges: Ranges
    attempt: int
    reason: str | None
    buried_at: datetime
