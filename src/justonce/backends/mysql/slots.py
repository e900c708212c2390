"""MySQL's and MariaDB's slot expression (see partitions.slot_expression): ``CRC32()`` and
``MOD()`` are built in. A text column must be utf8mb4 (``CRC32`` hashes the column's
bytes in its own character set; justonce hashes UTF-8)."""

from __future__ import annotations


def slot_sql(col: str, n: int, key_type: str, schema: str | None) -> str:
    """The slot of (validated) column ``col`` among ``n``."""
    if key_type == "int":
        return f"MOD(MOD({col}, {n}) + {n}, {n})"
    return f"MOD(CRC32({col}), {n})"
