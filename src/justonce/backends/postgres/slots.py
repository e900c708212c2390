"""PostgreSQL's slot expression (see partitions.slot_expression); ``justonce_crc32`` is
the SQL function migration 0003 creates."""

from __future__ import annotations


def slot_sql(col: str, n: int, key_type: str, schema: str | None) -> str:
    """The slot of (validated) column ``col`` among ``n``."""
    if key_type == "int":
        return f"mod(mod({col}, {n}) + {n}, {n})"
    fn = f"{schema}.justonce_crc32" if schema else "justonce_crc32"
    return f"mod({fn}(convert_to({col}, 'UTF8')), {n})"
