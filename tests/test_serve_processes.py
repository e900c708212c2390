"""``justonce serve --workers N`` as processes: its workers end with it."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from fleet import wait_for
from webserver import serving


def _children(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.add(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_workers_of_a_serve_killed_with_sigkill_stop_and_free_the_port(tmp_path: Path) -> None:
    """kill -9 of the supervisor of `serve --workers 2` left its worker processes serving
    for ever, holding the port (a restart failed with "address already in use"). Each
    worker now watches its parent and stops itself once it has gone."""
    db_url = f"sqlite:///{tmp_path / 'serve.db'}"
    with serving(db_url, tmp_path / "serve.log", "--workers", "2") as server:
        workers = wait_for(lambda: _children(server.process.pid) if len(
            _children(server.process.pid)) >= 2 else None, 30, "two worker processes")
        port = int(server.url.rsplit(":", 1)[1])
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
        try:
            wait_for(lambda: not any(_alive(p) for p in workers), 20,
                     "the orphaned workers to stop")
        finally:
            for pid in workers:  # (so that a failure leaves nothing serving)
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)

        def port_free() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) != 0

        assert wait_for(port_free, 10, "the port to be free")
