#!/usr/bin/env python3
"""Partitioned jobs per second: W worker processes started with ``--partitions bench:W``
drain N keyed jobs (K keys, one job per key at a time, in enqueue order).

    python bench/partitioned_jobs.py --database-url postgresql://postgres@127.0.0.1/test \\
        --jobs 20000 --keys 400 --workers 4 --rounds 3 --variant before=/tmp/old/src --variant after=src

Each ``--variant NAME=SRC`` is a source tree of justonce (``src`` of a checkout); the rounds
alternate the variants (before, after, before, after, …) so both meet the same machine
state. Per run: a fresh schema (Postgres), database (MariaDB/MySQL) or file (SQLite), W
workers started and ready, then N jobs enqueued in one bulk call, timed from the enqueue's
return to the last success. Prints one line per run and the medians; ``--json-out`` appends JSON lines.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

APP = '''
import justonce
app = justonce.App()

@app.task(queue="pt", max_attempts=5)
def step(key: int, i: int) -> None:
    pass
'''

SETUP = '''
import bench_pt_app as m
m.app.migrate()
'''

ENQUEUE = '''
import sys, time, json, justonce, bench_pt_app as m
n, k = int(sys.argv[1]), int(sys.argv[2])
reqs = [justonce.Enqueue(m.step, args=(i % k, i), partition_key=i % k) for i in range(n)]
t0 = time.perf_counter()
m.app.enqueue_many(reqs)
print(json.dumps({"enqueued_at": time.time(), "enqueue_s": time.perf_counter() - t0}))
'''


def count_succeeded(url: str) -> int:
    if url.startswith("sqlite"):
        import sqlite3
        conn = sqlite3.connect(url[len("sqlite:///"):].split("?", 1)[0], timeout=30)
        try:
            return conn.execute("SELECT count(*) FROM justonce_jobs WHERE state = 'succeeded'").fetchone()[0]
        finally:
            conn.close()
    if url.startswith(("mysql", "mariadb")):
        import pymysql

        from justonce.backends.mysql.backend import parse_mysql_url
        kwargs, _ = parse_mysql_url(url)
        conn = pymysql.connect(**kwargs, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM justonce_jobs WHERE state = 'succeeded'")
                return int(cur.fetchone()[0])
        finally:
            conn.close()
    import psycopg
    base, _, query = url.partition("?")
    schema = dict(p.split("=", 1) for p in query.split("&") if p).get("schema")
    with psycopg.connect(base, autocommit=True) as conn:
        table = f'"{schema}".justonce_jobs' if schema else "justonce_jobs"
        return conn.execute(f"SELECT count(*) FROM {table} WHERE state = 'succeeded'").fetchone()[0]


def one_run(name: str, src: str, url: str, args: argparse.Namespace, folder: Path) -> dict:
    env = dict(os.environ, JUSTONCE_DATABASE_URL=url,
               PYTHONPATH=os.pathsep.join([str(Path(src).resolve()), str(folder)]))
    py = sys.executable
    subprocess.run([py, "-c", SETUP, str(args.jobs), str(args.keys)], env=env, check=True, cwd=folder)
    procs = []
    logs = []
    for w in range(args.workers):
        log = open(folder / f"{name}-w{w}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(subprocess.Popen(
            [py, "-m", "justonce", "worker", "--app", "bench_pt_app:app", "--queues", "pt",
             "--partitions", f"bench:{args.workers}", "--concurrency", str(args.concurrency),
             "--log-level", "WARNING"], env=env, cwd=folder, stdout=log, stderr=log))
    try:
        time.sleep(args.warmup)  # every worker holds its slot
        out = subprocess.run([py, "-c", ENQUEUE, str(args.jobs), str(args.keys)], env=env,
                             check=True, cwd=folder, capture_output=True, text=True)
        enq = json.loads(out.stdout.strip().splitlines()[-1])
        deadline = time.time() + args.timeout
        while True:
            done = count_succeeded(url)
            if done >= args.jobs:
                break
            if time.time() > deadline:
                raise SystemExit(f"{name}: timed out with {done}/{args.jobs} done")
            time.sleep(0.02)
        took = time.time() - enq["enqueued_at"]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()
    return {"variant": name, "jobs": args.jobs, "keys": args.keys, "workers": args.workers,
            "backend": url.split(":", 1)[0], "drain_s": round(took, 3),
            "jobs_per_s": round(args.jobs / took, 1), "enqueue_s": round(enq["enqueue_s"], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test",
                    help="a Postgres or MariaDB/MySQL server URL, or 'sqlite' for a temp file per run")
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=400)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=SRC, a justonce source tree (default: this checkout's src)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    variants = [v.split("=", 1) for v in args.variant] or [["this", str(HERE.parent / "src")]]
    results: dict[str, list[float]] = {name: [] for name, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "bench_pt_app.py").write_text(APP)
        for r in range(args.rounds):
            for name, src in variants:
                with contextlib.ExitStack() as stack:
                    if args.database_url == "sqlite":
                        url = f"sqlite:///{folder / f'{name}-{r}.db'}"
                    elif args.database_url.startswith(("mysql", "mariadb")):
                        from justonce.testing.databases import fresh_mysql
                        url = stack.enter_context(fresh_mysql(args.database_url, prefix="bench"))
                    else:
                        from justonce.testing.databases import fresh_postgres
                        url = stack.enter_context(fresh_postgres(args.database_url, prefix="bench"))
                    res = one_run(name, src, url, args, folder)
                res["round"] = r
                results[name].append(res["jobs_per_s"])
                print(json.dumps(res), flush=True)
                if args.json_out:
                    with open(args.json_out, "a") as f:
                        f.write(json.dumps(res) + "\n")
    for name, vals in results.items():
        print(f"{name}: median {statistics.median(vals):,.0f} jobs/s over {len(vals)} runs: "
              + ", ".join(f"{v:,.0f}" for v in vals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
