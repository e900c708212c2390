"""Batch acks per second: justonce against a raw-SQL reference, in the same run.

    .venv/bin/python bench/batch_acks.py --backend postgres --items 200000 --single 20000
    .venv/bin/python bench/batch_acks.py --backend sqlite

For each backend, 4 acker processes (``--ackers``) ack a shuffled, disjoint share of the
items of one sealed batch:
- bulk: ``--per-call`` ids (default 1,000) per call, ``--items`` items in all;
- single: one id per call, ``--single`` items in all.
Rate = items / (last acker done − first acker started). The batch must complete exactly
once (one ack call reports it), and every item must be acked.

The reference (``raw``) is what a careful hand-written version does with plain SQL: one row
per item (``PRIMARY KEY (batch_id, item)``, a boolean), an ack is
``UPDATE … SET acked = true WHERE … AND NOT acked`` in its own transaction, and the acker
that sees nothing pending afterwards reports completion (no exactly-once guarantee, no
seal, no callbacks). It needs a row per item, where justonce needs one bit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PG_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


# -- the two implementations, run in acker processes ------------------------------------


def justonce_acker(url: str, ids: list[str], per_call: int, start: Any, out: Any) -> None:
    import justonce

    app = justonce.App(url, strict=False)
    app.batches.get(int(ids[0].split(":")[0]))  # connect and check the schema before timing
    start.wait()
    t0 = time.perf_counter()
    completed = 0
    for i in range(0, len(ids), per_call):
        r = app.batches.ack(ids[i:i + per_call] if per_call > 1 else ids[i])
        completed += len(r.completed)
    out.put((t0, time.perf_counter(), completed))
    app.close()


def raw_acker(url: str, items: list[int], per_call: int, start: Any, out: Any) -> None:
    conn, param = _raw_connect(url)
    start.wait()
    t0 = time.perf_counter()
    completed = 0
    for i in range(0, len(items), per_call):
        part = items[i:i + per_call]
        if param == "?":
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE raw_items SET acked = 1 WHERE batch_id = 1 AND acked = 0 AND item IN "
                         "(SELECT value FROM json_each(?))", (json.dumps(part),))
            left = conn.execute("SELECT 1 FROM raw_items WHERE batch_id = 1 AND acked = 0 LIMIT 1").fetchone()
            conn.execute("COMMIT")
        else:
            with conn.transaction():
                conn.execute("UPDATE raw_items SET acked = true WHERE batch_id = 1 AND NOT acked "
                             "AND item = ANY(%s)", (part,))
                left = conn.execute(
                    "SELECT 1 FROM raw_items WHERE batch_id = 1 AND NOT acked LIMIT 1").fetchone()
        completed += left is None
    out.put((t0, time.perf_counter(), completed))
    conn.close()


def _raw_connect(url: str) -> tuple[Any, str]:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):], timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn, "?"
    import psycopg

    server, schema = url.split("?schema=")
    return psycopg.connect(server, autocommit=True, options=f"-c search_path={schema}"), "%s"


# -- one measurement ----------------------------------------------------------------------


def measure(target: Any, shares: list[list[Any]], url: str, per_call: int) -> tuple[float, int]:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, share, per_call, start, out)) for share in shares]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every acker import and connect
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    n = sum(len(s) for s in shares)
    elapsed = max(r[1] for r in results) - min(r[0] for r in results)
    return n / elapsed, sum(r[2] for r in results)


def split(items: list[Any], ackers: int, seed: int) -> list[list[Any]]:
    items = list(items)
    random.Random(seed).shuffle(items)
    return [items[i::ackers] for i in range(ackers)]


def run_justonce(url: str, n: int, ackers: int, per_call: int, seed: int) -> tuple[float, int]:
    import justonce

    app = justonce.App(url, strict=False)
    app.migrate()
    batch = app.batches.open(f"bench {n}")
    ids: list[str] = []
    while len(ids) < n:
        ids += batch.add(min(10_000, n - len(ids))).item_ids()
    batch.seal()
    app.close()
    rate, completed = measure(justonce_acker, split(ids, ackers, seed), url, per_call)
    app = justonce.App(url, strict=False)
    info = app.batches.get(batch.id)
    app.close()
    assert info.acked == n and info.state == "completed" and completed == 1, (info, completed)
    return rate, completed


def run_raw(url: str, n: int, ackers: int, per_call: int, seed: int) -> tuple[float, int]:
    conn, param = _raw_connect(url)
    conn.execute("DROP TABLE IF EXISTS raw_items")
    conn.execute("CREATE TABLE raw_items (batch_id bigint NOT NULL, item integer NOT NULL, "
                 "acked boolean NOT NULL DEFAULT false, PRIMARY KEY (batch_id, item))")
    if param == "?":
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO raw_items (batch_id, item, acked) VALUES (1, ?, 0)",
                         ((i,) for i in range(n)))
        conn.execute("COMMIT")
    else:
        conn.execute("INSERT INTO raw_items (batch_id, item) SELECT 1, g FROM generate_series(0, %s - 1) g",
                     (n,))
        conn.execute("ANALYZE raw_items")
    conn.close()
    rate, completed = measure(raw_acker, split(list(range(n)), ackers, seed), url, per_call)
    return rate, completed


def fresh_url(backend: str, folder: Path, tag: str) -> str:
    if backend == "sqlite":
        path = folder / f"{tag}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return f"sqlite:///{path}"
    import psycopg

    schema = f"bench_batches_{tag}"
    with psycopg.connect(PG_SERVER, autocommit=True) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        c.execute(f"CREATE SCHEMA {schema}")
    return f"{PG_SERVER}?schema={schema}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--items", type=int, default=200_000, help="items acked in bulk")
    ap.add_argument("--single", type=int, default=20_000, help="items acked one per call")
    ap.add_argument("--per-call", type=int, default=1000)
    ap.add_argument("--ackers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    folder = Path(tempfile.mkdtemp(prefix="justonce-bench-"))
    rows = []
    for backend in backends:
        for mode, n, per_call in (("bulk", args.items, args.per_call), ("single", args.single, 1)):
            rates: dict[str, list[float]] = {"justonce": [], "raw": []}
            for r in range(args.repeat):
                for system, fn in (("justonce", run_justonce), ("raw", run_raw)):
                    url = fresh_url(backend, folder, f"{system}_{mode}_{os.getpid()}")
                    rate, _ = fn(url, n, args.ackers, per_call, seed=r)
                    rates[system].append(rate)
                    print(f"{backend:8} {mode:6} {system:8} run {r + 1}: {rate:10,.0f} items/s",
                          file=sys.stderr)
            med = {k: statistics.median(v) for k, v in rates.items()}
            row = {"backend": backend, "mode": mode, "items": n, "per_call": per_call,
                   "ackers": args.ackers, "justonce_per_s": med["justonce"], "raw_per_s": med["raw"],
                   "ratio": med["justonce"] / med["raw"], "runs": rates}
            rows.append(row)
    print(f"\n{'backend':9}{'mode':8}{'items':>9}{'justonce/s':>13}{'raw/s':>12}{'ratio':>8}")
    for row in rows:
        print(f"{row['backend']:9}{row['mode']:8}{row['items']:>9,}{row['justonce_per_s']:>13,.0f}"
              f"{row['raw_per_s']:>12,.0f}{row['ratio']:>8.2f}")
    if args.json_out:
        with open(args.json_out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
