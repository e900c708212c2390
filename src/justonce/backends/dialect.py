"""What a database dialect supplies to the one Store (store.py): a small set of primitives.

The Store writes every operation once, in terms of named statements (``<dialect>/queries.sql``)
run through these primitives. A dialect knows how to open a transaction on its driver,
how its list parameters travel, how its time and JSON columns come back, how to insert many
jobs and learn their ids, how to set bits in a batch chunk, which errors mean "unique key
taken" or "lock wait timed out", and how an idle worker waits. It knows nothing of jobs,
batches or leases beyond the statement names.

Every dialect's ``queries.sql`` names the same statements with the same parameters and
result columns (``tests/test_dialects.py`` holds that); a statement only one dialect needs
is listed in its ``DIALECT_ONLY``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from ..errors import InvalidOption, SchemaError
from ..models import NewJob
from ..types import BatchState
from .base import Waiter

T = TypeVar("T")
Key = tuple[int, str, int]
"""A batch chunk: (batch id, group id, chunk number)."""


@dataclass(frozen=True, slots=True)
class Flip:
    """What setting bits did to one batch chunk."""

    size: int
    state: str
    """Its batch's state."""
    pending_before: int
    pending_after: int | None
    """None when no bit changed."""
    was_set: frozenset[int]
    """The asked positions that were set already."""


