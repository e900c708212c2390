"""Start a PgBouncer (Debian's ``pgbouncer``) in transaction mode in front of a Postgres
server, on a free loopback port: for tests/test_pgbouncer.py and the torture scenarios."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from .pgcluster import free_port


def pgbouncer_bin() -> str | None:
    # Debian installs it in /usr/sbin, which a non-root PATH may lack.
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")


def start_pgbouncer(server_url: str, folder: Path,
                    pool_size: int = 4) -> tuple[subprocess.Popen[bytes], str]:
    """A pgbouncer in transaction mode in front of ``server_url``; returns the process and
    the URL of the same database through it. RuntimeError when it does not start."""
    server = urlsplit(server_url)
    dbname = server.path.lstrip("/") or "postgres"
    user = server.username or "postgres"
    port = free_port()
    (folder / "userlist.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(f"""\
[databases]
{dbname} = host={server.hostname or '127.0.0.1'} port={server.port or 5432} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / 'userlist.txt'}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 500
""")
    cmd = [pgbouncer_bin() or "pgbouncer", str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root; it reads its files first
        cmd[1:1] = ["-u", "postgres"]
    with open(folder / "pgbouncer.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    deadline = time.monotonic() + 10
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {proc.returncode}:\n"
                               f"{(folder / 'pgbouncer.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("pgbouncer did not listen within 10 s") from None
            time.sleep(0.05)
    return proc, f"postgresql://{user}@127.0.0.1:{port}/{dbname}"
