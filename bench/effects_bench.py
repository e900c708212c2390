"""Effects per second: ``app.effects.run_many`` (chunks) beside ``app.effects.run`` (one key
at a time), with a no-op ``fn``, in the same run, on each backend.

    PYTHONPATH=src .venv/bin/python bench/effects_bench.py --keys 20000 --chunk 500
    PYTHONPATH=src .venv/bin/python bench/effects_bench.py --backend postgres --repeat 3 \\
        --json-out bench/results/effects.jsonl

One process, one caller. Every measurement uses a fresh scope (every key new: an entry is
made, claimed and marked done), so ``run`` and ``run_many`` do the same work per key: the
difference is two transactions per chunk against two per key. The order of the two paths
alternates between repeats. Rate = keys / wall time of the call(s); each row ends with the
1-minute load average at its end. Databases: a fresh Postgres schema (``DATABASE_URL``,
default postgresql://postgres@127.0.0.1:5432/test), a fresh MariaDB/MySQL database
(``MYSQL_URL``, default mysql://root@127.0.0.1:3306/test), a temporary SQLite file
(synchronous FULL, the default); all dropped afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from justonce.testing.databases import fresh_database

PG_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
MY_SERVER = os.environ.get("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
NAMES = {"sqlite": "SQLite FULL", "postgres": "PostgreSQL", "mysql": "MariaDB/MySQL"}


@contextlib.contextmanager
def database(backend: str) -> Iterator[str]:
    """A fresh, empty database of ``backend``: its justonce URL, dropped afterwards."""
    with tempfile.TemporaryDirectory() as d, fresh_database(
            backend, Path(d), postgres=PG_SERVER, mysql=MY_SERVER, prefix="bench_effects") as url:
        yield url


def noop(idempotency_key: str) -> None:
    return None


def time_single(app: Any, scope: str, keys: int) -> float:
    t0 = time.perf_counter()
    for k in range(keys):
        out = app.effects.run(scope, k, noop)
        assert out.ran and out.state == "done", out
    return time.perf_counter() - t0


def time_many(app: Any, scope: str, keys: int, chunk: int) -> float:
    t0 = time.perf_counter()
    out = app.effects.run_many(scope, range(keys), noop, chunk=chunk)
    elapsed = time.perf_counter() - t0
    assert out.done == keys and not out.failed and not out.overtaken, out
    return elapsed


def bench(backend: str, keys: int, single_keys: int, chunk: int, repeat: int) -> list[dict[str, Any]]:
    import justonce

    rates: dict[str, list[float]] = {"run": [], "run_many": []}
    with database(backend) as url:
        app = justonce.App(url)
        app.migrate()
        app.effects.run_many("warm-up", range(chunk), noop, chunk=chunk)  # connect, load queries
        app.effects.run("warm-up", "single", noop)
        for r in range(repeat):
            order = ("run", "run_many") if r % 2 == 0 else ("run_many", "run")
            for path in order:
                scope = f"bench:{path}:{r}"
                if path == "run":
                    rates[path].append(single_keys / time_single(app, scope, single_keys))
                else:
                    rates[path].append(keys / time_many(app, scope, keys, chunk))
            counts = app.effects.counts(f"bench:run_many:{r}")
            assert counts == {"done": keys}, counts
        app.close()
    load = round(os.getloadavg()[0], 2)
    single = statistics.median(rates["run"])
    return [
        {"backend": backend, "path": "run", "keys": single_keys, "chunk": 1,
         "effects_per_s": round(single), "runs": [round(x) for x in rates["run"]],
         "ratio_to_run": 1.0, "loadavg_1m": load},
        {"backend": backend, "path": "run_many", "keys": keys, "chunk": chunk,
         "effects_per_s": round(statistics.median(rates["run_many"])),
         "runs": [round(x) for x in rates["run_many"]],
         "ratio_to_run": round(statistics.median(rates["run_many"]) / single, 1), "loadavg_1m": load},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgres", "mysql", "all"], default="all")
    ap.add_argument("--keys", type=int, default=20_000, help="keys per run_many measurement")
    ap.add_argument("--single", type=int, default=None,
                    help="keys per run (one at a time) measurement (default: --keys)")
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=1, help="medians of this many runs")
    ap.add_argument("--json-out", default=None, help="also append one JSON line per row here")
    args = ap.parse_args()
    backends = ["sqlite", "postgres", "mysql"] if args.backend == "all" else [args.backend]
    rows = []
    for b in backends:
        rows += bench(b, args.keys, args.single or args.keys, args.chunk, args.repeat)
    print(f"{'backend':<15} {'path':<9} {'keys':>7} {'chunk':>5} {'effects/s':>10} {'x run':>6} {'load':>5}")
    for row in rows:
        print(f"{NAMES[row['backend']]:<15} {row['path']:<9} {row['keys']:>7} {row['chunk']:>5} "
              f"{row['effects_per_s']:>10,} {row['ratio_to_run']:>6} {row['loadavg_1m']:>5}")
    if args.json_out:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with open(args.json_out, "a") as f:
            for row in rows:
                f.write(json.dumps({"bench": "effects", "at": stamp, **row,
                                    "python": sys.version.split()[0]}) + "\n")


if __name__ == "__main__":
    main()
