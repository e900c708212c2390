"""MySQL 8 and MariaDB 10.6+ backend, through PyMySQL.

PyMySQL is pure Python: it installs everywhere without client libraries or a compiler (the
C driver, mysqlclient, needs the server's development headers), and its cost per statement
is small beside a round trip. Our connections run READ COMMITTED (REPEATABLE READ's gap and
next-key locks are where MySQL queues deadlock), in UTC, in strict mode.

There is no ``UPDATE … RETURNING`` (MySQL has none; MariaDB has none for UPDATE): a named
block in ``queries.sql`` may hold several statements, run in order in one transaction. The
rows of each SELECT are bound as ``%(picked)s`` (the tuple of their first column, rendered
as a literal list) for the statements after it; a SELECT that finds nothing, or a write
that changes nothing, ends the block with no rows; the block's rows are those of the last
SELECT that ran. So "lock, then update" reads ``SELECT id … FOR UPDATE SKIP LOCKED;
UPDATE … WHERE id IN %(picked)s; SELECT … WHERE id IN %(picked)s``.

There is no LISTEN/NOTIFY: idle workers poll (``MySQLWaiter``). A transaction of ours that
InnoDB chose as a deadlock victim was rolled back whole, and is run again (it is made of
database statements only); a lock wait past ``innodb_lock_wait_timeout`` is a LockTimeout.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidOption,
    LockTimeout,
    SchemaError,
)
from ...models import NewJob
from ...validate import json_text, shown
from .. import check_escapes, pool_size, redact_url
from ..base import decode_column, load_queries, migration_files
from ..dialect import Dialect
from ..liststore import ListOps
from ..store import Store

try:
    import pymysql
    from pymysql.constants import CLIENT, SERVER_STATUS
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ConfigurationError(
        "the MySQL backend needs PyMySQL: pip install 'justonce[mysql]'"
    ) from exc

HERE = Path(__file__).parent
Q = load_queries(HERE / "queries.sql")
MIGRATIONS = migration_files(HERE / "migrations")
LATEST = MIGRATIONS[-1][0]
T = TypeVar("T")

_END = re.compile(r";\s*(?:\n|$)")
_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.I)
_SELECT = re.compile(r"^\s*(\(?\s*SELECT|WITH)\b", re.I)


def _statements(text: str) -> list[str]:
    return [s.strip() for s in _END.split(text) if s.strip()]


STATEMENTS = {name: _statements(text) for name, text in Q.items()}


def _segments(statements: list[str]) -> list[list[str]]:
    """The statements of a block in round trips: a new one starts only after a SELECT
    whose rows later statements use (``%(picked)s``). A segment never runs a write after
    a statement that could end the block (a SELECT, or another write): what follows such a
    statement in its segment is read-only, and its results are dropped when the block ends."""
    segments: list[list[str]] = [[]]
    for i, statement in enumerate(statements):
        segments[-1].append(statement)
        if _SELECT.match(statement) and any("%(picked)s" in s for s in statements[i + 1:]):
            segments.append([])
    segments = [s for s in segments if s]
    for segment in segments:
        for j, statement in enumerate(segment):
            if _WRITE.match(statement) and any(_SELECT.match(s) or _WRITE.match(s) for s in segment[:j]):
                raise AssertionError(f"a write after a possible end of the block: {statement[:60]}")
    return segments


SEGMENTS = {name: _segments(statements) for name, statements in STATEMENTS.items()}
KIND = {s: "select" if _SELECT.match(s) else "write" if _WRITE.match(s) else "other"
        for statements in STATEMENTS.values() for s in statements}
"""Each statement's kind, found once when the queries load (not per run)."""

DEADLOCK = 1213
NO_SUCH_TABLE, NO_DATABASE, SELECT_DENIED = 1146, 1046, 1142
TABLE_DEF_CHANGED = 1412  # a snapshot older than the table it reads
PACKET_TOO_LARGE = 1153  # a statement over max_allowed_packet; the server closes the session
LOCK_WAIT = 1205
DUPLICATE = 1062
JSON_TOO_DEEP = 4040
"""MariaDB's JSON functions read documents nested at most 31 deep (a list of calls whose
arguments are at most 30 deep); justonce allows 64."""
SERVER_SHUTDOWN, CONNECTION_KILLED = 1053, 1927
GONE = {2003, 2006, 2013, 2014, 2055, SERVER_SHUTDOWN, CONNECTION_KILLED, 4031}
"""Client and server codes of a connection that is lost or unusable: thrown away."""
INTERRUPTED = {1317, 1969, 3024}
"""A statement interrupted (KILL QUERY; MariaDB's max_statement_time, MySQL's
max_execution_time): it was rolled back, the session lives on."""
READ_ONLY_TRANSACTION = 1792  # a statement that writes in a READ ONLY transaction
READ_ONLY_SERVER = 1290  # --read-only (a replica, a server being failed over)
REFUSED_SQL_MODES = ("NO_BACKSLASH_ESCAPES", "ORACLE", "SIMULTANEOUS_ASSIGNMENT",
                     "EMPTY_STRING_IS_NULL")
"""sql_mode flags of a caller's session that justonce's statements cannot run under, each
tried against MariaDB 10.11: NO_BACKSLASH_ESCAPES reads the backslash escapes of a bulk
insert's rendered rows as data (invalid JSON stored, a quote that ends the string: 1064);
ORACLE parses with MariaDB's Oracle grammar (every statement: 1064); SIMULTANEOUS_ASSIGNMENT
changes what an UPDATE that reads a column it sets writes; EMPTY_STRING_IS_NULL stores ''
as NULL. (ANSI_QUOTES, PIPES_AS_CONCAT, IGNORE_SPACE and the rest leave them as they are:
no statement of justonce's has a double-quoted string or ``||``.)"""
OUR_SQL_MODE = ("STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
                "NO_ENGINE_SUBSTITUTION")
"""Our own sessions' sql_mode, set at connect whatever the server's global one (or an
init_connect) says: none of REFUSED_SQL_MODES."""
DEADLOCK_RETRIES = 8
IDLE_IN_TRANSACTION = 10
"""Seconds MariaDB lets one of our sessions sit idle inside a transaction before ending it."""
JOB_COLUMNS_JSON = ("args", "kwargs", "errors", "result")
JOB_COLUMNS_TIME = ("run_at", "created_at", "started_at", "finished_at", "lease_expires_at")


