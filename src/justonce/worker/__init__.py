"""The worker runtime: producer (claims), executor (runs one job), maintenance."""

from .maintenance import Maintenance
from .worker import Worker, WorkerStats

__all__ = ["Maintenance", "Worker", "WorkerStats"]
