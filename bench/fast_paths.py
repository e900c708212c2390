"""The PostgreSQL backend's own fast paths beside the shared Store's generic ones, in one run.

The Store (src/justonce/backends/store.py) writes every operation once; PostgresBackend keeps
two operations of its own because they are faster there. This measures both, alternating
the two forms in rounds so that both see the same machine:

- bulk insert of jobs that differ in their options (keys): one JSON statement
  (``job_insert_many``) against the generic ``job_insert`` once per job;
- complete a batch of jobs and claim the next: one fused statement
  (``job_complete_and_claim``) against the generic transaction of two statements.

    .venv/bin/python bench/fast_paths.py --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import psycopg

from justonce import App
from justonce.backends.dialect import Dialect
from justonce.backends.store import Store
from justonce.models import Completion, NewJob


def _jobs(n: int, tag: str) -> list[NewJob]:
    return [NewJob(task="t", queue="fast", args_json="[1]", kwargs_json="{}", priority=i % 3,
                   max_attempts=3, timeout=60.0, key=f"{tag}-{i}") for i in range(n)]


def insert_rate(app: App, generic: bool, n: int) -> float:
    backend: Any = app.backend
    jobs = _jobs(n, uuid.uuid4().hex)
    t0 = time.perf_counter()
    if generic:
        backend.d.on(None, lambda c: Dialect.insert_rows(backend.d, c, jobs, backend.job_params),
                     atomic=True)
    else:
        backend.job_insert_many(jobs)
    return n / (time.perf_counter() - t0)


def cycle_rate(app: App, generic: bool, batch: int, rounds: int) -> float:
    backend: Any = app.backend
    backend.job_insert_many([NewJob(task="t", queue="cycle", args_json="[1]", kwargs_json="{}", priority=0,
                                    max_attempts=3, timeout=60.0)
                             for _ in range(batch * (rounds + 1))])
    held = backend.job_claim("cycle", batch, "bench", 60.0)
    op = Store.job_complete_and_claim if generic else type(backend).job_complete_and_claim
    t0 = time.perf_counter()
    done = 0
    for _ in range(rounds):
        completions = [Completion(j.id, j.lease_token, None) for j in held]
        accepted, held = op(backend, completions, "cycle", batch, "bench", 60.0)
        done += len(accepted)
    return done / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    schema = f"fast_{uuid.uuid4().hex[:8]}"
    app = App(f"{args.database_url}?schema={schema}")
    app.migrate()
    results: dict[str, list[float]] = {k: [] for k in
                                       ("insert fast", "insert generic", "cycle fast", "cycle generic")}
    try:
        for _ in range(args.rounds):
            for generic in (False, True):
                kind = "generic" if generic else "fast"
                results[f"insert {kind}"].append(insert_rate(app, generic, 1000))
                results[f"cycle {kind}"].append(cycle_rate(app, generic, 100, 30))
    finally:
        app.close()
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"keyed bulk insert, 1,000 jobs per call: {med['insert fast']:,.0f} jobs/s in one "
          f"statement, {med['insert generic']:,.0f} one per job "
          f"(x{med['insert fast'] / med['insert generic']:.1f})")
    print(f"complete 100 + claim 100 per call: {med['cycle fast']:,.0f} jobs/s fused, "
          f"{med['cycle generic']:,.0f} as two statements in a transaction "
          f"(x{med['cycle fast'] / med['cycle generic']:.2f})")
    print(f"(medians of {args.rounds} alternating rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
