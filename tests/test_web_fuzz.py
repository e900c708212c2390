"""A schema-driven fuzz of the whole API from its own OpenAPI document (schemathesis): as
an admin, no answer may be a 5xx, and every answer must match the document (status code
and body schema). Short in CI; ``JUSTONCE_FUZZ_EXAMPLES=500`` for a long run."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest

from conftest import _drop_schema, mysql_database, mysql_or_skip, postgres_or_skip
from webserver import serving

EXAMPLES = int(os.environ.get("JUSTONCE_FUZZ_EXAMPLES", "6"))
ST = Path(sys.executable).with_name("st")


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql"])
def test_fuzzing_the_api_finds_no_server_error_and_no_schema_mismatch(backend: str, tmp_path: Path) -> None:
    if not ST.exists():
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    with ExitStack() as stack:
        if backend == "sqlite":
            db_url = f"sqlite:///{tmp_path / 'jobs.db'}"
        elif backend == "mysql":
            db_url = stack.enter_context(mysql_database(mysql_or_skip()))
        else:
            base = postgres_or_skip()
            schema = f"t_{uuid.uuid4().hex[:12]}"
            db_url = f"{base}{'&' if '?' in base else '?'}schema={schema}"
            stack.callback(_drop_schema, base, schema)
        with serving(db_url, tmp_path / "serve.log") as server:
            r = subprocess.run(
                [str(ST), "run", f"{server.url}/openapi.json",
                 "-H", f"Authorization: Bearer {server.admin}",
                 "-c", "not_a_server_error,response_schema_conformance,status_code_conformance",
                 "-n", str(EXAMPLES), "--phases", "examples,fuzzing", "--seed", "7",
                 "--suppress-health-check", "all", "--no-color"],
                capture_output=True, text=True, timeout=600, cwd=tmp_path)  # its cache stays there
            log = (tmp_path / "serve.log").read_text()
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
        assert "Traceback" not in log, log[-4000:]
