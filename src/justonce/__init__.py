"""justonce: share work kept in a SQL database among many processes and machines without
doing anything twice and without losing anything."""

from .app import App
from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArguments,
    InvalidName,
    InvalidOption,
    InvalidTransition,
    JobNotFound,
    JustonceError,
    KeyConflict,
    NonRetryable,
    PayloadTooLarge,
    SchemaError,
    UnknownTask,
    ValidationError,
)
from .models import Job
from .retry import Backoff
from .tasks import Enqueue, Task
from .types import JobState
from .validate import MAX_PAYLOAD_BYTES, MAX_RESULT_BYTES
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MAX_RESULT_BYTES",
    "App",
    "Backoff",
    "ConfigurationError",
    "DatabaseUnavailable",
    "Enqueue",
    "InvalidArguments",
    "InvalidName",
    "InvalidOption",
    "InvalidTransition",
    "Job",
    "JobNotFound",
    "JobState",
    "JustonceError",
    "KeyConflict",
    "NonRetryable",
    "PayloadTooLarge",
    "SchemaError",
    "Task",
    "UnknownTask",
    "ValidationError",
    "Worker",
    "__version__",
]
