"""Demonstrations that run on real worker processes (``justonce demo …``), and the two
helpers they share: a plain connection to the demo's database, and stopping workers."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ..lifeline import end_with_parent

PARENT_ENV = "JUSTONCE_DEMO_PARENT"
"""Set by a demo in the environment of the workers it starts: its own pid."""


def worker_env(env: Mapping[str, str], url: str) -> dict[str, str]:
    """``env`` for a worker this demo process starts on the database at ``url``: with the
    demo's pid, so that the worker stops once the demo is gone (:func:`exit_with_parent`).
    The URL goes in the environment, not on the worker's command line, where ``ps`` would
    show its password to every user of the machine."""
    return {**env, PARENT_ENV: str(os.getpid()), "JUSTONCE_DATABASE_URL": url}


def exit_with_parent() -> None:
    """In a demo's worker process (its app module calls this): stop the worker gracefully
    (SIGTERM to itself) once the demo that started it has gone. A demo killed with SIGKILL,
    or whose terminal closed, left its workers polling the database for ever, the Push's
    sender threads and SMTP connections with them. Outside a demo's worker: nothing."""
    raw = os.environ.get(PARENT_ENV, "")
    if not (raw.isascii() and raw.isdigit()):
        return
    end_with_parent(int(raw), name="justonce-demo-parent")


def connect(url: str) -> Any:
    """A plain autocommit DB-API connection to the database of a justonce URL (the demos
    keep their own tables there)."""
    if url.startswith("sqlite:"):
        from ..backends.sqlite.backend import parse_sqlite_url

        path, _ = parse_sqlite_url(url)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=30000")
        return conn
    if url.split(":", 1)[0] in ("mysql", "mariadb"):
        return MySQLConnection(url)
    import psycopg

    from ..backends.postgres.backend import parse_postgres_url, pgbouncer_mode

    conninfo, schema, options = parse_postgres_url(url)
    if pgbouncer_mode(options):
        return BouncedPostgres(conninfo, schema)
    if schema:
        return psycopg.connect(conninfo, autocommit=True, options=f"-c search_path={schema}")
    return psycopg.connect(conninfo, autocommit=True)


class BouncedPostgres:
    """psycopg through PgBouncer in transaction mode (``?pgbouncer=1``), as justonce's own
    connections do it: nothing prepared (the next statement may land on another server
    connection), and with ``?schema=`` every statement runs in a transaction that sets
    ``search_path`` first (PgBouncer refuses the startup option, and a session ``SET``
    would stay on a server connection that other clients get next)."""

    def __init__(self, conninfo: str, schema: str | None) -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
        self.schema = schema

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor in a transaction of its own, with the schema set."""
        with self.conn.transaction():
            cur = self.conn.cursor()
            if self.schema is not None:
                cur.execute("SELECT set_config('search_path', %s, true)", (self.schema,))
            yield cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self.schema is None:  # (nothing to set: one statement, one round trip)
            return self.conn.execute(sql, tuple(params) or None)
        with self.transaction() as cur:
            cur.execute(sql, tuple(params) or None)
            return cur  # (its rows were fetched with the result: readable after the commit)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        with self.transaction() as cur:
            cur.executemany(sql, rows)
            return cur

    def maintain(self, command: str, table: str) -> None:
        """``VACUUM``-like commands, which cannot run inside a transaction: the table is
        named with its schema instead."""
        name = f'"{self.schema}".{table}' if self.schema is not None else table
        self.conn.execute(f"{command} {name}")

    def close(self) -> None:
        self.conn.close()


class MySQLConnection:
    """PyMySQL with the shape the demos use of sqlite3 and psycopg connections:
    ``execute`` returns a cursor; ``%s`` placeholders; autocommit."""

    def __init__(self, url: str) -> None:
        import pymysql

        from ..backends.mysql.backend import parse_mysql_url

        kwargs, _ = parse_mysql_url(url)
        self.conn = pymysql.connect(**kwargs, autocommit=True, charset="utf8mb4")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self.conn.cursor()
        cur.execute(sql, tuple(params) or None)
        return cur

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        cur = self.conn.cursor()
        cur.executemany(sql, rows)  # PyMySQL sends INSERT … VALUES rows as multi-row inserts
        return cur

    def close(self) -> None:
        self.conn.close()


def broken(conn: Any) -> bool:
    """Whether a demo connection was lost (the server ended it, or the network broke): every
    statement on it fails from then on, so it is replaced, not kept (a thread that kept its
    lost connection failed each job it ran until their attempts ran out)."""
    if isinstance(conn, sqlite3.Connection):
        return False
    if isinstance(conn, MySQLConnection):
        return not conn.conn.open
    return bool((conn.conn if isinstance(conn, BouncedPostgres) else conn).closed)


def thread_connection(local: threading.local, url: str,
                      prepare: Callable[[Any], None] | None = None) -> Any:
    """This thread's demo connection to ``url``: made on first use, and made again when the
    one it had was lost; ``prepare`` runs on each new one (its session's settings)."""
    conn = getattr(local, "conn", None)
    if conn is not None and broken(conn):
        with contextlib.suppress(Exception):
            conn.close()
        conn = None
    if conn is None:
        conn = local.conn = connect(url)
        if prepare is not None:
            prepare(conn)
    return conn


def dialect(conn: Any) -> str:
    """"sqlite", "mysql" or "postgres": for the demos' few dialect-specific statements."""
    if isinstance(conn, sqlite3.Connection):
        return "sqlite"
    return "mysql" if isinstance(conn, MySQLConnection) else "postgres"


def stop_workers(procs: Sequence[subprocess.Popen[Any]], wait: float = 30) -> None:
    """SIGTERM every worker still running (a graceful stop), then wait; kill what hangs."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
