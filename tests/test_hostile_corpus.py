"""Bad input everywhere: the corpus of justonce.testing.corpus (hostile names, NUL bytes and
lone surrogates, deep and oversize JSON, forged ids and tokens, huge and negative numbers,
wrong types) against every public entry of the Python API that takes input (App and its
sub-APIs) and every command of the CLI, on every backend. Each call ends in a typed error
(a JustonceError whose message stays short; on the command line a one-line message and a
non-zero exit, no traceback), and a dump of every justonce table is the same before and
after. A public method or a command that the corpus does not cover fails the coverage
tests below until it is added (or listed, with the reason, as taking no input). The HTTP
API gets the same treatment in tests/test_web_hostile.py."""

from __future__ import annotations

import inspect
import logging
import signal
import sqlite3
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from justonce import (
    App,
    Audit,
    Batches,
    EffectClaim,
    Effects,
    Enqueue,
    JobFilter,
    JustonceError,
    Lists,
    PartitionLease,
    Partitions,
    StaleReservation,
    Tokens,
    Worker,
)
from justonce.cli import cli
from justonce.testing import corpus as C

Call = Callable[[Any], Any]
MAX_MESSAGE = 400
"""A refusal's message names what was wrong in a few lines at most (validate.shown cuts a
hostile value to ~80 characters)."""


def dump(app: App, skip: tuple[str, ...] = ()) -> list[tuple[str, list[str]]]:
    """Every row of every justonce table (but ``skip``), sorted: what a refused call must
    leave alone."""
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
            if name in ("justonce_maintenance", *skip):  # housekeeping's clock, not data
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
    """Something of every kind for a refused call to leave alone: a job, a list still
    loading, a sealed list with a live reservation (``app.res``), an open batch with a
    group (``app.batch``), a done effect, an API token (``app.token_id``), an audit entry
    and a held partition slot."""

    @app.task(name="corpus.noop")
    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    app.lists.create("loading", seal=False)
    app.lists.create("sealed", items=[1, 2, 3])
    app.res = app.lists.reserve("sealed", 1, ttr=3600)  # type: ignore[attr-defined]
    app.enqueue(noop, [1])
    app.effects.run("s", "present", lambda key: None)
    app.batch = app.batches.open("corpus")  # type: ignore[attr-defined]
    app.batches.add(app.batch.id, 2)  # type: ignore[attr-defined]
    app.token_id = app.tokens.create("corpus", "read")[0].id  # type: ignore[attr-defined]
    app.audit.record("corpus.setup")
    assert app.partitions.try_acquire("held", 1, lease=3600) is not None
    return app


