"""Bad input everywhere: the corpus of justonce.testing.corpus (hostile names, NUL bytes and
lone surrogates, deep and oversize JSON, forged ids, huge and negative numbers) against the
Python API and the CLI, on every backend. Each call ends in a typed error (a JustonceError;
on the command line a one-line message and a non-zero exit, no traceback), and a dump of
every justonce table is the same before and after. The HTTP API gets the same treatment in
tests/test_web_hostile.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

from justonce import (
    App,
    EffectClaim,
    JobFilter,
    JustonceError,
    PartitionLease,
    StaleReservation,
    Worker,
)
from justonce.cli import cli
from justonce.testing import corpus as C

Call = Callable[[Any], Any]


def dump(app: App) -> list[tuple[str, list[str]]]:
    """Every row of every justonce table, sorted: what a refused call must leave alone."""
    url = app.database_url
    with app.backend.transaction() as conn:
        if url.startswith("sqlite"):
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'justonce%'")]
            q = "SELECT * FROM {}"
        elif url.startswith("postgres"):
            names = [r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                "current_schema() AND table_name LIKE 'justonce%'").fetchall()]
            q = 'SELECT * FROM "{}"'
        else:
            with closing(conn.cursor()) as cur:
                cur.execute("SELECT table_name FROM information_schema.tables WHERE "
                            "table_schema = DATABASE() AND table_name LIKE 'justonce%'")
                names = [r[0] for r in cur.fetchall()]
            q = "SELECT * FROM `{}`"
        out = []
        for name in sorted(names):
            if name in ("justonce_maintenance",):  # housekeeping's clock, not data
                continue
            if url.startswith("mysql"):
                with closing(conn.cursor()) as cur:
                    cur.execute(q.format(name))
                    rows = cur.fetchall()
            else:
                rows = conn.execute(q.format(name)).fetchall()
            out.append((name, sorted(repr(tuple(r)) for r in rows)))
    return out


@pytest.fixture
def capp(app: App) -> App:
    @app.task(name="corpus.noop")
    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    app.lists.create("loading", seal=False)
    app.lists.create("sealed", items=[1, 2, 3])
    app.enqueue(noop, [1])  # something to leave alone
    app.effects.run("s", "present", lambda key: None)
    return app


def entries(app: App) -> dict[str, list[tuple[str, Call]]]:
    def fn(key: str) -> None:
        raise AssertionError("an effect ran for a refused call")

    def option(name: str) -> Call:
        return lambda v: app.enqueue("corpus.noop", [], **{name: v})

    return {
        "names": [
            ("enqueue task", lambda v: app.enqueue(v, [])),
            ("enqueue queue", lambda v: app.enqueue("corpus.noop", [], queue=v)),
            ("partitions.try_acquire", lambda v: app.partitions.try_acquire(v, 4)),
            ("partitions.list", lambda v: app.partitions.list(v)),
            ("lists.create", lambda v: app.lists.create(v, items=[1])),
            ("lists.get", lambda v: app.lists.get(v)),
            ("lists.reserve", lambda v: app.lists.reserve(v)),
            ("lists.append", lambda v: app.lists.append(v, [1])),
        ],
        "keys": [
            ("effects.run key", lambda v: app.effects.run("s", v, fn)),
            ("effects.run scope", lambda v: app.effects.run(v, "k", fn)),
            ("effects.run_many keys", lambda v: app.effects.run_many("s", ["ok", v], fn)),
            ("effects.resolve", lambda v: app.effects.resolve("s", v, done=True)),
            ("effects.resolve_many", lambda v: app.effects.resolve_many("s", [v], done=True)),
            ("enqueue key", lambda v: app.enqueue("corpus.noop", [], key=v)),
            ("enqueue partition_key", lambda v: app.enqueue("corpus.noop", [], partition_key=v)),
        ],
        "ids": [
            ("get_job", app.get_job), ("cancel", app.cancel), ("retry", app.retry),
            ("batches.get", app.batches.get), ("batches.seal", app.batches.seal),
            ("batches.add", lambda v: app.batches.add(v, 1)), ("batches.ack", app.batches.ack),
            ("lists.complete token", lambda v: app.lists.complete("sealed", v)),
        ],
        "numbers": [
            ("enqueue delay", option("delay")), ("enqueue max_attempts", option("max_attempts")),
            ("enqueue timeout", option("timeout")),
            ("effects.run lease", lambda v: app.effects.run("s", "n1", fn, lease=v)),
            ("effects.run lock_timeout", lambda v: app.effects.run("s", "n2", fn, lock_timeout=v)),
            ("effects.run_many chunk", lambda v: app.effects.run_many("s", ["n3"], fn, chunk=v)),
            ("lists.reserve k", lambda v: app.lists.reserve("sealed", k=v)),
            ("lists.reserve ttr", lambda v: app.lists.reserve("sealed", ttr=v)),
            ("partitions n", lambda v: app.partitions.try_acquire("set", v)),
            ("partitions lease", lambda v: app.partitions.try_acquire("set", 4, lease=v)),
            ("batches.open expire_after", lambda v: app.batches.open(expire_after=v)),
            ("Worker concurrency", lambda v: Worker(app, concurrency=v)),
            ("Worker lease", lambda v: Worker(app, lease=v)),
            ("list_jobs limit", lambda v: app.list_jobs(limit=v)),
            ("batches.list limit", lambda v: app.batches.list(limit=v)),
        ],
        "json": [
            ("enqueue args", lambda v: app.enqueue("corpus.noop", [v])),
            ("enqueue kwargs", lambda v: app.enqueue("corpus.noop", [], {"a": v})),
            ("enqueue_many", lambda v: app.enqueue_calls("corpus.noop", [[1], [v]])),
            ("lists.append", lambda v: app.lists.append("loading", [1, v])),
        ],
    }


KINDS: dict[str, list[tuple[str, Any]]] = {
    "names": C.NAMES, "keys": C.KEYS, "ids": C.IDS, "numbers": C.NUMBERS, "json": C.JSON_VALUES}
VALID_HERE = {
    # None means "the default" for these options, not a hostile value.
    ("enqueue queue", "none"), ("partitions.list", "none"), ("enqueue key", "none"),
    ("enqueue partition_key", "none"),
}


def test_every_hostile_value_gets_a_typed_error_and_changes_nothing(capp: App) -> None:
    before = dump(capp)
    wrong: list[str] = []
    for kind, entry, call in ((k, e, c) for k, es in entries(capp).items() for e, c in es):
        for label, value in KINDS[kind]:
            if (entry, label) in VALID_HERE:
                continue
            try:
                got = call(value)
            except JustonceError as exc:
                assert str(exc).strip(), (entry, label)
                continue
            except Exception as exc:  # noqa: BLE001 - collected: the point of the test
                wrong.append(f"{entry} <- {label}: untyped {type(exc).__name__}: {exc!s:.120}")
                continue
            wrong.append(f"{entry} <- {label}: accepted ({got!r:.80})")
    assert not wrong, "\n".join(wrong)
    assert dump(capp) == before


def test_forged_ids_are_a_typed_not_found(capp: App) -> None:
    before = dump(capp)
    for _, value in C.FORGED_IDS:
        for _, call in entries(capp)["ids"][:6]:
            with pytest.raises(JustonceError, match=r"(?i)no |not found|unknown"):
                call(value)
    for token in ("1.0123456789abcdef", f"{2**62}.0123456789abcdef"):
        with pytest.raises(JustonceError):
            capp.lists.complete("sealed", token)
    assert dump(capp) == before


CLI_CASES = [
    ["enqueue", "corpus.noop", "--queue", "a b"],
    ["enqueue", "corpus.noop", "--queue", "x'; DROP TABLE t;--"],
    ["enqueue", "corpus.noop", "--args", "[1e999]"],
    ["enqueue", "corpus.noop", "--args", "[" * 10_000 + "]" * 10_000],
    ["enqueue", "corpus.noop", "--args", "[NaN]"],
    ["enqueue", "corpus.noop", "--args", '["\\u0000"]'],
    ["enqueue", "corpus.noop", "--args", '["\\ud800"]'],
    ["enqueue", "corpus.noop", "--args", "{}"],
    ["enqueue", "corpus.noop", "--kwargs", "[]"],
    ["enqueue", "corpus.noop", "--delay", "-1"],
    ["enqueue", "corpus.noop", "--delay", "nan"],
    ["enqueue", "corpus.noop", "--priority", str(2**70)],
    ["enqueue", "corpus.noop", "--max-attempts", "0"],
    ["enqueue", "corpus.noop", "--timeout", "inf"],
    ["enqueue", "corpus.noop", "--key", "a\x00b"],
    ["enqueue", "", "--args", "[]"],
    ["jobs", "show", "0"], ["jobs", "show", "-1"], ["jobs", "show", str(2**64)],
    ["jobs", "show", "987654321"], ["jobs", "cancel", "987654321"], ["jobs", "retry", "abc"],
    ["batches", "show", "0"], ["batches", "seal", str(2**63)], ["batches", "show", "1.5"],
    ["lists", "show", "../etc"], ["lists", "seal", "a\x00b"], ["lists", "drop", "no-such-list", "--yes"],
    ["effects", "resolve", "s", "a\x00b", "--done"], ["partitions", "list", "--set", "a b"],
]


def test_the_command_line_refuses_with_one_line_and_changes_nothing(capp: App) -> None:
    before = dump(capp)
    wrong = []
    for args in CLI_CASES:
        result = CliRunner().invoke(cli, [*args, "--database-url", capp.database_url])
        lines = result.output.strip().splitlines()
        if result.exit_code == 0:
            wrong.append(f"{args[:4]}: accepted: {result.output[:200]}")
        elif "Traceback" in result.output or not (
                result.exception is None or isinstance(result.exception, SystemExit)):
            wrong.append(f"{args[:4]}: {result.exception!r}")
        elif not (lines and lines[-1].strip()):
            wrong.append(f"{args[:4]}: no message")  # it must say what was wrong
    assert not wrong, "\n".join(wrong)
    assert dump(capp) == before


def test_sqlite_dump_sees_every_table(tmp_path: Any) -> None:
    """The dump is not vacuous: it reads rows that exist."""
    app = App(f"sqlite:///{tmp_path / 'x.db'}")
    app.migrate()
    app.enqueue(app.task(lambda: None, name="t"), [])
    tables = dict(dump(app))
    assert tables["justonce_jobs"], tables
    with closing(sqlite3.connect(tmp_path / "x.db")) as c:
        n = c.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'justonce%' "
                      "AND type='table'").fetchone()[0]
    assert len(tables) == n - 1  # all but the housekeeping clock
    app.close()


def test_a_refusal_names_a_hostile_value_without_echoing_it_whole(capp: App) -> None:
    """A 10,000-character name (or a 100,000-character key, a list of 10,000 numbers) is
    cut in the message that refuses it: enough to recognise, never the whole value."""
    name, key, many = "q" * 10_000, "k" * 100_000, [5] * 10_000

    def fn(key: str) -> None:
        raise AssertionError("an effect ran for a refused call")

    calls: list[Callable[[], Any]] = [
        lambda: capp.enqueue(name, []), lambda: capp.enqueue("corpus.noop", [], queue=name),
        lambda: capp.enqueue("corpus.noop", [], key=key), lambda: capp.enqueue("corpus.noop", [], delay=many),
        lambda: capp.get_job(many), lambda: capp.lists.get(name), lambda: capp.lists.reserve("sealed", k=many),
        lambda: capp.lists.complete("sealed", "1.0123456789abcdef", positions=[name]),
        lambda: capp.partitions.list(name), lambda: capp.partitions.try_acquire("set", many),
        lambda: capp.effects.run(name, "k", fn), lambda: capp.effects.run("s", key, fn),
        lambda: capp.effects.run("s", "k", fn, policy=name), lambda: capp.effects.list("s", state=name),
        lambda: capp.batches.open(on_complete=many), lambda: capp.batches.ack(name),
        lambda: capp.list_jobs(state=name), lambda: capp.tokens.create(name, "read"),
        lambda: capp.tokens.create("n", name),
    ]
    for call in calls:
        with pytest.raises(JustonceError) as info:
            call()
        message = str(info.value)
        assert len(message) < 300 and "q" * 100 not in message and "k" * 100 not in message, message[:400]


def test_job_listing_filters_are_validated_before_any_sql(capp: App) -> None:
    """list_jobs passed queue and task straight to SQL (Postgres: a NUL was a DataError,
    an int an UndefinedFunction; everywhere a lone surrogate a UnicodeEncodeError), and
    list_jobs_page, count_matching and apply_matching took anything for a JobFilter."""
    before = dump(capp)
    for what in ("queue", "task"):
        for value in ("a\x00b", "a\ud800b", 123, ["a"], "q" * 10_000, "a b"):
            with pytest.raises(JustonceError):
                capp.list_jobs(**{what: value})
    for where in ("x", 5, {"queue": "default"}):
        with pytest.raises(JustonceError):
            capp.list_jobs_page(where)  # type: ignore[arg-type]
        with pytest.raises(JustonceError):
            capp.count_matching("cancel", where)  # type: ignore[arg-type]
        with pytest.raises(JustonceError):
            capp.apply_matching("cancel", where, expected=0)  # type: ignore[arg-type]
    with pytest.raises(JustonceError):
        capp.count_matching("cancel", None)  # type: ignore[arg-type]
    assert [j.task for j in capp.list_jobs(queue="default", task="corpus.noop")] == ["corpus.noop"]
    assert dump(capp) == before
    for bad in (JobFilter(queue="a\x00b"), JobFilter(task=7), JobFilter(state="zz"),  # type: ignore[arg-type]
                JobFilter(max_id=2**63), JobFilter(created_after="2024")):  # type: ignore[arg-type]
        with pytest.raises(JustonceError):
            capp.list_jobs_page(bad)
        with pytest.raises(JustonceError):
            capp.apply_matching("cancel", bad, expected=0)
    assert dump(capp) == before


def test_forged_tokens_and_ids_past_64_bits_are_typed(capp: App) -> None:
    """A reservation token's row id, an API token's id, an audit entry's token id and
    count, a partition lease's or an effect claim's fencing token: past 2**63 - 1 they
    were an OverflowError on SQLite (Python int too large for sqlite3) and a
    NumericValueOutOfRange or DataError on Postgres and MySQL."""
    before = dump(capp)
    for row_id in (2**63, 9_999_999_999_999_999_999):
        token = f"{row_id}.0123456789abcdef"
        for call in (capp.lists.complete, capp.lists.touch, capp.lists.release, capp.lists.bury):
            with pytest.raises(StaleReservation):
                call("sealed", token)
    for bad in (2**63, -1, 0, "1", 1.5, None):
        with pytest.raises(JustonceError):
            capp.tokens.active(bad)  # type: ignore[arg-type]
    for options in ({"token_id": 2**63}, {"token_id": "1"}, {"count": 2**63}, {"count": "x"},
                    {"count": -1}, {"detail": [1]}, {"detail": {"a": "\x00"}}, {"detail": {1: 2}},
                    {"detail": {"a": "\ud800"}}, {"detail": {"a": C.JSON_VALUES[0][1]}}):
        with pytest.raises(JustonceError):
            capp.audit.record("corpus.action", **options)
    now = datetime.now(UTC)
    for token in (2**63, -1, "1", None):
        with pytest.raises(JustonceError):
            PartitionLease(capp.partitions, "set", 4, 0, token, "me", 30.0, now)  # type: ignore[arg-type]
        with pytest.raises(JustonceError):
            EffectClaim(capp.effects, "s", "k", "pending", 2**63 if token is None else token,  # type: ignore[arg-type]
                        None)
    assert dump(capp) == before


def test_positions_past_64_bits_and_forged_reservations_are_typed(capp: App) -> None:
    """complete() with a position of 2**63 or more was psycopg's NumericValueOutOfRange on
    Postgres (a 500 over HTTP); a Reservation built by hand went to SQL unchecked."""
    res = capp.lists.reserve("sealed", 1, ttr=3600)
    assert res is not None
    before = dump(capp)
    for positions in ([2**63], [2**64], [0, 2**63], [-1], [True], ["0"], [1.5], 5):
        for call in (capp.lists.complete, capp.lists.release, capp.lists.bury):
            with pytest.raises(JustonceError):
                call(res, positions=positions)  # type: ignore[arg-type]
    forged = [replace(res, list="a\x00b"), replace(res, list="q" * 10_000),
              replace(res, ranges=((2**63, 2**63 + 1),)), replace(res, ranges=((-1, 0),)),
              replace(res, ranges=((1, 0),)), replace(res, ranges=(("0", "1"),)),  # type: ignore[arg-type]
              replace(res, ranges=((0, 2**30),))]
    for bad in forged:
        with pytest.raises(JustonceError):
            capp.lists.items(bad)
    for bad in forged[:2]:
        for call in (capp.lists.complete, capp.lists.touch, capp.lists.release, capp.lists.bury):
            with pytest.raises(JustonceError):
                call(bad)
    assert dump(capp) == before


def test_a_refused_partition_scan_opens_no_batch(capp: App) -> None:
    """scan() opened its batch, then built the jobs: an unknown task, a bad option or
    bad kwargs left an empty open batch behind."""
    before = dump(capp)
    for task, options in (("no.such.task", {}), ("corpus.noop", {"queue": "a b"}),
                          ("corpus.noop", {"max_attempts": 0}), ("corpus.noop", {"kwargs": {"a": C.Opaque()}}),
                          ("corpus.noop", {"column": "a b"}), ("corpus.noop", {"key_type": "float"}),
                          ("corpus.noop", {"dialect": "oracle"}), ("corpus.noop", {"description": "\x00"}),
                          ("corpus.noop", {"on_complete": "no.such.task"}), ("corpus.noop", {"key": "k"})):
        with pytest.raises(JustonceError):
            capp.partitions.scan(task, **{"column": "id", "n": 3, **options})
    assert dump(capp) == before
