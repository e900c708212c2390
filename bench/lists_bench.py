#!/usr/bin/env python3
"""Lists (issue 12, "Speed"): positions reserved and completed per second, in one run per
database, beside the job queue's one-job claim and ack and beside beanstalkd.

    PYTHONPATH=src /work/main/.venv/bin/python bench/lists_bench.py \\
        --json-out bench/results/lists.jsonl --label lists
    PYTHONPATH=src /work/main/.venv/bin/python bench/lists_bench.py --quick --only sqlite

Every database is a fresh one, dropped afterwards: Postgres ``CREATE DATABASE
jo_lists_<random>`` on ``--pg-url``'s server, MariaDB/MySQL ``jo_bench_<random>``
(mysql_common.fresh_database), SQLite a new file ``?synchronous=FULL`` in a temp dir. Per
database, ``--procs`` (4) reserving processes (multiprocessing, spawn, each its own
``App``), started together once all have connected; rate = positions / (last process done
− first process started):

1. load: ``app.lists.create(name, items=…)`` of ``--items`` (1,000,000) items ``{"id": i}``,
   timed in the parent (streamed in transactions of 10,000, then sealed) → items/s;
2. k = 1,000: each process ``reserve(name, 1000)`` then ``complete(reservation)`` until
   reserve says nothing is left: the whole list, drained;
3. on a second list of ``--items``: k = 1 (``--k1-positions`` in all), k = 1 reading the
   items too (``items(reservation)``), k = 1,000 reading the items (``--k1000-positions``);
4. jobs: as many no-op jobs as step 3's k = 1 (``enqueue_calls`` in calls of 1,000), then each
   process claims one job with the Store's own claim (``backend.job_claim(queue, 1, …)``,
   the statement a Worker's claim runs) and completes it with its lease token
   (``backend.job_complete_many``): two transactions per job, as a list's k = 1 is two;
5. scale: k = 1 on a list of ``--small`` (10,000) items and one of ``--big`` (10,000,000;
   on SQLite and MySQL only if step 1's rate loads it within ``--load-budget`` s, else
   ``--items``, and the row says so), ``--scale-rounds`` rounds alternating the order, the
   small list fresh each round; the ratio of the medians.

Before each measured phase: Postgres ``ANALYZE`` + ``CHECKPOINT``, MySQL ``ANALYZE TABLE``,
SQLite ``wal_checkpoint(TRUNCATE)`` (the shared harness's convention). Every phase checks
that no position (job) was handed out twice and every reservation completed all it held;
the drain also that every position is done and the list completed.

beanstalkd (beanstalkd_ref.py): its own server, binlog on: ``--items`` puts of the same
items from one client (one round trip each), then ``--procs`` processes reserve+delete
until empty; again with ``-f 0`` (fsync every binlog write, as our commits do) on
``--k1-positions`` jobs. Every number carries the 1-minute load average when it started.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

PG_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
MYSQL_SERVER = os.environ.get("JUSTONCE_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
QUEUE = "lists_bench"
TASK = "bench_noop"
PHASE_TIMEOUT = 1800.0
DBS = ("pg", "sqlite", "mysql")


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def items(n: int) -> Iterator[dict[str, int]]:
    return ({"id": i} for i in range(n))


# -- worker processes (spawn imports them from this module) ------------------------------------
def list_worker(url: str, name: str, k: int, limit: int | None, read: bool,
                ready: Any, start: Any, out: Any) -> None:
    """reserve(k) → [items()] → complete(), until ``limit`` positions or nothing is left."""
    import justonce

    app = justonce.App(url, strict=False)
    app.lists.get(name)  # connect and check the schema before the clock starts
    ready.put(1)
    start.wait()
    held: list[tuple[int, int]] = []
    n = 0
    t0 = time.perf_counter()
    while limit is None or n < limit:
        res = app.lists.reserve(name, k if limit is None else min(k, limit - n))
        if res is None:
            break
        if read and len(app.lists.items(res)) != res.count:
            raise AssertionError(f"items() of {res.ranges} is short")
        done = app.lists.complete(res)
        if done.completed != res.count or done.already:
            raise AssertionError(f"complete({res.ranges}) = {done}")
        held.extend(res.ranges)
        n += res.count
    t1 = time.perf_counter()
    app.close()
    out.put((t0, t1, n, held))


def job_worker(url: str, limit: int, ready: Any, start: Any, out: Any) -> None:
    """The Store's claim of one job, then its completion by lease token, ``limit`` times."""
    import justonce
    from justonce.models import Completion

    app = justonce.App(url, strict=False)
    backend = app.backend
    backend.now()
    owner = f"lists-bench-{os.getpid()}"
    ids: list[int] = []
    ready.put(1)
    start.wait()
    t0 = time.perf_counter()
    while len(ids) < limit:
        got = backend.job_claim(QUEUE, 1, owner, 60.0)
        if not got:
            break
        job = got[0]
        if backend.job_complete_many([Completion(job.id, job.lease_token, None)]) != {job.id}:
            raise AssertionError(f"completion of job {job.id} rejected")
        ids.append(job.id)
    t1 = time.perf_counter()
    app.close()
    out.put((t0, t1, len(ids), ids))


