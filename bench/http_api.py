"""The service's speed over HTTP, beside the library's own, in the same run.

    PYTHONPATH=src .venv/bin/python bench/http_api.py --seconds 5 --threads 4

One ``justonce serve`` process on a fresh Postgres schema (``--backend sqlite`` for the
embedded one); ``--threads`` client threads, each with its own keep-alive connection
(httpx). Measured, each for ``--seconds``:

- single enqueues: requests/s of ``POST /api/v1/jobs`` and, in this process, of
  ``app.enqueue`` on as many threads;
- bulk enqueues of ``--bulk`` (1,000) jobs: jobs/s of ``POST /api/v1/jobs/bulk`` and of
  ``app.enqueue_many``;
- bulk acks of ``--bulk`` item ids per request: ids/s of ``POST /api/v1/batches/acks``
  over one sealed batch (target ≥ 100,000 ids/s on Postgres) and of ``app.batches.ack``.

Every HTTP request also verifies its token (one indexed read) and writes one audit row,
as the service does; the library figures do neither.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from justonce import App, Enqueue  # noqa: E402
from webserver import serving  # noqa: E402

PG_SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def run_threads(n: int, seconds: float, work: Callable[[int], Callable[[], int]]) -> float:
    """Run ``work(i)()`` in a loop on n threads for ``seconds``; return units per second."""
    done = [0] * n
    stop = time.perf_counter() + seconds
    start = threading.Barrier(n + 1)

    def loop(i: int) -> None:
        step = work(i)
        start.wait()
        while time.perf_counter() < stop:
            done[i] += step()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--bulk", type=int, default=1000)
    p.add_argument("--workers", type=int, default=1, help="server processes (justonce serve --workers)")
    args = p.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    tmp = Path(f"/tmp/justonce-http-bench-{schema}")
    tmp.mkdir()
    url = (f"{PG_SERVER}?schema={schema}" if args.backend == "postgres" else f"sqlite:///{tmp / 'jobs.db'}")
    lib = App(url, strict=False)
    results: dict[str, float] = {}
    try:
        with serving(url, tmp / "serve.log", "--workers", str(args.workers)) as server:
            def client(_: int) -> httpx.Client:
                return httpx.Client(base_url=server.url, timeout=60,
                                    headers={"Authorization": f"Bearer {server.admin}"})

            def http_single(i: int) -> Callable[[], int]:
                c = client(i)

                def step() -> int:
                    c.post("/api/v1/jobs", json={"task": "bench.t", "args": [i]}).raise_for_status()
                    return 1
                return step

            def lib_single(i: int) -> Callable[[], int]:
                return lambda: (lib.enqueue("bench.t", [i]), 1)[1]

            body = {"jobs": [{"task": "bench.t", "args": [k]} for k in range(args.bulk)]}
            reqs = [Enqueue("bench.t", args=[k]) for k in range(args.bulk)]

            def http_bulk(i: int) -> Callable[[], int]:
                c = client(i)
                return lambda: len(c.post("/api/v1/jobs/bulk", json=body).raise_for_status().json()["ids"])

            def lib_bulk(i: int) -> Callable[[], int]:
                return lambda: len(lib.enqueue_many(reqs))

            results["single enqueue, HTTP (requests/s)"] = run_threads(args.threads, args.seconds, http_single)
            results["single enqueue, library (jobs/s)"] = run_threads(args.threads, args.seconds, lib_single)
            results[f"bulk enqueue of {args.bulk}, HTTP (jobs/s)"] = run_threads(
                args.threads, args.seconds, http_bulk)
            results[f"bulk enqueue of {args.bulk}, library (jobs/s)"] = run_threads(
                args.threads, args.seconds, lib_bulk)

            # Acks: one batch with enough items for the whole run, each thread its own range.
            per_thread = 3_000_000 // args.threads
            for name, via_http in (("HTTP", True), ("library", False)):
                batch = lib.batches.open("bench")
                groups = [batch.add(per_thread) for _ in range(args.threads)]
                batch.seal()

                def acker(i: int, via_http: bool = via_http, groups: Any = groups) -> Callable[[], int]:
                    g = groups[i]
                    prefix = f"{g.batch_id}:{g.group_id}:"
                    pos = [0]
                    c = client(i)

                    def step() -> int:
                        ids = [f"{prefix}{k}" for k in range(pos[0], min(pos[0] + args.bulk, g.count))]
                        pos[0] += len(ids)
                        if not ids:
                            return 0
                        if via_http:
                            c.post("/api/v1/batches/acks", json={"ids": ids}).raise_for_status()
                        else:
                            lib.batches.ack(ids)
                        return len(ids)
                    return step

                results[f"bulk ack of {args.bulk} ids, {name} (ids/s)"] = run_threads(
                    args.threads, args.seconds, acker)
    finally:
        lib.close()
        if args.backend == "postgres":
            subprocess.run(["psql", PG_SERVER, "-qc", f"DROP SCHEMA IF EXISTS {schema} CASCADE"],
                           capture_output=True)
    print(f"backend {args.backend}, {args.threads} client threads, {args.seconds:g} s each, "
          f"{args.workers} server process(es)")
    for k, v in results.items():
        print(f"  {k:<45} {v:>12,.0f}")


if __name__ == "__main__":
    main()
