"""Hostile input, by kind, for the entries that must refuse it: each value is wrong for
every entry of its kind (a name where a queue, task, set or list name goes; an id where a
job or batch id goes; a number where a count, a duration or a priority goes; a JSON value
where arguments or list items go), so every call must end in a typed error and change
nothing. tests/test_hostile_corpus.py runs it against the Python API and the CLI on every
backend (tests/test_web_hostile.py does the HTTP API)."""

from __future__ import annotations

from typing import Any


class Opaque:
    """An object no encoder knows."""

    def __repr__(self) -> str:
        return "Opaque()"


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


NAMES: list[tuple[str, Any]] = [
    ("empty", ""), ("space", " "), ("spaces-inside", "a b"), ("10k", "q" * 10_000),
    ("nul", "a\x00b"), ("lone-surrogate", "a\ud800b"), ("zero-width", "a\u200bb"),
    ("rtl", "a\u202eb"), ("dot-dot", "../etc"), ("slash", "a/b"), ("sql", "x'; DROP TABLE t;--"),
    ("percent-s", "%s"), ("question", "?"), ("newline", "a\nb"), ("cr", "a\rb"),
    ("tab", "a\tb"), ("control", "a\x07b"), ("int", 123), ("none", None), ("bytes", b"abc"),
    ("list", ["a"]), ("dict", {"a": 1}), ("float", 1.5), ("bool", True), ("object", Opaque()),
]
"""Wrong wherever a name (queue, task, partition set, list) is expected."""

KEYS: list[tuple[str, Any]] = [
    ("nul", "a\x00b"), ("lone-surrogate", "a\ud800b"), ("100k", "k" * 100_000),
    ("bytes", b"abc"), ("list", ["a"]), ("dict", {"a": 1}), ("object", Opaque()),
    ("nan", float("nan")), ("none", None),
]
"""Wrong wherever a free-text key (an effect's key, a job's unique key) is expected."""

IDS: list[tuple[str, Any]] = [
    ("zero", 0), ("negative", -1), ("2^63", 2**63), ("2^64", 2**64), ("-2^63-1", -(2**63) - 1),
    ("float", 1.5), ("bool", True), ("digits", "12"), ("none", None), ("empty", ""),
    ("sql", "1 OR 1=1"), ("list", [1]), ("nan", float("nan")), ("object", Opaque()),
]
"""Wrong wherever a job or batch id is expected (a well-formed id of nothing is not here:
that is a "not found", tested with the forged ones below)."""

FORGED_IDS: list[tuple[str, int]] = [("unused", 987_654_321), ("max", 2**63 - 1)]
"""Well-formed ids that name nothing: a typed "not found"."""

NUMBERS: list[tuple[str, Any]] = [
    ("negative", -1), ("huge-negative", -1e308), ("nan", float("nan")), ("inf", float("inf")),
    ("-inf", float("-inf")), ("2^70", 2**70), ("bool", True), ("string", "5"), ("list", [5]),
    ("object", Opaque()),
]
"""Wrong wherever a count, a duration or a delay is expected."""

JSON_VALUES: list[tuple[str, Any]] = [
    ("deep", _deep(10_000)), ("oversize", "x" * (2 * 1024 * 1024)), ("nan", float("nan")),
    ("inf", float("inf")), ("set", {1, 2}), ("bytes", b"abc"), ("object", Opaque()),
    ("lone-surrogate", "a\ud800b"), ("nul-in-text", "a\x00b"),
]
"""Wrong wherever JSON goes (job arguments, list items). (Integers past 64 bits are not
here: they are JSON, and every backend keeps them as written, see tests/test_jobs.py.)"""


def ids(entries: list[tuple[str, Any]]) -> list[str]:
    """The labels, for pytest ids."""
    return [label for label, _ in entries]
