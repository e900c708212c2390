"""SQLite backend: the embedded default. Several processes share one file safely.

WAL mode lets readers run beside the one writer; every write transaction starts with
``BEGIN IMMEDIATE`` so it takes the write lock up front (a deferred transaction that
upgrades later can fail with "database is locked" past the busy timeout), and a bounded
retry covers SQLITE_BUSY beyond the busy timeout.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote_to_bytes

from ...errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidOption,
    LockTimeout,
    SchemaError,
)
from ...validate import plain_int, shown
from .. import redact_url
from ..base import decode_column, load_queries, migration_files
from ..dialect import Dialect
from ..store import Store
from .functions import register_functions

HERE = Path(__file__).parent
NOW_SQL = "((julianday('now') - 2440587.5) * 86400.0)"
Q = load_queries(HERE / "queries.sql", {"NOW()": NOW_SQL})
MIGRATIONS = migration_files(HERE / "migrations")
_FOREIGN = ("already exists", "no such column", "has no column")
"""What SQLite says when a migration meets another product's table under justonce's names."""
LATEST = MIGRATIONS[-1][0]
SQLITE_BUSY_MS = 5  # SQLite's own wait; the fair retry loop in _write does the rest
SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}
T = TypeVar("T")


_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})|%2[Ff]|%00")
"""What a SQLite URL's path may not hold: a '%' that starts no escape (``50%.db``: write
``%25``), an escaped '/' (a file name cannot hold one, and written as ``/`` it already
is a folder's end) and an escaped NUL."""


def _path(text: str, url: str) -> str:
    """A SQLite URL's path %-decoded as UTF-8, as the other URLs' parts are decoded: a
    file named ``a b.db`` is ``a%20b.db`` in a URL (``a%20b.db`` was opened as a file of
    that literal name, where ``postgresql://…/a%20b`` names the database ``a b``)."""
    if "%" not in text:
        return text
    if (bad := _ESCAPE.search(text)) is not None:
        what = {"%": "a '%' that starts no %-escape (write %25 for a '%')",
                "%2F": "an escaped '/' (%2F: write the '/' itself)",
                "%00": "an escaped NUL (%00)"}[bad.group().upper()]
        raise ConfigurationError(f"malformed SQLite URL {shown(redact_url(url))}: its path holds {what}")
    try:
        return unquote_to_bytes(text).decode()
    except UnicodeDecodeError:
        raise ConfigurationError(
            f"malformed SQLite URL {shown(redact_url(url))}: a %-escape in its path is not UTF-8 "
            "(escape each byte of a name's UTF-8 encoding)") from None


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///relative.db`` or ``sqlite:////absolute.db`` → (path, options). The path
    is what comes before the first '?' (the options follow it), %-decoded: ``%3F`` is a
    '?' in a file's name, ``%25`` a '%'. A '#' is a character of the name (no fragment)."""
    rest = url.split("://", 1)[1]
    if not rest.startswith("/"):
        raise ConfigurationError(
            f"malformed SQLite URL {shown(redact_url(url))}: use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db"
        )
    raw_path, _, query = rest[1:].partition("?")
    path = _path(raw_path, url)
    if not path or path == ":memory:":
        raise ConfigurationError(
            f"SQLite URL {shown(redact_url(url))} names no file: justonce needs a file that several "
            "processes can share"
        )
    return path, dict(parse_qsl(query))


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _epoch_dt(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    return value.timestamp()


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for col in ("args", "kwargs", "errors", "result"):
        decode_column(row, col)  # (a corrupt column is marked, not raised: Job.undecodable)
    for col in ("run_at", "created_at", "started_at", "finished_at", "lease_expires_at"):
        row[col] = _ts(row.get(col))
    return row


def _pragma(conn: sqlite3.Connection, text: str) -> list[Any]:
    return conn.execute(text).fetchall()


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is open. SQLite rolls a transaction back by itself on some errors
    (a full disk, an I/O error): a ROLLBACK then would fail and hide the first error."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _autocommit(c: sqlite3.Connection) -> bool:
    """Whether the connection commits each statement by itself (isolation_level None, or
    autocommit=True on Python 3.12+) rather than opening a transaction before a write."""
    return c.isolation_level is None or getattr(c, "autocommit", None) is True


def _not_a_database(exc: BaseException) -> bool:
    """SQLite's "file is not a database" (or a damaged one): sqlite3.DatabaseError itself,
    not one of its subclasses (an IntegrityError is the Store's to read)."""
    return type(exc) is sqlite3.DatabaseError and (
        getattr(exc, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT")
        or "not a database" in str(exc) or "malformed" in str(exc))


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


def _params(params: dict[str, Any]) -> dict[str, Any]:
    """List parameters as one JSON document each (SQLite has no arrays)."""
    return {k: json.dumps(v, separators=(",", ":")) if isinstance(v, list | tuple) else v
            for k, v in params.items()}


def _file_mark(path: str) -> tuple[int, int] | None:
    """(device, inode) of a database file: which file it is, whatever path names it."""
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return None if st is None else (st.st_dev, st.st_ino)


class SQLiteDialect(Dialect):
    """The standard sqlite3 module; one connection per thread; WAL; BEGIN IMMEDIATE."""

    name = "sqlite"
    claim_precheck = True

    def __init__(self, url: str) -> None:
        self.url = url
        self.queries = Q
        self.latest = LATEST
        self.auto_migrate = True  # the embedded file migrates itself
        path, options = parse_sqlite_url(url)
        self.path = path
        # Absolute from the start: a connection opened later (a new thread's) after the
        # process changed its directory (daemons chdir to /) would open another file.
        # Joined, not normalised: "link/../jobs.db" goes through the link, as the kernel
        # (and sqlite3) read it.
        with contextlib.suppress(OSError):  # (a working directory deleted: left as given)
            self.path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        sync = options.pop("synchronous", "FULL").upper()
        if sync not in SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={shown(sync)} in SQLite URL {shown(redact_url(url))}: "
                f"use one of {sorted(SYNCHRONOUS)}"
            )
        self.synchronous = sync
        busy = options.pop("busy_timeout", "30000")
        # Plain digits: a negative or nan wait was no wait at all, and inf waited forever.
        ms = plain_int(busy, zero=True)
        if ms is None or ms > 86_400_000:
            raise ConfigurationError(f"busy_timeout in {shown(redact_url(url))} must be milliseconds, "
                                     f"0 to 86400000 (a day), not {shown(busy)}")
        self.busy_timeout = ms / 1000.0
        if options:
            raise ConfigurationError(
                f"unknown SQLite URL options {sorted(options)} in {shown(redact_url(url))}")
        parent = Path(path).expanduser().resolve().parent
        if not parent.is_dir():
            raise ConfigurationError(f"SQLite database folder {shown(str(parent))} does not exist")
        self._local = threading.local()
        self._all: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._lock = threading.Lock()
        self._schema_ok = False
        self._calls: dict[int, tuple[int, int]] = {}
        """The callers' connections in a call now: id → (thread, depth)."""
        self._undone: set[int] = set()
        """ids of callers' connections whose running call undid its writes (wrote_nothing)."""

    # -- connections ------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self.path, timeout=SQLITE_BUSY_MS / 1000, isolation_level=None,
                    check_same_thread=False,
                )
            except sqlite3.Error as exc:
                raise DatabaseUnavailable(f"cannot open SQLite database {shown(self.path)}: {exc}") from exc
            try:
                register_functions(conn)
                # Through the fair retry loop, as every write: the journal mode takes a lock
                # (another process making the file WAL, or checkpointing it), and with the
                # connection's 5 ms busy timeout alone a process started beside seven others
                # on a new file failed at once with "database is locked" (1 in ~300).
                what = f"cannot open SQLite database {shown(self.path)}"
                for pragma in ("PRAGMA journal_mode=WAL", f"PRAGMA synchronous={self.synchronous}",
                               f"PRAGMA busy_timeout={SQLITE_BUSY_MS}"):
                    self._busy_retry(functools.partial(_pragma, conn, pragma), what)
            except BaseException:
                conn.close()
                raise
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
            with self._lock:
                self._all.append((threading.current_thread(), conn))
        return conn

    def _write(self, fn: Callable[[sqlite3.Connection], T], *, schema: bool = True,
               timeout: float | None = None) -> T:
        """Run ``fn`` in one BEGIN IMMEDIATE transaction (see _immediate)."""
        with self._immediate(schema=schema, timeout=timeout) as conn:
            return fn(conn)

    @contextmanager
    def _immediate(self, *, schema: bool = True,
                   timeout: float | None = None) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction, committed when the block ends.

        SQLite's own busy handler is unfair: a waiter backs off to 100 ms sleeps while
        newcomers retry every millisecond, so under load an old waiter (a lease renewal!)
        can starve for seconds. The connection's busy timeout is therefore tiny and this
        loop retries with short random sleeps until ``busy_timeout`` has passed, which
        gives every waiter about the same chance."""
        if schema:
            self._ensure_schema()
        conn = self._conn()
        self._busy_retry(lambda: conn.execute("BEGIN IMMEDIATE"), "SQLite write lock not available",
                         timeout)
        try:
            yield conn
        except sqlite3.OperationalError as exc:  # disk full, I/O error, lock trouble
            _rollback(conn)
            raise DatabaseUnavailable(self._explain(exc)) from exc
        except sqlite3.DatabaseError as exc:
            _rollback(conn)
            if _not_a_database(exc):
                raise self._not_a_database(exc) from exc
            raise
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            _rollback(conn)
            raise DatabaseUnavailable(self._explain(exc, "commit failed")) from exc

    def _not_a_database(self, exc: sqlite3.Error) -> ConfigurationError:
        """SQLite's "file is not a database" (or "database disk image is malformed"), said
        as what it is: the URL names a file that is not a (sound) SQLite database."""
        return ConfigurationError(f"SQLite database {shown(self.path)}: {exc} (the URL names a "
                                  "file that is not a SQLite database, or a damaged one)")

    def _explain(self, exc: sqlite3.OperationalError, what: str = "") -> str:
        text = f"SQLite{' ' + what if what else ''}: {exc}"
        if "full" in str(exc).lower():
            text += (f" (the disk of {self.path} is full: nothing of this call was written; "
                     "work resumes once there is space)")
        return text

    def _read(self, sql: str, params: dict[str, Any] | Sequence[Any] = ()) -> list[sqlite3.Row]:
        self._ensure_schema()
        return self._busy_retry(lambda: self._conn().execute(sql, params).fetchall(),
                                "SQLite read failed")

    def _busy_retry(self, op: Callable[[], T], what: str, timeout: float | None = None) -> T:
        """Retry ``op`` while SQLite says busy, with short random sleeps, until
        ``busy_timeout`` has passed (see _write for why not SQLite's own handler)."""
        start = time.monotonic()
        deadline = start + (self.busy_timeout if timeout is None else timeout)
        while True:
            try:
                return op()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise DatabaseUnavailable(f"{what}: {exc}") from exc
                if time.monotonic() > deadline:
                    raise LockTimeout(f"{what}: {exc} (waited {deadline - start:g}s)") from exc
                time.sleep(random.uniform(0.00005, 0.0005))
            except sqlite3.DatabaseError as exc:
                if _not_a_database(exc):
                    raise self._not_a_database(exc) from exc
                raise

    # -- schema -----------------------------------------------------------------------
    def schema_version(self) -> int:
        conn = self._conn()
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='justonce_migrations'"
        ).fetchone()
        if not exists:
            return 0
        try:
            row = conn.execute("SELECT max(version) FROM justonce_migrations").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such column" not in str(exc):
                raise
            raise SchemaError(f"justonce_migrations here is not justonce's ({exc}): use "
                              "another database file") from None
        return row[0] or 0

    def migrate(self) -> list[str]:
        def apply(conn: sqlite3.Connection) -> list[str]:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS justonce_migrations ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            try:
                done = {r[0] for r in conn.execute("SELECT version FROM justonce_migrations")}
            except sqlite3.OperationalError as exc:
                if "no such column" not in str(exc):
                    raise
                raise SchemaError(f"justonce_migrations here is not justonce's ({exc}): use "
                                  "another database file") from None
            applied = []
            for version, name, sql in MIGRATIONS:
                if version in done:
                    continue
                for statement in _split_statements(sql):
                    try:
                        conn.execute(statement)
                    except sqlite3.OperationalError as exc:
                        if not any(t in str(exc) for t in _FOREIGN):
                            raise
                        # Tables of another product under justonce's names (the
                        # transaction rolls back: nothing of this migration stays).
                        raise SchemaError(f"migration {name} failed: {exc} (tables of something "
                                          "else here? use another database file)") from None
                conn.execute(
                    f"INSERT INTO justonce_migrations VALUES (?, ?, {NOW_SQL})", (version, name)
                )
                applied.append(name)
            return applied

        applied = self._write(apply, schema=False)
        self._schema_ok = True
        return applied

    # -- the dialect's primitives (dialect.py) ------------------------------------------
    def on(self, conn: Any, fn: Callable[[Any], T], atomic: bool = False,
           single_write: bool = False) -> T:
        if conn is not None:
            # ``atomic`` holds on the caller's connection too: in autocommit each INSERT of
            # an enqueue_many committed on its own, and a lock timeout midway left part of
            # the jobs written. A call of one write statement needs no savepoint in the
            # caller's transaction (a failed statement undoes itself), and must not take
            # one: SQLite refuses a SAVEPOINT while a statement of the caller's runs (an
            # enqueue per row of an UPDATE … RETURNING the caller is reading).
            return self._on_callers(conn, fn, begin=atomic, timeout=None, savepoint=not single_write)
        return self._write(fn)  # every write takes the file's write lock up front

    def wrote_nothing(self, c: Any) -> None:
        self._undone.add(id(c))

    def tx(self, conn: Any, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        if conn is None:
            return self._write(fn, timeout=timeout)
        return self._on_callers(conn, fn, begin=True, timeout=timeout)

    def _on_callers(self, conn: Any, fn: Callable[[Any], T], *, begin: bool,
                    timeout: float | None, savepoint: bool = True) -> T:
        """``fn(c)`` on the caller's connection, all or nothing, leaving the connection as
        the call found it when the call fails or writes nothing.

        Inside the caller's open transaction: under a savepoint, so that a refused call
        leaves the caller's own earlier writes and transaction alone. Without one, the
        transaction is the call's (``BEGIN IMMEDIATE`` when ``begin``; else sqlite3 begins
        one itself before a write, unless the connection is in autocommit): rolled back
        if the call fails, and on a connection that is not in autocommit also when the
        call changed nothing (a refused cancel left the file's write lock held, and every
        other process's writes waited, for a transaction the caller never began). In
        autocommit it is committed here; otherwise what the call wrote waits for the
        caller's COMMIT, as sqlite3's own implicit transaction would."""
        with self._callers(conn, timeout) as c:
            if c.in_transaction:
                return self._under_savepoint(c, fn) if savepoint else fn(c)
            auto = _autocommit(c)
            if begin:
                self._caller_begin(c, timeout)
            changes = c.total_changes
            self._undone.discard(id(c))
            try:
                result = fn(c)
                if auto and c.in_transaction:
                    c.execute("COMMIT")
            except BaseException:
                _rollback(c)  # (only what this call began: there was nothing before it)
                raise
            finally:
                undone = id(c) in self._undone
                self._undone.discard(id(c))
            if c.in_transaction and (c.total_changes == changes or undone):
                _rollback(c)  # wrote nothing: no transaction (and no lock) left behind
            return result

    @staticmethod
    def _under_savepoint(c: sqlite3.Connection, fn: Callable[[Any], T]) -> T:
        """``fn(c)`` in the caller's open transaction under a savepoint: a call that fails
        rolls back to it, and the caller's transaction and earlier writes stay as they
        were."""
        c.execute("SAVEPOINT justonce")
        try:
            result = fn(c)
        except BaseException:
            if c.in_transaction:  # (a full disk rolls the whole transaction back itself)
                with contextlib.suppress(sqlite3.Error):
                    c.execute("ROLLBACK TO justonce")
                    c.execute("RELEASE justonce")
            raise
        c.execute("RELEASE justonce")
        return result

    @contextmanager
    def _callers(self, conn: Any, timeout: float | None = None) -> Iterator[sqlite3.Connection]:
        """The caller's connection, checked, set up as justonce's statements need it for
        the call and put back after it: rows as tuples and text as str whatever its
        ``row_factory`` and ``text_factory`` (a dict factory failed every call with
        ``KeyError: 1``, bytes text read the file's name as bytes and refused the
        connection as another file's); its busy timeout ``timeout`` (a lock timeout asked
        for) for every statement of the call; SQLite's errors as justonce's."""
        c = self._caller_connection(conn)
        with self._one_thread(c), self._as_ours(c, timeout):
            yield c

    @contextmanager
    def _one_thread(self, c: sqlite3.Connection) -> Iterator[None]:
        """Refuse a call on a connection that another thread's justonce call is using
        (``check_same_thread=False`` shared by threads): the two calls' BEGIN, SAVEPOINT
        and COMMIT interleaved and failed with SQLite's puzzles ("no such savepoint",
        "cannot commit - no transaction is active")."""
        me = threading.get_ident()
        with self._lock:
            thread, depth = self._calls.get(id(c), (me, 0))
            if thread != me:
                raise InvalidOption("conn is in a justonce call of another thread: a sqlite3 "
                                    "connection serves one thread at a time (check_same_thread="
                                    "False does not make it safe to share); give each thread "
                                    "its own")
            self._calls[id(c)] = (me, depth + 1)
        try:
            yield
        finally:
            with self._lock:
                if depth:
                    self._calls[id(c)] = (me, depth)
                else:
                    self._calls.pop(id(c), None)

    @contextmanager
    def _as_ours(self, c: sqlite3.Connection, timeout: float | None) -> Iterator[None]:
        """See _callers."""
        rows, text = c.row_factory, c.text_factory
        c.row_factory, c.text_factory = None, str
        try:
            try:
                self.same_database(c)
                with (contextlib.nullcontext() if timeout is None
                      else _busy_wait(c, round(timeout * 1000))):
                    yield
            except sqlite3.Error as exc:
                if self.is_unique_violation(exc):
                    raise  # (the Store says what a taken key means for the call)
                raise self._callers_error(exc, timeout) from exc
        finally:
            c.row_factory, c.text_factory = rows, text

    def _callers_error(self, exc: sqlite3.Error, timeout: float | None = None) -> Exception:
        """SQLite's error on your connection, as justonce's."""
        name = getattr(exc, "sqlite_errorname", "") or ""
        if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
            if name == "SQLITE_BUSY_SNAPSHOT":
                # A read transaction of the caller's that another writer overtook cannot
                # become a write transaction (at once, whatever the busy timeout).
                return LockTimeout(
                    f"SQLite: {exc} (your transaction read before another writer committed, "
                    "so it cannot write now: roll it back and run it again; start a write "
                    "transaction with BEGIN IMMEDIATE before calling justonce on your connection)")
            waited = (f"the lock_timeout of {timeout:g}s" if timeout is not None
                      else "your connection's busy timeout")
            return LockTimeout(f"SQLite: {exc} (another connection held the database's write "
                               f"lock past {waited}: nothing of this call was written)")
        if name.startswith("SQLITE_READONLY") or "readonly" in str(exc).lower():
            return InvalidOption(
                f"conn cannot write: {exc} (a read-only connection: PRAGMA query_only, "
                "mode=ro, or a file it may not write; justonce's call writes)")
        if isinstance(exc, sqlite3.OperationalError):
            return DatabaseUnavailable(self._explain(exc))
        if _not_a_database(exc):
            return self._not_a_database(exc)
        # A constraint or a misuse that justonce's own statements do not make: something
        # on the connection changes them (a function of yours under SQLite's name, the
        # connection used by another thread meanwhile).
        return InvalidOption(f"SQLite refused justonce's statement on conn: "
                             f"{type(exc).__name__}: {exc}")

    def database_mark(self, c: sqlite3.Connection) -> Any:
        files = [r[2] for r in self.rows(c, "database_mark", {}) if r[1] == "main"]
        return _file_mark(files[0] if files else "")

    def own_mark(self) -> Any:
        # (The file itself: a connection of ours would wait for the write lock the
        # caller's transaction may hold.)
        return _file_mark(self.path)

    def other_database(self, mine: Any, theirs: Any) -> str | None:
        if theirs != mine:
            return f"is a connection to another database file than this App's ({self.path})"
        return None

    def plain(self, c: sqlite3.Connection, text: str) -> None:
        c.execute(text)

    def caller_in_transaction(self, conn: sqlite3.Connection) -> bool:
        return bool(conn.in_transaction)

    def _caller_connection(self, conn: Any) -> sqlite3.Connection:
        if not isinstance(conn, sqlite3.Connection):
            raise InvalidOption(
                f"conn must be an open sqlite3.Connection to this database, not {type(conn).__name__}"
            )
        try:
            conn.in_transaction  # noqa: B018 - raises on a closed connection
        except sqlite3.ProgrammingError:
            raise InvalidOption("conn is closed") from None
        self._ensure_schema()
        return conn

    def rows(self, c: sqlite3.Connection, name: str, params: dict[str, Any]) -> list[Any]:
        return c.execute(Q[name], _params(params)).fetchall()

    def dicts(self, c: sqlite3.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        # By the cursor's columns, not the row: a caller's connection (conn=) has no
        # sqlite3.Row factory, and dict() of its tuples failed.
        cur = c.execute(Q[name], _params(params))
        names = [d[0] for d in cur.description or ()]
        return [_decode(dict(zip(names, r, strict=True))) for r in cur.fetchall()]

    def many(self, c: sqlite3.Connection, name: str, seq: Sequence[dict[str, Any]]) -> None:
        if seq:
            c.executemany(Q[name], [_params(p) for p in seq])

    def read(self, name: str, params: dict[str, Any]) -> list[Any]:
        return self._read(Q[name], _params(params))

    def read_dicts(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return [_decode(dict(r)) for r in self._read(Q[name], _params(params))]

    def write(self, name: str, params: dict[str, Any]) -> list[Any]:
        return self._write(lambda c: c.execute(Q[name], _params(params)).fetchall())

    def write_guarded(self, name: str, params: dict[str, Any], idle_limit: float) -> list[Any]:
        # No server to end a frozen session: a process frozen inside a write transaction
        # stalls the file (the README's SQLite limit).
        return self.write(name, params)

    def write_count(self, name: str, params: dict[str, Any]) -> int:
        # (The statements return their rows: sqlite3's rowcount of a RETURNING statement
        # counts only the rows fetched.)
        return len(self.write(name, params))

    def insert_calls(self, c: sqlite3.Connection, params: dict[str, Any], args_doc: str,
                     kwargs_doc: str) -> list[int]:
        # One array of [args, kwargs] pairs: joining two json_each tables by position
        # would compare every row with every row.
        pairs = zip(json.loads(args_doc), json.loads(kwargs_doc), strict=True)
        rows = json.dumps([[a, k] for a, k in pairs], separators=(",", ":"))
        return sorted(r[0] for r in c.execute(Q["job_insert_pairs"],
                                              _params({**params, "rows": rows})))

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)

    def json(self, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    def locked_tx(self, conn: Any, lock_timeout: float,
                     fn: Callable[[sqlite3.Connection], T]) -> T:
        # The write lock is the row lock: wait for it at most lock_timeout.
        return self.tx(conn, fn, timeout=lock_timeout)

    def row_lock(self, conn: Any, table: str, column: str, value: Any, timeout: float) -> bool:
        with self._callers(conn) as c:
            began = not c.in_transaction
            if began:
                # Opened here and left open: the lock lasts until the caller commits.
                self._caller_begin(c, timeout)
            # SQLite locks the whole database for a writer: a no-op UPDATE takes that lock
            # (upgrading a read transaction) and says whether the row exists.
            t, col = _quoted(table), _quoted(column)
            try:
                with _busy_wait(c, 0):
                    cur = self._busy_retry(
                        lambda: c.execute(f"UPDATE {t} SET {col} = {col} WHERE {col} = ?", (value,)),
                        f"lock on {table}", timeout)
            except BaseException:
                if began:
                    _rollback(c)  # (the call's own transaction: the connection as it was)
                raise
            if cur.rowcount > 0:
                return True
            if began:
                _rollback(c)  # no such row: nothing locked, as on the other databases
            return False

    def _caller_begin(self, c: sqlite3.Connection, timeout: float | None) -> None:
        """BEGIN IMMEDIATE on the caller's connection, waiting at most ``timeout`` (the
        connection's own busy timeout is set aside meanwhile: ours decides)."""
        try:
            with _busy_wait(c, 0):
                self._busy_retry(lambda: c.execute("BEGIN IMMEDIATE"),
                                 "SQLite write lock not available", timeout)
        except DatabaseUnavailable as exc:
            # Not the lock: what the connection itself refuses (a read-only one), said as
            # on any other statement of the call.
            if isinstance(exc, LockTimeout) or not isinstance(exc.__cause__, sqlite3.Error):
                raise
            raise self._callers_error(exc.__cause__, timeout) from exc.__cause__

    def fence_connection(self, conn: Any) -> sqlite3.Connection:
        c = self._caller_connection(conn)
        if not c.in_transaction:
            raise InvalidOption("fence() needs your open transaction on conn (BEGIN IMMEDIATE "
                                "first, then fence, then your writes, then COMMIT)")
        return c

    def time(self, value: Any) -> datetime | None:
        return _ts(value)

    def at(self, value: datetime | None) -> Any:
        return _epoch(value)

    def at_bound(self, value: datetime | None) -> Any:
        # Times are epoch seconds here, finer than the microsecond they are shown in
        # (rounded): the bound is the smallest number shown at or after T, so that
        # created_at >= it holds exactly for the rows shown at T or later. (Shifting T by
        # half a microsecond in SQL missed by a float step for ~10 % of times.)
        if value is None:
            return None
        x = value.timestamp() - 5e-7
        try:
            while _ts(x) >= value:  # type: ignore[operator]
                x = math.nextafter(x, -math.inf)
            while _ts(x) < value:  # type: ignore[operator]
                x = math.nextafter(x, math.inf)
        except (OverflowError, ValueError, OSError):  # past the years a datetime can show
            return value.timestamp()
        return x

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._immediate()

    def waiter(self, queues: Sequence[str], listen: bool = True) -> SQLiteWaiter:
        return SQLiteWaiter(self)

    def now(self) -> datetime:
        value = self._conn().execute(Q["db_now"]).fetchone()[0]
        return datetime.fromtimestamp(value, UTC)

    def close(self) -> None:
        """Close this thread's connection and those of threads that have ended. A thread
        that is still running keeps its connection (closing a sqlite3 connection under a
        thread that is using it crashes the process); it is closed when that thread ends."""
        me = threading.current_thread()
        with self._lock:
            mine = [(t, c) for t, c in self._all if t is me or not t.is_alive()]
            self._all = [(t, c) for t, c in self._all if (t, c) not in mine]
        for _, conn in mine:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
        self._schema_ok = False


class SQLiteWaiter:
    """SQLite has no notifications between processes, but ``PRAGMA data_version`` changes
    whenever another connection commits; reading it is cheap (no table access), so idle
    workers check it every few milliseconds and claim only when something changed.

    The checks are ``CHECK_EVERY`` apart until the worker has claimed nothing for
    ``QUIET_AFTER`` seconds, then ``QUIET_EVERY`` apart: a job enqueued while jobs come
    and go starts within a few milliseconds, one enqueued to a worker idle for a while
    within about 50 ms. The wake-ups, not the reads, were what an idle worker cost (200 a
    second: 2 % of a core each; 20 now). (Not the database's own quiet: idle workers'
    housekeeping commits every second, so it is never quiet for long.)

    Used by one thread; ``close`` may come from any thread and only sets a flag."""

    CHECK_EVERY = 0.005
    QUIET_AFTER = 2.0
    QUIET_EVERY = 0.05

    def __init__(self, backend: SQLiteDialect) -> None:
        self.backend = backend
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._stop = threading.Event()

    def wait(self, timeout: float, idle_for: float = 0.0) -> None:
        start = time.monotonic()
        deadline, quiet_from = start + timeout, start - idle_for + self.QUIET_AFTER
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self.backend.path, check_same_thread=False)
                self._version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
                if version != self._version:
                    self._version = version
                    return
                every = self.CHECK_EVERY if now < quiet_from else self.QUIET_EVERY
                self._stop.wait(min(every, deadline - now))
        except sqlite3.Error:
            self._stop.wait(max(0.0, deadline - time.monotonic()))
        if self._stop.is_set() and self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._stop.set()


@contextmanager
def _busy_wait(c: sqlite3.Connection, ms: int) -> Iterator[None]:
    """Set the connection's own busy timeout for a while (then put it back)."""
    old = c.execute("PRAGMA busy_timeout").fetchone()[0]
    c.execute(f"PRAGMA busy_timeout = {int(ms)}")
    try:
        yield
    finally:
        c.execute(f"PRAGMA busy_timeout = {int(old)}")


def _quoted(identifier: str) -> str:
    """A validated identifier (validate.sql_identifier), quoted part by part."""
    return ".".join(f'"{part}"' for part in identifier.split("."))


def _row_dict(cur: Any, row: Any) -> dict[str, Any]:
    names = [d[0] for d in cur.description]
    return dict(zip(names, tuple(row), strict=True))


def _split_statements(script: str) -> list[str]:
    statements, buf = [], ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--"):
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            statements.append(buf.strip())
            buf = ""
    if buf.strip():
        statements.append(buf.strip())
    return statements


class SQLiteBackend(Store):
    """The Store on an SQLite file."""

    def __init__(self, url: str) -> None:
        self.sqlite = SQLiteDialect(url)
        self.path = self.sqlite.path
        super().__init__(self.sqlite)
