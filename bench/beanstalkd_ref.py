"""beanstalkd as the reference of lists_bench.py: a server of our own, put, reserve+delete.

The server is Debian's ``beanstalkd`` started on a free loopback port with its binlog on
(``-b``) in a fresh directory, and stopped (and the directory removed) afterwards. Its fsync
policy is the server's default unless asked: fsync at most every 50 ms (``-f 50``), so a
power cut may lose up to 50 ms of puts and deletes; ``-f 0`` fsyncs every binlog write, which
is what a committed justonce transaction pays (Postgres ``synchronous_commit`` on, SQLite
``FULL``, InnoDB's default flush at commit).

The client is greenstalk (``pip install -e '.[bench]'``), one TCP connection per process, one
command and one answer per round trip: beanstalkd's protocol has no batch put or reserve.

Worker functions live here, not in the script, so that ``multiprocessing`` (spawn) finds them
by module name in the child.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

TUBE = "lists_bench"


@dataclass(frozen=True)
class Server:
    port: int
    binlog: str
    fsync_ms: int | None
    version: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(fsync_ms: int | None = None, binary: str = "beanstalkd") -> Iterator[Server]:
    """A beanstalkd with a binlog in a fresh directory; ``fsync_ms`` None = its default."""
    path = shutil.which(binary)
    if path is None:
        raise RuntimeError("beanstalkd is not installed (Debian: apt-get install beanstalkd)")
    version = subprocess.run([path, "-v"], capture_output=True, text=True).stdout.strip()
    binlog = tempfile.mkdtemp(prefix="jo-beanstalkd-")
    port = _free_port()
    cmd = [path, "-l", "127.0.0.1", "-p", str(port), "-b", binlog, "-z", str(256 * 1024)]
    if fsync_ms is not None:
        cmd += ["-f", str(fsync_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"beanstalkd did not start: {' '.join(cmd)}: {err}") from None
                time.sleep(0.05)
        yield Server(port, binlog, fsync_ms, version)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(binlog, ignore_errors=True)


def put_all(port: int, bodies: Iterator[str]) -> int:
    """Put every body (one round trip each: the protocol has no batch put); how many."""
    import greenstalk

    n = 0
    with greenstalk.Client(("127.0.0.1", port), use=TUBE, watch=TUBE) as client:
        for body in bodies:
            client.put(body, ttr=60)
            n += 1
    return n


def ready_jobs(port: int) -> int:
    import greenstalk

    with greenstalk.Client(("127.0.0.1", port), use=TUBE, watch=TUBE) as client:
        stats = client.stats_tube(TUBE)
        return int(stats["current-jobs-ready"]) + int(stats["current-jobs-reserved"])


def reserve_delete_worker(port: int, limit: int | None, ready: Any, start: Any, out: Any) -> None:
    """Reserve and delete jobs until none is ready (or ``limit``), decoding each body as a
    list consumer decodes its items; puts (t0, t1, count, ids seen) on ``out``."""
    import greenstalk

    seen: list[int] = []
    with greenstalk.Client(("127.0.0.1", port), use=TUBE, watch=TUBE) as client:
        ready.put(1)
        start.wait()
        t0 = time.perf_counter()
        while limit is None or len(seen) < limit:
            try:
                job = client.reserve(timeout=0)
            except greenstalk.TimedOutError:
                break
            seen.append(json.loads(job.body)["id"])
            client.delete(job)
        t1 = time.perf_counter()
    out.put((t0, t1, len(seen), seen))
