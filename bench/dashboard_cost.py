"""What the dashboard costs the database with 1,000,000 jobs in the table (PostgreSQL).

1. The database time of one snapshot refresh (each dashboard statement timed on its own,
   and the whole refresh), on a jobs table of --rows rows bulk-inserted with generate_series.
2. Whether ten open dashboards (10 clients polling /dashboard/snapshot every second over
   HTTP) slow the workers: 4 worker processes drain --jobs noop jobs, without and with them.

    PYTHONPATH=src python bench/dashboard_cost.py [--rows 1000000] [--jobs 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from justonce import App
from justonce.web.snapshot import Snapshots

SERVER = os.environ.get("JUSTONCE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
APP = "import justonce\napp = justonce.App()\n\n@app.task(queue='bench')\ndef noop(i: int) -> None:\n    pass\n"
FILL = """
INSERT INTO justonce_jobs (queue, task, args, state, max_attempts, timeout, created_at, run_at,
                           finished_at, last_error)
SELECT 'q' || (i %% 4), 'bench.fill', jsonb_build_array(i),
       CASE WHEN i %% 100 < 90 THEN 'succeeded' WHEN i %% 100 < 95 THEN 'ready'
            WHEN i %% 100 < 99 THEN 'dead' ELSE 'cancelled' END,
       3, 60, now() - interval '2 hours', now() - interval '2 hours',
       CASE WHEN i %% 100 < 90 OR i %% 100 >= 95 THEN now() - (i %% 7200) * interval '1 second' END,
       CASE WHEN i %% 100 BETWEEN 95 AND 98 THEN 'boom' END
  FROM generate_series(1, %(rows)s) i
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pollers", type=int, default=10)
    args = ap.parse_args()
    schema = f"bench_dash_{os.getpid()}"
    url = f"{SERVER}?schema={schema}"
    with psycopg.connect(SERVER, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    try:
        app = App(url, strict=False)
        app.migrate()
        t0 = time.perf_counter()
        with psycopg.connect(SERVER, autocommit=True) as c:
            c.execute(f"SET search_path = {schema}")
            c.execute(FILL, {"rows": args.rows})
            c.execute("VACUUM ANALYZE justonce_jobs")
        print(f"filled {args.rows:,} jobs in {time.perf_counter() - t0:.1f} s", flush=True)
        b = app.backend
        # Every statement of a refresh, timed where it runs (round trip included): the
        # median over ten refreshes after the first (which also back-fills the series).
        took: dict[str, list[float]] = {}
        read = b._b_read

        def timed_read(name: str, params: dict[str, Any]) -> list[Any]:
            t = time.perf_counter()
            try:
                return read(name, params)
            finally:
                took.setdefault(name, []).append((time.perf_counter() - t) * 1000)

        b._b_read = timed_read  # type: ignore[method-assign]
        snaps = Snapshots(app, interval=0)
        snaps.get()
        took.clear()
        # _refresh, not get: get would serve the cached snapshot (a refresh spaces the next
        # one out by ten times its cost); this times ten refreshes back to back.
        costs = sorted(snaps._refresh().cost_ms for _ in range(10))
        b._b_read = read  # type: ignore[method-assign]
        stmt = {k: round(sorted(v)[len(v) // 2], 2) for k, v in took.items()}
        for label, fn in (("batch_list", lambda: b.batch_list(None, 20)),
                          ("lease_list", lambda: b.lease_list(None)),
                          ("effects_in_doubt", lambda: b.effects_in_doubt(None, 50))):
            ts = []
            for _ in range(10):
                t = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t) * 1000)
            stmt[label] = round(sorted(ts)[5], 2)
        print(json.dumps({"statement_ms": stmt, "refresh_ms_median": round(costs[5], 2),
                          "refresh_ms_max": round(costs[-1], 2),
                          "counts_sample": {f"{q}/{s}": f"{c.n} {c.kind}"
                                            for (q, s), c in sorted(b.dash_counts().items())}},
                         indent=1), flush=True)
        results: dict[int, list[float]] = {}
        for pollers in (0, args.pollers, 0, args.pollers):  # alternating: the machine is shared
            results.setdefault(pollers, []).append(drain(url, args, pollers, app))
        print(json.dumps({"drain_jobs_per_s": results}), flush=True)
        base = sum(results[0]) / len(results[0])
        loaded = sum(results[args.pollers]) / len(results[args.pollers])
        print(f"with {args.pollers} dashboards: {loaded / base:.3f} of the throughput without "
              f"(means of two runs each)")
        app.close()
    finally:
        with psycopg.connect(SERVER, autocommit=True) as c:
            c.execute(f"DROP SCHEMA {schema} CASCADE")


def drain(url: str, args: argparse.Namespace, pollers: int, app: App) -> float:
    folder = Path(tempfile.mkdtemp())
    (folder / "bench_dash_app.py").write_text(APP)
    # Absolute paths: the workers run in ``folder``, where a relative PYTHONPATH=src would
    # silently import another installed justonce.
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, JUSTONCE_DATABASE_URL=url,
               PYTHONPATH=os.pathsep.join([*paths, str(folder)]))
    _, secret = app.tokens.create("bench", "read")
    port = 18000 + os.getpid() % 1000
    serve = subprocess.Popen([sys.executable, "-m", "justonce", "serve", "--port", str(port)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = [subprocess.Popen([sys.executable, "-m", "justonce", "worker", "--app",
                                 "bench_dash_app:app", "--queues", "bench", "--log-level", "WARNING"],
                                env=env, cwd=folder) for _ in range(args.workers)]
    stop = threading.Event()
    polls = [0]

    def poll() -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/dashboard/snapshot",
                                     headers={"Authorization": f"Bearer {secret}"})
        while not stop.is_set():
            try:
                urllib.request.urlopen(req, timeout=5).read()
                polls[0] += 1
            except OSError:
                pass
            stop.wait(1.0)

    threads = [threading.Thread(target=poll) for _ in range(pollers)]
    try:
        time.sleep(3)
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        app.enqueue_calls("bench_dash_app.noop", [(i,) for i in range(args.jobs)], queue="bench")
        while True:
            left = app.list_jobs(queue="bench", state="ready", limit=1)
            running = app.list_jobs(queue="bench", state="running", limit=1)
            if not left and not running:
                break
            time.sleep(0.05)
        took = time.perf_counter() - t0
    finally:
        stop.set()
        for t in threads:
            t.join()
        for p in [*workers, serve]:
            p.terminate()
        for p in [*workers, serve]:
            p.wait(30)
    rate = round(args.jobs / took, 1)
    print(f"pollers={pollers}: {args.jobs} jobs in {took:.2f} s = {rate}/s ({polls[0]} polls)", flush=True)
    return rate


if __name__ == "__main__":
    main()
