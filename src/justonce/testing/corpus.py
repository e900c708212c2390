"""Hostile input, by kind, for the entries that must refuse it: each value is wrong for
every entry of its kind (a name where a queue, task, set or list name goes; an id where a
job or batch id goes; a number where a count, a duration or a priority goes; a JSON value
where arguments or list items go; free text, reservation tokens, positions, flags, times,
database URLs, iterables, callables, connections, job requests and batch item ids), so
every call must end in a typed error and change nothing. tests/test_hostile_corpus.py
runs it against the Python API and the CLI on every backend (tests/test_web_hostile.py
does the HTTP API)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from ..tasks import Enqueue


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


TEXTS: list[tuple[str, Any]] = [
    ("nul", "a\x00b"), ("lone-surrogate", "a\ud800b"), ("100k", "x" * 100_000), ("int", 5),
    ("bytes", b"abc"), ("list", ["a"]), ("dict", {"a": 1}), ("object", Opaque()),
]
"""Wrong wherever free text goes (a batch's description, a failure or burial reason, a
note, a request id, an API token's name, an audit entry's action)."""

TOKENS: list[tuple[str, Any]] = [
    ("empty", ""), ("nul", "1\x00.0123456789abcdef"), ("10k", "1." + "a" * 10_000),
    ("2^63", f"{2**63}.0123456789abcdef"), ("19-nines", "9999999999999999999.0123456789abcdef"),
    ("20-digits", "99999999999999999999.0123456789abcdef"), ("zero", "0.0123456789abcdef"),
    ("negative", "-1.0123456789abcdef"), ("unused", "987654321.0123456789abcdef"),
    ("wrong-secret", "1.0123456789abcdef"), ("lone-surrogate", "1.\ud800"), ("sql", "1 OR 1=1"),
    ("int", 5), ("none", None), ("bytes", b"1.0123456789abcdef"), ("object", Opaque()),
]
"""Wrong wherever a list reservation's token goes: malformed, forged, past 64 bits, or
well-formed and naming nothing (a stale reservation is a typed error too)."""

POSITIONS: list[tuple[str, Any]] = [
    ("2^63", [2**63]), ("2^64", [2**64]), ("negative", [-1]), ("bool", [True]),
    ("string-item", ["0"]), ("float", [1.5]), ("none-item", [None]), ("object-item", [Opaque()]),
    ("string", "0"), ("int", 5), ("object", Opaque()), ("too-many", [0] * 10_001),
    ("not-held", [2**62]),
]
"""Wrong wherever a list of positions of a reservation goes."""

FLAGS: list[tuple[str, Any]] = [
    ("string", "yes"), ("int", 1), ("none", None), ("list", [True]), ("object", Opaque()),
]
"""Wrong wherever True or False is expected ("yes" is not True, 1 is not True)."""

TIMES: list[tuple[str, Any]] = [
    ("naive", datetime(2030, 1, 1)), ("string", "2030-01-01T00:00:00+00:00"), ("int", 0),
    ("date", date(2030, 1, 1)), ("nan", float("nan")), ("object", Opaque()),
]
"""Wrong wherever a moment goes (a timezone-aware datetime)."""

URLS: list[tuple[str, Any]] = [
    ("nonsense", "nonsense"), ("scheme", "oracle://x/y"), ("nul", "sqlite:///a\x00b.db"),
    ("no-folder", "sqlite:////no/such/folder/x.db"), ("10k", "sqlite:///" + "a" * 10_000),
    ("lone-surrogate", "sqlite:///a\ud800.db"), ("memory", "sqlite:///:memory:"),
    ("postgres-port", "postgresql://h:notaport/db"), ("mysql-path", "mysql://h/a/b"),
    ("pg-escape", "postgresql://h/db_%FF"), ("pg-password-escape", "postgresql://u:pw%FF@h/db"),
    ("mysql-escape", "mysql://u:pw%FF@h/db"), ("pg-reserved-schema", "postgresql://h/db?schema=pg_x"),
    ("sqlite-escape", "sqlite:///db_%FF.db"), ("sqlite-percent", "sqlite:///50%.db"),
    ("sqlite-slash", "sqlite:///a%2Fb.db"), ("sqlite-nul-escape", "sqlite:///a%00b.db"),
    ("pool-size-underscore", "postgresql://h/db?pool_size=1_0"), ("pool-size-digit", "mysql://h/db?pool_size=%D9%A3"),
    ("int", 5), ("bytes", b"sqlite:///x.db"), ("object", Opaque()),
]
"""Wrong wherever a database URL goes. (None and the empty string mean "the default":
``$JUSTONCE_DATABASE_URL``, else ``sqlite:///justonce.db``.)"""

ITERABLES: list[tuple[str, Any]] = [
    ("int", 5), ("none", None), ("object", Opaque()), ("string", "abc"), ("bytes", b"abc"),
]
"""Wrong wherever a collection goes (items, keys, calls, requests, positions): a number,
nothing, a string or bytes (not a collection of strings), an object."""

CALLABLES: list[tuple[str, Any]] = [
    ("int", 5), ("string", "print"), ("none", None), ("object", Opaque()),
]
"""Wrong wherever a function goes (a task, an effect, a backoff, a stop flag)."""

CONNS: list[tuple[str, Any]] = [
    ("string", "sqlite:///x.db"), ("int", 5), ("object", Opaque()), ("list", []),
]
"""Wrong wherever the caller's own connection goes (``conn=``)."""

REQUESTS: list[tuple[str, Any]] = [
    ("string", "corpus.noop"), ("dict", {"task": "corpus.noop"}), ("int", 5), ("none", None),
    ("bad-args", Enqueue("corpus.noop", args=[Opaque()])), ("bad-queue", Enqueue("corpus.noop", queue="a b")),
    ("bad-task", Enqueue("a\x00b")), ("bad-delay", Enqueue("corpus.noop", delay=-1)),
    ("unknown-task", Enqueue("no.such.task")), ("deep-args", Enqueue("corpus.noop", args=[_deep(100)])),
]
"""Wrong wherever one job request (an Enqueue) goes."""

ITEM_IDS: list[tuple[str, Any]] = [
    ("empty", ""), ("forged-group", "1:zzzzzzzzzzzz:0"), ("2^63", f"{2**63}:0123456789ab:0"),
    ("nul", "1:0123456789ab:0\x00"), ("negative", "-1:0123456789ab:0"),
    ("huge-index", "1:0123456789ab:9999999999"), ("unknown-group", "1:0123456789ab:0"),
    ("unknown-batch", "987654321:0123456789ab:0"), ("10k", "1:0123456789ab:" + "9" * 10_000),
    ("int", 5), ("list-of-int", [1]), ("none", None), ("bytes", b"1:0123456789ab:0"),
    ("too-many", ["1:0123456789ab:0"] * 100_001),
]
"""Wrong wherever batch item ids go: malformed, forged or naming nothing."""


def ids(entries: list[tuple[str, Any]]) -> list[str]:
    """The labels, for pytest ids."""
    return [label for label, _ in entries]
