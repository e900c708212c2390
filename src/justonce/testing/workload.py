"""The torture run's work: the tasks its worker processes run, each writing what it does to
the run's history (``$JUSTONCE_HISTORY``), and a subscriber that writes what the worker
itself saw (claims with their tokens, accepted and rejected writes, slots won and lost).

Workers start as users start them::

    JUSTONCE_HISTORY=run.jsonl python -m justonce worker \\
        --app justonce.testing.workload:app --database-url URL --partitions torture:4

The history is the evidence :mod:`justonce.testing.check` reads; nothing here checks
anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from .. import App, Backoff, LeaseLost, StaleReservation, current_job
from ..demo import connect, dialect
from ..events import Event, subscribe
from .history import Recorder, from_env

app = App()
SCOPE = "torture"
PARTITION_SET = "torture"
FENCE_SET, FENCE_SLOTS, FENCE_LEASE = "torture-fence", 2, 1.0
"""The slots that ``fenced`` jobs take for themselves (not the workers' partition set)."""
FENCE_TABLE = "torture_fenced"

_history: Recorder | None = from_env()


def _record(ev: str, **fields: Any) -> None:
    if _history is not None:
        _history.record(ev, **fields)


def _started(n: int) -> None:
    job = current_job()
    assert job is not None, "a workload task runs as a job"
    _record("start", job=job.id, token=job.lease_token, attempt=job.attempts, n=n)


def _ended() -> None:
    job = current_job()
    assert job is not None
    _record("end", job=job.id, token=job.lease_token)


def _effect(n: int) -> None:
    """The side effect of ``n``, at most once, through the ledger: the ``effect`` line is
    the effect itself (a mail sent, say); what the ledger says about it is not evidence."""
    def send(idempotency_key: str) -> None:
        _record("effect", scope=SCOPE, key=str(n))

    app.effects.run(SCOPE, str(n), send, lease=30.0, lock_timeout=10.0)


@app.task(queue="torture", max_attempts=5, backoff=Backoff(base=0.05, cap=0.5, jitter=0))
def step(n: int, seconds: float = 0.005, effect: bool = False) -> int:
    """One unit of work: start, an effect through the ledger (when asked), a short wait."""
    _started(n)
    if effect:
        _effect(n)
    time.sleep(seconds)
    _ended()
    return n


@app.task(queue="torture", max_attempts=5, backoff=Backoff(base=0.05, cap=0.5, jitter=0))
def flaky(n: int) -> int:
    """Fails its first attempt (a retry goes through the failure path), then succeeds."""
    _started(n)
    job = current_job()
    assert job is not None
    if job.attempts == 1:
        raise RuntimeError("the first attempt fails on purpose")
    _ended()
    return n


@app.task(queue="torture", max_attempts=3, backoff=Backoff(base=0.05, cap=0.2, jitter=0))
def poison(n: int) -> None:
    """Kills its own process, every attempt (a poison job): it must end dead, within its
    attempts, without taking the rest of the queue with it."""
    _started(n)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(queue="torture", max_attempts=5, backoff=Backoff(base=0.05, cap=0.5, jitter=0))
def list_part(name: str, k: int = 3) -> int:
    """Reserve up to ``k`` positions of list ``name``, work on them, complete them: the
    history has each position's reservation (with its token) and whether its completion
    was accepted (newly done) or refused (the reservation timed out meanwhile)."""
    _started(0)
    res = app.lists.reserve(name, k)  # for the list's time to run (torture.LIST_TTR)
    if res is None:  # all done or all held by others
        _ended()
        return 0
    positions = res.positions
    for p in positions:
        _record("list_reserve", list=name, item=p, token=res.token)
    time.sleep(0.03 * len(positions))  # long enough to be stopped or killed in the middle
    try:
        out = app.lists.complete(res)
    except StaleReservation:
        for p in positions:
            _record("list_complete", list=name, item=p, token=res.token, accepted=False)
    else:
        already = set(out.already)
        for p in positions:
            _record("list_complete", list=name, item=p, token=res.token,
                    accepted=p not in already)
    _ended()
    return len(positions)


_db = threading.local()


def _fence_db() -> Any:
    """This thread's own connection to the run's database, for fenced writes (a caller's
    connection, as a user's code would have)."""
    db = getattr(_db, "conn", None)
    if db is None:
        url = app.database_url
        if url.split(":", 1)[0].startswith("postgres"):
            # Behind PgBouncer (transaction mode) no startup options and no prepared
            # statements: the schema is set in each transaction (_fenced_write).
            import psycopg

            from ..backends.postgres.backend import parse_postgres_url

            conninfo, _db.schema, _ = parse_postgres_url(url)
            db = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
        else:
            db = connect(url)
        if dialect(db) == "mysql":
            db.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            # The README's advice for a connection that fences: a holder frozen inside its
            # fenced transaction keeps the slot at most this long (MariaDB only).
            with contextlib.suppress(Exception):
                db.execute("SET SESSION idle_transaction_timeout = 2")
        _db.conn = db
    return db


def _fenced_write(db: Any, lease: Any, n: int) -> float:
    """One write under ``lease``'s fence, in one transaction; the database's time read just
    before the fence (LeaseLost if the fence refuses)."""
    insert = f"INSERT INTO {FENCE_TABLE} (slot, token, n) VALUES (%s, %s, %s)"
    kind = dialect(db)
    if kind == "sqlite":
        db.execute("BEGIN IMMEDIATE")
        try:
            at = time.time()  # SQLite's NOW() is each process's own clock (one machine)
            lease.fence(db)
            db.execute(insert.replace("%s", "?"), (lease.slot, lease.token, n))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return at
    if kind == "postgres":
        with db.transaction():
            if getattr(_db, "schema", None):
                db.execute("SELECT set_config('search_path', %s, true)", (_db.schema,))
            at = float(db.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
            lease.fence(db)
            db.execute(insert, (lease.slot, lease.token, n))
        return at
    conn = db.conn  # PyMySQL's own connection: what fence() takes
    conn.begin()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT UNIX_TIMESTAMP(NOW(6))")
            at = float(cur.fetchone()[0])
            lease.fence(conn)
            cur.execute(insert, (lease.slot, lease.token, n))
    except BaseException:
        with contextlib.suppress(Exception):
            conn.rollback()
        raise
    conn.commit()
    return at


@app.task(queue="torture", max_attempts=5, backoff=Backoff(base=0.05, cap=0.5, jitter=0))
def fenced(n: int) -> int:
    """Take a free slot of the fence set, write three times under its fence, release it.
    Each committed write is a ``slot_act`` at the database's time just before its fence
    (the fence let it through, so the token was current then); a refused or failed write
    ends the job's acts. A worker frozen meanwhile loses the slot to another ``fenced`` job
    and, woken, is refused."""
    _started(n)
    lease = app.partitions.try_acquire(FENCE_SET, FENCE_SLOTS, lease=FENCE_LEASE)
    acts = 0
    if lease is not None:
        try:
            for _ in range(3):
                try:
                    at = _fenced_write(_fence_db(), lease, n)
                except LeaseLost:
                    break
                except Exception:  # noqa: BLE001 - a connection the server ended, say
                    with contextlib.suppress(Exception):
                        _db.conn.close()
                    _db.conn = None
                    break
                if _history is not None:
                    _history.line("slot_act", at, set=FENCE_SET, slot=lease.slot, token=lease.token)
                acts += 1
                time.sleep(0.05)
        finally:
            # Logged before the call: a process killed between the release's commit and a
            # line after it would leave the next holder looking like an overlap (the
            # checker prefers missing a violation to inventing one).
            _record("slot_release", set=FENCE_SET, slot=lease.slot, token=lease.token)
            with contextlib.suppress(Exception):
                lease.release()
    _ended()
    return acts


@app.task(queue="torture")
def batch_done(batch: dict[str, Any]) -> None:
    """A batch's completion callback."""
    _record("batch_complete", batch=str(batch.get("id")))


def _on_event(event: Event, fields: Mapping[str, Any]) -> None:
    if event is Event.JOB_CLAIMED:
        _record("claim", job=fields["job_id"], token=fields["token"], attempt=fields["attempt"])
    elif event is Event.JOB_SUCCEEDED:
        _record("complete", job=fields["job_id"], token=fields["token"], accepted=True)
        if fields.get("batch_item"):  # acked in the transaction that accepted the success
            batch, _, item = str(fields["batch_item"]).split(":")
            _record("batch_ack", batch=batch, item=int(item), accepted=True, job=fields["job_id"])
    elif event is Event.JOB_REJECTED:
        ev = "complete" if fields.get("outcome") == "succeeded" else "fail"
        extra = {} if ev == "complete" else {"final": False}
        _record(ev, job=fields["job_id"], token=fields["token"], accepted=False, **extra)
    elif event in (Event.JOB_FAILED, Event.JOB_TIMEOUT, Event.JOB_UNKNOWN_TASK,
                   Event.JOB_BAD_ARGUMENTS, Event.JOB_UNDECODABLE):
        _record("fail", job=fields["job_id"], token=fields["token"], accepted=True,
                final=fields.get("state") == "dead")
    elif event is Event.PARTITION_ACQUIRED:
        _record("slot_acquire", set=fields["set"], slot=fields["slot"], token=fields["token"],
                until=fields["until"], lease=fields["lease"])
    elif event is Event.PARTITION_RENEWED:
        _record("slot_renew", set=fields["set"], slot=fields["slot"], token=fields["token"],
                until=fields["until"])
    elif event is Event.PARTITION_RELEASED:
        _record("slot_release", set=fields["set"], slot=fields["slot"], token=fields["token"])
    elif event is Event.PARTITION_LOST:
        _record("slot_lose", set=fields["set"], slot=fields["slot"], token=fields["token"])


if _history is not None:
    subscribe(_on_event)
