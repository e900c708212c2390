#!/usr/bin/env python3
"""justonce on one SQLite file, W1 throughput, measured like shared/bench/sqlite_ref.py.

Per ``synchronous`` setting (FULL = the library default, and NORMAL), on a FRESH database
file ``sqlite:////<tmp>/queue.db?synchronous=<S>``:

1. enqueue ``--n1`` jobs one at a time with ``task.enqueue(seq)`` (one BEGIN IMMEDIATE
   transaction each) -> ``enqueue_per_s``; then the rest with ``task.enqueue_many`` in calls
   of ``--chunk`` jobs (one transaction per call) -> ``enqueue_bulk_per_s``. Same split as
   sqlite_ref.py (``--n1`` 2000, ``--chunk`` 1000 by default).
2. check that N jobs are pending, ``PRAGMA wal_checkpoint(TRUNCATE)``.
3. start ``--workers`` processes (multiprocessing, spawn); each builds its App and a
   ``justonce.Worker(app, concurrency=1)`` with the library defaults otherwise (leases,
   heartbeats, fenced tokens, batched acks, retries, housekeeping), signals ready, waits for
   a common "go", then runs ``Worker.run()`` on its main thread (so SIGTERM is the library's
   graceful stop). The task is a no-op that records ``(seq, time.time())`` in memory.
4. the parent polls the pending count (scheduled + ready + running) every ``--poll`` s
   (20 ms) on its own connection. ``process_per_s = N / (t_first_poll_seeing_0 -
   t_first_job_start)``; the first start is the earliest record of any worker. The end is
   therefore the last completion as COMMITTED by the library (acks are batched).
5. SIGTERM to every worker; each writes its records to a file as it exits ->
   ``duplicates`` / ``missing``; ``left_pending`` and ``done_in_db`` from the table.

In the same run (so the ratios come from one run on the same disk and load), unless
``--no-peers``: ``shared/bench/sqlite_ref.py`` (raw SQL, b=1 and b=100, same N, same
``synchronous``) and ``shared/bench/huey_sqlite.py`` (Huey ``SqliteHuey``, 4 process
workers, Huey default = SQLite's synchronous FULL; Huey has no NORMAL setting), as
subprocesses. ``--repeat R`` repeats the whole round R times and reports medians.

Output: one JSON line per measurement (run.py / sqlite_ref.py field names), then a markdown
table with the ratios justonce / raw and justonce / Huey.

Run with a Python that has justonce (and huey for the Huey peer), e.g. the qbench venv:

    ~/.venvs/qbench/bin/python bench/sqlite_bench.py -n 50000
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PEER_DIR = Path(os.environ.get("PEER_BENCH_DIR", HERE.parent.parent / "shared" / "bench"))
TASK_NAME = "bench_noop"
# Each state has its own partial index (claim, leases, scheduled), so this counts index
# entries instead of scanning the table every 20 ms.
PENDING_SQL = """
SELECT (SELECT count(*) FROM justonce_jobs WHERE state = 'ready')
     + (SELECT count(*) FROM justonce_jobs WHERE state = 'running')
     + (SELECT count(*) FROM justonce_jobs WHERE state = 'scheduled')