# -- one measurement ------------------------------------------------------------------------------
@dataclass
class Measured:
    per_s: float
    seconds: float
    n: int
    parts: list[Any]
    load1: float


def measure(target: Callable[..., None], per_proc: list[tuple[Any, ...]]) -> Measured:
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, ready, start, out)) for a in per_proc]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        load1 = os.getloadavg()[0]
        start.set()
        results: list[Any] = []
        deadline = time.monotonic() + PHASE_TIMEOUT
        while len(results) < len(procs):
            try:
                results.append(out.get(timeout=1))
            except Exception:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"a worker failed (exit codes {dead}) or timed out") from None
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    n = sum(r[2] for r in results)
    seconds = max(r[1] for r in results) - min(r[0] for r in results)
    return Measured(n / seconds, seconds, n, [r[3] for r in results], load1)


def disjoint(parts: list[list[tuple[int, int]]], whole: int | None = None) -> int:
    """Positions handed out (ranges from every process); raises on overlap, and when
    ``whole`` is given, unless they are exactly 0..whole-1."""
    ranges = sorted(r for part in parts for r in part)
    end = 0
    for lo, hi in ranges:
        if lo < end:
            raise AssertionError(f"position {lo} handed out twice")
        if whole is not None and lo != end:
            raise AssertionError(f"positions {end}..{lo - 1} never handed out")
        end = hi
    if whole is not None and end != whole:
        raise AssertionError(f"positions {end}..{whole - 1} never handed out")
    return sum(hi - lo for lo, hi in ranges)