class Dialect:
    """The primitives. ``c`` is always one of the dialect's connections inside a transaction
    (its own, or the caller's). List parameters are passed as Python lists; a dialect
    without array parameters sends them as one JSON document."""

    name: str
    url: str
    queries: dict[str, str]
    channel: str | None = None
    schema: str | None = None
    """Where justonce's tables live when not in the connection's default (Postgres)."""
    """Postgres: the NOTIFY channel, passed to every statement that wakes workers."""
    claim_precheck: bool = False
    """Look for a ready job with a read before an unpartitioned claim (where an empty
    claim would take a database-wide write lock for nothing: SQLite)."""

    latest: int
    """The newest migration this version has."""
    auto_migrate: bool = False
    """Migrate on first use (the embedded SQLite file) instead of asking for `justonce migrate`."""
    _schema_ok: bool = False

    def _ensure_schema(self) -> None:
        """Check once that the database's schema is this version's (or migrate it, where
        ``auto_migrate``)."""
        if self._schema_ok:
            return
        version = self.schema_version()
        if version > self.latest:
            raise SchemaError(
                f"database schema v{version} is newer than this justonce (v{self.latest}); upgrade"
            )
        if version < self.latest:
            if not self.auto_migrate:
                raise SchemaError(
                    f"the justonce schema is at v{version}, this version needs v{self.latest}: "
                    "run `justonce migrate`"
                )
            self.migrate()
        self._schema_ok = True

    # -- running named statements -----------------------------------------------------------
    def rows(self, c: Any, name: str, params: dict[str, Any]) -> list[Any]:
        """Run a named statement on ``c``; its rows (positional)."""
        raise NotImplementedError

    def dicts(self, c: Any, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a named statement on ``c``; its rows as dicts, JSON and time columns decoded."""
        raise NotImplementedError

    def many(self, c: Any, name: str, seq: Sequence[dict[str, Any]]) -> None:
        """Run a named statement once per parameter set."""
        raise NotImplementedError

    def read(self, name: str, params: dict[str, Any]) -> list[Any]:
        """Run a reading statement on a connection of the dialect's own."""
        raise NotImplementedError

    def read_dicts(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def write(self, name: str, params: dict[str, Any]) -> list[Any]:
        """Run one named statement atomically in a transaction of its own, the cheapest way
        the dialect has (Postgres: one autocommit round trip)."""
        return self.tx(None, lambda c: self.rows(c, name, params))

    def write_guarded(self, name: str, params: dict[str, Any], idle_limit: float) -> list[Any]:
        """``write`` for a statement that holds locks others wait on (a partitioned claim
        holds its slots): where the dialect runs it as several statements in one
        transaction, a session left idle inside it longer than ``idle_limit`` seconds (its
        process froze) is ended by the server, which releases the locks."""
        def run(c: Any) -> list[Any]:
            self.guard_idle(c, idle_limit)
            return self.rows(c, name, params)

        return self.tx(None, run)

    def wrote_nothing(self, c: Any) -> None:
        """The call running on ``c`` leaves nothing written (it undid what it wrote: a chunk
        of effects that claimed nothing drops its row): a dialect may end a transaction the
        call began on a caller's connection. Default: nothing."""

    def guard_idle(self, c: Any, idle_limit: float) -> None:
        """In ``c``'s open transaction: the server ends the session if it stays idle in this
        transaction longer than ``idle_limit`` s. Default: nothing (no such setting)."""

    def guard_fence(self, c: Any, idle_limit: float) -> None:
        """``guard_idle`` for the caller's own transaction: only where the setting ends with
        that transaction (a caller's later transactions keep their own). When it fires, the
        server ends the whole session: the caller's connection is closed (a pool must
        discard it). Default: nothing."""

    def write_dicts(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self.tx(None, lambda c: self.dicts(c, name, params))

    def write_count(self, name: str, params: dict[str, Any]) -> int:
        """Run one writing statement in a transaction of its own; the rows it changed."""
        raise NotImplementedError

    # -- the caller's connection ----------------------------------------------------------------
    _mark: Any = None

    def same_database(self, c: Any, hint: str = "") -> None:
        """Refuse (InvalidOption) a caller's connection (``conn=``) that does not reach this
        backend's tables: another database, or another justonce database, whose jobs, ids
        and effects are not this App's (a job enqueued there came back with an id naming
        another job here). Each dialect says what marks its database (``database_mark``),
        read so that it needs no privilege beyond justonce's tables, cannot fail (on
        Postgres an error would end the caller's transaction) and opens no snapshot (on
        SQLite a read before the first write can make that write fail at once). Read on
        every call: a connection's ``USE`` or ``SET search_path`` moves it to another
        database between two calls (remembering a connection checked once let those
        through)."""
        theirs = self.database_mark(c)
        refusal = self._mark is None or self.other_database(self._mark, theirs)
        if refusal:
            # Read our own mark again before refusing: the database may have been made
            # again (dropped and migrated) under this App since the mark was remembered.
            self._mark = self.own_mark()
            refusal = self.other_database(self._mark, theirs)
        if refusal:
            raise InvalidOption(f"conn {refusal}{hint}")

    def database_mark(self, c: Any) -> Any:
        """What tells this database apart, as connection ``c`` sees it."""
        raise NotImplementedError

    def own_mark(self) -> Any:
        """The mark as this backend's own connections see it."""
        return self.on(None, self.database_mark)

    def other_database(self, mine: Any, theirs: Any) -> str | None:
        """Why a connection whose mark is ``theirs`` does not reach this database, or None."""
        if theirs != mine:
            return ("is a connection to another justonce database than this App's (its jobs, "
                    "ids and effects are not this App's)")
        return None

    def callers_savepoint(self, conn: Any, fn: Callable[[], T]) -> T:
        """``fn()`` under a savepoint of its own when the caller's connection ``conn`` is in
        a transaction: rolled back to it if ``fn`` raises, so that an effect's function that
        wrote part of its work and then failed leaves none of it in your transaction (its
        entry is released and may be done again). Outside a transaction, ``fn()`` as is.
        Savepoints nest (an effect run inside another's function): each level has a name
        of its own, since on MySQL a savepoint of the same name replaces the outer one."""
        if not self.caller_in_transaction(conn):
            return fn()
        depth = self._fn_depth.get(id(conn), 0)
        name = f"justonce_fn_{depth}"
        self.plain(conn, f"SAVEPOINT {name}")
        self._fn_depth[id(conn)] = depth + 1
        try:
            result = fn()
        except BaseException:
            # Back to the savepoint; if the database ended the whole transaction meanwhile
            # (a deadlock, a full disk) there is none: the original error is what matters.
            with contextlib.suppress(Exception):
                if self.caller_in_transaction(conn):
                    self.plain(conn, f"ROLLBACK TO SAVEPOINT {name}")
                    self.plain(conn, f"RELEASE SAVEPOINT {name}")
            raise
        finally:
            if depth:
                self._fn_depth[id(conn)] = depth
            else:
                self._fn_depth.pop(id(conn), None)
        self.plain(conn, f"RELEASE SAVEPOINT {name}")
        return result

    _fn_depth: dict[int, int] = {}
    """Per caller's connection, how many effect functions run inside each other on it."""

    def live_key_holders(self, c: Any, keys: Sequence[Any]) -> list[dict[str, Any]]:
        """The live jobs holding ``keys`` (a keyed insert found them held), as rows."""
        return self.dicts(c, "job_live_by_keys", {"keys": list(keys)})

    def caller_in_transaction(self, conn: Any) -> bool:
        """Whether the caller's connection has a transaction open now."""
        raise NotImplementedError

    def plain(self, c: Any, text: str) -> None:
        """Run SQL ``text`` that takes no parameters and returns no rows (a savepoint's)."""
        raise NotImplementedError

    # -- transactions -------------------------------------------------------------------------
    def tx(self, conn: Any, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        """Run ``fn(c)`` atomically: in the caller's open transaction on ``conn`` (under a
        savepoint, so a refused call leaves the caller's writes alone; a connection in
        autocommit mode gets a transaction of its own, committed here), or, with ``conn``
        None, in a transaction of the dialect's own. ``timeout``: how long to wait for a
        write lock where the dialect has one (SQLite)."""
        raise NotImplementedError

    def on(self, conn: Any, fn: Callable[[Any], T], atomic: bool = False,
           single_write: bool = False) -> T:
        """Run ``fn`` on the caller's connection as it is (inside the caller's transaction),
        or on one of the dialect's own (in a transaction when ``atomic``, or where the
        dialect needs one for every write). ``single_write``: ``fn`` changes rows with one
        statement at most (a statement that changed nothing may be sent again), so a
        dialect whose failed statement undoes itself alone (MySQL) needs no savepoint to
        leave the caller's transaction as it was."""
        raise NotImplementedError

    def locked_tx(self, conn: Any, lock_timeout: float, fn: Callable[[Any], T]) -> T:
        """``tx`` with lock waits bounded by ``lock_timeout`` (LockTimeout past it)."""
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Any]:
        """One of the dialect's connections in an open write transaction, committed when the
        block ends and rolled back if it raises."""
        raise NotImplementedError

    def fence_connection(self, conn: Any) -> Any:
        """The caller's connection, checked to be inside a transaction (a fence outside one
        would hold nothing)."""
        raise NotImplementedError

    def row_lock(self, conn: Any, table: str, column: str, value: Any, timeout: float) -> bool:
        """Lock the row ``table.column = value`` in the caller's open transaction on ``conn``
        (waiting at most ``timeout``); False when there is no such row."""
        raise NotImplementedError

    # -- values --------------------------------------------------------------------------------
    def time(self, value: Any) -> datetime | None:
        """A time column as an aware datetime."""
        raise NotImplementedError

    def at(self, value: datetime | None) -> Any:
        """A time as the dialect's statements take it as a parameter."""
        raise NotImplementedError

    def at_bound(self, value: datetime | None) -> Any:
        """A time filter's bound (``created_after`` inclusive, ``created_before``
        exclusive), so that a row shown at T is on the same side of T as its time."""
        return self.at(value)

    def json(self, value: Any) -> Any:
        """A JSON column as Python."""
        raise NotImplementedError

    def array(self, values: Sequence[str | int | None]) -> Any:
        """A list parameter of a hot statement, in the form the dialect sends fastest (by
        default the list itself)."""
        return list(values)

    def is_unique_violation(self, exc: BaseException) -> bool:
        raise NotImplementedError

    # -- bulk inserts ------------------------------------------------------------------------------
    def insert_rows(self, c: Any, jobs: Sequence[NewJob],
                    params: Callable[[NewJob], dict[str, Any]]) -> list[int | None]:
        """Insert jobs that differ in their options; each one's id in input order, None for
        a job whose key a live job holds. The ids ascend in the order given: jobs run in
        it, a partition key's jobs one at a time (the partitioned claim goes by id).
        Default: ``job_insert`` once per job, in the order given (no multi-row insert
        reports which rows a unique key refused). Where concurrent writers lock keys (not
        SQLite's one writer), a dialect takes the keys in key order while the ids still
        follow the list, so that two bulk inserts of the same keys cannot deadlock
        (Postgres: ids drawn first; MariaDB: keys set after the rows)."""
        out: list[int | None] = [None] * len(jobs)
        for i, job in enumerate(jobs):
            rows = self.rows(c, "job_insert", params(job))
            out[i] = int(rows[0][0]) if rows else None
        return out

    def insert_calls(self, c: Any, params: dict[str, Any], args_doc: str,
                     kwargs_doc: str) -> list[int]:
        """Insert one job per entry of the JSON arrays ``args_doc`` / ``kwargs_doc`` (same
        length), all with ``params``' options (and ``item_prefix``) and no key; their ids
        in input order."""
        raise NotImplementedError

    # -- batch bits ----------------------------------------------------------------------------------
    def flip(self, c: Any, positions: dict[Key, set[int]]) -> dict[Key, Flip]:
        """Lock the chunks (in key order) and set the bits at ``positions`` (skipping
        positions past a chunk's size and chunks of expired batches); a chunk that does not
        exist is missing from the answer.

        Default: read the chunks under lock (``batch_chunks_lock``), set the bits here, and
        write back the chunks that changed (``batch_chunk_update``): for dialects without
        bit operations on binary strings."""
        keys = [list(k) for k in sorted(positions)]
        out: dict[Key, Flip] = {}
        writes = []
        for batch_id, group_id, chunk, size, pending, blob, state in self.rows(
                c, "batch_chunks_lock", {"keys": keys}):
            key = (int(batch_id), str(group_id), int(chunk))
            size, pending = int(size), int(pending)
            if state == BatchState.EXPIRED:
                out[key] = Flip(size, state, pending, None, frozenset())
                continue
            bits, left, was_set = bytearray(blob), pending, set()
            for pos in positions[key]:
                if pos >= size:
                    continue
                byte, mask = pos >> 3, 1 << (pos & 7)
                if bits[byte] & mask:
                    was_set.add(pos)
                else:
                    bits[byte] |= mask
                    left -= 1
            out[key] = Flip(size, state, pending, left if left != pending else None,
                            frozenset(was_set))
            if left != pending:
                writes.append({"batch_id": key[0], "group_id": key[1], "chunk": key[2],
                               "bits": bytes(bits), "pending": left})
        self.many(c, "batch_chunk_update", writes)
        return out

    def bits(self, value: Any) -> bytes | bytearray:
        """A chunk's bits as the batch columns return them, as bytes: item ``n`` is bit
        ``n % 8`` (least significant first) of byte ``n // 8``. Default: the column is that
        blob already."""
        return bytes(value)

    # -- the effect ledger in bulk ---------------------------------------------------------------
    def claim_new_effects(self, c: Any, params: dict[str, Any], n: int) -> list[Any]:
        """(key, token) of the entries ``effect_claim_new_many`` inserted claimed, out of the
        ``n`` keys of ``params["keys"]``. Default: the statement's own answer."""
        return self.rows(c, "effect_claim_new_many", params)

    statement_bytes = 64 * 1024 * 1024
    """How much a statement's parameters may carry: bulk writes whose size depends on the
    caller's data (a chunk's done marks with their results) are cut into statements under
    it, in the same transaction. MySQL reads its max_allowed_packet."""

    def finish_effects(self, c: Any, scope: str, chunk: int,
                       rows: Sequence[tuple[str, int, str | None, str | None]]) -> list[Any]:
        """(key, new state) of the claims of chunk ``chunk`` that ``effect_finish_many``
        marked, each on its own entry, out of ``rows`` (key, token, result, error) in key
        order. Default: the statement, with ``rows`` sent as one JSON list."""
        return self.rows(c, "effect_finish_many", {"scope": scope, "chunk": chunk,
                                                   "rows": json.dumps(rows, separators=(",", ":"))})

    # -- queue statistics ----------------------------------------------------------------------
    def count_jobs(self, exact_below: int) -> tuple[list[Any], bool]:
        """(rows of (queue, state, count), estimated) for the service's queue view: exact by
        default; a dialect with a cheap sample may estimate above ``exact_below`` rows."""
        return self.read("queue_counts", {}), False

    # -- schema, clock, waiting ----------------------------------------------------------------
    def migrate(self) -> list[str]:
        raise NotImplementedError

    def schema_version(self) -> int:
        raise NotImplementedError

    def now(self) -> datetime:
        raise NotImplementedError

    def waiter(self, queues: Sequence[str], listen: bool = True) -> Waiter:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
