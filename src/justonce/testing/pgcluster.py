"""Find or start a PostgreSQL server for the tests and the torture scenarios.

Order: ``$JUSTONCE_TEST_POSTGRES_URL``; the local server on 127.0.0.1:5432 (database
``test``); else a throwaway cluster made with ``initdb`` / ``pg_ctl`` in a temp folder.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def can_connect(url: str, timeout: float = 3.0) -> str | None:
    """None if a connection works, else the reason."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        with psycopg.connect(url, connect_timeout=int(timeout)) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def pg_bin() -> Path | None:
    """Folder with initdb and pg_ctl, or None."""
    for candidate in [os.environ.get("PGBIN", "")] + sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), reverse=True
    ):
        if candidate and (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A throwaway PostgreSQL cluster (fsync off: it only lives for the test run)."""

    bindir: Path
    datadir: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    @classmethod
    def create(cls) -> Cluster:
        bindir = pg_bin()
        if bindir is None:
            raise RuntimeError("initdb / pg_ctl not found")
        datadir = Path(tempfile.mkdtemp(prefix="justonce-pg-"))
        if os.geteuid() == 0:
            shutil.chown(datadir, "postgres", "postgres")
        cluster = cls(bindir, datadir / "data", free_port())
        cluster._run("initdb", "-D", str(cluster.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        cluster.start()
        return cluster

    def start(self) -> None:
        opts = f"-p {self.port} -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.datadir), "-o", opts, "-w", "-t", "60", "start",
                  "-l", str(self.datadir.parent / "log"))

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop("fast")
        self.start()

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.datadir.parent, ignore_errors=True)


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