def entries(app: App) -> dict[str, list[tuple[str, Call]]]:
    """Every public entry that takes input, by the kind of input: ``"<api>.<method>
    <parameter>"`` and a call that hands it the value. The API is ``app`` or one of its
    sub-APIs (``lists``, ``batches``…); the coverage test reads the names."""
    L, B, E, P, T, A = app.lists, app.batches, app.effects, app.partitions, app.tokens, app.audit
    res, bid = app.res, app.batch.id  # type: ignore[attr-defined]
    ok = Enqueue("corpus.noop")

    def fn(key: str) -> None:
        raise AssertionError("an effect ran for a refused call")

    def enqueue(name: str) -> Call:
        return lambda v: app.enqueue("corpus.noop", [], **{name: v})

    def use_database(a: App, url: Any) -> Any:
        a.use_database(url)
        return a.backend.schema_version()

    def in_tx(call: Callable[[Any, Any], Any]) -> Call:
        def run(v: Any) -> Any:
            with app.backend.transaction() as conn:
                return call(conn, v)
        return run

    return {
        "names": [
            ("app.enqueue task", lambda v: app.enqueue(v, [])),
            ("app.enqueue queue", enqueue("queue")),
            ("app.enqueue_calls task", lambda v: app.enqueue_calls(v, [[1]])),
            ("app.task name", lambda v: app.task(lambda: None, name=v)),
            ("app.task queue", lambda v: app.task(lambda: None, name="corpus.t1", queue=v)),
            ("app.list_jobs state", lambda v: app.list_jobs(state=v)),
            ("app.list_jobs queue", lambda v: app.list_jobs(queue=v)),
            ("app.list_jobs task", lambda v: app.list_jobs(task=v)),
            ("app.job_filter state", lambda v: app.job_filter(state=v)),
            ("app.job_filter queue", lambda v: app.job_filter(queue=v)),
            ("app.job_filter task", lambda v: app.job_filter(task=v)),
            ("app.count_matching action", lambda v: app.count_matching(v, JobFilter())),
            ("app.apply_matching action", lambda v: app.apply_matching(v, JobFilter(), expected=0)),
            ("app.pause_queue queue", lambda v: app.pause_queue(v)),
            ("app.resume_queue queue", lambda v: app.resume_queue(v)),
            ("partitions.try_acquire set_name", lambda v: P.try_acquire(v, 4)),
            ("partitions.acquire set_name", lambda v: P.acquire(v, 4, timeout=0)),
            ("partitions.list set_name", lambda v: P.list(v)),
            ("partitions.predicate column", lambda v: P.predicate(v, 4, 0)),
            ("partitions.predicate key_type", lambda v: P.predicate("id", 4, 0, key_type=v)),
            ("partitions.predicate dialect", lambda v: P.predicate("id", 4, 0, dialect=v)),
            ("partitions.scan task", lambda v: P.scan(v, column="id", n=2)),
            ("partitions.scan column", lambda v: P.scan("corpus.noop", column=v, n=2)),
            ("partitions.scan on_complete", lambda v: P.scan("corpus.noop", column="id", n=2, on_complete=v)),
            ("lists.create name", lambda v: L.create(v, items=[1])),
            ("lists.create task", lambda v: L.create("new", task=v)),
            ("lists.create on_complete", lambda v: L.create("new", on_complete=v)),
            ("lists.get name", lambda v: L.get(v)),
            ("lists.progress name", lambda v: L.progress(v)),
            ("lists.buried name", lambda v: L.buried(v)),
            ("lists.reserve name", lambda v: L.reserve(v)),
            ("lists.append name", lambda v: L.append(v, [1])),
            ("lists.seal name", lambda v: L.seal(v)),
            ("lists.drop name", lambda v: L.drop(v)),
            ("lists.kick name", lambda v: L.kick(v)),
            ("lists.run_next name", lambda v: L.run_next(v)),
            ("lists.drain name", lambda v: list(L.drain(v))),
            ("lists.complete name", lambda v: L.complete(v, res.token)),
            ("lists.touch name", lambda v: L.touch(v, res.token)),
            ("lists.release name", lambda v: L.release(v, res.token)),
            ("lists.bury name", lambda v: L.bury(v, res.token)),
            ("batches.open on_complete", lambda v: B.open(on_complete=v)),
            ("batches.open on_success", lambda v: B.open(on_success=v)),
            ("batches.list state", lambda v: B.list(v)),
            ("batches.enqueue_calls task", lambda v: B.enqueue_calls(bid, v, [[1]])),
            ("effects.run policy", lambda v: E.run("s", "n0", fn, policy=v)),
            ("effects.claim policy", lambda v: E.claim("s", "n0", policy=v)),
            ("effects.run_many policy", lambda v: E.run_many("s", ["n0"], fn, policy=v)),
            ("effects.list state", lambda v: E.list("s", v)),
            ("effects.lock_row table", in_tx(lambda c, v: E.lock_row(c, v, "id", 1))),
            ("effects.lock_row column", in_tx(lambda c, v: E.lock_row(c, "justonce_jobs", v, 1))),
            ("tokens.create scope", lambda v: T.create("corpus 2", v)),
        ],
        "keys": [
            ("effects.run key", lambda v: E.run("s", v, fn)),
            ("effects.run scope", lambda v: E.run(v, "k", fn)),
            ("effects.claim key", lambda v: E.claim("s", v)),
            ("effects.claim scope", lambda v: E.claim(v, "k")),
            ("effects.run_many keys", lambda v: E.run_many("s", ["ok", v], fn)),
            ("effects.run_many scope", lambda v: E.run_many(v, ["k"], fn)),
            ("effects.resolve key", lambda v: E.resolve("s", v, done=True)),
            ("effects.resolve scope", lambda v: E.resolve(v, "present", done=True)),
            ("effects.resolve_many keys", lambda v: E.resolve_many("s", [v], done=True)),
            ("effects.resolve_many scope", lambda v: E.resolve_many(v, ["present"], done=True)),
            ("effects.get key", lambda v: E.get("s", v)),
            ("effects.get scope", lambda v: E.get(v, "present")),
            ("effects.in_doubt scope", lambda v: E.in_doubt(v)),
            ("effects.list scope", lambda v: E.list(v)),
            ("effects.list after", lambda v: E.list("s", after=v)),
            ("effects.counts scope", lambda v: E.counts(v)),
            ("app.enqueue key", enqueue("key")),
            ("app.enqueue partition_key", enqueue("partition_key")),
            ("lists.reserve request_id", lambda v: L.reserve("sealed", request_id=v)),
            ("partitions.try_acquire owner", lambda v: P.try_acquire("set", 4, owner=v)),
            ("partitions.acquire owner", lambda v: P.acquire("set", 4, owner=v, timeout=0)),
            ("effects.claim owner", lambda v: E.claim("s", "n6", owner=v)),
        ],
        "ids": [
            ("app.get_job job_id", app.get_job), ("app.cancel job_id", app.cancel),
            ("app.retry job_id", app.retry), ("app.wait job_id", lambda v: app.wait(v, timeout=0)),
            ("app.list_jobs_page cursor", lambda v: app.list_jobs_page(cursor=v)),
            ("app.job_filter max_id", lambda v: app.job_filter(max_id=v)),
            ("batches.get batch_id", B.get), ("batches.seal batch_id", B.seal),
            ("batches.batch batch_id", B.batch), ("batches.failures batch_id", B.failures),
            ("batches.add batch_id", lambda v: B.add(v, 1)),
            ("batches.enqueue batch_id", lambda v: B.enqueue(v, [ok])),
            ("batches.enqueue_calls batch_id", lambda v: B.enqueue_calls(v, "corpus.noop", [[1]])),
            ("batches.ack item_ids", B.ack),
            ("tokens.get token_id", T.get), ("tokens.revoke token_id", T.revoke),
            ("tokens.active token_id", T.active), ("audit.list cursor", lambda v: A.list(v)),
            ("audit.record token_id", lambda v: A.record("corpus.x", token_id=v)),
        ],
        "item_ids": [
            ("batches.ack item_ids", B.ack),
            ("batches.ack item_ids (many)", lambda v: B.ack([f"{bid}:000000000000:0", v])),
            ("batches.fail item_ids", lambda v: B.fail(v, "no")),
        ],
        "tokens": [
            ("lists.complete token", lambda v: L.complete("sealed", v)),
            ("lists.touch token", lambda v: L.touch("sealed", v)),
            ("lists.release token", lambda v: L.release("sealed", v)),
            ("lists.bury token", lambda v: L.bury("sealed", v)),
            ("lists.items reservation", L.items),
            ("lists.complete reservation", lambda v: L.complete(replace(res, token=v))),
        ],
        "positions": [
            ("lists.complete positions", lambda v: L.complete(res, positions=v)),
            ("lists.release positions", lambda v: L.release(res, positions=v)),
            ("lists.bury positions", lambda v: L.bury(res, positions=v)),
        ],
        "numbers": [
            ("app.enqueue delay", enqueue("delay")), ("app.enqueue max_attempts", enqueue("max_attempts")),
            ("app.enqueue timeout", enqueue("timeout")), ("app.enqueue priority", enqueue("priority")),
            ("app.enqueue_calls delay", lambda v: app.enqueue_calls("corpus.noop", [[1]], delay=v)),
            ("app.task priority", lambda v: app.task(lambda: None, name="corpus.t2", priority=v)),
            ("app.task max_attempts", lambda v: app.task(lambda: None, name="corpus.t3", max_attempts=v)),
            ("app.task timeout", lambda v: app.task(lambda: None, name="corpus.t4", timeout=v)),
            ("app.list_jobs limit", lambda v: app.list_jobs(limit=v)),
            ("app.list_jobs_page limit", lambda v: app.list_jobs_page(limit=v)),
            ("app.queue_stats exact_below", app.queue_stats),
            ("app.wait timeout", lambda v: app.wait(1, timeout=v)),
            ("app.wait poll", lambda v: app.wait(1, timeout=0, poll=v)),
            ("app.apply_matching expected", lambda v: app.apply_matching("cancel", JobFilter(), expected=v)),
            ("app.apply_matching tolerance",
             lambda v: app.apply_matching("cancel", JobFilter(), expected=0, tolerance=v)),
            ("app.apply_matching chunk",
             lambda v: app.apply_matching("cancel", JobFilter(), expected=0, chunk=v)),
            ("effects.run lease", lambda v: E.run("s", "n1", fn, lease=v)),
            ("effects.run lock_timeout", lambda v: E.run("s", "n2", fn, lock_timeout=v)),
            ("effects.claim lease", lambda v: E.claim("s", "n1", lease=v)),
            ("effects.claim lock_timeout", lambda v: E.claim("s", "n2", lock_timeout=v)),
            ("effects.run_many chunk", lambda v: E.run_many("s", ["n3"], fn, chunk=v)),
            ("effects.run_many lease", lambda v: E.run_many("s", ["n3"], fn, lease=v)),
            ("effects.run_many lock_timeout", lambda v: E.run_many("s", ["n3"], fn, lock_timeout=v)),
            ("effects.in_doubt limit", lambda v: E.in_doubt(None, v)),
            ("effects.list limit", lambda v: E.list("s", limit=v)),
            ("effects.lock_row timeout",
             in_tx(lambda c, v: E.lock_row(c, "justonce_jobs", "id", 1, timeout=v))),
            ("lists.reserve k", lambda v: L.reserve("sealed", k=v)),
            ("lists.reserve ttr", lambda v: L.reserve("sealed", ttr=v)),
            ("lists.create ttr", lambda v: L.create("new", ttr=v)),
            ("lists.create max_attempts", lambda v: L.create("new", max_attempts=v)),
            ("lists.touch ttr", lambda v: L.touch(res, ttr=v)),
            ("lists.release delay", lambda v: L.release(res, delay=v)),
            ("lists.kick limit", lambda v: L.kick("sealed", v)),
            ("lists.list limit", lambda v: L.list(v)),
            ("lists.buried limit", lambda v: L.buried("sealed", v)),
            ("lists.prune retention", lambda v: L.prune(v)),
            ("lists.run_next ttr", lambda v: L.run_next("sealed", ttr=v)),
            ("lists.drain poll", lambda v: list(L.drain("sealed", poll=v))),
            ("partitions.try_acquire n", lambda v: P.try_acquire("set", v)),
            ("partitions.try_acquire lease", lambda v: P.try_acquire("set", 4, lease=v)),
            ("partitions.acquire n", lambda v: P.acquire("set", v, timeout=0)),
            ("partitions.acquire lease", lambda v: P.acquire("set", 4, lease=v, timeout=0)),
            ("partitions.acquire timeout", lambda v: P.acquire("held", 1, timeout=v)),
            ("partitions.acquire poll", lambda v: P.acquire("held", 1, timeout=0, poll=v)),
            ("partitions.predicate n", lambda v: P.predicate("id", v, 0)),
            ("partitions.predicate slot", lambda v: P.predicate("id", 4, v)),
            ("partitions.scan n", lambda v: P.scan("corpus.noop", column="id", n=v)),
            ("batches.open expire_after", lambda v: B.open(expire_after=v)),
            ("batches.add count", lambda v: B.add(bid, v)),
            ("batches.list limit", lambda v: B.list(limit=v)),
            ("batches.failures limit", lambda v: B.failures(bid, v)),
            ("batches.prune retention", lambda v: B.prune(v)),
            ("audit.list limit", lambda v: A.list(limit=v)),
            ("audit.record count", lambda v: A.record("corpus.x", count=v)),
            ("Worker concurrency", lambda v: Worker(app, concurrency=v)),
            ("Worker lease", lambda v: Worker(app, lease=v)),
        ],
        "json": [
            ("app.enqueue args", lambda v: app.enqueue("corpus.noop", [v])),
            ("app.enqueue kwargs", lambda v: app.enqueue("corpus.noop", [], {"a": v})),
            ("app.enqueue_calls calls", lambda v: app.enqueue_calls("corpus.noop", [[1], [v]])),
            ("app.enqueue_calls keyed", lambda v: app.enqueue_calls("corpus.noop", [[v]], key="k")),
            ("app.enqueue_many requests", lambda v: app.enqueue_many([ok, Enqueue("corpus.noop", [v])])),
            ("app.build req", lambda v: app.build(Enqueue("corpus.noop", kwargs={"a": v}))),
            ("batches.enqueue_calls calls", lambda v: B.enqueue_calls(bid, "corpus.noop", [[v]])),
            ("batches.open on_complete", lambda v: B.open(on_complete=Enqueue("corpus.noop", [v]))),
            ("lists.create items", lambda v: L.create("new", items=[1, v])),
            ("lists.append items", lambda v: L.append("loading", [1, v])),
            ("partitions.scan kwargs", lambda v: P.scan("corpus.noop", column="id", n=2, kwargs={"a": v})),
            ("audit.record detail", lambda v: A.record("corpus.x", detail={"a": v})),
        ],
        "texts": [
            ("batches.open description", lambda v: B.open(v)),
            ("batches.fail reason", lambda v: B.fail(f"{bid}:000000000000:0", v)),
            ("lists.bury reason", lambda v: L.bury(res, reason=v)),
            ("lists.reserve request_id", lambda v: L.reserve("sealed", request_id=v)),
            ("effects.resolve note", lambda v: E.resolve("s", "present", done=True, note=v)),
            ("app.pause_queue note", lambda v: app.pause_queue("corpus-q", note=v)),
            ("app.pause_queue actor", lambda v: app.pause_queue("corpus-q", actor=v)),
            ("effects.resolve_many note", lambda v: E.resolve_many("s", ["present"], done=True, note=v)),
            ("partitions.scan description", lambda v: P.scan("corpus.noop", column="id", n=2, description=v)),
            ("tokens.create name", lambda v: T.create(v, "read")),
            ("tokens.verify secret", T.verify),
            ("audit.record action", lambda v: A.record(v)),
            ("audit.record actor", lambda v: A.record("corpus.x", actor=v)),
            ("audit.record target", lambda v: A.record("corpus.x", target=v)),
        ],
        "flags": [
            ("App strict", lambda v: App(app.database_url, strict=v)),
            ("Worker listen", lambda v: Worker(app, listen=v)),
            ("Worker housekeeping", lambda v: Worker(app, housekeeping=v)),
            ("lists.create seal", lambda v: L.create("new", seal=v)),
            ("effects.resolve done", lambda v: E.resolve("s", "present", done=v)),
            ("effects.resolve force", lambda v: E.resolve("s", "present", done=True, force=v)),
            ("effects.resolve_many done", lambda v: E.resolve_many("s", ["present"], done=v)),
            ("effects.resolve_many force", lambda v: E.resolve_many("s", ["present"], done=True, force=v)),
        ],
        "times": [
            ("app.enqueue run_at", enqueue("run_at")),
            ("app.job_filter created_after", lambda v: app.job_filter(created_after=v)),
            ("app.job_filter created_before", lambda v: app.job_filter(created_before=v)),
        ],
        "urls": [
            # App(url) and use_database open nothing: a URL is refused on first use.
            ("App database_url", lambda v: App(v).backend.schema_version()),
            ("app.use_database url", lambda v: use_database(App(app.database_url), v)),
        ],
        "iterables": [
            ("app.enqueue args", lambda v: app.enqueue("corpus.noop", v)),
            ("app.enqueue kwargs", lambda v: app.enqueue("corpus.noop", [], v)),
            ("app.enqueue_calls calls", lambda v: app.enqueue_calls("corpus.noop", v)),
            ("app.enqueue_many requests", app.enqueue_many),
            ("app.build_many requests", app.build_many),
            ("batches.enqueue requests", lambda v: B.enqueue(bid, v)),
            ("batches.enqueue_calls calls", lambda v: B.enqueue_calls(bid, "corpus.noop", v)),
            ("batches.ack item_ids", B.ack),
            ("batches.fail item_ids", lambda v: B.fail(v, "no")),
            ("effects.run_many keys", lambda v: E.run_many("s", v, fn)),
            ("effects.resolve_many keys", lambda v: E.resolve_many("s", v, done=True)),
            ("lists.create items", lambda v: L.create("new", items=v)),
            ("lists.append items", lambda v: L.append("loading", v)),
            ("lists.complete positions", lambda v: L.complete(res, positions=v)),
            ("partitions.scan kwargs", lambda v: P.scan("corpus.noop", column="id", n=2, kwargs=v)),
        ],
        "callables": [
            ("app.task fn", lambda v: app.task(v)),
            ("app.task backoff", lambda v: app.task(lambda: None, name="corpus.t5", backoff=v)),
            ("effects.run fn", lambda v: E.run("s", "n4", v)),
            ("effects.run_many fn", lambda v: E.run_many("s", ["n4"], v)),
            ("lists.drain stop", lambda v: list(L.drain("sealed", stop=v))),
        ],
        "conns": [
            ("app.enqueue conn", enqueue("conn")),
            ("app.enqueue_many conn", lambda v: app.enqueue_many([ok], conn=v)),
            ("app.enqueue_calls conn", lambda v: app.enqueue_calls("corpus.noop", [[1]], conn=v)),
            ("batches.open conn", lambda v: B.open(conn=v)),
            ("batches.add conn", lambda v: B.add(bid, 1, conn=v)),
            ("batches.enqueue conn", lambda v: B.enqueue(bid, [ok], conn=v)),
            ("batches.enqueue_calls conn", lambda v: B.enqueue_calls(bid, "corpus.noop", [[1]], conn=v)),
            ("batches.seal conn", lambda v: B.seal(bid, conn=v)),
            ("batches.ack conn", lambda v: B.ack(f"{bid}:000000000000:0", conn=v)),
            ("batches.fail conn", lambda v: B.fail(f"{bid}:000000000000:0", "no", conn=v)),
            ("effects.run conn", lambda v: E.run("s", "n5", fn, conn=v)),
            ("effects.claim conn", lambda v: E.claim("s", "n5", conn=v)),
            ("effects.run_many conn", lambda v: E.run_many("s", ["n5"], fn, conn=v)),
            ("effects.lock_row conn", lambda v: E.lock_row(v, "justonce_jobs", "id", 1)),
            ("partitions.scan conn", lambda v: P.scan("corpus.noop", column="id", n=2, conn=v)),
            ("audit.record conn", lambda v: A.record("corpus.x", conn=v)),
        ],
        "requests": [
            ("app.build req", app.build),
            ("app.build_many requests", lambda v: app.build_many([ok, v])),
            ("app.enqueue_many requests", lambda v: app.enqueue_many([ok, v])),
            ("batches.enqueue requests", lambda v: B.enqueue(bid, [ok, v])),
        ],
    }


