"""Demonstrations that run on real worker processes (``justonce demo …``), and the two
helpers they share: a plain connection to the demo's database, and stopping workers."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
from collections.abc import Sequence
from typing import Any


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

    from ..backends.postgres.backend import parse_postgres_url

    conninfo, schema, _ = parse_postgres_url(url)
    if schema:
        return psycopg.connect(conninfo, autocommit=True, options=f"-c search_path={schema}")
    return psycopg.connect(conninfo, autocommit=True)


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
