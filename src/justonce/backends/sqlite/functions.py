"""SQL functions justonce registers on SQLite connections, and SQLite's slot expression.

SQLite has no CRC-32: ``justonce_crc32`` is registered on every connection justonce opens,
and :func:`register_functions` registers it on yours (for a text-key slot predicate).
"""

from __future__ import annotations

import sqlite3
import zlib
from typing import Any


def register_functions(conn: sqlite3.Connection) -> None:
    """Make ``justonce_crc32(text or blob)`` available on ``conn``."""
    conn.create_function("justonce_crc32", 1, _crc32, deterministic=True)


def _crc32(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        return zlib.crc32(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return zlib.crc32(value)
    return zlib.crc32(str(value).encode())


def slot_sql(col: str, n: int, key_type: str, schema: str | None) -> str:
    """The slot of (validated) column ``col`` among ``n``: see partitions.slot_expression."""
    if key_type == "int":
        return f"((({col}) % {n}) + {n}) % {n}"
    return f"(justonce_crc32({col}) % {n})"
