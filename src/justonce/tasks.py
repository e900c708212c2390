"""Tasks: a function registered with an App, plus its defaults."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .errors import InvalidOption
from .retry import Backoff

if TYPE_CHECKING:
    from .app import App
    from .models import Job


@dataclass(frozen=True, slots=True)
class Enqueue:
    """One job request for :meth:`App.enqueue_many`. Options left None take the task's
    defaults."""

    task: str | Task
    args: list[Any] | tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    priority: int | None = None
    queue: str | None = None
    key: str | None = None
    partition_key: str | int | None = None
    max_attempts: int | None = None
    timeout: float | None = None


CALL_OPTIONS = ("delay", "run_at", "priority", "queue", "key", "partition_key", "max_attempts", "timeout")
"""The options that ``enqueue_calls`` and ``partitions.scan`` pass on to every job."""


def call_template(task: str | Task, options: dict[str, Any]) -> Enqueue:
    """The job options shared by every call of ``enqueue_calls`` (or a scan's slots): a
    name that is not one of them is refused by name (a misspelt ``prioirty=`` once
    reached ``Enqueue`` as a TypeError)."""
    unknown = sorted(set(options) - set(CALL_OPTIONS))
    if unknown:
        raise InvalidOption(f"unknown option {', '.join(map(repr, unknown))}: a job takes "
                            f"{', '.join(CALL_OPTIONS)}")
    return Enqueue(task, **options)


@dataclass
class Task:
    """A registered task. Calling it runs the function here and now; ``enqueue`` queues it."""

    app: App
    fn: Callable[..., Any]
    name: str
    queue: str
    priority: int
    max_attempts: int
    timeout: float
    backoff: Backoff | Callable[[int], float]
    is_async: bool = field(init=False)
    signature: inspect.Signature | None = field(init=False)
    _outer: inspect.Signature | None = field(init=False, repr=False)
    _positional: tuple[int, float] | None = field(init=False, repr=False)
    """(fewest, most) positional arguments that fit when no keyword is given, or None when
    a keyword-only parameter has no default (then every check binds)."""

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)
        try:
            self.signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            self.signature = None
        # The enqueue check reads the function as called, not through functools.wraps: a
        # decorator may supply or drop arguments (a wrapper of *args, **kwargs: any fits).
        try:
            self._outer = inspect.signature(self.fn, follow_wrapped=False)
        except (TypeError, ValueError):
            self._outer = None
        self._positional = _positional(self._outer)

    def positional_counts(self) -> tuple[int, float]:
        """(fewest, most) positional arguments that fit when no keyword is given; (1, 0)
        (nothing fits that way) when that alone cannot tell."""
        return self._positional if self._positional is not None else (1, 0)

    def argument_error(self, args: Sequence[Any], kwargs: dict[str, Any] | None = None,
                       passed: Sequence[str] = ()) -> str | None:
        """Why a job with these arguments could never run (they do not fit the function's
        signature), or None. ``passed``: keyword arguments the job will also be given (a
        batch callback's ``batch``). None as well when the signature cannot be read. A
        plain call (positional arguments only) is a length check; anything else binds."""
        if self._outer is None:
            return None
        args = () if args is None else args
        if not kwargs and not passed and self._positional is not None:
            fewest, most = self._positional
            if fewest <= len(args) <= most:
                return None
        try:
            self._outer.bind(*args, **(kwargs or {}), **dict.fromkeys(passed))
        except TypeError as exc:
            return f"arguments do not match {self.name}{self._outer}: {exc}"
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def retry_delay(self, attempt: int) -> float:
        if isinstance(self.backoff, Backoff):
            return self.backoff.delay(attempt)
        return max(0.0, float(self.backoff(attempt)))

    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        """Queue one run with these arguments and the task's default options."""
        return self.app.enqueue(self, args=args, kwargs=kwargs)

    def configure(self, **options: Any) -> TaskCall:
        """Options for one enqueue: ``task.configure(delay=5, key="x").enqueue(1, 2)``."""
        return TaskCall(self, options)

    def enqueue_many(self, calls: Iterable[tuple[Any, ...] | dict[str, Any]], **options: Any) -> list[int]:
        """Queue many runs in one round trip: each item is a tuple of positional
        arguments or a dict of keyword arguments."""
        return self.app.enqueue_calls(self, calls, **options)


@dataclass(frozen=True)
class TaskCall:
    task: Task
    options: dict[str, Any]

    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        return self.task.app.enqueue(self.task, args=args, kwargs=kwargs, **self.options)


def _positional(sig: inspect.Signature | None) -> tuple[int, float] | None:
    if sig is None:
        return None
    fewest, most = 0, 0.0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            most += 1
            fewest += p.default is p.empty
        elif p.kind is p.VAR_POSITIONAL:
            most = math.inf
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            return None
    return fewest, most
