"""The JSON shapes of the API: one pydantic model per request and response, so the OpenAPI
document says exactly what is accepted and returned. Requests refuse unknown fields,
numbers and flags of the wrong JSON type (no coercion) and non-finite numbers; the library
validates the rest (names, ranges, sizes)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, Strict

from ..items import MAX_GROUP_ITEMS
from ..types import BatchState, JobState
from ..validate import plain_int

BIGINT = 2**63 - 1
MAX_BULK_JOBS = 10_000
MAX_ACK_IDS = 100_000

# Numbers and flags of a request are taken as sent: a wrong JSON type is refused (422),
# never coerced ("1" is not 1, 1.5 is not 1, "yes" is not true). Strict floats take ints.
SInt = Annotated[int, Strict()]
SFloat = Annotated[float, Strict()]
SBool = Annotated[bool, Strict()]


def _path_id(value: Any) -> Any:
    """An id in a URL path exactly as ids are written (validate.plain_int): "1_5", " 01",
    "+1" and "١" are refused, not read as 15 or 1."""
    if isinstance(value, str) and plain_int(value) is None:
        raise ValueError("an id is a positive integer in plain digits (no sign, leading zero, "
                         "space or underscore)")
    return value


PATH_ID = BeforeValidator(_path_id)
"""For a job's or batch's id in a path: ``Annotated[int, Path(ge=1, le=BIGINT), PATH_ID]``
(after ``Path``, so the OpenAPI document keeps its minimum and maximum)."""


def _query_int(value: Any) -> Any:
    """A number in a query string (a cursor, a limit, a start) as numbers are written:
    "1_5", "+15" and " 015" are refused, not read as 15."""
    if isinstance(value, str) and plain_int(value, zero=True) is None:
        raise ValueError("a whole number in plain digits below 2**63 (no sign, leading zero, "
                         "space or underscore)")
    return value


QUERY_INT = BeforeValidator(_query_int)
"""For a number in a query string: ``Annotated[int, Query(ge=…, le=…), QUERY_INT]``."""


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# -- jobs -----------------------------------------------------------------------------
class EnqueueIn(Request):
    task: str = Field(description="Task name; the service enqueues names it does not know.")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    queue: str | None = None
    priority: SInt | None = Field(None, description="Lower runs first.")
    delay: SFloat | None = Field(None, ge=0, description="Seconds from the database's now.")
    run_at: AwareDatetime | None = None
    key: str | None = Field(None, description="While a live job holds the key, that job is returned.")
    partition_key: str | SInt | None = None
    max_attempts: SInt | None = None
    timeout: SFloat | None = Field(None, gt=0)


class BulkEnqueueIn(Request):
    jobs: list[EnqueueIn] = Field(min_length=1, max_length=MAX_BULK_JOBS)


class BulkEnqueueOut(BaseModel):
    ids: list[int] = Field(description="In input order; a keyed job's id may be a live job's.")


class JobOut(Out):
    id: int
    queue: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
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
    result: Any = None
    errors: list[dict[str, Any]] = Field(default_factory=list, description="One per failed attempt.")
    duplicate: bool = False
    undecodable: str | None = Field(
        default=None, description="Set when a stored JSON column of the job does not decode "
        "(corrupted outside the library): which and why; args/kwargs are then []/{}.")


class JobPage(BaseModel):
    jobs: list[JobOut]
    next_cursor: int | None = Field(description="Pass as cursor for the next page; null on the last.")


class JobFilterIn(Request):
    state: JobState | None = None
    queue: str | None = None
    task: str | None = None
    created_after: AwareDatetime | None = None
    created_before: AwareDatetime | None = None


class PreviewIn(Request):
    action: Literal["cancel", "retry"]
    filter: JobFilterIn = Field(default_factory=JobFilterIn)


class PreviewOut(BaseModel):
    action: str
    count: int = Field(description="Jobs the action would change now.")
    max_id: int | None = Field(description="Pass to apply: jobs created later are left alone.")


class ApplyIn(Request):
    action: Literal["cancel", "retry"]
    filter: JobFilterIn = Field(default_factory=JobFilterIn)
    max_id: SInt | None = Field(None, ge=1, le=BIGINT)
    expected: SInt = Field(ge=0, le=BIGINT, description="The preview's count.")
    tolerance: SInt = Field(0, ge=0, le=BIGINT,
                           description="Refuse (409 CountChanged) if more than expected + tolerance match.")


class ApplyOut(BaseModel):
    action: str
    previewed: int
    applied: int = Field(description="Jobs changed (fewer than previewed when some finished meanwhile).")


# -- queues ---------------------------------------------------------------------------
class QueuePauseOut(Out):
    queue: str
    paused_at: datetime
    actor: str | None = Field(description="Who paused it: the token's name, or the CLI's user@host.")
    note: str | None = None


class QueueOut(Out):
    queue: str
    counts: dict[str, int]
    oldest_ready_age: float | None = Field(description="Seconds the next ready job has waited.")
    estimated: bool = Field(description="Counts from a sample of a big table, not a full count.")
    paused: QueuePauseOut | None = Field(
        description="The queue's pause while it is paused (no worker claims its jobs), else null.")


class PauseOut(QueuePauseOut):
    already: bool = Field(description="The queue was paused before this call, which changed nothing.")


class PauseIn(Request):
    note: str | None = Field(None, max_length=4000, description="Why: kept with the pause.")


class ResumeOut(BaseModel):
    queue: str
    resumed: bool = Field(description="False when the queue was not paused.")


class QueuesOut(BaseModel):
    queues: list[QueueOut]


# -- batches --------------------------------------------------------------------------
class BatchOpenIn(Request):
    description: str | None = None
    on_complete: str | None = Field(None, description="Task enqueued once when the batch completes.")
    on_success: str | None = Field(None, description="Task enqueued once if no item failed.")
    expire_after: SFloat = Field(7 * 86400.0, gt=0,
                                description="Seconds without activity before an open batch expires.")


class BatchOut(Out):
    id: int
    state: BatchState
    description: str | None
    total: int
    acked: int
    failed: int
    pending: int
    groups: int
    expire_after: float
    created_at: datetime
    updated_at: datetime
    sealed_at: datetime | None = None
    finished_at: datetime | None = None
    on_complete: str | None = None
    on_success: str | None = None


class BatchList(BaseModel):
    batches: list[BatchOut]


class GroupIn(Request):
    count: SInt = Field(ge=1, le=MAX_GROUP_ITEMS)


class GroupOut(BaseModel):
    batch_id: int
    group: str
    count: int
    first_id: str | None = Field(description="Item i is '<batch_id>:<group>:<i>', for i in [0, count).")


class SealOut(Out):
    batch_id: int
    state: BatchState
    completed: bool
    already_sealed: bool


class AckIn(Request):
    ids: list[str] = Field(min_length=1, max_length=MAX_ACK_IDS)


class FailIn(AckIn):
    reason: str


class AckOut(BaseModel):
    resolved: int = Field(description="Items this call resolved.")
    already: list[str] = Field(description="Ids that were resolved before (nothing changed for them).")
    completed: list[int] = Field(description="Batches this call completed (exactly once).")


class ItemFailureOut(Out):
    item: str
    reason: str
    failed_at: datetime


class FailuresOut(BaseModel):
    failures: list[ItemFailureOut]


# -- partitions, effects, audit, session ------------------------------------------------
class SlotOut(Out):
    slot: int
    owner: str | None
    token: int
    expires_at: datetime | None
    held: bool


class PartitionSetOut(BaseModel):
    set_name: str
    n: int
    held: int
    slots: list[SlotOut]


class PartitionsOut(BaseModel):
    sets: list[PartitionSetOut]


class EffectOut(Out):
    scope: str
    key: str
    state: str
    policy: str
    token: int
    owner: str | None
    attempts: int
    lease_expires_at: datetime | None
    last_error: str | None
    result: Any = None
    created_at: datetime
    updated_at: datetime
    done_at: datetime | None


class EffectsOut(BaseModel):
    effects: list[EffectOut]


class ResolveIn(Request):
    scope: str
    key: str | SInt
    done: SBool = Field(description="true: it happened, never redo; false: claimable again.")
    note: str | None = None
    force: SBool = False


class AuditOut(Out):
    id: int
    at: datetime
    token_id: int | None
    actor: str
    action: str
    target: str | None
    count: int | None
    detail: dict[str, Any]


class AuditPage(BaseModel):
    entries: list[AuditOut]
    next_cursor: int | None


class SessionIn(Request):
    token: str


class SessionOut(BaseModel):
    token_id: int
    name: str
    scope: str
    csrf: str | None = Field(description="Send in X-CSRF-Token with every cookie-authenticated POST.")
