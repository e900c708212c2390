"""The worker side of ``justonce demo push``: two ways to send a Push, at most one email
per (Push, user) whatever runs twice. Workers run them with
``justonce worker --app justonce.demo.push_app:app``.

``send_push_slot`` is the seed's shape: one job per slot ``k`` of ``N`` (made by
``app.partitions.scan``), which runs the list's query with the slot predicate
``MOD(users.id, N) = k``, reads its users a window of ids at a time (a range of the primary
key per query: no long transaction, no offset, no sort) and hands chunks to its process's
sender threads (one SMTP connection each, ``$JUSTONCE_DEMO_SENDERS`` of them). A chunk goes through
``app.effects.run_many``: one transaction claims its users' ledger entries, the emails go
out, one transaction marks them done. N is the number of worker processes: each slot job
is a full pass over the users table, so more slots than processes would only add passes.
A user whose entry another sender holds right now (the A/B phase and the rest phase
racing) is looked at again until that claim ends, done or in doubt.

``send_push_email`` is one job per user (``--per-user-jobs``): a job, a claim, a done mark
and an address look-up per email; kept to compare the two.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from ..app import App
from ..effects import EffectsOutcome
from ..retry import Backoff
from . import BouncedPostgres, dialect, exit_with_parent, thread_connection
from .mail import ThreadSMTP, render
from .push_data import criteria_sql, load_push, sql

app = App(strict=True)
exit_with_parent()  # (in a worker the demo started: stop once the demo is gone)
SENDERS_ENV = "JUSTONCE_DEMO_SENDERS"
CHUNK_ENV = "JUSTONCE_DEMO_CHUNK"
WINDOW = 50_000
"""User ids read per query of a slot's scan (then cut into chunks for the senders): each
query reads one id range through the primary key, ``id > lo AND id <= lo + WINDOW``.
Not ``ORDER BY id LIMIT n``: with the list's criteria the planner expects few matches
and answers every such page with a scan and sort of the whole table (measured on Postgres:
~250 ms of three processes' CPU per page of 5,000, most of the database's work in a Push)."""
CHUNK_LEASE = 10.0
"""How long one chunk's sends may take before its unmarked entries are in doubt (a chunk of
500 takes well under a second; the sender of a chunk past it still marks it done, at most
once: the entries are only reported in doubt meanwhile)."""
RETRY_FAILED = 3
AB_CHUNK = 25
WINNER = "A"
"""The simulated A/B result: A opened 23.1 %, B 19.4 %."""

_local = threading.local()
_pushes: dict[int, dict[str, Any]] = {}
_lock = threading.Lock()
_smtp = ThreadSMTP()
_pool: ThreadPoolExecutor | None = None


def _db() -> Any:
    return thread_connection(_local, app.database_url, _prepare)


def _prepare(conn: Any) -> None:
    if dialect(conn) == "postgres" and not isinstance(conn, BouncedPostgres):
        # The slot scan's window query, as psycopg prepares it after five runs, got a
        # generic plan: one that cannot see the window's bounds or the list's numbers,
        # expects one user per window and may then read all of R for each user it finds
        # (1.6-7x the scan's CPU on the server, measured at 2,000,000 and 10,000,000 users). A plan
        # made for each window's own values costs well under a millisecond. And no
        # parallel workers: the slots are the parallelism (a worker process started
        # for each window cost the server ~25 % more CPU on two cores). Through
        # PgBouncer nothing is prepared, and a session setting would outlive the
        # transaction on a shared server connection: left as they are.
        conn.execute("SET plan_cache_mode = force_custom_plan")
        conn.execute("SET max_parallel_workers_per_gather = 0")


def _push(push_id: int) -> dict[str, Any]:
    with _lock:
        if push_id not in _pushes:
            _pushes[push_id] = load_push(_db(), push_id)
        return _pushes[push_id]


def _senders() -> tuple[ThreadPoolExecutor, int]:
    """This process's sender threads (``$JUSTONCE_DEMO_SENDERS``, one SMTP connection each)."""
    global _pool
    n = max(1, int(os.environ.get(SENDERS_ENV, "4")))
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(n, thread_name_prefix="sender")
    return _pool, n


class SendInProgress(Exception):
    """Another claim of a user's email is live: look again shortly (it ends done, or in
    doubt if its worker died)."""


# -- the seed's shape: one job per slot, chunks through the effect ledger ------------------------


Row = tuple[int, str, str]
"""A user to send to: (id, email, variant)."""


@app.task(name="demo.send_push_slot", queue="push", max_attempts=20, timeout=6 * 3600,
          backoff=Backoff(base=0.5, factor=2.0, cap=5.0, jitter=0.2))
