"""Partitions: N workers share one data set with no overlap, and standbys take over.

- :func:`partition_of` says which of ``n`` slots a key belongs to: ``key mod n`` for
  integers (never negative), the CRC-32 of the UTF-8 bytes mod n for text (of the bytes
  for bytes). :func:`slot_predicate` is the same rule as SQL, for a query over your table.
- A partition lease gives one process a slot ``0..n-1`` of a named set, with an expiry and
  a fencing token that grows with each new holder. ``acquire`` takes the first free or
  expired slot, or waits as a standby until one frees up. Renewal runs in the background
  while the holder works; :meth:`PartitionLease.fence` checks, inside the caller's own
  transaction, that the token is still current, so a holder that was paused past its lease
  (a zombie) cannot write after another process took its slot.
- Partitioned queues (``partition_key`` on jobs, workers started with ``--partitions``)
  and partitioned scans (:meth:`Partitions.scan`) are built on the two.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Mapping
from contextlib import nullcontext
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import failpoints, validate
from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidOption,
    LeaseLost,
    LockTimeout,
    NoFreeSlot,
    PartitionSetNotFound,
)
from .events import Event, emit
from .models import SlotInfo
from .owner import default_owner
from .tasks import Task, call_template

if TYPE_CHECKING:
    from .app import App
    from .batches import Batch, Callback

log = logging.getLogger("justonce.partitions")

MAX_SLOTS = 4096
"""Most slots a set may have."""
ENV_N = "JUSTONCE_PARTITIONS"
"""Where ``n`` comes from when it is not given (the seed's ``ENV["N"]``)."""
INT64 = 2**63
DIALECTS = ("postgres", "sqlite", "mysql")


def partition_hash(key: Any) -> int:
    """The number a key is partitioned by: an integer key itself, the CRC-32 of a text
    key's UTF-8 bytes, the CRC-32 of bytes."""
    if isinstance(key, bool):
        raise InvalidOption("a partition key is an int, a str or bytes, not a bool")
    if (number := validate.exact_int(key)) is not None:  # (an IntEnum by its value)
        if not -INT64 <= number < INT64:
            raise InvalidOption(f"an integer partition key must fit in 64 bits, not {number}")
        return number
    if isinstance(key, str):
        try:
            return zlib.crc32(key.encode())
        except UnicodeEncodeError:
            raise InvalidOption("a text partition key cannot contain a lone surrogate") from None
    if isinstance(key, (bytes, bytearray, memoryview)):
        return zlib.crc32(bytes(key))
    raise InvalidOption(f"a partition key is an int, a str or bytes, not {type(key).__name__}")


def partition_of(key: Any, n: int) -> int:
    """The slot of ``key`` among ``n``: in ``0..n-1``, also for negative integers."""
    return partition_hash(key) % slots(n)


def slots(n: Any) -> int:
    """Validate a number of slots."""
    number = validate.exact_int(n)
    if number is None or not 1 <= number <= MAX_SLOTS:
        raise InvalidOption(
            f"n (the number of slots) must be an integer in [1, {MAX_SLOTS}], not {validate.shown(n)}")
    return number


def _slot(slot: Any, n: int) -> int:
    """Validate a slot of ``n`` (a plain int: it is written into SQL text)."""
    number = validate.exact_int(slot)
    if number is None or not 0 <= number < n:
        raise InvalidOption(f"slot must be an integer in [0, {n}), not {validate.shown(slot)}")
    return number


def slot_expression(column: str, n: int, *, key_type: str = "int", dialect: str = "postgres",
                    schema: str | None = None) -> str:
    """SQL for the slot of ``column`` among ``n`` (the same number as :func:`partition_of`).

    ``key_type="int"``: an integer column, ``MOD(col, n)`` brought into ``0..n-1`` for
    negative values. ``key_type="text"``: a text column, through ``justonce_crc32`` — on
    Postgres a function ``justonce migrate`` creates (in ``schema``, if justonce's tables
    live in one), on SQLite a function registered on each connection (justonce's own, and
    yours with :func:`register_sqlite_functions`). ``column`` is an SQL identifier or a
    dotted pair (``t.id``), never user input: it is checked against that pattern.
    """
    n = slots(n)
    col = validate.sql_identifier(column)
    if dialect not in DIALECTS:
        raise InvalidOption(f"dialect must be one of {DIALECTS}, not {validate.shown(dialect)}")
    if key_type not in ("int", "text"):
        raise InvalidOption(f"key_type must be 'int' or 'text', not {validate.shown(key_type)}")
    if dialect == "postgres":
        from .backends.postgres.slots import slot_sql
    elif dialect == "sqlite":
        from .backends.sqlite.functions import slot_sql
    else:
        from .backends.mysql.slots import slot_sql
    return slot_sql(col, n, key_type, None if schema is None else validate.sql_identifier(schema))


def slot_predicate(column: str, n: int, slot: int, *, key_type: str = "int",
                   dialect: str = "postgres", schema: str | None = None) -> str:
    """A WHERE condition that selects exactly the rows whose key :func:`partition_of`
    assigns to ``slot``: ``MOD(col, n) = slot`` for integer keys (normalised for negative
    ones), the CRC-32 rule for text keys (see :func:`slot_expression`)."""
    n, slot = slots(n), _slot(slot, n)
    return f"{slot_expression(column, n, key_type=key_type, dialect=dialect, schema=schema)} = {slot}"


def register_sqlite_functions(conn: sqlite3.Connection) -> None:
    """Make ``justonce_crc32(text or blob)`` available on your own SQLite connection, for
    text-key predicates (justonce registers it on its own connections)."""
    from .backends.sqlite.functions import register_functions

    register_functions(conn)


def n_from_env(n: int | None) -> int:
    """``n`` as given, else ``$JUSTONCE_PARTITIONS``."""
    if n is not None:
        return slots(n)
    raw = os.environ.get(ENV_N)
    if raw is None:
        raise ConfigurationError(f"give n, or set ${ENV_N} to the number of slots")
    # Plain digits, as --partitions SET:N takes them: int() reads "4_0" as 40 and "٤" as 4.
    n = validate.plain_int(raw)
    if n is None:
        raise ConfigurationError(f"${ENV_N} must be a whole number in plain digits, not "
                                 f"{validate.shown(raw)}")
    return slots(n)


class PartitionLease:
    """Slot ``slot`` of ``n`` in set ``set_name``, held by ``owner`` until ``expires_at``.

    As a context manager it renews itself in a background thread every ``lease / 3`` s
    and releases the slot on exit. ``lost`` turns True when a renewal finds the slot taken
    by another holder (this process was paused past its lease): stop working on the slot.
    """

    def __init__(self, partitions: Partitions, set_name: str, n: int, slot: int, token: int,
                 owner: str, lease: float, expires_at: datetime,
                 started: float | None = None) -> None:
        # Built by acquire; checked all the same, as its fields go to SQL when it renews,
        # releases or fences.
        n = slots(n)
        slot = _slot(slot, n)
        set_name, token = validate.set_name(set_name), validate.int64(token, "token")
        lease = validate.bounded(lease, "lease", 0.1, 86400)
        self._partitions = partitions
        # Read-only once checked (properties below): they go to SQL at every renewal,
        # release and fence, so a lease changed by hand could write what no check saw.
        self._set_name, self._n, self._slot, self._token = set_name, n, slot, token
        self._owner, self._lease = owner, lease
        self.expires_at = expires_at
        self.lost = False
        # By this process's clock, from before the acquire was sent (``started``).
        self._valid_until = (time.monotonic() if started is None else started) + lease
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def set_name(self) -> str:
        return self._set_name

    @property
    def n(self) -> int:
        """The set's number of slots."""
        return self._n

    @property
    def slot(self) -> int:
        """This lease's slot, in ``[0, n)``."""
        return self._slot

    @property
    def token(self) -> int:
        """The fencing token this holder took the slot with."""
        return self._token

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def lease(self) -> float:
        """Seconds each renewal extends the lease by."""
        return self._lease

    @property
    def backend(self) -> Any:
        return self._partitions.app.backend

    def predicate(self, column: str, *, key_type: str = "int", dialect: str | None = None) -> str:
        """This slot's WHERE condition over ``column`` (see :func:`slot_predicate`)."""
        return self._partitions.predicate(column, self.n, self.slot, key_type=key_type, dialect=dialect)

    @property
    def alive(self) -> bool:
        """Not lost, and renewed within the last ``lease`` seconds by this process's clock:
        past that, another process may hold the slot even if no renewal said so yet."""
        return self.alive_for(0.0)

    def alive_for(self, margin: float) -> bool:
        """:attr:`alive` with more than ``margin`` seconds of lease left. The lease is
        counted from before the last successful renewal (or the acquire) was sent: the
        database set its expiry after that, so the slot cannot have changed hands sooner."""
        return not self.lost and time.monotonic() + margin < self._valid_until

    def owns(self, key: Any) -> bool:
        return partition_of(key, self.n) == self.slot

    def renew(self) -> datetime:
        """Extend the lease by ``lease`` s from now. Raises :class:`LeaseLost` (and marks
        the lease lost) when the lease had already expired by the database's clock, or
        another holder has the slot: an expired token is spent even if nobody took the
        slot yet, so acquire it anew."""
        started = time.monotonic()
        failpoints.hit("partition.before_renew")
        expires = self.backend.lease_renew(self.set_name, self.slot, self.token, self.lease)
        if expires is None:
            self.lost = True
            raise LeaseLost(f"slot {self.slot} of {self.set_name!r}: token {self.token} expired "
                            "or was taken over")
        self.expires_at = expires
        self._valid_until = started + self.lease
        emit(Event.PARTITION_RENEWED, set=self.set_name, slot=self.slot, token=self.token,
             until=expires.timestamp())
        return expires

    def release(self) -> None:
        """Give the slot up at once (a standby may take it). Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if not self.lost:
            try:
                if self.backend.lease_release(self.set_name, self.slot, self.token):
                    emit(Event.PARTITION_RELEASED, set=self.set_name, slot=self.slot,
                         token=self.token)
            except LockTimeout:
                # The slot's row is held by a fenced transaction still open (maybe this
                # process's own): leave the slot to expire instead of waiting for it.
                emit(Event.PARTITION_RELEASE_SKIPPED, "partition release skipped: the slot is "
                     "held by an open fenced transaction; it frees up when its lease expires",
                     set=self.set_name, slot=self.slot)
            self.lost = True

    def fence(self, conn: Any) -> None:
        """Inside your open transaction on ``conn``: raise :class:`LeaseLost` unless this
        lease's token is still the slot's current one, and hold the slot's row so that no
        takeover can commit before your transaction ends. Call it before the writes that
        only the holder may make; a zombie's call fails and its transaction rolls back."""
        if not self.backend.lease_fence(conn, self.set_name, self.slot, self.token,
                                        self.lease):
            self.lost = True
            raise LeaseLost(f"slot {self.slot} of {self.set_name!r} belongs to a newer holder: "
                            f"token {self.token} is fenced out")

    def start_renewing(self) -> PartitionLease:
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                            name=f"justonce-lease-{self.set_name}-{self.slot}")
            self._thread.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self.renew()
            except LeaseLost:
                emit(Event.PARTITION_LOST, "partition lease lost", logger=log, set=self.set_name,
                     slot=self.slot, token=self.token)
                return
            except Exception as exc:  # noqa: BLE001 - keep trying while the lease lasts
                emit(Event.PARTITION_RENEW_ERROR, "partition lease renewal failed, retrying",
                     logger=log, error=str(exc))

    def __enter__(self) -> PartitionLease:
        return self.start_renewing()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def __repr__(self) -> str:
        return (f"PartitionLease({self.set_name!r}, slot={self.slot}/{self.n}, "
                f"token={self.token}, lost={self.lost})")


