#!/usr/bin/env python3
"""What the event seam costs a worker's hot path, per job, in nanoseconds.

The worker reports ``job.succeeded`` once per job. It asks ``wanted(JOB_SUCCEEDED)`` once
per ack batch and, when nothing listens (INFO off, no subscriber), builds no fields and
calls nothing: the cost per job is then the guard's branch alone. This measures, per job:

- ``plain_call``: a call of an empty function with the same keyword arguments (the floor
  of any emitter that is called at all);
- ``before_seam``: the guard the worker had before (``log.isEnabledFor`` per batch);
- ``guarded_skip``: what the worker does per job when nothing listens (``wanted`` once per
  batch of 500, then a branch per job);
- ``emit_nobody``: ``emit`` called unguarded with nothing listening (what a careless call
  site would pay);
- ``emit_logged_off_metrics_on``: ``emit`` with INFO off and a :class:`WorkerMetrics`
  subscriber (a worker with ``--metrics-port``);
- ``emit_logged_on``: ``emit`` with INFO on, to a handler that formats JSON into a null
  stream (the default worker, for scale).

    python bench/events_bench.py [--n 200000] [--repeat 5]

Output: one JSON line with the medians in ns per job.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import statistics
import time
from collections.abc import Callable

from justonce.events import Event, emit, wanted
from justonce.logs import JsonFormatter
from justonce.metrics import WorkerMetrics


def per_job(fn: Callable[[int], None], n: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter_ns()
        fn(n)
        runs.append((time.perf_counter_ns() - t) / n)
    return round(statistics.median(runs), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    log = logging.getLogger("justonce.worker")
    root = logging.getLogger("justonce")
    root.propagate = False
    root.setLevel(logging.WARNING)

    def noop(**fields: object) -> None:
        pass

    def plain_call(n: int) -> None:
        for i in range(n):
            noop(job_id=i, task="t", queue="q", attempt=1, duration_ms=0.1, note=None)

    def guarded_skip(n: int) -> None:
        for start in range(0, n, 500):
            info = wanted(Event.JOB_SUCCEEDED, log)
            for i in range(start, min(n, start + 500)):
                if info:
                    emit(Event.JOB_SUCCEEDED, "job succeeded", job_id=i, task="t", queue="q",
                         attempt=1, duration_ms=0.1, note=None)

    def before_seam(n: int) -> None:  # the worker's guard before events.py existed
        for start in range(0, n, 500):
            info = log.isEnabledFor(logging.INFO)
            for i in range(start, min(n, start + 500)):
                if info:
                    log.info("job succeeded", extra={"event": Event.JOB_SUCCEEDED.value, "job_id": i})

    def emit_all(n: int) -> None:
        for i in range(n):
            emit(Event.JOB_SUCCEEDED, "job succeeded", job_id=i, task="t", queue="q", attempt=1,
                 duration_ms=0.1, note=None)

    out = {"n": args.n, "repeat": args.repeat, "unit": "ns per job"}
    out["plain_call"] = per_job(plain_call, args.n, args.repeat)
    out["before_seam"] = per_job(before_seam, args.n, args.repeat)
    out["guarded_skip"] = per_job(guarded_skip, args.n, args.repeat)
    out["emit_nobody"] = per_job(emit_all, args.n, args.repeat)
    metrics = WorkerMetrics(tasks=["t"], queues=["q"]).attach()
    out["emit_logged_off_metrics_on"] = per_job(emit_all, args.n, args.repeat)
    metrics.close()
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(JsonFormatter())
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    out["emit_logged_on"] = per_job(emit_all, max(1, args.n // 10), args.repeat)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
