"""justonce.current_job(): inside a task, the job it runs as; None outside one."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from justonce import App, current_job


def test_a_task_sees_its_own_job_sync_and_async(app: App, worker_factory: Any) -> None:
    seen: dict[int, tuple[Any, ...]] = {}
    lock = threading.Lock()

    @app.task(max_attempts=2)
    def sync_task(n: int) -> None:
        began = time.time()
        job = current_job()
        assert job is not None
        # Set by the worker at its last check before calling the task: just before now.
        assert job.started_at is not None and began - 60 < job.started_at <= began, (job.started_at, began)
        with lock:
            seen[n] = (job.id, job.attempts, job.max_attempts, job.task, job.lease_token)
        if n == 0 and job.attempts == 1:
            raise RuntimeError("again")

    @app.task
    async def async_task(n: int) -> None:
        began = time.time()
        job = current_job()
        assert job is not None
        assert job.started_at is not None and began - 60 < job.started_at <= began, (job.started_at, began)
        await asyncio.sleep(0.05)  # other coroutines run meanwhile: each keeps its own job
        again = current_job()
        with lock:
            seen[n] = (job.id, job.attempts, job.max_attempts, job.task,
                       job.lease_token, again is job)

    ids = {n: sync_task.enqueue(n).id for n in range(3)}
    ids |= {n: async_task.enqueue(n).id for n in range(10, 16)}
    worker_factory(concurrency=4)
    for n, job_id in ids.items():
        assert app.wait(job_id, 30).state == "succeeded", n
    assert current_job() is None  # not in a job here
    for n, job_id in ids.items():
        got = seen[n]
        assert got[0] == job_id
        assert got[1] == (2 if n == 0 else 1)  # the retry is attempt 2
        assert got[3] == (sync_task.name if n < 10 else async_task.name)
        assert isinstance(got[4], int)
        if n >= 10:
            assert got[5] is True
    assert seen[0][2] == 2