def send_push_slot(predicate: str, slot: int, n: int, push_id: int, phase: str) -> dict[str, int]:
    """Send phase ``phase`` ("ab" or "rest") of a Push to the users of one slot: the job
    reads the slot's users a page at a time and its process's sender threads send them, a
    chunk each at a time."""
    push = _push(push_id)
    pool, senders = _senders()
    chunk_size = max(1, int(os.environ.get(CHUNK_ENV, "500")))
    if phase == "ab":
        # The A/B phase is small (2,000 users): small chunks make its done marks come in
        # steps, so the rest phase starts with R incomplete, as in the seed's race.
        chunk_size = min(chunk_size, AB_CHUNK)
    totals: Counter[str] = Counter()
    held: list[Row] = []
    failed: dict[str, tuple[Row, str]] = {}
    in_flight: set[Future[tuple[EffectsOutcome, list[Row]]]] = set()

    def collect(futures: set[Future[tuple[EffectsOutcome, list[Row]]]]) -> None:
        for f in futures:
            outcome, rows = f.result()
            totals["sent"] += outcome.done
            totals["left_in_doubt"] += len(outcome.left_in_doubt)  # (the mail server's answer lost)
            for why, count in outcome.skipped.items():
                totals[f"skipped_{why}"] += count
            by_key = {str(r[0]): r for r in rows}
            held.extend(by_key[k] for k in outcome.held)
            failed.update((k, (by_key[k], error)) for k, error in outcome.failed.items())

    for page in _pages(push, push_id, phase, predicate):
        for at in range(0, len(page), chunk_size):
            in_flight.add(pool.submit(_send_chunk, push_id, push, phase, page[at:at + chunk_size]))
            if len(in_flight) >= 2 * senders:  # keep the senders busy and the memory bounded
                finished, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                collect(finished)
    collect(wait(in_flight).done)
    # Users whose entry another claim held when we came (the other phase, or a sender that
    # died): that claim ends done, or in doubt if its holder died (at most once: left for an
    # operator); look again until it has. Failed sends: tried again a few times.
    rounds: Counter[str] = Counter()
    while held or failed:
        if failed:
            rounds["failed"] += 1
            if rounds["failed"] > RETRY_FAILED:
                key, (_, error) = next(iter(failed.items()))
                raise RuntimeError(f"slot {slot}: {len(failed)} sends still failing (user {key}: {error})")
        if held:
            rounds["held"] += 1
            if rounds["held"] * 0.5 > CHUNK_LEASE + 5:
                raise SendInProgress(f"slot {slot}: {len(held)} users still held by another claim")
        retry = held + [row for row, _ in failed.values()]
        held, failed = [], {}
        time.sleep(0.5)
        collect({pool.submit(_send_chunk, push_id, push, phase, retry)})
    return {"slot": slot, **totals}


def _pages(push: dict[str, Any], push_id: int, phase: str, predicate: str) -> Iterator[list[Row]]:
    """The slot's users, by id, a window of ids at a time (each query a short statement of
    its own: no transaction held open across the scan, no offset)."""
    if phase == "ab":
        query = ("SELECT u.id, u.email, ab.variant FROM demo_push_ab ab JOIN demo_users u ON u.id = ab.user_id "
                 f"WHERE ab.push_id = ? AND {predicate} AND ab.user_id > ? AND ab.user_id <= ? "
                 "ORDER BY ab.user_id")
        top = "SELECT MAX(user_id) FROM demo_push_ab WHERE push_id = ?"
        params: list[Any] = [push_id]
        top_params: tuple[Any, ...] = (push_id,)
    elif phase == "rest":
        # The list minus R, as R was when the rest phase started (the seed's L minus R).
        where, params = criteria_sql(push["criteria"], "u.")
        query = (f"SELECT u.id, u.email, '{WINNER}' FROM demo_users u WHERE {predicate} AND {where} "
                 "AND NOT EXISTS (SELECT 1 FROM demo_push_reached r WHERE r.push_id = ? AND r.user_id = u.id) "
                 "AND u.id > ? AND u.id <= ? ORDER BY u.id")
        top, top_params = "SELECT MAX(id) FROM demo_users", ()
        params = [*params, push_id]
    else:
        raise ValueError(f"unknown phase {phase!r}")
    db = _db()
    statement = sql(db, query)
    last = db.execute(sql(db, top), top_params).fetchone()[0] or 0
    for lo in range(0, int(last), WINDOW):
        page: list[Row] = [(int(r[0]), str(r[1]), str(r[2]))
                           for r in db.execute(statement, (*params, lo, lo + WINDOW)).fetchall()]
        if page:
            yield page


def _send_chunk(push_id: int, push: dict[str, Any], phase: str,
                rows: list[Row]) -> tuple[EffectsOutcome, list[Row]]:
    """One chunk through the ledger, on this sender thread's SMTP connection."""
    by_key = {str(uid): (email, variant) for uid, email, variant in rows}
    variants = push["variants"]

    def send(idempotency_key: str) -> str:
        email, variant = by_key[idempotency_key.rpartition(":")[2]]
        _smtp.send(email, render(push_id, email, variant, phase, variants[variant], idempotency_key))
        return f"{phase} {variant}"

    outcome = app.effects.run_many(f"push:{push_id}", [r[0] for r in rows], send,
                                   lease=CHUNK_LEASE, chunk=len(rows))
    return outcome, rows


# -- one job per user -----------------------------------------------------------------------------


@app.task(name="demo.send_push_email", queue="push", max_attempts=30, timeout=60,
          backoff=Backoff(base=1.0, factor=1.5, cap=5.0, jitter=0.2))
def send_push_email(push_id: int, user_id: int, variant: str, phase: str) -> dict[str, Any]:
    push = _push(push_id)

    def send(idempotency_key: str) -> str:
        db = _db()
        email = db.execute(sql(db, "SELECT email FROM demo_users WHERE id = ?"), (user_id,)).fetchone()[0]
        _smtp.send(email, render(push_id, email, variant, phase, push["variants"][variant], idempotency_key))
        return f"{phase} {variant}"

    outcome = app.effects.run(f"push:{push_id}", user_id, send, lease=10)
    if outcome.state == "running":
        raise SendInProgress(f"user {user_id}: another send of push {push_id} is in progress")
    return {"sent": outcome.ran, "state": outcome.state}
