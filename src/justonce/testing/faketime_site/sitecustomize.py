"""Put on PYTHONPATH only for the torture's workers under ``faketime`` (the skew scenario).

libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1 (a machine's monotonic clock is its own,
never skewed) makes ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, …)`` fail with EINVAL,
and that is how Python's ``time.sleep`` waits: every sleep would raise ``OSError``, in the
tasks and in justonce alike, and the scenario would test nothing. ``select`` waits
correctly there, so ``time.sleep`` is replaced by a wait on it. Nothing else changes.
"""

import select
import time
from typing import SupportsIndex


def _sleep(secs: float | SupportsIndex, /) -> None:
    seconds = float(secs)
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