def parse_mysql_url(url: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``mysql://user:password@host:port/db`` (or ``mariadb://``) → (connect kwargs,
    justonce's own options: ``pool_size``, ``ssl`` = 1 for verified TLS, 0 (default) for
    none)."""
    parts = urlsplit(url)
    database = unquote(parts.path.lstrip("/"))
    if not parts.hostname or not database or "/" in database:
        raise ConfigurationError(f"malformed MySQL URL {shown(redact_url(url))}: "
                                 "expected mysql://user:password@host:port/dbname")
    check_escapes(url, "MySQL")
    try:
        port = parts.port or 3306
    except ValueError:
        raise ConfigurationError(f"malformed port in MySQL URL {shown(redact_url(url))}") from None
    options = dict(parse_qsl(parts.query))
    ours: dict[str, str] = {k: options.pop(k) for k in ("pool_size", "ssl") if k in options}
    if options:
        raise ConfigurationError(f"unknown MySQL URL options {sorted(options)} in {shown(redact_url(url))}")
    kwargs: dict[str, Any] = {
        "host": parts.hostname, "port": port, "user": unquote(parts.username or "root"),
        # The password as UTF-8 bytes, as a client in a UTF-8 terminal sends it and as a
        # password set over a utf8mb4 connection is kept: PyMySQL encodes a str password as
        # Latin-1, so 'pé' was refused and 'p€' raised UnicodeEncodeError.
        "password": unquote(parts.password or "").encode(), "database": database}
    ssl = ours.get("ssl", "0").lower()
    if ssl in ("1", "true", "yes", "on"):
        # TLS with the server's certificate checked against the system's CAs and its name.
        kwargs.update(ssl_verify_cert=True, ssl_verify_identity=True)
    elif ssl in ("0", "false", "no", "off"):
        # No TLS (PyMySQL would otherwise take whatever TLS the server offers, unchecked,
        # and build a TLS context for every new connection: ~30 ms of CPU each).
        kwargs["ssl_disabled"] = True
    else:
        raise ConfigurationError(f"ssl must be 1 or 0, not {shown(ssl)}")
    return kwargs, ours


_MARK = "\x01justonce-row-part\x01"
"""Stands for a per-row value while job_insert_row's constant part is rendered."""


_ALL_EMPTY_KWARGS = re.compile(r"\[(?:\{\},)*\{\}\]")
_ALL_EMPTY_ARGS = re.compile(r"\[(?:\[\],)*\[\]\]")
"""A list of calls' keyword (positional) arguments where no call has any."""


def _consecutive(got: list[Any], n: int) -> list[int]:
    """The ids of a bulk insert of ``n`` jobs from its (first id, rows) answer: one INSERT
    under innodb_autoinc_lock_mode 0 or 1 draws consecutive ids, in insert order."""
    first, count = int(got[0][0]), int(got[0][1])
    if count != n:
        raise DatabaseUnavailable(f"bulk insert wrote {count} of {n} jobs")
    return list(range(first, first + count))


def _param(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, datetime):
        return _naive(value)
    if isinstance(value, bool):
        return int(value)
    # A subclass of str or int goes by its value: PyMySQL formats a type it has no encoder
    # for with str(), which for an Enum member (a queue or scope from a str Enum, a
    # priority from an int Enum) is its name, not its value (validation passes its value).
    if type(value) is not str and isinstance(value, str):
        return str.__str__(value)
    if type(value) is not int and isinstance(value, int):
        return int.__index__(value)
    return value


def _text(value: Any) -> str:
    """A text column's value (PyMySQL gives bytes for a binary collation's result)."""
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def _naive(value: datetime) -> datetime:
    """A time as the server's DATETIME(6) in UTC takes it. An aware time whose UTC falls
    outside Python's years 1-9999 (0001-01-01T00:00+14:00) is the earliest or latest
    time there is: as a filter's bound it means the same, and it cannot be stored as given."""
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:
        return datetime.min if value.year == 1 else datetime.max


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value
    raise TypeError(f"not a time: {shown(value)}")


def _keepalive(conn: pymysql.Connection) -> None:
    """TCP keepalives after 10 s of silence and a 30 s limit on unacknowledged data, on a
    TCP connection of ours: a server host that dies or drops off the network without a FIN
    or RST (a VM paused, a failover) left every call waiting on its socket for the kernel's
    own limits (~15 min, or over 2 h when idle); PyMySQL has no setting for it. A live
    server answers keepalives from its kernel, however long its statement runs."""
    sock = getattr(conn, "_sock", None)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", 30_000)):
        if hasattr(socket, name):  # (Linux's; other systems keep their defaults)
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


@contextlib.contextmanager
def _callers_errors() -> Iterator[None]:
    """The server's errors on your connection, as justonce's: a deadlock (your whole
    transaction was rolled back: run it again), a lock wait past its timeout, and a lost
    connection (the server ended the session, or the network broke: what your transaction
    wrote is gone; reconnect and run it again)."""
    try:
        yield
    except pymysql.err.InterfaceError as exc:
        raise DatabaseUnavailable(f"MySQL: your connection is closed ({exc!r}): reconnect and "
                                  "run your transaction again") from exc
    except pymysql.err.MySQLError as exc:
        code = _code(exc)
        if code in GONE or (code is not None and 2000 <= code < 3000):
            raise DatabaseUnavailable(f"MySQL: your connection was lost ({exc.args[-1]}): reconnect "
                                      "and run your transaction again") from exc
        if code == DEADLOCK:
            raise DatabaseUnavailable(
                "MySQL chose your transaction as a deadlock victim and rolled it back whole: "
                "run it again") from exc
        if code == LOCK_WAIT:
            raise LockTimeout(f"MySQL: {exc.args[-1]}") from exc
        if code in INTERRUPTED:
            raise DatabaseUnavailable(
                f"MySQL interrupted a statement of this call on your connection ({exc.args[-1]}: "
                "KILL QUERY, or a statement time limit): what the call wrote in your open "
                "transaction was undone, and the transaction stays open") from exc
        if code == READ_ONLY_TRANSACTION:
            raise InvalidOption(
                "your transaction on conn is read-only (SET TRANSACTION READ ONLY, START "
                "TRANSACTION READ ONLY, or tx_read_only): justonce writes in it; use a read-write "
                "transaction") from exc
        if code == READ_ONLY_SERVER:
            raise DatabaseUnavailable(f"MySQL refused the write: {exc.args[-1]} (a replica, or "
                                      "a failover under way)") from exc
        raise


def _check_session(sql_mode: str, charsets: list[str | None]) -> None:
    """Refuse (InvalidOption) a caller's session whose sql_mode or character sets would
    make justonce's statements parse differently or corrupt what they write."""
    names = ("character_set_client", "character_set_connection", "character_set_results")
    for name, value in zip(names, charsets, strict=True):
        if value is None or value.lower() != "utf8mb4":
            # The client's charset is not enough: SET NAMES latin1 on a utf8mb4 connection
            # stored mojibake; SET character_set_results = latin1 broke the connection.
            raise InvalidOption(
                f"conn's session has {name} = {value or 'NULL'}, not utf8mb4: arguments, keys "
                "and results would be stored or read as another encoding; run SET NAMES utf8mb4 "
                "on it (or do not change the character set of a connection opened with "
                "charset='utf8mb4')")
    refused = [m for m in sql_mode.upper().split(",") if m in REFUSED_SQL_MODES]
    if refused:
        raise InvalidOption(
            f"conn's session has sql_mode {', '.join(refused)} (of {sql_mode!r}): justonce's "
            "statements do not parse or mean the same under it (values it writes would be "
            "corrupted); run SET SESSION sql_mode = '...' without it on this connection "
            f"(justonce's own connections use {OUR_SQL_MODE!r})")


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


