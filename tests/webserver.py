"""A real ``justonce serve`` process for the service tests, and a client for it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def justonce(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a child process (inherits PYTHONPATH)."""
    r = subprocess.run([sys.executable, "-m", "justonce", *args], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    if ok:
        assert r.returncode == 0, r.stderr
    return r


@dataclass
class Server:
    url: str
    db_url: str
    admin: str
    reader: str
    process: subprocess.Popen[bytes]

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@contextmanager
def serving(db_url: str, log: Path, *serve_args: str, migrate: bool = True) -> Iterator[Server]:
    """Migrate, create an admin and a read token with the CLI, start ``justonce serve`` on
    a free loopback port and wait for its OpenAPI document; terminate it at the end.
    ``migrate=False``: none of that before the start (no tokens: ``admin``/``reader`` empty)."""
    admin = reader = ""
    if migrate:
        justonce("migrate", "--database-url", db_url)
        admin = justonce("tokens", "create", "--name", "test admin", "--scope", "admin",
                         "--database-url", db_url).stdout.strip()
        reader = justonce("tokens", "create", "--name", "test reader", "--scope", "read",
                          "--database-url", db_url).stdout.strip()
    port = free_port()
    env = {**os.environ, "JUSTONCE_SECRET_KEY": uuid.uuid4().hex,  # --app proc_app:app imports
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "justonce", "serve", "--port", str(port), "--database-url", db_url,
             *serve_args],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/openapi.json", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"justonce serve did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    try:
        yield Server(url, db_url, admin, reader, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def serving_with_ledger(backend: str, folder: Path, *serve_args: str) -> Iterator[Server]:
    """``serving`` on a fresh database of ``backend`` (sqlite, postgres or mysql: a file in
    ``folder``, a scratch schema, a scratch database), with the tests' effect ledger table."""
    import proc_app
    from conftest import _drop_schema, mysql_database, mysql_or_skip, postgres_or_skip

    if backend == "sqlite":
        with serving(f"sqlite:///{folder / 'jobs.db'}", folder / "serve.log", *serve_args) as s:
            proc_app.create_ledger(s.db_url)
            yield s
        return
    if backend == "mysql":
        with mysql_database(mysql_or_skip()) as url, serving(url, folder / "serve.log", *serve_args) as s:
            proc_app.create_ledger(url)
            yield s
        return
    base = postgres_or_skip()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        with serving(f"{base}{'&' if '?' in base else '?'}schema={schema}", folder / "serve.log",
                     *serve_args) as s:
            proc_app.create_ledger(s.db_url)
            yield s
    finally:
        _drop_schema(base, schema)
