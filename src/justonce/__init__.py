"""justonce: share work kept in a SQL database among many processes and machines without
doing anything twice and without losing anything."""

from .app import App
from .backends.effectstore import AT_LEAST_ONCE, AT_MOST_ONCE
from .batches import Batch, Batches
from .effects import EffectClaim, EffectOutcome, Effects
from .errors import (
    BatchExpired,
    BatchNotFound,
    ConfigurationError,
    CountChanged,
    DatabaseUnavailable,
    EffectNotFound,
    InvalidArguments,
    InvalidItemId,
    InvalidName,
    InvalidOption,
    InvalidTransition,
    ItemNotFound,
    JobNotFound,
    JustonceError,
    KeyConflict,
    LeaseLost,
    LockTimeout,
    NoFreeSlot,
    NonRetryable,
    PartitionConflict,
    PartitionSetNotFound,
    PayloadTooLarge,
    SchemaError,
    TokenNotFound,
    UnknownTask,
    ValidationError,
)
from .items import ItemGroup
from .models import (
    AckResult,
    AuditEntry,
    BatchInfo,
    EffectInfo,
    Job,
    JobFilter,
    QueueStats,
    SealResult,
    SlotInfo,
    TokenInfo,
)
from .partitions import PartitionLease, Partitions, partition_of, slot_predicate
from .retry import Backoff
from .tasks import Enqueue, Task
from .tokens import Audit, Tokens
from .types import BatchState, JobState
from .validate import MAX_PAYLOAD_BYTES, MAX_RESULT_BYTES
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Audit",
    "AuditEntry",
    "CountChanged",
    "JobFilter",
    "QueueStats",
    "TokenInfo",
    "TokenNotFound",
    "Tokens",
    "AT_LEAST_ONCE",
    "AT_MOST_ONCE",
    "MAX_PAYLOAD_BYTES",
    "MAX_RESULT_BYTES",
    "AckResult",
    "App",
    "Backoff",
    "Batch",
    "BatchExpired",
    "BatchInfo",
    "BatchNotFound",
    "BatchState",
    "Batches",
    "ConfigurationError",
    "DatabaseUnavailable",
    "EffectClaim",
    "EffectInfo",
    "EffectNotFound",
    "EffectOutcome",
    "Effects",
    "Enqueue",
    "InvalidArguments",
    "InvalidItemId",
    "InvalidName",
    "InvalidOption",
    "InvalidTransition",
    "ItemGroup",
    "ItemNotFound",
    "Job",
    "JobNotFound",
    "JobState",
    "JustonceError",
    "KeyConflict",
    "LeaseLost",
    "LockTimeout",
    "NoFreeSlot",
    "PartitionConflict",
    "PartitionLease",
    "PartitionSetNotFound",
    "Partitions",
    "NonRetryable",
    "PayloadTooLarge",
    "SchemaError",
    "SealResult",
    "SlotInfo",
    "Task",
    "UnknownTask",
    "ValidationError",
    "Worker",
    "__version__",
    "partition_of",
    "slot_predicate",
]