# -- databases ------------------------------------------------------------------------------------
@contextmanager
def fresh(db: str, args: argparse.Namespace) -> Iterator[str]:
    if db == "sqlite":
        folder = tempfile.mkdtemp(prefix="jo-lists-", dir=args.db_dir)
        try:
            yield f"sqlite:///{folder}/lists.db?synchronous=FULL"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    elif db == "mysql":
        from mysql_common import fresh_database

        with fresh_database(args.mysql_url) as url:
            yield url
    else:
        import psycopg

        name = f"jo_lists_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(args.pg_url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        try:
            yield pg_url(args.pg_url, name)
        finally:
            with psycopg.connect(args.pg_url, autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_url(server: str, name: str) -> str:
    base, _, query = server.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


def settle(db: str, url: str) -> None:
    """What the shared harness does before a measured phase: statistics and a checkpoint."""
    if db == "pg":
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            c.execute("ANALYZE")
            c.execute("CHECKPOINT")
    elif db == "mysql":
        from mysql_common import connect

        with connect(url) as conn, conn.cursor() as cur:
            cur.execute("SHOW TABLES LIKE 'justonce\\_%%'")
            for (table,) in cur.fetchall():
                cur.execute(f"ANALYZE TABLE `{table}`")
                cur.fetchall()
    else:
        path = url[len("sqlite:///"):].split("?", 1)[0]
        with sqlite3.connect(path) as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def server_version(db: str, url: str) -> str:
    if db == "sqlite":
        return f"SQLite {sqlite3.sqlite_version}"
    if db == "mysql":
        from mysql_common import server_version as mysql_version

        return f"MySQL {mysql_version(url)}"
    import psycopg

    with psycopg.connect(url) as c:
        return f"PostgreSQL {c.execute('SHOW server_version').fetchone()[0]}"  # type: ignore[index]


# -- the phases ------------------------------------------------------------------------------------
class Run:
    """One run: its options, its rows (JSON lines, written as they come) and its summary."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.summary: dict[str, dict[str, Any]] = {}
        self.context = {"label": args.label, "procs": args.procs, "commit": _commit(),
                        "python": platform.python_version(), "nproc": os.cpu_count()}

    def emit(self, row: dict[str, Any]) -> None:
        row = {**self.context, **row}
        log(f"  {row['system']:16} {row['measure']:15} k={row.get('k', '-')!s:5} "
            f"items={row.get('list_items', 0):>10,} {row['per_s']:>11,.0f}/s "
            f"({row['seconds']:.1f} s, load {row['load1']:.2f}){' ' + row['note'] if row.get('note') else ''}")
        if self.args.json_out:
            with open(self.args.json_out, "a") as f:
                f.write(json.dumps(row) + "\n")

    def database(self, db: str) -> None:
        import justonce

        a, s = self.args, self.summary.setdefault(db, {})
        per_k1 = a.k1_positions // a.procs
        with fresh(db, a) as url:
            base = {"system": f"justonce_{db}", "db": db, "version": server_version(db, url)}
            log(f"{db}: {base['version']}")
            app = justonce.App(url, strict=False)
            app.migrate()

            def load(name: str, n: int, emit: bool = True) -> float:
                load1, t = os.getloadavg()[0], time.perf_counter()
                info = app.lists.create(name, items=items(n))
                dt = time.perf_counter() - t
                if info.state != "sealed" or info.progress.total != n:
                    raise AssertionError(f"{name} loaded as {info}")
                if emit:
                    self.emit({**base, "measure": "load", "list_items": n, "per_s": n / dt,
                               "seconds": dt, "load1": load1})
                return n / dt

            def run(key: str, name: str, n: int, k: int, total: int | None, read: bool,
                    note: str = "") -> float:
                settle(db, url)
                per = None if total is None else total // a.procs
                m = measure(list_worker, [(url, name, k, per, read)] * a.procs)
                disjoint(m.parts, n if total is None else None)
                if total is None:
                    info = app.lists.get(name)
                    if info.state != "completed" or info.progress.done != n:
                        raise AssertionError(f"{name} drained, but {info}")
                self.emit({**base, "measure": "reserve_complete" + ("_items" if read else ""),
                           "k": k, "list_items": n, "positions": m.n, "per_s": m.per_s,
                           "seconds": m.seconds, "load1": m.load1, "read_items": read,
                           "drained": total is None, "phase": key, "note": note})
                return m.per_s

            s["load"] = load("main", a.items)
            s["k1000"] = run("k1000", "main", a.items, 1000, None, False)
            s["load2"] = load("side", a.items)
            s["k1"] = run("k1", "side", a.items, 1, per_k1 * a.procs, False)
            s["k1_items"] = run("k1_items", "side", a.items, 1, per_k1 * a.procs, True)
            s["k1000_items"] = run("k1000_items", "side", a.items, 1000, a.k1000_positions, True)

            n_jobs = per_k1 * a.procs
            for i in range(0, n_jobs, 1000):
                app.enqueue_calls(TASK, [({"id": j},) for j in range(i, min(n_jobs, i + 1000))],
                                  queue=QUEUE)
            settle(db, url)
            m = measure(job_worker, [(url, per_k1)] * a.procs)
            ids = [i for part in m.parts for i in part]
            if len(set(ids)) != len(ids) or len(ids) != n_jobs:
                raise AssertionError(f"{len(ids)} claims of {len(set(ids))} jobs, {n_jobs} queued")
            s["job_k1"] = m.per_s
            self.emit({**base, "system": f"justonce_{db}_jobs", "measure": "job_claim_complete",
                       "k": 1, "positions": m.n, "per_s": m.per_s, "seconds": m.seconds,
                       "load1": m.load1})

            big, note = a.big, ""
            if db != "pg" and a.big / s["load"] > a.load_budget:
                big = a.items
                note = (f"{a.big:,} items would load in ~{a.big / s['load']:.0f} s "
                        f"(> {a.load_budget:.0f} s): {a.items:,} instead")
            s["big"], s["big_note"] = big, note
            s["load_big"] = load("big", big)
            per = min(a.scale_per_proc, a.small // a.procs)
            rates: dict[str, list[float]] = {"small": [], "big": []}
            for r in range(a.scale_rounds):
                load(f"small{r}", a.small, emit=False)
                pair = [("small", f"small{r}", a.small), ("big", "big", big)]
                for which, name, n in pair[::-1] if r % 2 else pair:
                    rates[which].append(run(f"scale_{which}", name, n, 1, per * a.procs, False,
                                            note if which == "big" else ""))
            s["scale_small"] = statistics.median(rates["small"])
            s["scale_big"] = statistics.median(rates["big"])
            app.close()

    def beanstalkd(self) -> None:
        from importlib.metadata import version

        import beanstalkd_ref as bs

        a = self.args
        for key, fsync_ms, n in (("bs", None, a.items), ("bs_f0", 0, a.k1_positions)):
            with bs.server(fsync_ms) as srv:
                base = {"system": "beanstalkd" + ("" if fsync_ms is None else "_f0"), "db": "beanstalkd",
                        "version": f"{srv.version}, greenstalk {version('greenstalk')}",
                        "fsync": "at most every 50 ms (default)" if fsync_ms is None else "every write (-f 0)"}
                log(f"beanstalkd: {base['version']}, binlog {srv.binlog}, fsync {base['fsync']}")
                load1, t = os.getloadavg()[0], time.perf_counter()
                bs.put_all(srv.port, (json.dumps(x, separators=(",", ":")) for x in items(n)))
                dt = time.perf_counter() - t
                self.emit({**base, "measure": "put", "list_items": n, "per_s": n / dt, "seconds": dt,
                           "load1": load1})
                m = measure(bs.reserve_delete_worker, [(srv.port, None)] * a.procs)
                ids = [i for part in m.parts for i in part]
                if len(set(ids)) != len(ids) or len(ids) != n or bs.ready_jobs(srv.port):
                    raise AssertionError(f"{len(ids)} reserves of {len(set(ids))} jobs, {n} put")
                self.emit({**base, "measure": "reserve_delete", "k": 1, "list_items": n,
                           "positions": m.n, "per_s": m.per_s, "seconds": m.seconds, "load1": m.load1})
                self.summary.setdefault("beanstalkd", {}).update({key: m.per_s, f"{key}_put": n / dt})

    def table(self) -> str:
        s = self.summary
        out = ["| database | load items/s | k=1000 | k=1000 +items | k=1 | k=1 +items | job claim+ack "
               "| k=1 / job | scale k=1: small / big (items) | big / small |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        for db in DBS:
            r = s.get(db)
            if not r or "scale_big" not in r:
                continue
            out.append(f"| {db} | {r['load']:,.0f} | {r['k1000']:,.0f} | {r['k1000_items']:,.0f} "
                       f"| {r['k1']:,.0f} | {r['k1_items']:,.0f} | {r['job_k1']:,.0f} "
                       f"| {r['k1'] / r['job_k1']:.2f} | {r['scale_small']:,.0f} / {r['scale_big']:,.0f} "
                       f"({self.args.small:,} / {r['big']:,}) | {r['scale_big'] / r['scale_small']:.2f} |")
        b = s.get("beanstalkd", {})
        if "bs" in b:
            out += ["", "| beanstalkd (binlog on) | put/s | reserve+delete/s |", "|---|---:|---:|",
                    f"| fsync at most every 50 ms (default) | {b['bs_put']:,.0f} | {b['bs']:,.0f} |"]
            if "bs_f0" in b:
                out.append(f"| fsync every write (-f 0) | {b['bs_f0_put']:,.0f} | {b['bs_f0']:,.0f} |")
            out += ["", "| ratio to beanstalkd (default / -f 0) | k=1 | k=1000 |", "|---|---:|---:|"]
            for db in DBS:
                r = s.get(db)
                if r and "k1" in r:
                    k1 = f"{r['k1'] / b['bs']:.3f}"
                    k1000 = f"{r['k1000'] / b['bs']:.1f}"
                    if "bs_f0" in b:
                        k1 += f" / {r['k1'] / b['bs_f0']:.2f}"
                        k1000 += f" / {r['k1000'] / b['bs_f0']:.1f}"
                    out.append(f"| {db} | {k1} | {k1000} |")
        return "\n".join(out)


def _commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


QUICK = {"items": 20_000, "k1_positions": 400, "k1000_positions": 8_000, "small": 2_000,
         "big": 40_000, "scale_per_proc": 100, "scale_rounds": 1}
FULL = {"items": 1_000_000, "k1_positions": 10_000, "k1000_positions": 200_000, "small": 10_000,
        "big": 10_000_000, "scale_per_proc": 2_000, "scale_rounds": 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="pg,sqlite,mysql,beanstalkd",
                    help="comma-separated: pg, sqlite, mysql, beanstalkd")
    ap.add_argument("--quick", action="store_true", help="a one-minute smoke run (small sizes)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--items", type=int, help="items of the k=1000 list (1,000,000)")
    ap.add_argument("--k1-positions", type=int, help="positions (and jobs) at k=1 (10,000)")
    ap.add_argument("--k1000-positions", type=int, help="positions at k=1000 reading items (200,000)")
    ap.add_argument("--small", type=int, help="the small list of the scale check (10,000)")
    ap.add_argument("--big", type=int, help="the big list of the scale check (10,000,000)")
    ap.add_argument("--scale-per-proc", type=int, help="k=1 positions per process per scale phase")
    ap.add_argument("--scale-rounds", type=int)
    ap.add_argument("--load-budget", type=float, default=180.0,
                    help="seconds a big list may take to load on SQLite/MySQL, else --items")
    ap.add_argument("--pg-url", default=PG_SERVER, help="a Postgres server (a database is created)")
    ap.add_argument("--mysql-url", default=MYSQL_SERVER)
    ap.add_argument("--db-dir", default=None, help="where the SQLite file goes (a temp dir)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--label", default=None)
    args = ap.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(only) - {*DBS, "beanstalkd"}
    if unknown:
        ap.error(f"--only: unknown {sorted(unknown)}")
    run = Run(args)
    log(f"lists_bench at {run.context['commit']}, load {os.getloadavg()}")
    failed = []
    for what in only:
        try:
            run.beanstalkd() if what == "beanstalkd" else run.database(what)
        except Exception as exc:  # one system failing must not hide the others' figures
            failed.append(what)
            log(f"{what}: FAILED: {type(exc).__name__}: {exc}")
            run.emit({"system": what, "measure": "error", "per_s": 0.0, "seconds": 0.0,
                      "load1": os.getloadavg()[0], "error": f"{type(exc).__name__}: {exc}"})
    log(f"done, load {os.getloadavg()}")
    print(run.table())
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