KINDS: dict[str, list[tuple[str, Any]]] = {
    "names": C.NAMES, "keys": C.KEYS, "ids": C.IDS, "numbers": C.NUMBERS, "json": C.JSON_VALUES,
    "item_ids": C.ITEM_IDS, "tokens": C.TOKENS, "positions": C.POSITIONS, "texts": C.TEXTS,
    "flags": C.FLAGS, "times": C.TIMES, "urls": C.URLS, "iterables": C.ITERABLES,
    "callables": C.CALLABLES, "conns": C.CONNS, "requests": C.REQUESTS,
}
VALID_HERE = {
    # None means "the default" for these options, not a hostile value.
    ("app.enqueue queue", "none"), ("partitions.list set_name", "none"), ("app.enqueue key", "none"),
    ("app.enqueue partition_key", "none"), ("app.list_jobs state", "none"),
    ("app.list_jobs queue", "none"), ("app.list_jobs task", "none"), ("app.job_filter state", "none"),
    ("app.job_filter queue", "none"), ("app.job_filter task", "none"), ("app.task name", "none"),
    ("lists.create task", "none"), ("lists.create on_complete", "none"),
    ("batches.open on_complete", "none"), ("batches.open on_success", "none"),
    ("batches.list state", "none"), ("effects.list state", "none"), ("effects.list after", "none"),
    ("effects.in_doubt scope", "none"),
    ("partitions.scan on_complete", "none"), ("partitions.predicate dialect", "none"),
    ("lists.reserve request_id", "none"), ("partitions.try_acquire owner", "none"),
    ("partitions.acquire owner", "none"), ("effects.claim owner", "none"),
    ("app.list_jobs_page cursor", "none"), ("app.job_filter max_id", "none"), ("audit.list cursor", "none"),
    ("audit.record token_id", "none"),
    ("app.enqueue args", "none"), ("app.enqueue kwargs", "none"), ("lists.create items", "none"),
    ("lists.complete positions", "none"), ("partitions.scan kwargs", "none"),
    ("app.task backoff", "none"), ("lists.drain stop", "none"),
    # An integer is a key (the ledger keeps it as text); a negative priority runs sooner.
    ("app.enqueue priority", "negative"),
    ("app.task priority", "negative"),
    # app.task(None) is @app.task(...) without a function: it returns the decorator.
    ("app.task fn", "none"),
    # The audit trail writes what JSON does not know as its str().
    ("audit.record detail", "set"), ("audit.record detail", "bytes"), ("audit.record detail", "object"),
}
ANSWERS_NONE = {"tokens.verify secret"}
"""Entries that answer None, not an error, for what they refuse (verify: a malformed or
unknown secret is simply not a token; the service answers 401)."""


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
                message = str(exc).strip()
                if not message or len(message) > MAX_MESSAGE:
                    wrong.append(f"{entry} <- {label}: a message of {len(message)} characters: {message:.120}")
                continue
            except Exception as exc:  # noqa: BLE001 - collected: the point of the test
                wrong.append(f"{entry} <- {label}: untyped {type(exc).__name__}: {exc!s:.120}")
                continue
            if got is None and entry in ANSWERS_NONE:
                continue
            wrong.append(f"{entry} <- {label}: accepted ({got!r:.80})")
    assert not wrong, f"{len(wrong)} wrong:\n" + "\n".join(wrong)
    assert dump(capp) == before


