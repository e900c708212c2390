"""Every dialect's queries.sql names the same statements with the same parameters: the one
Store (backends/store.py) runs them all. A statement only one dialect needs says so with a
``-- dialect-only: why`` line; a parameter a dialect deliberately ignores, with ``-- unused:``."""

from __future__ import annotations

import re
from pathlib import Path

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
