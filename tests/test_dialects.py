"""Every dialect's queries.sql names the same statements with the same parameters: the one
Store (backends/store.py) runs them all. A statement only one dialect needs says so with a
``-- dialect-only: why`` line; a parameter a dialect deliberately ignores, with ``-- unused:``."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent / "src" / "justonce" / "backends"
DIALECTS = {"postgres": "pyformat", "sqlite": "named", "mysql": "pyformat"}
PG_ONLY_PARAMS = {"channel"}  # the NOTIFY channel: only PostgreSQL wakes workers in SQL


def _blocks(dialect: str) -> dict[str, str]:
    text = (ROOT / dialect / "queries.sql").read_text()
    parts = re.split(r"^--\s*name:\s*(\w+)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _code(body: str) -> str:
    return "\n".join(ln for ln in body.splitlines() if not ln.lstrip().startswith("--"))


def _params(blocks: dict[str, str], name: str, style: str) -> set[str]:
    code = _code(blocks[name])
    if style == "pyformat":
        found = set(re.findall(r"%\((\w+)\)s", code)) - {"picked"}
    else:
        found = set(re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", code))
    for included in re.findall(r"\{\{(\w+)\}\}", code):
        found |= _params(blocks, included, style)
    for line in blocks[name].splitlines():
        if line.lstrip().startswith("-- unused:"):
            found |= {p.strip() for p in line.split(":", 1)[1].split(",")}
    return found


def _only(blocks: dict[str, str]) -> set[str]:
    return {n for n, b in blocks.items() if re.search(r"^--\s*dialect-only:", b, re.M)}


def _present() -> dict[str, dict[str, str]]:
    return {d: _blocks(d) for d in DIALECTS if (ROOT / d / "queries.sql").exists()}


def test_every_dialect_names_the_same_statements() -> None:
    all_blocks = _present()
    assert {"postgres", "sqlite"} <= set(all_blocks)
    shared = {d: set(b) - _only(b) for d, b in all_blocks.items()}
    reference = shared["postgres"]
    for dialect, names in shared.items():
        assert names == reference, (
            f"{dialect}: missing {sorted(reference - names)}, "
            f"undeclared extras {sorted(names - reference)} (mark them -- dialect-only)")


@pytest.mark.parametrize("dialect", [d for d in DIALECTS if d != "postgres"])
def test_every_shared_statement_takes_the_same_parameters(dialect: str) -> None:
    all_blocks = _present()
    if dialect not in all_blocks:
        pytest.fail(f"no {dialect} queries.sql")
    pg, other = all_blocks["postgres"], all_blocks[dialect]
    for name in sorted((set(pg) - _only(pg)) & set(other)):
        want = _params(pg, name, "pyformat") - PG_ONLY_PARAMS
        got = _params(other, name, DIALECTS[dialect])
        assert got == want, f"{dialect}.{name}: takes {sorted(got)}, postgres {sorted(want)}"


def test_dialect_only_statements_are_used_by_their_dialect_alone() -> None:
    # A dialect-only statement must not be run by the shared Store.
    store = (ROOT / "store.py").read_text() + "".join(
        (ROOT / f).read_text() for f in ("batchstore.py", "leasestore.py", "effectstore.py",
                                         "servicestore.py", "dashstore.py"))
    for dialect, blocks in _present().items():
        for name in _only(blocks):
            assert f'"{name}"' not in store, f"the shared Store runs {dialect}-only {name}"


# -- result columns: every dialect's statement returns as many columns as PostgreSQL's -----------

FRAGMENTS = {"claim_lease", "claim_returning", "effect_columns", "job_filter", "match_cancel", "match_retry"}
SAMPLES: dict[str, Any] = {
    "id": 1, "ids": [1], "tokens": [1], "results": [None], "notes": [None], "queue": "q",
    "queues": ["q"], "task": "t", "args": "[]", "kwargs": "{}", "priority": 0, "delay": 0.0,
    "run_at": None, "max_attempts": 1, "timeout": 1.0, "key": "k", "keys": ["k"],
    "partition_key": None, "partition_hash": None, "batch_item": None, "channel": "justonce",
    "limit": 1, "owner": "o", "lease": 1.0, "set": "s", "n": 1, "slots": [0], "slot": 0,
    "token": 1, "refund": False, "retry_in": None, "error": "e", "kind": "error",
    "keep_succeeded": 1.0, "keep_dead": 1.0, "name": "n", "interval": 1.0,
    "description": None, "callbacks": "{}", "expire_after": 1.0, "count": 1, "group_id": "g",
    "sizes": [1], "reason": "r", "item": "1:g:0", "batch_id": 1, "acked": 0, "failed": 0,
    "state": "active", "retention": 1.0, "scope": "read", "policy": "at_most_once", "result": None,
    "note": None, "force": False, "secret_hash": "h", "prefix": "p", "token_id": None,
    "actor": "a", "action": "x", "target": None, "detail": "{}", "cursor": None,
    "created_after": None, "created_before": None, "max_id": None, "since": 0.0, "cap": 1,
    "item_prefix": None, "bits": b"\x00", "pending": 0, "chunk": 0, "after": None,
    "list_id": 1, "next_position": 0, "total": 0, "position": 0, "lo": 0, "hi": 1,
    "secret": "0123456789abcdef", "request_id": None, "due_in": 1.0, "ranges": "[]",
    "held": "[]", "budget": 1, "positions": "[]",
    "attempt": 1, "ttr": 1.0, "errors": [None], "rows": "[[\"k\",1,null,null]]",
}


def _sample_params(name: str, pg_text: str) -> dict[str, Any]:
    """Every parameter a statement may take; a list travels as JSON where PostgreSQL's
    statement reads it as JSON (batch and dashboard lists), as an array elsewhere."""
    out = {}
    for param, value in SAMPLES.items():
        as_json = isinstance(value, list) and f"%({param})s::jsonb" in pg_text
        out[param] = json.dumps(value) if as_json else value
    return out


def _columns_postgres(app: Any, name: str, params: dict[str, Any]) -> int:
    with app.backend.pg._connection() as conn, conn.transaction(force_rollback=True):
        cur = conn.cursor()
        cur.execute(app.backend.pg.queries[name], params)
        return len(cur.description or ())


def _columns_sqlite(app: Any, name: str, params: dict[str, Any]) -> int:
    from justonce.backends.sqlite.backend import _params

    conn = app.backend.sqlite._conn()
    conn.execute("BEGIN")
    try:
        return len(conn.execute(app.backend.sqlite.queries[name], _params(params)).description or ())
    finally:
        conn.execute("ROLLBACK")


def _columns_mysql(app: Any, name: str, params: dict[str, Any]) -> int:
    """A block's rows are those of its last SELECT: describe that one (with an empty pick)."""
    from justonce.backends.mysql.backend import _SELECT, STATEMENTS, _param

    selects = [s for s in STATEMENTS[name] if _SELECT.match(s)]
    if not selects:
        return 0
    args = {k: _param(v) for k, v in params.items()} | {"picked": (0,)}
    with app.backend.mysql._connection() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(selects[-1], args)
            return len(cur.description or ())
        finally:
            cur.execute("ROLLBACK")


