"""Failpoints: named places in the library where a test run can make a process die, stall
or fail, to see that the promises hold when it happens exactly there.

Set ``JUSTONCE_FAILPOINTS`` before the process starts (or call :func:`configure`)::

    JUSTONCE_FAILPOINTS='effect.after_fn=kill;ack.after_commit=sleep(2000)'

Each entry is ``point=action``. Actions:

- ``kill``: SIGKILL this process (as ``kill -9`` from outside would, at exactly this place);
- ``sleep(ms)``: stall the calling thread for ``ms`` milliseconds;
- ``raise``: raise :class:`FailpointError` (an unexpected error, as a broken network or
  driver would raise);
- ``off``: nothing (to switch one point off in a longer list).

An action may be prefixed by a probability, ``25%kill`` (hit one time in four, drawn from
a generator seeded by ``JUSTONCE_FAILPOINTS_SEED`` when set, so a run can be replayed), and
by a count, ``3*raise`` (only the first three hits act). A name that is not a point of
:data:`POINTS`, or an action that does not parse, is refused when the setting is read:
a mistyped failpoint must not make a fault test pass vacuously.

When a point acts it reports ``failpoint.hit`` (a warning in the JSON log, with the point
and the action) before acting, so a test can see where a process stopped.

Cost when unset: each point is one call that tests one module global and returns. Hot
paths (per job) check :data:`ACTIVE` first and skip even the call.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass

from .errors import InvalidOption
from .events import Event, emit

POINTS: dict[str, str] = {
    "job.after_claim": "a claim committed; the worker has not yet seen its jobs",
    "job.before_start": "a slot chose a leased job; its code has not begun",
    "job.after_run": "a job's code returned; its outcome is not yet queued for writing",
    "ack.before_write": "completions are about to be written (the acker)",
    "ack.after_commit": "completions committed; the worker has not yet seen that they were",
    "fail.after_commit": "a failure (retry or dead) committed; the worker has not seen it",
    "heartbeat.before_write": "a worker is about to renew its jobs' leases",
    "partition.before_renew": "a slot's lease renewal is about to be written",
    "partition.after_acquire": "a slot was acquired; its holder has not yet used it",
    "effect.before_claim": "an effect (or a chunk of run_many) is about to be claimed",
    "effect.after_fn": "an effect's function returned; the effect is not yet marked done",
    "effect.in_finish": "a chunk's finishing transaction wrote its marks; not yet committed",
    "effect.after_finish": "an effect's (or a chunk's) done mark committed; not yet seen",
    "effect.after_chunk": "a chunk of run_many was marked done; the next is not claimed",
    "batch.before_ack": "batch items are about to be acked",
    "batch.before_seal": "a batch is about to be sealed",
    "list.after_append_chunk": "a chunk of a list append committed; the next is not written",
    "list.before_complete": "a list position's outcome is about to be written",
}
"""Every failpoint, with where it is (the README's failpoint table is this one)."""


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``raise``."""


@dataclass
class _Action:
    kind: str  # kill, sleep, raise, off
    ms: int = 0
    chance: float = 1.0
    left: int | None = None  # hits that still act; None: all

    def __str__(self) -> str:
        return self.kind if self.kind != "sleep" else f"sleep({self.ms})"


ACTIVE = False
"""True when any failpoint is configured (hot paths test this before calling :func:`hit`)."""

_points: dict[str, _Action] = {}
_lock = threading.Lock()
_rng = random.Random()
_ACTION = re.compile(r"^(?:(?P<count>\d+)\*)?(?:(?P<pct>\d+(?:\.\d+)?)%)?"
                     r"(?P<kind>kill|raise|off|sleep\((?P<ms>\d+)\))\Z")


def parse(spec: str) -> dict[str, _Action]:
    """The points of a ``JUSTONCE_FAILPOINTS`` value; InvalidOption when it does not parse."""
    if not isinstance(spec, str):
        raise InvalidOption(f"failpoints must be a string like 'job.before_start=kill', not "
                            f"{type(spec).__name__}")
    points: dict[str, _Action] = {}
    for entry in filter(None, (e.strip() for e in spec.split(";"))):
        name, sep, action = (p.strip() for p in entry.partition("="))
        if not sep:
            raise InvalidOption(f"failpoint entry {entry!r} is not point=action")
        if name not in POINTS:
            raise InvalidOption(f"no failpoint {name!r}; the points are: {', '.join(POINTS)}")
        m = _ACTION.match(action.replace(" ", ""))
        if m is None:
            raise InvalidOption(f"failpoint {name}: action {action!r} is not kill, raise, off or "
                                "sleep(ms), optionally after N* (first N hits) and P% (chance)")
        pct = float(m["pct"]) if m["pct"] is not None else 100.0
        if not 0 <= pct <= 100:
            raise InvalidOption(f"failpoint {name}: chance {pct}% is not in [0, 100]")
        kind = m["kind"].split("(")[0]
        points[name] = _Action(kind, int(m["ms"] or 0), pct / 100,
                               int(m["count"]) if m["count"] is not None else None)
    return points


def configure(spec: str | None, seed: int | None = None) -> None:
    """Replace the configured failpoints (``None`` or ``""``: none). ``seed`` seeds the
    probability draws."""
    global ACTIVE
    points = parse(spec) if spec else {}
    with _lock:
        _points.clear()
        _points.update((k, v) for k, v in points.items() if v.kind != "off")
        _rng.seed(seed)
        ACTIVE = bool(_points)


def hit(name: str) -> None:
    """The failpoint ``name``: act if it is configured, else return at once."""
    if not ACTIVE:
        return
    action = _points.get(name)
    if action is None:
        return
    with _lock:
        if action.left is not None and action.left <= 0:
            return
        if action.chance < 1.0 and _rng.random() >= action.chance:
            return
        if action.left is not None:
            action.left -= 1
    emit(Event.FAILPOINT_HIT, "failpoint hit", point=name, action=str(action))
    if action.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # SIGKILL is delivered before this returns; never go on
    elif action.kind == "sleep":
        time.sleep(action.ms / 1000)
    elif action.kind == "raise":
        raise FailpointError(f"failpoint {name}")


def _from_env() -> None:
    spec = os.environ.get("JUSTONCE_FAILPOINTS")
    if spec:
        seed = os.environ.get("JUSTONCE_FAILPOINTS_SEED") or None
        if seed is not None and not re.fullmatch(r"-?[0-9]+", seed):
            raise InvalidOption(f"JUSTONCE_FAILPOINTS_SEED must be an integer, not {seed!r}")
        configure(spec, int(seed) if seed is not None else None)


_from_env()
