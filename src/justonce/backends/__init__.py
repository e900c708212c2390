"""Backends: pick one from a database URL."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote_to_bytes, urlsplit

from ..errors import ConfigurationError
from ..validate import plain_int, shown
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
            f"malformed database URL {shown(redact_url(url) if isinstance(url, str) else url)}: "
            "expected sqlite:///path.db, postgresql://user@host:port/dbname or "
            "mysql://user:password@host:port/dbname"
        )
    if "\x00" in url or not url.isascii() and not _encodable(url):
        # sqlite3 and the drivers raise ValueError / UnicodeEncodeError for these.
        raise ConfigurationError(f"malformed database URL {shown(redact_url(url))}: it contains a NUL "
                                 "character or a lone surrogate")
    try:
        parts = urlsplit(url)
        _ = parts.port  # (raises for a port out of range or not a number)
    except ValueError as exc:
        # urllib's own words are not shown: they may quote part of a password (the "port"
        # of postgresql://u:pa/ss@h is "pa/ss" up to the "/").
        what = ("an IPv6 host in brackets that do not close or hold no address" if "IPv" in str(exc)
                else "a port that is not a number from 0 to 65535")
        raise ConfigurationError(f"malformed database URL (not shown: it may hold a password): "
                                 f"{what}") from None
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
        f"unsupported database URL scheme {shown(scheme)} in {shown(redact_url(url))}: use "
        "sqlite:///path.db, postgresql://user@host:port/dbname or "
        "mysql://user:password@host:port/dbname"
    )


_PASSWORD_OPTION = re.compile(r"(password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` as justonce shows it (in errors, logs, banners): its password, whether
    ``user:password@`` or a ``password=`` option (libpq takes one), as ``***``.

    It also shows URLs refused as malformed, so it reads them as loosely as it can: the
    password runs from the first ``:`` after the ``//`` (or after the start, for a URL
    that lacks it) to the URL's last ``@``, since a password may hold an unescaped ``/``,
    ``?`` or ``@``. A rare ``@`` in an option after a port masks more than the password;
    never less. A SQLite URL names no user and no host: whatever stands between its
    ``//`` and its path (``sqlite://secret/x.db``) is shown as ``***`` too."""
    at = url.rfind("@")
    if at >= 0:
        start = url.find("//", 0, at)
        start = 0 if start < 0 else start + 2
        colon = url.find(":", start, at)
        if colon >= 0:
            url = f"{url[:colon + 1]}***{url[at:]}"
    if url[:9].lower() == "sqlite://" and url[9:10] not in ("/", ""):
        end = url.find("/", 9)
        url = f"{url[:9]}***{url[end:] if end >= 0 else ''}"
    return _PASSWORD_OPTION.sub(r"\1***", url)


def check_escapes(url: str, kind: str) -> None:
    """Refuse a URL whose %-escapes do not spell UTF-8 (``db_%FF``): psycopg decodes a
    URL's parts as UTF-8 and raised UnicodeDecodeError, and PyMySQL got U+FFFD in the
    byte's place (another database's name, a password it could not send)."""
    try:
        unquote_to_bytes(url).decode()
    except UnicodeDecodeError:
        raise ConfigurationError(
            f"malformed {kind} URL {shown(redact_url(url))}: a %-escape in it is not UTF-8 "
            "(escape each byte of a name's UTF-8 encoding)") from None


def pool_size(options: dict[str, str]) -> int:
    """The ``pool_size`` URL option (default 10): 1 to 1000 in plain digits. int() read
    "1_0" as 10 and " 5" as 5, where every other number of a URL is refused so."""
    raw = options.get("pool_size", "10")
    size = plain_int(raw)
    if size is None or size > 1000:
        raise ConfigurationError(f"pool_size must be a whole number from 1 to 1000 in plain digits, "
                                 f"not {shown(raw)}")
    return size


def _encodable(url: str) -> bool:
    try:
        url.encode()
    except UnicodeEncodeError:
        return False
    return True


__all__ = ["Backend", "DEFAULT_URL", "open_backend", "redact_url", "resolve_url"]
