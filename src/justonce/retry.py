"""Retry delays: exponential backoff with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import InvalidOption


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base * factor**(attempt-1)`` seconds, capped at ``cap``, times a random factor in
    ``[1 - jitter, 1 + jitter]`` so that jobs failing together do not retry together.

    With the defaults (factor 2, jitter 0.25) each delay is longer than the one before,
    whatever the dice say: 2 > 1.25 / 0.75.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.cap >= 0):
            raise InvalidOption("backoff base and cap must be >= 0")
        if self.factor < 1:
            raise InvalidOption("backoff factor must be >= 1")
        if not 0 <= self.jitter < 1:
            raise InvalidOption("backoff jitter must be in [0, 1)")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        try:
            raw = min(self.cap, self.base * self.factor ** max(0, attempt - 1))
        except OverflowError:
            raw = self.cap
        return raw * random.uniform(1 - self.jitter, 1 + self.jitter)
