"""justonce direct vs through PgBouncer (transaction mode), in one run.

For each path, in a fresh schema: one-by-one enqueue/s, bulk enqueue/s (``enqueue_calls``
in chunks of 5,000), and processed/s: worker processes (``--no-listen`` on both paths,
so only the pooler differs) are started and idle, then N no-op jobs are enqueued in bulk
and the clock runs until the last one succeeded. The PgBouncer path starts its own
pgbouncer (1.18 here) on a free loopback port with a pool big enough for every client
(so it measures the extra hop, not queueing for server connections) and uses
``?schema=…&pgbouncer=1``.

    python bench/pgbouncer.py -n 20000 --single 2000 --workers 4      # from the repo root
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import justonce

app = justonce.App(os.environ.get("JUSTONCE_DATABASE_URL"), strict=False)


@app.task(name="bench.noop")
def noop(i: int) -> None:
    pass


HERE = Path(__file__).resolve().parent


def start_pgbouncer(server_url: str, folder: Path, pool: int) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if exe is None:
        sys.exit("pgbouncer is not installed")
    s = urlsplit(server_url)
    db, user = s.path.lstrip("/") or "postgres", s.username or "postgres"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n{db} = host={s.hostname or '127.0.0.1'} port={s.port or 5432} dbname={db}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\npool_mode = transaction\n"
        f"default_pool_size = {pool}\nmax_client_conn = 1000\n")
    cmd = [exe, *(["-u", "postgres"] if os.geteuid() == 0 else []), str(folder / "pgbouncer.ini")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"postgresql://{user}@127.0.0.1:{port}/{db}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("pgbouncer did not start")


def succeeded(a: justonce.App) -> int:
    return sum(c.count for c in a.queue_counts() if str(c.state) == "succeeded")


def measure(url: str, direct_url: str, n: int, single: int, workers: int, concurrency: int,
            folder: Path) -> dict[str, float]:
    schema = f"bench_pgb_{uuid.uuid4().hex[:8]}"
    justonce.App(f"{direct_url}?schema={schema}", strict=False).migrate()
    sep = "&" if "?" in url else "?"
    url = f"{url}{sep}schema={schema}"
    app.use_database(url)
    out: dict[str, float] = {}
    try:
        t = time.perf_counter()
        for i in range(single):
            app.enqueue("bench.noop", [i])
        out["single enqueue / s"] = single / (time.perf_counter() - t)
        t = time.perf_counter()
        for lo in range(0, n, 5000):
            app.enqueue_calls("bench.noop", [(i,) for i in range(lo, min(n, lo + 5000))])
        out["bulk enqueue / s"] = n / (time.perf_counter() - t)

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
        env.pop("JUSTONCE_DATABASE_URL", None)
        logs = [folder / f"{schema}-w{k}.log" for k in range(workers)]
        procs = []
        for log in logs:
            with open(log, "wb") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "justonce", "worker", "--app", "pgbouncer:app",
                     "--database-url", url, "--queues", "default", "--concurrency",
                     str(concurrency), "--no-listen", "--poll", "0.05", "--log-level", "WARNING"],
                    env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                    start_new_session=True))
        try:
            while succeeded(app) < n + single:  # the enqueue phases' jobs first (warm-up)
                time.sleep(0.1)
            t = time.perf_counter()
            for lo in range(0, n, 5000):
                app.enqueue_calls("bench.noop", [(i,) for i in range(lo, min(n, lo + 5000))])
            target = 2 * n + single
            while succeeded(app) < target:
                time.sleep(0.02)
            out["processed / s"] = n / (time.perf_counter() - t)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(30)
        errors = [ln for log in logs for ln in log.read_text(errors="replace").splitlines()
                  if '"level": "warning"' in ln or '"level": "error"' in ln]
        out["worker warnings/errors"] = len(errors)
    finally:
        app.close()
        import psycopg
        with psycopg.connect(direct_url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("-n", type=int, default=20000, help="jobs for bulk enqueue and processing")
    ap.add_argument("--single", type=int, default=2000, help="jobs enqueued one by one")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="justonce-bench-pgb-"))
    folder.chmod(0o755)
    # Each worker process pools up to 10 connections, plus the producer.
    bouncer, via = start_pgbouncer(args.database_url, folder, pool=10 * (args.workers + 1))
    try:
        rows = {
            "direct": measure(args.database_url, args.database_url, args.n, args.single,
                              args.workers, args.concurrency, folder),
            "PgBouncer": measure(f"{via}?pgbouncer=1", args.database_url, args.n, args.single,
                                 args.workers, args.concurrency, folder),
        }
    finally:
        bouncer.send_signal(signal.SIGTERM)
        bouncer.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    print(f"justonce, PostgreSQL, ?schema=, N = {args.n:,}, {args.workers} workers "
          f"x {args.concurrency}, --no-listen")
    print(f"{'':24s}{'direct':>12s}{'PgBouncer':>12s}{'ratio':>8s}")
    for key in rows["direct"]:
        d, b = rows["direct"][key], rows["PgBouncer"][key]
        ratio = f"{b / d:.2f}" if d else "-"
        print(f"{key:24s}{d:12,.0f}{b:12,.0f}{ratio:>8s}")


if __name__ == "__main__":
    main()