def test_every_shared_statement_returns_the_same_columns(tmp_path: Path) -> None:
    """Run every shared statement once on an empty database of each dialect (rolled back)
    and compare the number of result columns with PostgreSQL's. PostgreSQL may return one
    more, trailing column where its statement sends a NOTIFY (pg_notify's result; MySQL
    returns NULL there, SQLite leaves it out)."""
    from conftest import _drop_schema, mysql_database, mysql_or_skip, postgres_or_skip
    from justonce import App

    server = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in server else "?"
    apps = {"postgres": App(f"{server}{sep}schema={schema}"),
            "sqlite": App(f"sqlite:///{tmp_path / 'cols.db'}")}
    with contextlib.ExitStack() as stack:
        apps["mysql"] = App(stack.enter_context(mysql_database(mysql_or_skip())))
        try:
            for app in apps.values():
                app.migrate()
            pg = _blocks("postgres")
            describe = {"postgres": _columns_postgres, "sqlite": _columns_sqlite,
                        "mysql": _columns_mysql}
            differ = []
            for name in sorted(set(pg) - _only(pg) - FRAGMENTS):
                params = _sample_params(name, pg[name])
                got = {}
                for d in apps:
                    try:
                        got[d] = describe[d](apps[d], name, params)
                    except Exception as exc:  # noqa: BLE001 - reported below, all at once
                        differ.append(f"{name} on {d}: {type(exc).__name__}: {exc}")
                if len(got) < len(apps):
                    continue
                notify = "pg_notify" in _code(pg[name])
                for d in ("sqlite", "mysql"):
                    if got[d] != got["postgres"] and not (notify and got[d] == got["postgres"] - 1):
                        differ.append(f"{name}: postgres {got['postgres']}, {d} {got[d]}")
            assert not differ, differ
        finally:
            for app in apps.values():
                app.close()
            _drop_schema(server, schema)


def test_mysql_statements_parse_the_same_under_the_sql_modes_a_callers_session_may_have() -> None:
    """A caller's session (conn=) may run ANSI_QUOTES, PIPES_AS_CONCAT or HIGH_NOT_PRECEDENCE
    (only the modes in REFUSED_SQL_MODES are refused): no statement of the MySQL dialect may
    use a double-quoted string, ``||`` or a ``NOT x BETWEEN``/``NOT x IN`` that those modes
    read otherwise."""
    code = _code((ROOT / "mysql" / "queries.sql").read_text())
    code = re.sub(r"'(?:[^'\\]|\\.|'')*'", "''", code)  # (inside a string they are text)
    assert '"' not in code
    assert "||" not in code
    assert not re.search(r"\bNOT\s+[\w.`]+\s+(?:BETWEEN|IN|LIKE)\b", code, re.I)