"""


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


# ---- worker process -------------------------------------------------------------------
def worker_main(url: str, out_path: str, ready, go) -> None:
    import justonce

    records: list[tuple[int, float]] = []
    append = records.append
    app = justonce.App(url)

    @app.task(name=TASK_NAME)
    def bench_noop(seq: int) -> None:
        append((seq, time.time()))

    err = None
    try:
        worker = justonce.Worker(app, concurrency=1)  # library defaults otherwise
        ready.set()
        go.wait()
        worker.run()  # main thread: SIGTERM / SIGINT = graceful stop
    except BaseException as e:  # still dump what we have
        err = f"{type(e).__name__}: {e}"
    finally:
        app.close()
        with open(out_path, "w") as f:
            json.dump({"records": records, "error": err}, f)


# ---- one justonce measurement ---------------------------------------------------------
def run_justonce(args, synchronous: str) -> dict:
    import justonce

    t_wall = time.perf_counter()
    d = tempfile.mkdtemp(prefix="justonce-sqlite-", dir=args.db_dir)
    path = os.path.join(d, "queue.db")
    url = f"sqlite:///{path}?synchronous={synchronous}"  # path is absolute: sqlite:////...
    n, procs = args.n, args.workers
    res = {"system": "justonce_sqlite",
           "version": f"justonce {justonce.__version__}, sqlite {sqlite3.sqlite_version}",
           "workload": "W1_throughput", "n": n, "workers": procs, "procs": procs, "concurrency": 1,
           "enqueue_per_s": None, "enqueue_bulk_per_s": None, "process_per_s": None,
           "duplicates": None, "missing": None, "synchronous": synchronous, "journal_mode": "wal",
           "poll_s": args.poll}
    ps: list = []
    try:
        app = justonce.App(url)
        app.migrate()

        @app.task(name=TASK_NAME)
        def bench_noop(seq: int) -> None:  # pragma: no cover - runs in the workers
            pass

        n1 = min(args.n1, n)
        t = time.perf_counter()
        for s in range(n1):
            bench_noop.enqueue(s)
        res["enqueue_per_s"] = round(n1 / (time.perf_counter() - t), 1) if n1 else None
        rest = list(range(n1, n))
        t = time.perf_counter()
        for i in range(0, len(rest), args.chunk):
            bench_noop.enqueue_many([(s,) for s in rest[i:i + args.chunk]])
        if rest:
            res["enqueue_bulk_per_s"] = round(len(rest) / (time.perf_counter() - t), 1)
        app.close()

        mon = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        mon.execute("PRAGMA busy_timeout=5000")
        queued = mon.execute(PENDING_SQL).fetchone()[0]
        if queued != n:
            res["error"] = f"expected {n} pending after enqueue, found {queued}"
        mon.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        ctx = mp.get_context("spawn")
        ready = [ctx.Event() for _ in range(procs)]
        go = ctx.Event()
        outs = [os.path.join(d, f"w{i}.json") for i in range(procs)]
        ps = [ctx.Process(target=worker_main, args=(url, outs[i], ready[i], go), daemon=True)
              for i in range(procs)]
        for p in ps:
            p.start()
        for e in ready:
            if not e.wait(60):
                raise RuntimeError("worker did not start within 60 s")
        go.set()
        t_done = None
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if mon.execute(PENDING_SQL).fetchone()[0] == 0:
                t_done = time.time()
                break
            if any(p.exitcode is not None for p in ps):
                break
            time.sleep(args.poll)
        errors = []
        for p in ps:
            if p.exitcode is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in ps:
            p.join(60)
            if p.exitcode is None:
                p.kill()
                p.join()
                errors.append(f"pid {p.pid} killed after 60 s grace")
        records: list[tuple[int, float]] = []
        for i, out in enumerate(outs):
            try:
                with open(out) as f:
                    o = json.load(f)
                records.extend((int(s), float(tt)) for s, tt in o["records"])
                if o.get("error"):
                    errors.append(o["error"])
            except FileNotFoundError:
                errors.append(f"worker {i}: no output")
        first: dict[int, float] = {}
        dups = 0
        for s, tt in records:
            if s in first:
                dups += 1
            else:
                first[s] = tt
        res["duplicates"] = dups
        res["missing"] = sum(1 for s in range(n) if s not in first)
        if t_done is None:
            res["timed_out"] = True
        elif first:
            t0 = min(first.values())
            res["process_per_s"] = round(n / (t_done - t0), 1)
            res["process_s"] = round(t_done - t0, 3)
        res["left_pending"] = mon.execute(PENDING_SQL).fetchone()[0]
        res["done_in_db"] = mon.execute(
            "SELECT count(*) FROM justonce_jobs WHERE state = 'succeeded'").fetchone()[0]
        mon.close()
        if errors:
            res["worker_errors"] = errors[:5]
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
        for p in ps:
            if p.exitcode is None:
                p.kill()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    res["wall_s"] = round(time.perf_counter() - t_wall, 2)
    return res


# ---- peers (subprocesses) -------------------------------------------------------------
def run_peer(cmd: list[str], timeout: float) -> list[dict]:
    log("  $", " ".join(cmd))
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"system": Path(cmd[1]).stem, "error": f"timed out after {timeout:g} s"}]
    rows = []
    for line in cp.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    if cp.returncode != 0 or not rows:
        rows.append({"system": Path(cmd[1]).stem, "error": f"exit {cp.returncode}: {cp.stderr.strip()[-500:]}"})
    return rows


# ---- report -------------------------------------------------------------------------
def median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v: float | None, nd: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{nd}f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def report(rows: list[dict], syncs: list[str], repeats: int) -> str:
    def sel(system: str, sync: str | None) -> list[dict]:
        return [r for r in rows if r.get("system") == system and (sync is None or r.get("synchronous") == sync)
                and not r.get("error")]

    huey = sel("huey_sqlite_process", None)
    out = [f"medians over {repeats} round(s); process/s = N / (last completion - first start)", "",
           "| system | synchronous | enqueue/s (1-by-1) | enqueue/s (bulk) | processed/s "
           "| dup | missing | runs |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    listing = [(s, sync) for sync in syncs for s in ("justonce_sqlite", "sqlite_ref_b1", "sqlite_ref_b100")]
    listing.append(("huey_sqlite_process", None))
    for system, sync in listing:
        rs = sel(system, sync)
        if not rs:
            continue
        out.append(f"| {system} | {rs[0].get('synchronous', sync)} | {fmt(median(rs, 'enqueue_per_s'))} | "
                   f"{fmt(median(rs, 'enqueue_bulk_per_s'))} | {fmt(median(rs, 'process_per_s'))} | "
                   f"{sum(r.get('duplicates') or 0 for r in rs)} | "
                   f"{sum(r.get('missing') or 0 for r in rs)} | {len(rs)} |")
    out += ["", "| synchronous | processed: justonce / raw_b100 | processed: justonce / raw_b1 | "
                "processed: justonce / Huey (FULL) | bulk enqueue: justonce / raw | "
                "1-by-1 enqueue: justonce / raw | 1-by-1 enqueue: justonce / Huey |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for sync in syncs:
        j = sel("justonce_sqlite", sync)
        b100, b1 = sel("sqlite_ref_b100", sync), sel("sqlite_ref_b1", sync)
        raw_enq = b100 + b1
        out.append(
            f"| {sync} | {ratio(median(j, 'process_per_s'), median(b100, 'process_per_s'))} | "
            f"{ratio(median(j, 'process_per_s'), median(b1, 'process_per_s'))} | "
            f"{ratio(median(j, 'process_per_s'), median(huey, 'process_per_s'))} | "
            f"{ratio(median(j, 'enqueue_bulk_per_s'), median(raw_enq, 'enqueue_bulk_per_s'))} | "
            f"{ratio(median(j, 'enqueue_per_s'), median(raw_enq, 'enqueue_per_s'))} | "
            f"{ratio(median(j, 'enqueue_per_s'), median(huey, 'enqueue_per_s'))} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--n", type=int, default=50000, help="jobs per measurement")
    ap.add_argument("--n1", type=int, default=2000, help="jobs enqueued one by one (rest with enqueue_many)")
    ap.add_argument("--chunk", type=int, default=1000, help="jobs per enqueue_many call")
    ap.add_argument("--workers", type=int, default=4, help="worker processes (concurrency 1 each)")
    ap.add_argument("--synchronous", default="FULL,NORMAL", help="comma list of PRAGMA synchronous values")
    ap.add_argument("--poll", type=float, default=0.02, help="seconds between pending polls")
    ap.add_argument("--timeout", type=float, default=600.0, help="max seconds for one drain")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the table shows medians")
    ap.add_argument("--no-peers", action="store_true", help="justonce only (no sqlite_ref.py / huey_sqlite.py)")
    ap.add_argument("--no-huey", action="store_true", help="skip huey_sqlite.py")
    ap.add_argument("--peer-dir", default=str(DEFAULT_PEER_DIR),
                    help="folder with sqlite_ref.py and huey_sqlite.py "
                         "(default: ../../shared/bench or $PEER_BENCH_DIR)")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="interpreter for the peer scripts (huey must be importable; default: this one)")
    ap.add_argument("--db-dir", default=None, help="where the temporary database files go")
    ap.add_argument("--json-out", help="also append JSON lines to this file")
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    syncs = [s.strip().upper() for s in args.synchronous.split(",") if s.strip()]
    peer_dir = Path(args.peer_dir)
    jf = open(args.json_out, "a") if args.json_out else None  # noqa: SIM115 - closed at exit
    common = ["-n", str(args.n), "--n1", str(args.n1), "--chunk", str(args.chunk),
              "--workers", str(args.workers), "--label", args.label]
    if args.db_dir:
        common += ["--db-dir", args.db_dir]
    log(f"sqlite {sqlite3.sqlite_version} python {platform.python_version()} nproc={os.cpu_count()} "
        f"n={args.n} workers={args.workers} synchronous={syncs} repeat={args.repeat}")

    rows: list[dict] = []

    def emit(r: dict, rnd: int) -> None:
        r.update({"round": rnd, "nproc": os.cpu_count(), "python": platform.python_version(),
                  "label": args.label})
        line = json.dumps(r)
        print(line, flush=True)
        if jf:
            jf.write(line + "\n")
            jf.flush()
        rows.append(r)

    for rnd in range(1, args.repeat + 1):
        for sync in syncs:
            log(f"[round {rnd}] justonce_sqlite synchronous={sync} ...")
            emit(run_justonce(args, sync), rnd)
            if not args.no_peers:
                log(f"[round {rnd}] sqlite_ref b=1,100 synchronous={sync} ...")
                for r in run_peer([args.peer_python, str(peer_dir / "sqlite_ref.py"), *common,
                                   "--batches", "1,100", "--synchronous", sync], args.timeout * 3):
                    emit(r, rnd)
        if not args.no_peers and not args.no_huey:
            log(f"[round {rnd}] huey_sqlite (process workers, fsync default = FULL) ...")
            huey_common = ["-n", str(args.n), "--workers", str(args.workers), "--label", args.label]
            if args.db_dir:
                huey_common += ["--db-dir", args.db_dir]
            for r in run_peer([args.peer_python, str(peer_dir / "huey_sqlite.py"), *huey_common],
                              args.timeout * 2):
                emit(r, rnd)
    print()
    print(report(rows, syncs, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
