"""justonce adapter for the peer benchmark harness (shared/bench/run.py).

Point the harness at this folder:

    cd ../shared/bench   # the harness
    BENCH_ADAPTERS=/path/to/justonce/bench/adapters python run.py --systems justonce,raw_sql_b100,pgqueuer

The harness imports this file under a private module name, so ``import justonce`` below
gets the installed package, not this file.

What is measured is the library as a user runs it:

- producer: ``App(dsn)`` with the task registered under the same name as in the worker;
  one-by-one enqueue = ``task.enqueue(seq)`` (one INSERT ... RETURNING + pg_notify, one
  commit); bulk = ``task.enqueue_many([(seq,), ...])`` (one statement, one transaction per
  harness chunk). The library API is synchronous; it is called inline from the harness's
  async methods (nothing else runs in the producer meanwhile), as the RQ adapter does.
- worker: ``justonce.Worker(app, concurrency=K)`` with every other setting at the
  library default (15 s leases renewed by heartbeat, fenced lease tokens, adaptive claim
  batches up to prefetch=250, acks batched every 20 ms, retries on, LISTEN/NOTIFY wake-up,
  housekeeping on). It runs in its own threads (``Worker.start()``); the adapter waits for
  the harness's stop event, then ``stop()`` + ``join()`` (graceful: in-flight jobs finish,
  buffered acks are flushed, unstarted prefetched jobs are released).
- pending = scheduled + ready + running jobs; done = succeeded jobs.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
from common import Adapter

import justonce

TASK_NAME = "bench_noop"


def _make_app(dsn: str, on_job: Callable[[int], None] | None = None) -> tuple[justonce.App, justonce.Task]:
    app = justonce.App(dsn)
    sink = on_job or (lambda seq: None)

    @app.task(name=TASK_NAME)
    def bench_noop(seq: int) -> None:
        sink(seq)

    return app, bench_noop


class JustOnce(Adapter):
    name = "justonce"
    has_bulk = True
    pending_sql = "SELECT count(*) FROM justonce_jobs WHERE state IN ('scheduled','ready','running')"
    done_sql = "SELECT count(*) FROM justonce_jobs WHERE state = 'succeeded'"
    layout_note = ("each proc: one justonce.Worker(concurrency=K) with library defaults "
                   "(slot threads + fetcher, batched acks, heartbeats, housekeeping)")

    def __init__(self, dsn: str):
        super().__init__(dsn)
        self.app: justonce.App | None = None
        self.task: justonce.Task | None = None

    def version(self) -> str:
        return f"justonce {justonce.__version__}, psycopg {psycopg.__version__}"

    # ---- producer (run.py process) ---------------------------------------------------
    async def install(self) -> None:
        app = justonce.App(self.dsn)
        try:
            app.migrate()
        finally:
            app.close()

    async def open_producer(self) -> None:
        self.app, self.task = _make_app(self.dsn)

    async def close_producer(self) -> None:
        if self.app is not None:
            self.app.close()
            self.app = self.task = None

    async def enqueue_one(self, seq: int) -> None:
        self.task.enqueue(seq)  # sync library call, made inline on purpose

    async def enqueue_bulk(self, seqs: list[int]) -> None:
        self.task.enqueue_many([(s,) for s in seqs])

    # ---- worker (worker.py subprocess) ----------------------------------------------
    async def run_worker(self, concurrency: int, on_job: Callable[[int], None], stop: asyncio.Event) -> None:
        app, _ = _make_app(self.dsn, on_job)
        worker = justonce.Worker(app, concurrency=concurrency)  # library defaults otherwise
        try:
            worker.start()
            stop_task = asyncio.create_task(stop.wait())
            done_task = asyncio.create_task(asyncio.to_thread(worker.join))
            # Return early (and let the harness report it) if the worker thread ends by itself.
            await asyncio.wait([stop_task, done_task], return_when=asyncio.FIRST_COMPLETED)
            worker.stop()
            if not await asyncio.to_thread(worker.join, 60.0):
                raise RuntimeError("justonce worker did not stop within 60 s")
            stop_task.cancel()
            if not stop.is_set():
                raise RuntimeError("justonce worker stopped before the harness asked it to")
        finally:
            await asyncio.to_thread(app.close)


ADAPTERS = {"justonce": JustOnce}