def test_forged_ids_are_a_typed_not_found(capp: App) -> None:
    before = dump(capp)
    by_name = dict(entries(capp)["ids"])
    for _, value in C.FORGED_IDS:
        for name in ("app.get_job job_id", "app.cancel job_id", "app.retry job_id", "batches.get batch_id",
                     "batches.seal batch_id", "batches.add batch_id", "batches.failures batch_id",
                     "tokens.get token_id", "tokens.revoke token_id"):
            with pytest.raises(JustonceError, match=r"(?i)no |not found|unknown"):
                by_name[name](value)
        assert capp.tokens.active(value) is None
    for token in ("1.0123456789abcdef", f"{2**62}.0123456789abcdef"):
        with pytest.raises(JustonceError):
            capp.lists.complete("sealed", token)
    assert dump(capp) == before


# -- coverage: every public entry that takes input is in the corpus -------------------------
APIS: dict[str, type] = {"app": App, "batches": Batches, "effects": Effects, "lists": Lists,
                         "partitions": Partitions, "tokens": Tokens, "audit": Audit}
"""Each API by the name the entries use: App and its sub-APIs (app.batches, …)."""
NO_INPUT = {
    # Nothing to refuse: these take no argument (other than self).
    "app.migrate", "app.close", "app.queue_counts", "app.metrics_snapshot", "tokens.list",
    "app.paused_queues",
}
"""Public methods that take no input, so the corpus has nothing to throw at them.
(``app.backend`` is a property: the storage layer itself, below every check.)"""


