"""Backends: pick one from a database URL."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..validate import shown
from .base import Backend

DEFAULT_URL = "sqlite:///justonce.db"


def resolve_url(url: str | None) -> str:
    """The URL given, else ``$JUSTONCE_DATABASE_URL``, else the embedded default."""
    return url or os.environ.get("JUSTONCE_DATABASE_URL") or DEFAULT_URL


def open_backend(url: str | None = None) -> Backend:
    """Open the backend named by the URL's scheme.

    ``sqlite:///relative.db``, ``sqlite:////absolute/path.db`` (query options
    ``synchronous``, ``busy_timeout``), ``postgresql://user@host:port/db`` (query option
    ``schema`` to keep justonce's tables in a schema of their own),
    ``mysql://user:password@host:port/db`` or ``mariadb://…`` (MySQL 8, MariaDB 10.6+).
    """
    url = resolve_url(url)
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"malformed database URL {shown(url)}: expected sqlite:///path.db, "
            "postgresql://user@host:port/dbname or mysql://user:password@host:port/dbname"
        )
    if "\x00" in url or not url.isascii() and not _encodable(url):
        # sqlite3 and the drivers raise ValueError / UnicodeEncodeError for these.
        raise ConfigurationError(f"malformed database URL {shown(url)}: it contains a NUL "
                                 "character or a lone surrogate")
    try:
        parts = urlsplit(url)
        _ = parts.port  # (raises for a port out of range or not a number)
    except ValueError as exc:  # "Invalid IPv6 URL": a '[' without its ']', say
        raise ConfigurationError(f"malformed database URL (not shown: it may hold a password): "
                                 f"{exc}") from None
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        from .sqlite.backend import SQLiteBackend

        return SQLiteBackend(url)
    if scheme in ("postgresql", "postgres"):
        from .postgres.backend import PostgresBackend

        return PostgresBackend(url)
    if scheme in ("mysql", "mariadb"):
        from .mysql.backend import MySQLBackend

        return MySQLBackend(url)
    raise ConfigurationError(
        f"unsupported database URL scheme {shown(scheme)} in {shown(url)}: use sqlite:///path.db, "
        "postgresql://user@host:port/dbname or mysql://user:password@host:port/dbname"
    )


def _encodable(url: str) -> bool:
    try:
        url.encode()
    except UnicodeEncodeError:
        return False
    return True


__all__ = ["Backend", "DEFAULT_URL", "open_backend", "resolve_url"]
