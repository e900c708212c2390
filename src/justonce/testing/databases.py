"""Fresh, empty databases for tests, benchmarks and the torture scenarios.

One place makes them so that every caller names, creates and drops them the same way:
a Postgres schema of its own (justonce creates it on first use; ``?schema=``), a MySQL
database of its own (``utf8mb4``), a SQLite file in a folder the caller owns. Each is
dropped when the ``with`` block ends, whatever happened inside it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

BACKENDS = ("sqlite", "postgres", "mysql")


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@contextmanager
def fresh_postgres(server: str, prefix: str = "jo") -> Iterator[str]:
    """A schema of its own on the Postgres of ``server``: its justonce URL; dropped after."""
    import psycopg

    schema = _name(prefix)
    sep = "&" if "?" in server else "?"
    try:
        yield f"{server}{sep}schema={schema}"
    finally:
        with psycopg.connect(server.split("?", 1)[0], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def fresh_mysql(server: str, prefix: str = "jo") -> Iterator[str]:
    """``CREATE DATABASE <prefix>_<random>`` on the MySQL server of ``server``: its URL
    (the server's, with the database replaced and the options dropped); dropped after."""
    import pymysql

    from ..backends.mysql.backend import parse_mysql_url

    kwargs, _ = parse_mysql_url(server)
    kwargs.pop("database", None)
    name = _name(prefix)
    with pymysql.connect(**kwargs, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    base = server.split("?", 1)[0].rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with pymysql.connect(**kwargs, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


@contextmanager
def fresh_database(backend: str, folder: Path, *, postgres: str, mysql: str,
                   prefix: str = "jo") -> Iterator[str]:
    """A fresh, empty database of ``backend``: a SQLite file in ``folder`` (the caller
    removes the folder), or a schema / database of its own on the ``postgres`` / ``mysql``
    server. Its justonce URL; dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{quote(str(folder / (prefix + '.db')))}"  # (URLs are %-decoded)
    elif backend == "postgres":
        with fresh_postgres(postgres, prefix) as url:
            yield url
    elif backend == "mysql":
        with fresh_mysql(mysql, prefix) as url:
            yield url
    else:
        raise ValueError(f"unknown backend {backend!r}; the backends are {', '.join(BACKENDS)}")
