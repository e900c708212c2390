"""A run's history: JSON lines appended by every process of a test run, read back in one
list for :mod:`justonce.testing.check`.

Each line is one object with ``ev`` (what happened), ``t`` (``time.time()`` when it was
recorded: after the thing it records) and ``pid``, plus the event's fields (see
:mod:`justonce.testing.check` for the events and their fields).

Many processes and threads append to one file: each line is written with a single
``os.write`` on a descriptor opened with ``O_APPEND``, so lines never interleave; a
``kill -9`` can at worst cut the line being written, which :func:`read` skips (and counts).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Recorder:
    """Appends history lines to ``path`` (created if missing). ``skew``: seconds this
    process's wall clock is known to be ahead (a test skewed it), taken off every ``t`` so
    that the lines of all processes share one clock."""

    def __init__(self, path: str | os.PathLike[str], skew: float = 0.0) -> None:
        self.path = Path(path)
        self.skew = skew
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def record(self, ev: str, **fields: Any) -> None:
        """One line: ``{"ev": ev, "t": now, "pid": pid, **fields}``."""
        self.line(ev, time.time() - self.skew, **fields)

    def line(self, ev: str, t: float, **fields: Any) -> None:
        """One line with the time given (for facts learnt afterwards, e.g. from the database)."""
        data = (json.dumps({"ev": ev, "t": t, "pid": os.getpid(), **fields},
                           separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            os.write(self._fd, data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def from_env() -> Recorder | None:
    """A Recorder for ``$JUSTONCE_HISTORY`` (with ``$JUSTONCE_HISTORY_SKEW`` seconds taken
    off its times), or None when it is unset (record nothing)."""
    path = os.environ.get("JUSTONCE_HISTORY")
    return Recorder(path, float(os.environ.get("JUSTONCE_HISTORY_SKEW") or 0)) if path else None


@dataclass(frozen=True)
class Line:
    """One history line, with where it came from (for witnesses)."""

    data: dict[str, Any]
    file: str
    lineno: int

    @property
    def ev(self) -> str:
        return str(self.data["ev"])

    @property
    def t(self) -> float:
        return float(self.data["t"])

    @property
    def pid(self) -> int:
        return int(self.data.get("pid", 0))

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def where(self) -> str:
        return f"{self.file}:{self.lineno}"

    def __str__(self) -> str:
        return f"{self.where()}: {json.dumps(self.data, separators=(',', ':'), default=str)}"


class MalformedHistory(ValueError):
    """A line that is not a history line (and not a cut-off last line)."""


@dataclass
class Read:
    lines: list[Line]
    cut: int  # cut-off last lines skipped


def read_all(paths: Iterable[str | os.PathLike[str]]) -> Read:
    """Every line of every file, sorted by time (then file order). A last line cut off
    by a kill is skipped and counted; any other bad line raises MalformedHistory."""
    out: list[Line] = []
    cut = 0
    for path in paths:
        name = str(path)
        raw = Path(path).read_bytes().split(b"\n")
        last = len(raw)
        if raw and raw[-1] == b"":
            raw.pop()
            last = len(raw) + 1  # the file ends with a newline: no line is cut
        for i, b in enumerate(raw, 1):
            if not b.strip():
                continue
            try:
                data = json.loads(b)
                if not isinstance(data, dict) or not isinstance(data.get("ev"), str):
                    raise ValueError("not an object with a string 'ev'")
                if not isinstance(data.get("t"), (int, float)) or isinstance(data["t"], bool):
                    raise ValueError("no numeric 't'")
            except ValueError as exc:
                if i == len(raw) and last == len(raw):
                    cut += 1  # the last line, without its newline: cut by a kill
                    continue
                raise MalformedHistory(f"{name}:{i}: not a history line ({exc}): "
                                       f"{b[:200]!r}") from None
            out.append(Line(data, name, i))
    out.sort(key=lambda x: x.t)
    return Read(out, cut)


def read(paths: Iterable[str | os.PathLike[str]]) -> list[Line]:
    """The lines of :func:`read_all`."""
    return read_all(paths).lines