def public_methods() -> set[str]:
    found = set()
    for api, cls in APIS.items():
        for name, member in inspect.getmembers(cls):
            if not name.startswith("_") and inspect.isfunction(member):
                found.add(f"{api}.{name}")
    return found


def test_every_public_method_that_takes_input_is_in_the_corpus(capp: App) -> None:
    covered = {entry.split()[0] for es in entries(capp).values() for entry, _ in es}
    public = public_methods()
    missing = public - covered - NO_INPUT
    assert not missing, f"public methods the hostile corpus does not cover: {sorted(missing)}"
    assert not NO_INPUT - public, f"stale exclusions: {sorted(NO_INPUT - public)}"
    for name in NO_INPUT:  # they really take nothing
        api, method = name.split(".")
        assert list(inspect.signature(getattr(APIS[api], method)).parameters) == ["self"], name
    assert covered & public == public - NO_INPUT


# -- the command line ------------------------------------------------------------------------
CORPUS_APP = "hostile_corpus_app:app"
"""The module the cases name with --app: the test's own App (see cli_app)."""
Q = "q" * 10_000


def cli_cases(files: dict[str, str]) -> list[list[str]]:
    """Command lines that must be refused: every command that takes input, with hostile
    arguments, options and files. The test adds ``--database-url`` unless a case has its
    own."""
    good, bad, deep, blank = files["good"], files["bad"], files["deep"], files["blank"]
    app = ["--app", CORPUS_APP]
    return [
        ["enqueue", "corpus.noop", "--queue", "a b"],
        ["enqueue", "corpus.noop", "--queue", "x'; DROP TABLE t;--"],
        ["enqueue", "corpus.noop", "--queue", Q],
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
        # Numbers as int() and float() read them, not as they are written.
        ["enqueue", "corpus.noop", "--priority", "1_0"], ["enqueue", "corpus.noop", "--priority", " 7"],
        ["enqueue", "corpus.noop", "--priority", "\u0663"], ["enqueue", "corpus.noop", "--max-attempts", "1_0"],
        ["enqueue", "corpus.noop", "--delay", "inf"], ["enqueue", "corpus.noop", "--delay", "1_0"],
        ["enqueue", "corpus.noop", "--timeout", " 1.5"], ["jobs", "list", "--limit", "\uff15"],
        ["worker", *app, "--concurrency", "1_0"], ["worker", *app, "--poll", "nan"],
        ["lists", "create", "new", "--from", good, "--ttr", "1e999"],
        ["lists", "run", "sealed", "--parallelism", "\u0662"], ["serve", "--port", "8_080"],
        ["status", "--database-url", "sqlite:///db_%FF.db"], ["status", "--database-url", "sqlite:///50%.db"],
        ["status", "--database-url", "postgresql://h/db?pool_size=1_0"],
        ["enqueue", "corpus.noop", "--max-attempts", "0"],
        ["enqueue", "corpus.noop", "--timeout", "inf"],
        ["enqueue", "corpus.noop", "--key", "a\x00b"],
        ["enqueue", "corpus.noop", "--key", "a\udcffb"],  # an argv byte that is not UTF-8
        ["enqueue", "", "--args", "[]"],
        ["enqueue", "no.such.task", *app],
        ["enqueue", "corpus.noop", "--app", "no.such.module:app"],
        ["enqueue", "corpus.noop", "--app", "justonce"],
        ["enqueue", "corpus.noop", "--app", "justonce:__version__"],
        ["jobs", "show", "0"], ["jobs", "show", "-1"], ["jobs", "show", str(2**64)],
        ["jobs", "show", "987654321"], ["jobs", "cancel", "987654321"], ["jobs", "retry", "abc"],
        ["jobs", "cancel", str(2**63)], ["jobs", "retry", "987654321"],
        ["jobs", "list", "--queue", "a\x00b"], ["jobs", "list", "--queue", Q],
        ["jobs", "list", "--task", "a\udcffb"], ["jobs", "list", "--state", "zz"],
        ["jobs", "list", "--limit", "0"],
        ["batches", "show", "0"], ["batches", "seal", str(2**63)], ["batches", "show", "1.5"],
        ["batches", "show", "987654321"], ["batches", "show", "1", "--failures", "-1"],
        ["batches", "seal", "987654321"], ["batches", "list", "--state", "zz"],
        ["batches", "list", "--limit", str(2**70)], ["batches", "prune", "--retention", "-1"],
        ["batches", "prune", "--retention", "nan"],
        ["partitions", "list", "--set", "a b"], ["partitions", "list", "--set", Q],
        ["partitions", "list", "--set", "no-such-set"],
        ["effects", "resolve", "s", "a\x00b", "--done"], ["effects", "resolve", "s", "k"],
        ["effects", "resolve", "a\x00b", "k", "--redo"],
        ["effects", "resolve", "s", "k", "--done", "--note", "\x00"],
        ["effects", "resolve", "s", "k1", "k\x00", "--done"],
        ["effects", "resolve", "s", "no-such-key", "--done"],
        ["effects", "in-doubt", "--scope", "a\x00b"], ["effects", "in-doubt", "--limit", "0"],
        ["lists", "show", "../etc"], ["lists", "show", Q], ["lists", "show", "sealed", "--buried", "-1"],
        ["lists", "seal", "a\x00b"], ["lists", "drop", "no-such-list", "--yes"],
        ["lists", "drop", "a b", "--yes"],
        ["lists", "list", "--limit", "0"],
        ["lists", "create", "a b", "--from", good], ["lists", "create", "sealed", "--from", good],
        ["lists", "create", "new", "--from", bad], ["lists", "create", "new", "--from", deep],
        ["lists", "create", "new", "--from", "/no/such/file.jsonl"],
        ["lists", "create", "new", "--from", good, "--task", "a b"],
        ["lists", "create", "new", "--from", good, "--task", "no.such.task", *app],
        ["lists", "create", "new", "--from", good, "--on-complete", "a b"],
        ["lists", "create", "new", "--from", good, "--ttr", "0"],
        ["lists", "create", "new", "--from", good, "--max-attempts", "0"],
        ["lists", "append", "sealed", "--from", good], ["lists", "append", "loading", "--from", bad],
        ["lists", "append", "a\x00b", "--from", good], ["lists", "append", "no-such-list", "--from", blank],
        ["lists", "kick", "a b"], ["lists", "kick", "sealed", "--limit", "0"],
        ["lists", "kick", "no-such-list"],
        ["lists", "run", "a b"], ["lists", "run", "sealed", "--parallelism", "0"], ["lists", "run", "sealed"],
        ["lists", "run", "loading", *app], ["lists", "run", "no-such-list"],
        ["lists", "drain", "a b", *app], ["lists", "drain", "sealed", "--app", "no.such.module:app"],
        ["lists", "drain", "sealed", *app],  # it has no task
        ["tokens", "create", "--name", "a\x00b", "--scope", "read"],
        ["tokens", "create", "--name", Q, "--scope", "admin"],
        ["tokens", "create", "--name", "x", "--scope", "root"],
        ["tokens", "revoke", "0"], ["tokens", "revoke", str(2**63)], ["tokens", "revoke", "987654321"],
        ["worker", "--app", "no.such.module:app"], ["worker", "--app", "x"],
        ["worker", *app, "--queues", "a b"], ["worker", *app, "--queues", Q],
        ["worker", *app, "--partitions", "a b:4"], ["worker", *app, "--partitions", "set:0"],
        ["worker", *app, "--partitions", "set:x"], ["worker", *app, "--concurrency", "0"],
        ["worker", *app, "--lease", "nan"], ["worker", *app, "--metrics-port", "0"],
        ["worker", *app, "--metrics-host", "a..b", "--metrics-port", "9"],
        ["serve", "--app", "no.such.module:app"], ["serve", "--port", "-1"], ["serve", "--max-body-bytes", "1"],
        ["serve", "--host", "a..b"], ["serve", "--host", "x" * 64],
        ["serve", "--workers", "0"], ["serve", "--log-level", "loud"],
        ["demo", "jobs", "--jobs", "0"], ["demo", "jobs", "--workers", "1000"],
        ["demo", "push", "--users", "1"], ["demo", "push", "--smtp", "nohost"],
        ["demo", "push", "--smtp", "h:99999"], ["demo", "push", "--smtp", "h:25", "--redo"],
        ["demo", "push", "--smtp", "mail..example.com:25"],
        # A database URL is input too: these commands take no other.
        ["migrate", "--database-url", "nonsense"], ["migrate", "--database-url", "sqlite:////no/such/dir/x.db"],
        ["status", "--database-url", "oracle://x/y"], ["status", "--database-url", "sqlite:///" + "a" * 10_000],
        ["tokens", "list", "--database-url", "mysql://x/y/z"],
        ["queues", "list", "--database-url", "mysql://x/y/z"], ["queues", "pause", "a b"],
        ["queues", "pause", Q], ["queues", "pause", "a\x00b"], ["queues", "pause", ""],
        ["queues", "pause", "q", "--note", "a\x00b"], ["queues", "pause", "q", "--note", "n" * 5000],
        ["queues", "pause", "q", "--note", "a\udcffb"], ["queues", "resume", "a\udcffb"],
        ["queues", "resume", "-q"], ["queues", "resume", "q" * 64],
        ["tokens", "list", "--database-url", "postgresql://h:notaport/db"],
        ["status", "--database-url", "postgresql://h/db_%FF"],
        ["status", "--database-url", "mysql://u:pw%FF@h/db"],
        ["migrate", "--database-url", "postgresql://h/db?schema=pg_x"],
    ]


def commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command of the CLI, hidden ones included, as its words."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name)


def command_of(args: list[str]) -> tuple[str, ...]:
    group: click.Command = cli
    words: list[str] = []
    for word in args:
        if not isinstance(group, click.Group) or word not in group.commands:
            break
        words.append(word)
        group = group.commands[word]
    return tuple(words)


@pytest.fixture
def cli_files(tmp_path: Path) -> dict[str, str]:
    files = {"good": b"1\n2\n", "bad": b'{"oops": \n1\n', "deep": b"[" * 10_000 + b"]" * 10_000 + b"\n",
             "blank": b"\n"}
    for name, body in files.items():
        (tmp_path / f"{name}.jsonl").write_bytes(body)
    return {name: str(tmp_path / f"{name}.jsonl") for name in files}


@pytest.fixture
def cli_app(capp: App, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    """The test's App as ``hostile_corpus_app:app``; a command that gets past its checks
    to where it would start a worker, a server, a demo or child processes fails instead
    (it is then counted as accepted); logging and signal handlers set by a command are
    put back."""
    module = types.ModuleType("hostile_corpus_app")
    module.app = capp  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hostile_corpus_app", module)

    def started(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the command was accepted and started")

    import uvicorn

    import justonce.cli_lists
    import justonce.demo.jobs
    import justonce.demo.push
    import justonce.worker

    monkeypatch.setattr(justonce.worker.Worker, "run", started)
    monkeypatch.setattr(uvicorn, "run", started)
    monkeypatch.setattr(justonce.demo.jobs, "run_demo", started)
    monkeypatch.setattr(justonce.demo.push, "run_push_demo", started)
    monkeypatch.setattr(justonce.cli_lists.subprocess, "Popen", started)
    loggers = {name: (list(lg.handlers), lg.level, lg.propagate)
               for name in ("justonce", "psycopg") for lg in [logging.getLogger(name)]}
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield capp
    for s, handler in handlers.items():
        signal.signal(s, handler)
    for name, (hs, level, propagate) in loggers.items():
        lg = logging.getLogger(name)
        lg.handlers[:], lg.level, lg.propagate = hs, level, propagate


def test_the_command_line_refuses_with_one_line_and_changes_nothing(
        cli_app: App, cli_files: dict[str, str]) -> None:
    before = dump(cli_app)
    wrong = []
    for args in cli_cases(cli_files):
        url = [] if "--database-url" in args else ["--database-url", cli_app.database_url]
        result = CliRunner().invoke(cli, [*args, *url])
        lines = result.output.strip().splitlines()
        shown = [a[:20] for a in args[:5]]
        if result.exit_code == 0:
            wrong.append(f"{shown}: accepted: {result.output[:200]}")
        elif "Traceback" in result.output or not (
                result.exception is None or isinstance(result.exception, SystemExit)):
            wrong.append(f"{shown}: {result.exception!r:.200}")
        elif not (lines and lines[-1].strip()):
            wrong.append(f"{shown}: no message")  # it must say what was wrong
        elif len(lines[-1]) > MAX_MESSAGE + 200:
            wrong.append(f"{shown}: a message of {len(lines[-1])} characters: {lines[-1][:120]}")
    assert not wrong, f"{len(wrong)} wrong:\n" + "\n".join(wrong)
    assert dump(cli_app) == before


CLI_NO_INPUT: dict[tuple[str, ...], str] = {}
"""Commands the cases above leave out, with the reason (none: every command takes input,
if only a database URL)."""


def test_every_command_is_in_the_corpus(cli_files: dict[str, str]) -> None:
    covered = {command_of(args) for args in cli_cases(cli_files)}
    every = set(commands())
    missing = every - covered - set(CLI_NO_INPUT)
    assert not missing, f"commands the hostile corpus does not cover: {sorted(missing)}"
    assert not covered - every, f"cases of no command: {sorted(covered - every)}"
    assert len(every) >= 29


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


def test_a_leases_checked_fields_cannot_be_changed(capp: App) -> None:
    """A lease's fields are checked once and go to SQL at every renewal, release and fence:
    changed by hand, a token of 2**63 was a bare OverflowError and a negative lease an
    expiry in the past. They are read-only."""
    lease = capp.partitions.acquire("corpus-set", 2, lease=30, timeout=0)
    for field, value in (("token", 2**63), ("lease", -5.0), ("slot", 7), ("set_name", "a b"),
                         ("n", 0), ("owner", "x")):
        with pytest.raises(AttributeError):
            setattr(lease, field, value)
    assert lease.renew() > datetime.now(UTC)
    lease.release()


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
