#!/usr/bin/env python3
"""justonce on MariaDB / MySQL beside a raw-SQL reference, in one run.

Every system gets a FRESH database on the server (``CREATE DATABASE jo_bench_<random>``,
dropped afterwards). Systems:

- ``raw_mysql_b100`` (and ``raw_mysql_b1`` with ``--raw-batches 1,100``): one table, PyMySQL,
  READ COMMITTED; a worker claims up to b jobs with ``SELECT id, args … WHERE state='ready'
  … ORDER BY priority, id LIMIT b FOR UPDATE SKIP LOCKED`` + ``UPDATE … WHERE id IN (…)`` +
  COMMIT, runs them, acks them in one autocommit UPDATE; an empty claim sleeps ``--raw-poll``
  s (MySQL has no notifications). Enqueue: one autocommit INSERT each; bulk: one multi-row
  INSERT per call. The Postgres reference (shared/bench/adapters/raw_sql.py) on MySQL.
- ``justonce_mysql``: ``App(url)``, ``app.migrate()``, a no-op task; enqueue with
  ``task.enqueue(seq)`` and ``task.enqueue_many([(seq,), …])``; workers are
  ``justonce.Worker(app, concurrency=1)`` with the library defaults otherwise.

W1 (throughput): ``--n1`` jobs (2,000) enqueued one by one → ``enqueue_per_s``, the rest of
``-n`` in calls of ``--chunk`` (1,000) → ``enqueue_bulk_per_s``; ``ANALYZE TABLE``; then
``--workers`` (4) processes (multiprocessing, spawn) start together; the parent polls the
pending count every ``--poll`` s (20 ms). ``process_per_s = N / (first poll that sees 0 −
earliest job start recorded by any worker)``. SIGTERM stops the workers; each writes what it
ran → ``duplicates`` and ``missing`` (both must be 0).

W2 (latency): one idle worker, left ``--settle`` s; ``--lat-n`` (300) jobs enqueued one by
one every ``--lat-gap-ms`` (10 ms); latency = task start − ``time.time()`` just before the
enqueue call; nearest-rank p50 / p99.

Every justonce worker also counts the warnings and errors it showed its user (``warnings``).
``--soak MINUTES`` runs mysql_soak.py's long run instead (8 workers, a producer that never
stops, every deadlock or lock wait that reached the user counted).

    /work/main/.venv/bin/python bench/mysql_bench.py -n 20000 --repeat 3 \\
        --json-out bench/results/mysql.jsonl --label mariadb
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from mysql_common import (
    JustonceSystem,
    RawSystem,
    Workers,
    connect,
    count,
    exactly_once,
    fresh_database,
    log,
    merge_traps,
    pct,
    server_version,
    wait_drained,
)

DEFAULT_SERVER = os.environ.get("JUSTONCE_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


def finish(res: dict[str, Any], mon: Any, system: Any, workers: Workers, n: int) -> dict[int, float]:
    records, errors, traps, deadlocks = workers.stop()
    dups, missing, first = exactly_once(records, n)
    res.update(duplicates=dups, missing=missing, left_pending=count(mon, system.pending_sql),
               done_in_db=count(mon, system.done_sql))
    if traps:
        trap = merge_traps(traps)
        res["warnings"] = trap["total"]
        res["warning_kinds"] = trap["counts"]
        if trap["samples"]:
            res["warning_samples"] = trap["samples"][:3]
    if isinstance(system, RawSystem):
        res["deadlocks_retried"] = deadlocks
    if errors:
        res["worker_errors"] = errors[:5]
    return first


# ---- W1 ----------------------------------------------------------------------------------------
def w1(system: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    n = args.n
    res: dict[str, Any] = {"system": system.name, "version": system.version(), "workload": "W1_throughput",
                           "n": n, "workers": args.workers, "procs": args.workers, "concurrency": 1,
                           "enqueue_per_s": None, "enqueue_bulk_per_s": None, "process_per_s": None,
                           "duplicates": None, "missing": None, "poll_s": args.poll}
    system.install()
    system.open()
    try:
        n1 = min(args.n1, n)
        t = time.perf_counter()
        for s in range(n1):
            system.enqueue_one(s)
        res["enqueue_per_s"] = round(n1 / (time.perf_counter() - t), 1) if n1 else None
        rest = list(range(n1, n))
        t = time.perf_counter()
        for i in range(0, len(rest), args.chunk):
            system.enqueue_bulk(rest[i:i + args.chunk])
        if rest:
            res["enqueue_bulk_per_s"] = round(len(rest) / (time.perf_counter() - t), 1)
    finally:
        system.close()
    with connect(system.url) as mon:
        queued = count(mon, system.pending_sql)
        if queued != n:
            res["error"] = f"expected {n} pending after enqueue, found {queued}"
            return res
        with mon.cursor() as cur:  # as the Postgres harness runs ANALYZE, for both systems
            cur.execute("ANALYZE TABLE " + system.pending_sql.split("FROM ")[1].split()[0])
            cur.fetchall()
        workers = Workers(system, args.workers, tmp)
        try:
            workers.start()
            t_done = wait_drained(mon, system, workers, args.timeout, args.poll)
        finally:
            first = finish(res, mon, system, workers, n)
    if t_done is None:
        res["timed_out"] = True
    elif first:
        t0 = min(first.values())
        res["process_per_s"] = round(n / (t_done - t0), 1)
        res["process_s"] = round(t_done - t0, 3)
    return res


# ---- W2 ----------------------------------------------------------------------------------------
def w2(system: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    n = args.lat_n
    res: dict[str, Any] = {"system": system.name, "version": system.version(), "workload": "W2_latency",
                           "n": n, "workers": 1, "procs": 1, "concurrency": 1, "p50_ms": None,
                           "p99_ms": None, "duplicates": None, "missing": None}
    system.install()
    t_enq: dict[int, float] = {}
    with connect(system.url) as mon:
        workers = Workers(system, 1, tmp)
        system.open()
        try:
            workers.start()
            time.sleep(args.settle)  # let the worker reach its idle wait
            gap = args.lat_gap_ms / 1000.0
            t0 = time.perf_counter()
            for s in range(n):
                delay = t0 + s * gap - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                t_enq[s] = time.time()
                system.enqueue_one(s)
            # an idle worker that stopped taking jobs shows up here: do not wait 10 minutes
            if wait_drained(mon, system, workers, min(args.timeout, 120.0), args.poll) is None:
                res["timed_out"] = True
        finally:
            system.close()
            first = finish(res, mon, system, workers, n)
    lat = [(first[s] - t_enq[s]) * 1000.0 for s in first if s in t_enq]
    if lat:
        res["p50_ms"] = round(pct(lat, 0.50) or 0.0, 2)
        res["p99_ms"] = round(pct(lat, 0.99) or 0.0, 2)
        res["max_ms"] = round(max(lat), 2)
        res["mean_ms"] = round(statistics.fmean(lat), 2)
    return res


def measure(make: Any, workload: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One workload of one system in a fresh database."""
    t_wall = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="jo-mysql-bench-")
    res: dict[str, Any]
    try:
        with fresh_database(args.url) as url:
            system = make(url)
            try:
                res = workload(system, args, tmp)
            except Exception as e:  # report it in the table, go on with the others
                res = {"system": system.name, "workload": workload.__name__.upper(),
                       "error": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["wall_s"] = round(time.perf_counter() - t_wall, 2)
    return res


# ---- report ------------------------------------------------------------------------------------
def median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v: float | None, nd: int = 0) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def report(rows: list[dict[str, Any]], systems: list[str], repeats: int) -> str:
    def sel(system: str, workload: str) -> list[dict[str, Any]]:
        return [r for r in rows if r.get("system") == system and r.get("workload") == workload
                and not r.get("error")]

    out = [f"medians over {repeats} round(s); process/s = N / (last completion - first start)", "",
           "| system | enqueue/s (1-by-1) | enqueue/s (bulk) | processed/s | W2 p50 ms | W2 p99 ms "
           "| dup | missing | warnings | runs |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for system in systems:
        a, b = sel(system, "W1_throughput"), sel(system, "W2_latency")
        if not a and not b:
            continue
        out.append(f"| {system} | {fmt(median(a, 'enqueue_per_s'))} | {fmt(median(a, 'enqueue_bulk_per_s'))} | "
                   f"{fmt(median(a, 'process_per_s'))} | {fmt(median(b, 'p50_ms'), 1)} | "
                   f"{fmt(median(b, 'p99_ms'), 1)} | {sum(r.get('duplicates') or 0 for r in a + b)} | "
                   f"{sum(r.get('missing') or 0 for r in a + b)} | "
                   f"{sum(r.get('warnings') or 0 for r in a + b)} | {len(a)} + {len(b)} |")
    failed = [r for r in rows if r.get("error") or r.get("timed_out")]
    for r in failed:
        out.append(f"\n{r.get('system')} {r.get('workload')}: "
                   f"{r.get('error') or 'TIMED OUT'}")
    j1, j2 = sel("justonce_mysql", "W1_throughput"), sel("justonce_mysql", "W2_latency")
    out += ["", "| reference | processed: justonce / raw | bulk enqueue: justonce / raw | "
                "1-by-1 enqueue: justonce / raw | W2 p99: justonce / raw |",
            "|---|---:|---:|---:|---:|"]
    for system in systems:
        if system == "justonce_mysql":
            continue
        r1, r2 = sel(system, "W1_throughput"), sel(system, "W2_latency")
        out.append(f"| {system} | {ratio(median(j1, 'process_per_s'), median(r1, 'process_per_s'))} | "
                   f"{ratio(median(j1, 'enqueue_bulk_per_s'), median(r1, 'enqueue_bulk_per_s'))} | "
                   f"{ratio(median(j1, 'enqueue_per_s'), median(r1, 'enqueue_per_s'))} | "
                   f"{ratio(median(j2, 'p99_ms'), median(r2, 'p99_ms'))} |")
    b1 = sel("raw_mysql_b100", "W1_throughput")
    for label, key in (("processed", "process_per_s"), ("bulk enqueue", "enqueue_bulk_per_s")):
        jv, rv = median(j1, key), median(b1, key)
        if jv is not None and rv:
            out.append(f"\ntarget {label} >= 0.5 x raw_mysql_b100: {jv / rv:.3f} "
                       f"({'met' if jv / rv >= 0.5 else 'NOT met'})")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=DEFAULT_SERVER,
                    help="the server (its database name is ignored: each system gets a fresh one)")
    ap.add_argument("-n", "--n", type=int, default=20000, help="W1 jobs per measurement")
    ap.add_argument("--n1", type=int, default=2000, help="jobs enqueued one by one (rest with the bulk call)")
    ap.add_argument("--chunk", type=int, default=1000, help="jobs per bulk enqueue call")
    ap.add_argument("--workers", type=int, default=4, help="W1 worker processes (concurrency 1 each)")
    ap.add_argument("--poll", type=float, default=0.02, help="seconds between pending polls")
    ap.add_argument("--timeout", type=float, default=600.0, help="max seconds for one drain")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the table shows medians")
    ap.add_argument("--workloads", default="w1,w2", help="comma list from w1,w2")
    ap.add_argument("--lat-n", type=int, default=300, help="W2 jobs")
    ap.add_argument("--lat-gap-ms", type=float, default=10.0, help="W2 ms between enqueues")
    ap.add_argument("--settle", type=float, default=2.0, help="W2 seconds the idle worker waits first")
    ap.add_argument("--raw-batches", default="100", help="raw reference claim batches, e.g. 1,100 ('' = none)")
    ap.add_argument("--raw-poll", type=float, default=0.05,
                    help="raw worker's sleep after an empty claim (justonce's idle MySQL poll is 50 ms)")
    ap.add_argument("--no-justonce", action="store_true", help="the raw reference only")
    ap.add_argument("--soak", type=float, metavar="MINUTES", help="run the soak (mysql_soak.py) instead")
    ap.add_argument("--soak-workers", type=int, default=8)
    ap.add_argument("--soak-rate", type=float, default=1000.0, help="soak producer's jobs/s (a cap)")
    ap.add_argument("--json-out", help="also append JSON lines to this file")
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    jf = open(args.json_out, "a") if args.json_out else None  # noqa: SIM115 - closed at exit
    version = server_version(args.url)
    log(f"server {version} python {platform.python_version()} nproc={os.cpu_count()} n={args.n} "
        f"workers={args.workers} repeat={args.repeat}")
    rows: list[dict[str, Any]] = []

    def emit(r: dict[str, Any], rnd: int) -> None:
        r.update({"round": rnd, "server": version, "nproc": os.cpu_count(),
                  "loadavg_1m": round(os.getloadavg()[0], 2),
                  "python": platform.python_version(), "label": args.label})
        line = json.dumps(r)
        print(line, flush=True)
        if jf:
            jf.write(line + "\n")
            jf.flush()
        rows.append(r)

    if args.soak:
        from mysql_soak import soak, soak_report

        log(f"soak: {args.soak:g} min, {args.soak_workers} workers, producer up to {args.soak_rate:g} jobs/s")
        r = soak(args)
        emit(r, 1)
        print()
        print(soak_report(r))
        return 0 if r.get("ok") else 1

    makers: list[tuple[str, Any]] = [
        (f"raw_mysql_b{b}", (lambda url, b=b: RawSystem(url, b, args.raw_poll)))
        for b in sorted({int(x) for x in args.raw_batches.split(",") if x.strip()}, reverse=True)]
    if not args.no_justonce:
        makers.insert(0, ("justonce_mysql", JustonceSystem))
    workloads = [{"w1": w1, "w2": w2}[w.strip()] for w in args.workloads.split(",") if w.strip()]
    for rnd in range(1, args.repeat + 1):
        for name, make in makers:
            for workload in workloads:
                log(f"[round {rnd}] {name} {workload.__name__} ...")
                emit(measure(make, workload, args), rnd)
    print()
    print(report(rows, [name for name, _ in makers], args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