class _Pool:
    """A small thread-safe pool of PyMySQL connections (at most ``size`` open)."""

    def __init__(self, connect: Callable[[], pymysql.Connection], size: int,
                 timeout: float) -> None:
        self._connect = connect
        self._idle: queue.LifoQueue[pymysql.Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._all: set[int] = set()

    def get(self) -> pymysql.Connection:
        if not self._slots.acquire(timeout=self._timeout):
            raise DatabaseUnavailable(f"no MySQL connection free within {self._timeout:g}s")
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        try:
            return self._connect()
        except BaseException:
            self._slots.release()
            raise

    def put(self, conn: pymysql.Connection, broken: bool = False) -> None:
        try:
            if broken or not conn.open:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - already broken
                    pass
            else:
                self._idle.put(conn)
        finally:
            self._slots.release()

    def close(self) -> None:
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                return
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


class MySQLDialect(Dialect):
    """PyMySQL over a small pool; every connection READ COMMITTED, UTC, strict."""

    name = "mysql"

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.queries = Q
        self.latest = LATEST
        self._connect_kwargs, ours = parse_mysql_url(url)
        self.pool_size = pool_size(ours)
        self.connect_timeout = connect_timeout
        self._pool: _Pool | None = None
        self._lock = threading.Lock()
        self._schema_ok = False
        self._begin: dict[int, list[str]] = {}
        """ids of our connections whose transaction begins with their next statement: the
        statements to send first (BEGIN, after any session setting the transaction needs)."""
        self._restore: dict[int, str] = {}
        """ids of pooled connections with a session setting changed for one transaction of
        ours (a claim's lock wait, a guarded write's idle limit): the statement that puts
        it back (sent with the COMMIT, else on return to the pool)."""
        self.mariadb = True
        self.consecutive_ids = True
        """Multi-row inserts draw consecutive ids (innodb_autoinc_lock_mode 0 or 1)."""
        self.statement_bytes = 16 * 1024 * 1024 - 65536  # (read from the server at first use)
        self._own: set[int] = set()
        """ids of connections lent out by transaction(): ours, checked already."""
        self._call_savepoint: dict[int, bool] = {}
        """ids of callers' connections running one call of ours inside their transaction
        (``on``): whether the savepoint that makes the call all-or-nothing is set yet (it
        is set just before the call's first write: a call that only reads needs none)."""

    # -- connections ------------------------------------------------------------------------------
    def _new_connection(self) -> pymysql.Connection:
        try:
            conn = pymysql.connect(
                **self._connect_kwargs, autocommit=True, charset="utf8mb4",
                connect_timeout=max(1, int(self.connect_timeout)),
                # No FOUND_ROWS: an UPDATE reports the rows it changed, not those it matched
                # (a no-op upsert must count 0).
                client_flag=CLIENT.MULTI_RESULTS | CLIENT.MULTI_STATEMENTS,
            )
        except (pymysql.err.MySQLError, OSError) as exc:
            raise DatabaseUnavailable(
                f"cannot connect to MySQL at {self._connect_kwargs['host']}:"
                f"{self._connect_kwargs['port']}: {exc}") from exc
        try:
            _keepalive(conn)
            self._set_up(conn)
        except (pymysql.err.MySQLError, OSError) as exc:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - broken already
                pass
            raise DatabaseUnavailable(f"MySQL: setting up a new connection failed: {exc}") from exc
        return conn

    @staticmethod
    def _set_up(conn: pymysql.Connection) -> None:
        with conn.cursor() as cur:
            # READ WRITE: a server whose transactions are read-only by default
            # (transaction_read_only) would refuse every write of ours with 1792.
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE")
            # @justonce_lock_wait: the session's own lock wait (the server's, or what its
            # init_connect set), put back after each claim that changes it (locked_tx).
            # sql_mode pinned: the server's global one (or its init_connect) may hold a mode
            # our statements do not parse under (REFUSED_SQL_MODES).
            cur.execute(f"SET time_zone = '+00:00', sql_mode = '{OUR_SQL_MODE}', "
                        "@justonce_lock_wait = @@SESSION.innodb_lock_wait_timeout")
            try:
                # Our own transactions never wait on us for long: a process frozen inside
                # one (SIGSTOP, a paused VM) would keep its row locks, and other workers'
                # SKIP LOCKED claims would skip those jobs, until it ran again. MariaDB ends
                # such a session; MySQL 8 has no such setting (README).
                cur.execute("SET SESSION idle_transaction_timeout = %s", (IDLE_IN_TRANSACTION,))
            except pymysql.err.MySQLError:
                pass

    def _get_pool(self) -> _Pool:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    conn = self._new_connection()
                    try:
                        with conn.cursor() as cur:
                            cur.execute("SELECT VERSION(), @@innodb_autoinc_lock_mode, "
                                        "@@max_allowed_packet")
                            version, mode, packet = cur.fetchone()
                    except pymysql.err.MySQLError as exc:
                        with contextlib.suppress(Exception):
                            conn.close()
                        raise DatabaseUnavailable(
                            f"MySQL: setting up a new connection failed: {exc}") from exc
                    self.mariadb = "mariadb" in str(version).lower()
                    self.consecutive_ids = int(mode) < 2
                    # A bulk insert is cut into statements under this many bytes: one
                    # statement over max_allowed_packet is refused (1153) or, far over,
                    # answered by the server closing the connection.
                    self.statement_bytes = max(int(packet) - 65536, int(packet) // 2)
                    pool = _Pool(self._new_connection, self.pool_size, self.connect_timeout)
                    pool._idle.put(conn)
                    self._pool = pool
        return self._pool

    @contextmanager
    def _connection(self, schema: bool = True) -> Iterator[pymysql.Connection]:
        """A pooled connection in autocommit mode; thrown away if it broke."""
        if schema:
            self._ensure_schema()
        pool = self._get_pool()
        conn = pool.get()
        broken = False
        try:
            yield conn
        except pymysql.err.MySQLError as exc:
            code = _code(exc)
            if code == LOCK_WAIT:  # the statement was rolled back; the connection is fine
                raise LockTimeout(f"MySQL: {exc.args[-1]}") from exc
            if code == DEADLOCK:  # still a deadlock victim after DEADLOCK_RETRIES runs
                raise DatabaseUnavailable(f"MySQL: {exc.args[-1]}") from exc
            if code == PACKET_TOO_LARGE:  # the input's fault, not the server's: no retry helps
                broken = True
                raise InvalidOption("MySQL refused a statement larger than its "
                                    "max_allowed_packet: send less in one call") from exc
            if code in INTERRUPTED:
                # Rolled back (our transaction with it, when the connection goes back); a
                # multi-statement round trip's later results are not to be trusted: a new
                # connection is cheaper than finding out.
                broken = True
                raise DatabaseUnavailable(f"MySQL interrupted a statement ({exc.args[-1]}: "
                                          "KILL QUERY, or a statement time limit)") from exc
            if code in (READ_ONLY_SERVER, READ_ONLY_TRANSACTION):
                broken = True  # (a new connection may reach the new primary)
                raise DatabaseUnavailable(f"MySQL refused a write: {exc.args[-1]} (a replica, "
                                          "or a failover under way)") from exc
            # PyMySQL raises OperationalError for every server error it has no class for
            # (a failed CHECK, say): only a lost connection or a client error (2xxx) means
            # the connection is unusable.
            if code in GONE or isinstance(exc, pymysql.err.InterfaceError) or (
                    code is not None and 2000 <= code < 3000):
                broken = True
                raise DatabaseUnavailable(f"MySQL: {exc}") from exc
            raise  # unique violations, deadlocks (retried above us), SQL errors
        except BaseException:
            broken = True  # interrupted mid-conversation: the protocol state is unknown
            raise
        finally:
            restore = self._restore.pop(id(conn), None)
            if not broken and conn.open:
                try:
                    if conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
                        conn.rollback()
                    if restore is not None:
                        with conn.cursor() as cur:
                            cur.execute(restore)
                except pymysql.err.MySQLError:
                    broken = True
            pool.put(conn, broken)

    # -- the block runner ---------------------------------------------------------------------------
    def _with_begin(self, c: pymysql.Connection, statements: Sequence[str]) -> list[str]:
        """``statements``, after the BEGIN of a transaction of ours on ``c`` still to be
        sent (``_own_tx`` defers it so that it rides with the first statement)."""
        first = self._begin.pop(id(c), None)
        return [*first, *statements] if first is not None else list(statements)

    def _run(self, c: pymysql.Connection, name: str, params: dict[str, Any],
             dicts: bool = False, splice: str | None = None) -> list[Any]:
        """Run a block (see the module docstring). ``splice``: SQL the dialect rendered
        itself (job_insert_values' rows), put in place of ``/*rows*/``."""
        args = {k: _param(v) for k, v in params.items()}
        result: list[Any] = []
        names: list[str] = []
        # On our own connections (MULTI_STATEMENTS) each segment is one round trip, and the
        # BEGIN of a transaction of ours rides with its first statement; a caller's
        # connection gets one statement per round trip.
        if c.client_flag & CLIENT.MULTI_STATEMENTS:
            segments = SEGMENTS[name]
        else:
            segments = [[s] for s in STATEMENTS[name]]
        with c.cursor() as cur:
            for segment in segments:
                if self._call_savepoint and any(KIND.get(s) == "write" for s in segment):
                    self.before_write(c)
                segment = self._with_begin(c, segment)
                text = ";\n".join(segment)
                if splice is not None:
                    text = text.replace("/*rows*/", splice.replace("%", "%%"))
                cur.execute(text, args)
                for k, statement in enumerate(segment):
                    if k:
                        cur.nextset()
                    stop = False
                    kind = KIND.get(statement, "other")  # (BEGIN: other)
                    if kind == "select":
                        result = list(cur.fetchall())
                        stop = not result
                        if result:
                            names = [d[0] for d in cur.description or ()]
                            args["picked"] = tuple(r[0] for r in result)
                    elif kind == "write" and cur.rowcount == 0:
                        stop = True
                    if stop:
                        while cur.nextset():  # the rest of the segment: read-only, dropped
                            pass
                        return []
        if dicts:
            return [_decode(dict(zip(names, r, strict=True))) for r in result]
        return result

    # -- the dialect's primitives (dialect.py) ----------------------------------------------------------
    def rows(self, c: pymysql.Connection, name: str, params: dict[str, Any]) -> list[Any]:
        return self._run(c, name, params)

    def dicts(self, c: pymysql.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self._run(c, name, params, dicts=True)

    def many(self, c: pymysql.Connection, name: str, seq: Sequence[dict[str, Any]]) -> None:
        for params in seq:
            self._run(c, name, params)

    def read(self, name: str, params: dict[str, Any]) -> list[Any]:
        with self._connection() as c:
            return self._run(c, name, params)

    def read_dicts(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self._connection() as c:
            return self._run(c, name, params, dicts=True)

    def write(self, name: str, params: dict[str, Any]) -> list[Any]:
        if len(STATEMENTS[name]) == 1:  # one statement in autocommit mode is atomic
            with self._connection() as c:
                return self._retry_deadlock(lambda: self._run(c, name, params))
        return self.tx(None, lambda c: self._run(c, name, params))

    def write_guarded(self, name: str, params: dict[str, Any], idle_limit: float) -> list[Any]:
        if not self.mariadb:  # MySQL 8 has no such setting: the README names the limit
            return self.tx(None, lambda c: self._run(c, name, params))
        # MariaDB's idle_transaction_timeout (whole seconds), set with this transaction's
        # BEGIN and put back with its COMMIT: no round trip of its own.
        return self._own_tx(lambda c: self._run(c, name, params), self._idle_guard(idle_limit))

    def guard_idle(self, c: pymysql.Connection, idle_limit: float) -> None:
        if not self.mariadb:
            return  # MySQL 8 has no such setting: the README names the limit
        # Set now, put back when the connection goes back to the pool.
        guard, self._restore[id(c)] = self._idle_guard(idle_limit)
        with c.cursor() as cur:
            cur.execute(guard)

    @staticmethod
    def _idle_guard(idle_limit: float) -> tuple[str, str]:
        """MariaDB's idle_transaction_timeout (whole seconds) for one transaction: the
        statement that sets it and the one that puts back IDLE_IN_TRANSACTION."""
        return (f"SET SESSION idle_transaction_timeout = {max(1, math.ceil(idle_limit))}",
                f"SET SESSION idle_transaction_timeout = {IDLE_IN_TRANSACTION}")

    def write_count(self, name: str, params: dict[str, Any]) -> int:
        if len(STATEMENTS[name]) > 1:  # lock, then write: the rows its SELECT picked
            return len(self.write(name, params))
        args = {k: _param(v) for k, v in params.items()}
        (statement,) = STATEMENTS[name]
        with self._connection() as c, c.cursor() as cur:
            return int(self._retry_deadlock(lambda: cur.execute(statement, args)))

    def _retry_deadlock(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` again when InnoDB rolled it back as a deadlock victim (only for work
        of our own: the whole transaction was rolled back, so nothing of it stays)."""
        for attempt in range(DEADLOCK_RETRIES):
            try:
                return fn()
            except pymysql.err.OperationalError as exc:
                if _code(exc) != DEADLOCK or attempt == DEADLOCK_RETRIES - 1:
                    raise
            time.sleep(random.uniform(0, 0.002 * 2 ** attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _own_tx(self, fn: Callable[[pymysql.Connection], T],
                session: tuple[str, str] | None = None) -> T:
        """``fn`` in a transaction of ours on a pooled connection, run again if InnoDB chose
        it as a deadlock victim. ``session``: a setting for this transaction only, as
        (statement that sets it, statement that puts it back); both ride with statements
        the transaction sends anyway (its first one, its COMMIT), so it costs no round trip."""
        setting = [session[0]] if session is not None else []
        with self._connection() as c:
            if session is not None:
                self._restore[id(c)] = session[1]
            def once() -> T:
                self._begin[id(c)] = [*setting, "BEGIN"]  # goes with the first statement (_run)
                try:
                    result = fn(c)
                except BaseException:
                    self._begin.pop(id(c), None)
                    if c.open:
                        c.rollback()
                    raise
                if self._begin.pop(id(c), None) is not None:
                    return result  # nothing ran: nothing to commit
                # The setting is forgotten only once the COMMIT that puts it back has
                # gone through: a COMMIT that fails (a deadlock at commit on a cluster,
                # retried by _retry_deadlock) leaves it to be put back later.
                restore = self._restore.get(id(c))
                if restore is None or not c.client_flag & CLIENT.MULTI_STATEMENTS:
                    c.commit()  # (a setting is put back on return to the pool)
                    return result
                with c.cursor() as cur:  # one round trip for both
                    cur.execute(f"COMMIT;\n{restore}")  # raises if the COMMIT failed
                    self._restore.pop(id(c), None)
                    try:
                        cur.nextset()
                    except pymysql.err.MySQLError:
                        # Committed, but the setting may have stayed: this connection
                        # must not serve again (the pool drops a closed one).
                        with contextlib.suppress(Exception):
                            c.close()
                return result

            return self._retry_deadlock(once)

    def on(self, conn: Any, fn: Callable[[Any], T], atomic: bool = False,
           single_write: bool = False) -> T:
        if conn is not None:
            c = self._caller_connection(conn)
            # Your connection in autocommit, outside a transaction: the operation's
            # statements still commit together (a bulk insert's rows, and the ids it hands
            # back in the order given before anyone may claim them). Inside your
            # transaction: under a savepoint, since an error in MySQL undoes only the
            # statement that failed (a bulk insert cut into statements, one of them killed,
            # left the others' jobs to your COMMIT).
            with _callers_errors():
                if (not single_write and id(c) not in self._call_savepoint
                        and self._in_transaction(c)):
                    return self._all_or_nothing(c, fn)
                return self._atomic(c, fn) if atomic else fn(c)
        if atomic:
            return self._own_tx(fn)
        with self._connection() as c:
            return self._retry_deadlock(lambda: fn(c))

    def _all_or_nothing(self, c: pymysql.Connection, fn: Callable[[Any], T]) -> T:
        """``fn(c)`` in the caller's open transaction, its writes undone if it raises: a
        savepoint set before its first write (``before_write``; none for a call that only
        reads), rolled back to on an error. Not released when it returns (a round trip a
        call): the next call's SAVEPOINT of the same name replaces it, and the caller's
        COMMIT or ROLLBACK ends it."""
        key = id(c)
        self._call_savepoint[key] = False
        try:
            result = fn(c)
        except BaseException as exc:
            if self._call_savepoint.pop(key, False) and _code(exc) != DEADLOCK and c.open:
                # (a deadlock victim's transaction was rolled back whole: no savepoint left)
                try:
                    with c.cursor() as cur:
                        cur.execute("ROLLBACK TO SAVEPOINT justonce_call")
                except pymysql.err.MySQLError as undo:
                    if not isinstance(exc, Exception):
                        raise exc from undo  # (an interrupt stays one: the caller stops)
                    if _code(undo) in GONE or not c.open:
                        raise  # the session and its transaction are gone (_callers_errors)
                    raise DatabaseUnavailable(
                        f"MySQL: this call failed ({exc!r}) and what it wrote in your "
                        f"transaction could not be undone ({undo.args[-1]}): roll your "
                        "transaction back") from exc
            raise
        self._call_savepoint.pop(key, None)
        return result

    def before_write(self, c: pymysql.Connection) -> None:
        """The savepoint of the call running on the caller's connection ``c``
        (``_all_or_nothing``), if it is not set yet."""
        if self._call_savepoint.get(id(c)) is False:
            with c.cursor() as cur:
                cur.execute("SAVEPOINT justonce_call")
            self._call_savepoint[id(c)] = True

    def database_mark(self, c: pymysql.Connection) -> Any:
        try:
            rows = self.rows(c, "database_mark", {})
        except pymysql.err.MySQLError as exc:
            if _code(exc) in (NO_SUCH_TABLE, NO_DATABASE):
                return None
            if _code(exc) == SELECT_DENIED:
                raise InvalidOption(
                    "conn's user may not read justonce_migrations: grant it SELECT there (conn= "
                    "is checked to reach this App's database)") from None
            if _code(exc) == TABLE_DEF_CHANGED:
                raise InvalidOption(
                    "conn's transaction began before justonce's tables were made or migrated "
                    "(its snapshot cannot read them): commit or roll it back, then call again"
                ) from None
            raise
        if not rows:
            return None
        mark, offset, mode, *charsets = rows[0]
        _check_session(_text(mode or ""), [None if x is None else _text(x) for x in charsets])
        if offset:
            raise InvalidOption(
                f"conn's session is not in UTC (its NOW() is {int(offset) / 3600:+g} h from "
                "UTC_TIMESTAMP()): justonce keeps its times in UTC and reads the clock with "
                "NOW(6), so every lease, delay and expiry would move by that much: run "
                "SET time_zone = '+00:00' on it")
        return int(mark)

    def other_database(self, mine: Any, theirs: Any) -> str | None:
        if theirs is None:
            return "does not reach justonce's tables (no justonce_migrations in its database)"
        return super().other_database(mine, theirs)

    def plain(self, c: pymysql.Connection, text: str) -> None:
        with c.cursor() as cur:
            cur.execute(text)

    def live_key_holders(self, c: pymysql.Connection, keys: Sequence[Any]) -> list[dict[str, Any]]:
        found = self._run(c, "job_live_by_keys", {"keys": list(keys)}, dicts=True)
        missing = sorted(set(keys) - {r["key"] for r in found})
        if not missing or id(c) in self._own:  # (ours read committed rows: READ COMMITTED)
            return found
        # A caller's transaction may read a snapshot (REPEATABLE READ, the server's default)
        # older than the holder whose key refused the insert: a locking read sees it. (Or
        # the holder finished meanwhile: the insert is tried again.)
        return found + self._run(c, "job_live_by_keys_locked", {"keys": missing}, dicts=True)

    def caller_in_transaction(self, conn: pymysql.Connection) -> bool:
        return self._in_transaction(conn)

    def _caller_connection(self, conn: Any) -> pymysql.Connection:
        if not isinstance(conn, pymysql.connections.Connection):
            raise InvalidOption(
                f"conn must be an open pymysql Connection to this database, not {type(conn).__name__}"
            )
        if not conn.open:
            raise InvalidOption("conn is closed")
        if conn.charset.lower() != "utf8mb4":
            # (latin1 or utf8mb3 cannot carry every argument, result or key: 4-byte UTF-8;
            # the session's own character sets are checked with the database (database_mark))
            raise InvalidOption(f"conn must be opened with charset='utf8mb4' (PyMySQL's default), "
                                f"not {conn.charset!r}")
        self._ensure_schema()
        if id(conn) not in self._own:
            with _callers_errors():  # (the check's read is the first to find a lost session)
                self.same_database(conn)
        return conn

    @staticmethod
    def _caller_autocommit_tx(c: pymysql.Connection, fn: Callable[[Any], T]) -> T:
        with c.cursor() as cur:
            cur.execute("BEGIN")
            try:
                result = fn(c)
            except BaseException as exc:
                if _code(exc) != DEADLOCK:  # (a deadlock victim was rolled back already)
                    cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")
        return result

    def _atomic(self, c: pymysql.Connection, fn: Callable[[Any], T]) -> T:
        """``fn(c)`` in the transaction ``c`` is in (or one of ours about to begin), else
        in one of its own: for operations that take several statements on a connection in
        autocommit mode, where each statement would commit on its own."""
        if id(c) in self._begin or self._in_transaction(c):
            return fn(c)
        return self._caller_autocommit_tx(c, fn)

    @staticmethod
    def _in_transaction(c: pymysql.Connection) -> bool:
        return bool(c.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS) or not c.get_autocommit()

    def _isolation(self, c: pymysql.Connection) -> str:
        variable = "@@tx_isolation" if self.mariadb else "@@transaction_isolation"
        with c.cursor() as cur:
            cur.execute(f"SELECT {variable}")
            row = cur.fetchone()
        return str(row[0]) if row else "unknown"

    def tx(self, conn: Any, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        if conn is None:
            return self._own_tx(fn)
        c = self._caller_connection(conn)
        with _callers_errors():
            level = "READ-COMMITTED" if id(c) in self._own else self._isolation(c)
        if level != "READ-COMMITTED":
            raise InvalidOption(
                "batch operations on your connection need READ COMMITTED isolation (each "
                f"statement must see what committed before it), not {level}: run "
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED, or use another connection"
            )
        own = not self._in_transaction(c)
        with _callers_errors(), c.cursor() as cur:
            cur.execute("BEGIN" if own else "SAVEPOINT justonce")
            try:
                result = fn(c)
            except BaseException as exc:
                if _code(exc) == DEADLOCK:
                    raise  # InnoDB rolled back the caller's whole transaction already
                cur.execute("ROLLBACK" if own else "ROLLBACK TO SAVEPOINT justonce")
                raise
            cur.execute("COMMIT" if own else "RELEASE SAVEPOINT justonce")
        return result

    def locked_tx(self, conn: Any, lock_timeout: float, fn: Callable[[Any], T]) -> T:
        # innodb_lock_wait_timeout takes whole seconds: a wait is bounded by the timeout
        # rounded up (at least 1 s).
        seconds = max(1, math.ceil(lock_timeout))

        def bounded(c: pymysql.Connection) -> T:  # (a caller's connection keeps its own)
            with _lock_wait(c, seconds):
                return fn(c)

        try:
            if conn is None:  # ours: set with the BEGIN, put back with the COMMIT
                return self._own_tx(fn, (f"SET SESSION innodb_lock_wait_timeout = {seconds}",
                                         "SET SESSION innodb_lock_wait_timeout = @justonce_lock_wait"))
            return self.tx(conn, bounded)
        except pymysql.err.OperationalError as exc:
            if _code(exc) == LOCK_WAIT:
                raise LockTimeout(f"a ledger entry stayed locked for {lock_timeout:g}s") from exc
            raise

    @contextmanager
    def transaction(self) -> Iterator[pymysql.Connection]:
        with self._connection() as c:
            # One of ours: this database, READ COMMITTED (set at connect); the checks a
            # caller's connection gets on every call (two round trips) are not needed.
            self._own.add(id(c))
            try:
                c.begin()
                try:
                    yield c
                except BaseException:
                    if c.open:
                        c.rollback()
                    raise
                c.commit()
            finally:
                self._own.discard(id(c))

    def fence_connection(self, conn: Any) -> pymysql.Connection:
        c = self._caller_connection(conn)
        if not self._in_transaction(c):
            raise InvalidOption("fence() needs your open transaction on conn (conn.begin() "
                                "first, or a connection with autocommit off)")
        return c

    def row_lock(self, conn: Any, table: str, column: str, value: Any, timeout: float) -> bool:
        c = self.fence_connection(conn)
        t = ".".join(f"`{part}`" for part in table.split("."))
        with _lock_wait(c, max(1, math.ceil(timeout))), c.cursor() as cur:
            try:
                return cur.execute(f"SELECT 1 FROM {t} WHERE `{column}` = %s FOR UPDATE",
                                   (value,)) > 0
            except pymysql.err.OperationalError as exc:
                if _code(exc) == LOCK_WAIT:
                    raise LockTimeout(
                        f"row {table}.{column} = {shown(value)} stayed locked for {timeout:g}s") from exc
                raise

    def time(self, value: Any) -> datetime | None:
        return _aware(value)

    def at(self, value: datetime | None) -> Any:
        return None if value is None else _naive(value)

    def json(self, value: Any) -> Any:
        if isinstance(value, bytes):
            value = value.decode()
        return json.loads(value) if isinstance(value, str) else value

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, pymysql.err.IntegrityError) and _code(exc) == DUPLICATE

    # -- the effect ledger in bulk ------------------------------------------------------------------
    def _count(self, c: pymysql.Connection, statements: Sequence[str], args: dict[str, Any]) -> int:
        """Run ``statements`` in order (one round trip on our own connections, whose
        pending BEGIN rides with them as in ``_run``); the last one's affected rows."""
        if self._call_savepoint:
            self.before_write(c)
        todo = self._with_begin(c, statements)
        with c.cursor() as cur:
            if c.client_flag & CLIENT.MULTI_STATEMENTS:
                cur.execute(";\n".join(todo), args)
                for _ in todo[1:]:
                    cur.nextset()
            else:
                for statement in todo:
                    cur.execute(statement, args)
            return int(cur.rowcount)

    def claim_new_effects(self, c: pymysql.Connection, params: dict[str, Any], n: int) -> list[Any]:
        # Every key inserted was inserted claimed with token 1, by this chunk. The insert's
        # count says how many keys were new: all of them (a bulk run's first pass) or none
        # (a re-run over entries that all exist) needs no second look. Otherwise the keys
        # the chunk does not hold are read (the few that existed), not the ones it does.
        # The count is trusted only where the connection counts rows changed rather than
        # found (CLIENT_FOUND_ROWS: a key inserted meanwhile would count too); there, the
        # rows inserted are read back. So they are when the keys read do not add up with
        # the count: a key taken for new by mistake would run its effect again.
        if c.client_flag & CLIENT.FOUND_ROWS:
            return self._run(c, "effect_claim_new_many", params)
        insert, read_back = STATEMENTS["effect_claim_new_many"]
        args = {k: _param(v) for k, v in params.items()}
        keys: list[str] = json.loads(args["keys"])
        inserted = self._count(c, [insert], args)
        if inserted == n:
            return [(k, 1) for k in keys]
        if inserted == 0:
            return []
        there = {_text(r[0]) for r in self._run(c, "effect_claim_new_others", params)}
        new = [(k, 1) for k in keys if k not in there]
        if len(new) == inserted and len(there) == n - inserted:
            return new
        with c.cursor() as cur:
            cur.execute(read_back, args)
            return [(_text(k), t) for k, t in cur.fetchall()]

    # -- bulk inserts ----------------------------------------------------------------------------------
    def insert_rows(self, c: pymysql.Connection, jobs: Sequence[NewJob],
                    params: Callable[[NewJob], dict[str, Any]]) -> list[int | None]:
        # Every job is inserted in the order given (its id ascends with it: jobs run in that
        # order), a keyed job without its key; then the keys are set in key order. Only the
        # keys take locks another transaction may wait on (the live-key unique index), so
        # two bulk inserts of the same keys take them in one order and cannot deadlock.
        # A key a live job holds (or an earlier job of this call) refuses its job: None, as
        # job_insert answers. Keys held already are looked up first and their jobs not
        # inserted at all (a client retrying a whole call sends only such keys); one taken
        # meanwhile fails its update, and that job is deleted again.
        keys = sorted({j.key for j in jobs if j.key is not None})
        held = ({r["key"] for r in self._run(c, "job_live_by_keys", {"keys": keys}, dicts=True)}
                if keys else set())
        out: list[int | None] = []
        for job in jobs:
            if job.key is not None and job.key in held:
                out.append(None)
                continue
            held.add(job.key)  # (a second job of the key in this call is refused)
            p = params(job)
            out.append(int(self.rows(c, "job_insert", {**p, "key": None} if job.key else p)[0][0]))
        keyed = sorted((i for i, j in enumerate(jobs) if j.key is not None and out[i] is not None),
                       key=lambda i: (jobs[i].key, i))
        # The keys' updates go many to a round trip where the connection takes several
        # statements (ours do): MySQL stops a batch at its first error, so a refused key
        # ends its batch there and the next batch starts after it.
        per_trip = 500 if c.client_flag & CLIENT.MULTI_STATEMENTS else 1
        [take_key] = STATEMENTS["job_take_key"]
        with c.cursor() as cur:
            texts = [cur.mogrify(take_key, {"id": out[i], "key": jobs[i].key}) for i in keyed]
        at = 0
        if keyed and self._call_savepoint:
            self.before_write(c)
        while at < len(keyed):
            batch = keyed[at:at + per_trip]
            ran = 0
            with c.cursor() as cur:
                text = ";\n".join(texts[at:at + per_trip])
                try:
                    cur.execute(text)
                    ran = 1
                    while ran < len(batch):
                        cur.nextset()
                        ran += 1
                except pymysql.err.IntegrityError as exc:
                    if _code(exc) != DUPLICATE:
                        raise
                    refused = batch[ran]  # a live job (or an earlier job of this call) holds its key
                    self._run(c, "job_drop_unkeyed", {"id": out[refused]})
                    out[refused] = None
                    at += ran + 1
                    continue
            at += len(batch)
        return out

    def insert_calls(self, c: pymysql.Connection, params: dict[str, Any], args_doc: str,
                     kwargs_doc: str) -> list[int]:
        if not self.consecutive_ids:
            # innodb_autoinc_lock_mode = 2 (MySQL 8's default) interleaves the ids of
            # concurrent multi-row inserts: one row at a time, each with its own id.
            prefix = params.get("item_prefix")

            def one_by_one(c: pymysql.Connection) -> list[int]:
                out = []
                for i, (a, k) in enumerate(zip(json.loads(args_doc), json.loads(kwargs_doc),
                                               strict=True)):
                    row = {**params, "args": json_text(a), "kwargs": json_text(k), "key": None,
                           "batch_item": None if prefix is None else f"{prefix}{i}"}
                    out.append(int(self._run(c, "job_insert", row)[0][0]))
                return out

            return self._atomic(c, one_by_one)
        if self.mariadb:
            ids = self._insert_doc(c, params, args_doc, kwargs_doc)
            if ids is not None:
                return ids
        args, kwargs = json.loads(args_doc), json.loads(kwargs_doc)
        if len(args) != len(kwargs):
            raise InvalidOption("args and kwargs lists differ in length")
        if not args:
            return []
        # The row's constant part is rendered once; only the arguments (and the item) are
        # escaped per row.
        marked = {**{k: _param(v) for k, v in params.items()},
                  "args": _MARK, "kwargs": _MARK, "batch_item": _MARK}
        with c.cursor() as cur:
            parts = cur.mogrify(Q["job_insert_row"], marked).split(c.escape(_MARK))
        if len(parts) != 4:
            raise AssertionError("job_insert_row must name args, kwargs and batch_item once")
        prefix = params.get("item_prefix")
        dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        empty: dict[str, str] = {}  # the common kwargs, escaped once

        # The connection's escaping: it follows the session's NO_BACKSLASH_ESCAPES (ours
        # never have it; a caller's is refused with it, but escaping as the server reads is
        # what keeps a value from ending its string).
        escape = c.escape

        def literal(value: Any) -> str:
            return escape(dumps(value))

        def repr_item(i: int) -> str:
            return escape(f"{prefix}{i}")

        def kwargs_literal(value: Any) -> str:
            if not value:
                return empty.setdefault("{}", literal({}))
            return literal(value)

        rows = [
            f"{parts[0]}{literal(a)}{parts[1]}{kwargs_literal(k)}{parts[2]}"
            f"{'NULL' if prefix is None else repr_item(i)}{parts[3]}"
            for i, (a, k) in enumerate(zip(args, kwargs, strict=True))]
        sizes = [len(r) if r.isascii() else len(r.encode()) for r in rows]
        budget = self.statement_bytes
        if sum(sizes) + len(sizes) <= budget:  # (the common case: one statement)
            return _consecutive(self._run(c, "job_insert_values", params,
                                          splice=",".join(rows)), len(rows))
        # Cut into statements under the server's packet limit, in one transaction: each
        # draws consecutive ids, in order.
        pieces: list[tuple[int, int]] = []
        at = 0
        while at < len(rows):
            end, size = at, 0
            while end < len(rows) and (end == at or size + sizes[end] + 1 <= budget):
                size += sizes[end] + 1
                end += 1
            if size > budget:
                raise InvalidOption(
                    f"job {at} of this call is {size:,} bytes as SQL, more than the MySQL "
                    f"server takes in one statement (max_allowed_packet)")
            pieces.append((at, end))
            at = end

        def cut(c: pymysql.Connection) -> list[int]:
            out: list[int] = []
            for at, end in pieces:
                out += _consecutive(self._run(c, "job_insert_values", params,
                                              splice=",".join(rows[at:end])), end - at)
            return out

        return self._atomic(c, cut)

    def _insert_doc(self, c: pymysql.Connection, params: dict[str, Any], args_doc: str,
                    kwargs_doc: str) -> list[int] | None:
        """job_insert_doc where the calls differ in one of args or kwargs only (every entry
        of the other list is empty); None where they differ in both, or where the list is
        nested deeper than MariaDB's JSON functions read (job_insert_values takes both)."""
        if _ALL_EMPTY_KWARGS.fullmatch(kwargs_doc):
            doc, fixed = args_doc, {"args": None, "kwargs": "{}"}
            n = (len(kwargs_doc) - 1) // 3  # "[" + "{}," * (n - 1) + "{}]"
        elif _ALL_EMPTY_ARGS.fullmatch(args_doc):
            doc, fixed = kwargs_doc, {"args": "[]", "kwargs": None}
            n = (len(args_doc) - 1) // 3
        else:
            return None
        if len(json.loads(doc)) != n:
            raise InvalidOption("args and kwargs lists differ in length")
        if 2 * len(doc) * (1 if doc.isascii() else 4) > self.statement_bytes:
            return None  # (escaped, it may not fit one statement: job_insert_values cuts)
        try:
            got = self._run(c, "job_insert_doc", {**params, **fixed, "doc": doc})
        except pymysql.err.MySQLError as exc:
            if _code(exc) == JSON_TOO_DEEP:  # the statement changed nothing
                return None
            raise
        return _consecutive(got, n)

    # -- schema, clock, waiting --------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._connection(schema=False) as c, c.cursor() as cur:
            cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
                        " AND TABLE_NAME = 'justonce_migrations'")
            if not cur.fetchone():
                return 0
            try:
                cur.execute("SELECT COALESCE(MAX(version), 0) FROM justonce_migrations")
            except pymysql.err.OperationalError as exc:
                raise _foreign_migrations(exc) from None
            row = cur.fetchone()
            return int(row[0]) if row else 0

    def migrate(self) -> list[str]:
        """Apply missing migrations. MySQL commits each DDL statement on its own, so a
        migration is not atomic; concurrent migrators take turns on a named lock, and a
        migration that failed half-way is reported with its name."""
        applied: list[str] = []
        with self._connection(schema=False) as c, c.cursor() as cur:
            cur.execute("SELECT GET_LOCK(CONCAT(DATABASE(), '.justonce_migrate'), 60)")
            row = cur.fetchone()
            if not row or row[0] != 1:
                raise DatabaseUnavailable("another process held the migration lock for 60 s")
            try:
                cur.execute(
                    "CREATE TABLE IF NOT EXISTS justonce_migrations ("
                    " version INT PRIMARY KEY, name VARCHAR(200) NOT NULL,"
                    " applied_at DATETIME(6) NOT NULL DEFAULT NOW(6))"
                    " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
                try:
                    cur.execute("SELECT version FROM justonce_migrations")
                except pymysql.err.OperationalError as exc:
                    raise _foreign_migrations(exc) from None
                done = {r[0] for r in cur.fetchall()}
                for version, name, text in MIGRATIONS:
                    if version in done:
                        continue
                    if not self.mariadb:
                        text = text.replace("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
                    try:
                        for statement in _statements(_strip_comments(text)):
                            cur.execute(statement)
                    except pymysql.err.MySQLError as exc:
                        # Table exists, no such column, duplicate column or index name:
                        # another product's tables under justonce's names, most likely.
                        foreign = bool(exc.args) and exc.args[0] in (1050, 1054, 1060, 1061)
                        if not foreign:
                            raise SchemaError(f"migration {name} failed: {exc}") from exc
                        raise SchemaError(f"migration {name} failed: {exc} (tables of something "
                                          "else here? use another database)") from None
                    cur.execute("INSERT INTO justonce_migrations (version, name) VALUES (%s, %s)",
                                (version, name))
                    applied.append(name)
            finally:
                cur.execute("SELECT RELEASE_LOCK(CONCAT(DATABASE(), '.justonce_migrate'))")
        self._schema_ok = True
        return applied

    def now(self) -> datetime:
        value = self.read("db_now", {})[0][0]
        return _aware(value)  # type: ignore[return-value]

    def waiter(self, queues: Sequence[str], listen: bool = True) -> MySQLWaiter:
        return MySQLWaiter(self, queues)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


@contextmanager
def _lock_wait(c: pymysql.Connection, seconds: int) -> Iterator[None]:
    """``innodb_lock_wait_timeout`` for a while on ``c``, then its value before again (the
    caller's connection keeps its own setting)."""
    with c.cursor() as cur:
        cur.execute("SELECT @@innodb_lock_wait_timeout")
        row = cur.fetchone()
        cur.execute("SET SESSION innodb_lock_wait_timeout = %s", (seconds,))
    try:
        yield
    finally:
        if c.open:
            with c.cursor() as cur:
                cur.execute("SET SESSION innodb_lock_wait_timeout = %s",
                            (int(row[0]) if row else 50,))


def _strip_comments(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("--"))


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for col in JOB_COLUMNS_JSON:
        decode_column(row, col)  # (a corrupt column is marked, not raised: Job.undecodable)
    for col in JOB_COLUMNS_TIME:
        if col in row:
            row[col] = _aware(row[col])
    return row


class MySQLWaiter:
    """No notifications between sessions: an idle worker looks for a ready job of its
    queues every ``EVERY`` seconds (one index probe) and returns when there is one."""

    EVERY = 0.05

    def __init__(self, dialect: MySQLDialect, queues: Sequence[str]) -> None:
        self.dialect = dialect
        self.queues = list(queues)
        self._stop = threading.Event()

    def wait(self, timeout: float, idle_for: float = 0.0) -> None:
        # The first look comes after EVERY, not at once: the caller's claim just came back
        # empty, so ready jobs seen now are ones it could not take (another worker's
        # partition slots, keys held by a running job, a standby's queue) and returning at
        # once would spin on claim and probe.
        deadline = time.monotonic() + timeout
        while not self._stop.wait(min(self.EVERY, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return
            try:
                if self.dialect.read("jobs_ready_in", {"queues": self.queues}):
                    return
            except (DatabaseUnavailable, pymysql.err.MySQLError):
                pass

    def close(self) -> None:
        self._stop.set()


class MySQLListOps(ListOps):
    """Lists, with items loaded by multi-row INSERTs."""

    mysql: MySQLDialect

    def insert_items(self, c: Any, list_id: int, start: int, items: Sequence[str]) -> None:
        # PyMySQL's executemany sends an INSERT ... VALUES as multi-row INSERTs of up to
        # 1 MB each, instead of one round trip per item (the Dialect's many()).
        self.mysql.before_write(c)
        with c.cursor() as cur:
            cur.executemany(STATEMENTS["list_item_insert"][0], [
                {"list_id": list_id, "position": start + i, "item": item}
                for i, item in enumerate(items)])


class MySQLBackend(Store):
    """The Store on MySQL 8 or MariaDB 10.6+."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.mysql = MySQLDialect(url, connect_timeout=connect_timeout)
        super().__init__(self.mysql)
        self.lists = MySQLListOps(self.mysql, self.batches)
        self.lists.mysql = self.mysql


__all__ = ["MySQLBackend", "MySQLDialect", "parse_mysql_url"]


def _foreign_migrations(exc: Exception) -> Exception:
    """A justonce_migrations table that is not justonce's (no version column): a SchemaError;
    any other error as it was."""
    if getattr(exc, "args", None) and exc.args[0] == 1054:  # ER_BAD_FIELD_ERROR
        return SchemaError(f"justonce_migrations here is not justonce's ({exc.args[1]}): use "
                           "another database")
    return exc