class Partitions:
    """The partition API of an :class:`~justonce.App` (``app.partitions``)."""

    def __init__(self, app: App) -> None:
        self.app = app

    def try_acquire(self, set_name: str, n: int | None = None, *, lease: float = 30.0,
                    owner: str | None = None) -> PartitionLease | None:
        """Take the first free or expired slot of ``set_name`` now, or None when every
        slot is held. Raises :class:`PartitionConflict` when the set is held with another
        ``n`` (every holder must stop, or its lease expire, before ``n`` changes)."""
        name = validate.set_name(set_name)
        n = n_from_env(n)
        lease = validate.bounded(lease, "lease", 0.1, 86400)
        who = _default_owner() if owner is None else validate.owner(owner)
        started = time.monotonic()
        got = self.app.backend.lease_acquire(name, n, who, lease)
        if got is None:
            return None
        slot, token, expires_at = got
        emit(Event.PARTITION_ACQUIRED, "partition acquired", set=name, slot=slot, n=n, token=token,
             until=expires_at.timestamp(), lease=lease)
        failpoints.hit("partition.after_acquire")
        return PartitionLease(self, name, n, slot, token, who, lease, expires_at, started)

    def acquire(self, set_name: str, n: int | None = None, *, lease: float = 30.0,
                timeout: float | timedelta | None = None, poll: float | None = None,
                owner: str | None = None) -> PartitionLease:
        """Take a slot, waiting as a standby while every slot is held: the first slot whose
        holder releases it or lets its lease expire is taken (checked every ``poll`` s,
        default a third of the lease, at most 1 s). ``timeout``: give up with :class:`NoFreeSlot` after that
        many seconds (None waits for ever, 0 tries once). A database that is away
        (DatabaseUnavailable) is waited out the same way, and its error raised if the
        timeout passes meanwhile. Use it as a context manager to renew in the background
        and release on exit."""
        lease = validate.bounded(lease, "lease", 0.1, 86400)
        wait = None if timeout is None else validate.bounded(timeout, "timeout", 0, 10 * 365 * 86400)
        every = validate.bounded(poll, "poll", 0.01, 3600) if poll is not None else min(lease / 3, 1.0)
        # (default: a third of the lease, at most 1 s)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                got = self.try_acquire(set_name, n, lease=lease, owner=owner)
                away = None
            except DatabaseUnavailable as exc:
                # A standby waits out a database that restarts or fails over as it waits out
                # a held slot: it raised at the first blip, and its process had to start over.
                got, away = None, exc
                emit(Event.PARTITION_ACQUIRE_ERROR, "could not try to take a slot: waiting on",
                     set=set_name, error=str(exc))
            if got is not None:
                return got
            if deadline is not None and time.monotonic() >= deadline:
                if away is not None:
                    raise away
                raise NoFreeSlot(f"every slot of {set_name!r} is held (waited {wait:g}s)")
            pause = every if deadline is None else max(0.0, min(every, deadline - time.monotonic()))
            time.sleep(pause)

    def list(self, set_name: str | None = None) -> list[SlotInfo]:
        """Every slot of every set (or of one), with owner, expiry and token."""
        name = validate.set_name(set_name) if set_name is not None else None
        rows = self.app.backend.lease_list(name)
        if name is not None and not rows:
            raise PartitionSetNotFound(f"no partition set {name!r}")
        return rows

    def predicate(self, column: str, n: int, slot: int, *, key_type: str = "int",
                  dialect: str | None = None) -> str:
        """:func:`slot_predicate` in this app's database dialect (and schema)."""
        backend = self.app.backend
        return slot_predicate(column, n, slot, key_type=key_type,
                              dialect=backend.name if dialect is None else dialect,
                              schema=getattr(backend, "schema", None))

    def scan(self, task: str | Task, *, column: str, n: int | None = None,
             key_type: str = "int", dialect: str | None = None, description: str | None = None,
             on_complete: Callback | None = None, on_success: Callback | None = None,
             kwargs: Mapping[str, Any] | None = None, **options: Any) -> Batch:
        """Fan a query over your table out into ``n`` jobs of ``task``, one per slot, tracked
        as a sealed batch (its ``on_complete`` runs once when every slot's job is done).

        Job ``k`` is called with the keyword arguments ``predicate`` (the SQL condition of
        slot ``k`` over ``column``), ``slot`` and ``n``: run your query with
        ``WHERE <predicate>``; ``kwargs`` adds the same keyword arguments to every slot's job
        (which of your things to scan, say). A job that dies is retried like any job, so
        make its writes idempotent (the effect ledger, or a unique key in your own table).

        The batch, its jobs and its seal commit together (in your transaction with
        ``conn=``): a scan refused for any of its parts leaves nothing behind."""
        n = n_from_env(n)
        dialect = self.app.backend.name if dialect is None else dialect
        if not isinstance(kwargs, Mapping | None) or any(not isinstance(k, str) for k in kwargs or {}):
            raise InvalidOption("kwargs must be a mapping of keyword argument names to values")
        extra = dict(kwargs or {})
        clash = sorted(extra.keys() & {"predicate", "slot", "n"})
        if clash:
            raise InvalidOption(f"kwargs must not name {clash}: the scan passes those itself")
        calls = [{**extra, "predicate": self.predicate(column, n, k, key_type=key_type, dialect=dialect),
                  "slot": k, "n": n} for k in range(n)]
        conn = options.pop("conn", None)
        # The jobs' options are checked before anything is written: in your transaction
        # (conn=) a refusal after the batch was opened would leave it behind.
        self.app.build(call_template(task, options), bind=False)
        self.app._check_calls(task, calls[:1])  # (every slot's call has the same names)
        with nullcontext(conn) if conn is not None else self.app.backend.transaction() as c:
            batch = self.app.batches.open(description or f"scan of {column} in {n} slots",
                                          on_complete=on_complete, on_success=on_success, conn=c)
            batch.enqueue_calls(task, calls, conn=c, **options)
            batch.seal(conn=c)
        return batch


def _default_owner() -> str:
    return default_owner()


def parse_set_spec(spec: str) -> tuple[str, int]:
    """``SET:N`` (or ``SET``, with N from ``$JUSTONCE_PARTITIONS``) → (set, n). A set name
    may hold ':' itself (``tenant:eu:8``): N is what follows the last one, when digits."""
    name, sep, raw = spec.rpartition(":")
    if sep and (not raw or raw[0] in "+-0123456789") and not (raw.isascii() and raw.isdigit()):
        # ("orders:", "orders:8x", "orders:-3": an N meant, not a part of the name)
        raise InvalidOption(f"--partitions {validate.shown(spec)} (SET:N): N must be a whole "
                            f"number of slots, not {validate.shown(raw)}")
    if not sep or not (raw.isascii() and raw.isdigit()):
        name, raw = spec, ""
    try:
        set_name = validate.set_name(name)
        return set_name, (slots(int(raw)) if raw else n_from_env(None))
    except (ValueError, ConfigurationError) as exc:
        raise InvalidOption(f"--partitions {validate.shown(spec)} (SET:N): {exc}") from None

