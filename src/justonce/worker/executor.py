"""Runs one claimed job and turns what happened into an outcome to record.

Sync tasks run in the calling slot thread; ``async def`` tasks run on one event loop per
worker (a thread of its own), and the slot waits for them. Nothing a task does — raise,
return something odd, take wrong arguments — escapes as an exception here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import validate
from ..context import _current
from ..errors import NonRetryable
from ..models import ClaimedJob, Completion, Failure
from ..retry import Backoff

if TYPE_CHECKING:
    from ..app import App
    from ..tasks import Task


@dataclass(slots=True)
class Outcome:
    """``kind`` is succeeded, failed, timeout, unknown_task, bad_arguments, undecodable or not_started
    (an async job its gate stopped: no code ran)."""

    kind: str
    duration: float
    completion: Completion | None = None
    failure: Failure | None = None


class AsyncRunner:
    """An event loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=_serve, args=(loop,), name="justonce-async", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def submit(self, task: Task, job: ClaimedJob,
               gate: Callable[[], bool] | None = None) -> concurrent.futures.Future[Any]:
        """Run the task's coroutine on the loop. ``gate``, called on the loop first, may
        say the job must not start after all (NotStarted): the loop may get to a job long
        after the slot handed it over, when another job's code holds the loop. Nothing
        is awaited between the gate's answer and the task's code."""
        async def run() -> Any:
            if gate is not None and not gate():
                raise NotStarted()
            _current.set(job)  # this coroutine's own context: concurrent jobs do not mix
            pid = os.getpid()
            try:
                async with asyncio.timeout(job.timeout) as deadline:
                    try:
                        return await task.fn(*job.args, **job.kwargs)
                    finally:
                        _end_a_forked_child(pid)
            except TimeoutError:
                # The deadline's own TimeoutError, or one the task raised (a socket's or
                # an inner wait_for's): only the first is the job's timeout.
                if deadline.expired():
                    raise Overran() from None
                raise

        return asyncio.run_coroutine_threadsafe(run(), self.loop())

    def close(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Run the loop until :meth:`AsyncRunner.close`, then end it as ``asyncio.run`` does:
    the jobs handed over but not reached yet (their futures cancelled by the worker's stop)
    are closed unstarted, coroutines still running past the grace are cancelled and their
    cleanup runs, and the loop's own sockets are closed (a worker started and stopped
    in a long-lived process used to leave its loop and an unawaited coroutine behind)."""
    try:
        loop.run_forever()
        left = asyncio.all_tasks(loop)
        for t in left:
            t.cancel()
        # Once more round the loop: the hand-overs still queued make their tasks, which
        # see their futures cancelled; then everything ends.
        loop.run_until_complete(asyncio.sleep(0))
        left = asyncio.all_tasks(loop)
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:  # noqa: BLE001 - user code that will not end; the thread is a daemon
        pass
    finally:
        if not loop.is_running():
            loop.close()


def _end_a_forked_child(pid: int) -> None:
    """In a process the task forked (``os.fork()``) whose child returned or raised from the
    task instead of ending itself: end it here, at once. It went on in the worker's own
    loop: it completed the job in its parent's place, claimed and ran other jobs over
    connections it shared with its parent, and lived on after the worker stopped."""
    if os.getpid() != pid:
        os._exit(0)


class NotStarted(Exception):
    """An async job's gate said no when the loop got to it: its code never ran (the worker
    has given it back)."""


class Overran(Exception):
    """An async task's attempt ran past its ``timeout``. (Not TimeoutError: a task raises
    that for timeouts of its own, an HTTP read say, and those are plain failures with
    their message, not the job's timeout.) A sync task's overrun is seen by the worker's
    supervisor while it runs, and by the executor when it returns."""


def _error_text(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc))
        head = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        text = head = type(exc).__name__
    if len(text) > validate.MAX_ERROR_CHARS:
        text = head[:1000] + "\n…\n" + text[-(validate.MAX_ERROR_CHARS - 1010):]
    return validate.error_text(text)


def _mismatch(task: Task, job: ClaimedJob) -> str | None:
    if task.signature is None:
        return None
    try:
        task.signature.bind(*job.args, **job.kwargs)
    except TypeError as exc:
        return str(exc)
    return None


class Executor:
    def __init__(self, app: App) -> None:
        self.app = app
        self.async_runner = AsyncRunner()

    def run(self, job: ClaimedJob, on_future: Any = None,
            gate: Callable[[], bool] | None = None) -> Outcome:
        """Run the job once. ``on_future(fut)`` is told the future of an async task so
        the worker can cancel it (timeout, shutdown); ``gate`` is called on the loop just
        before an async task's code (see AsyncRunner.submit): when it says no, the outcome
        is ``not_started`` and nothing ran."""
        start = time.perf_counter()
        task = self.app.tasks.get(job.task)
        if job.undecodable is not None:
            # (stored corrupt: every attempt would find it so, and calling the task with
            # anything else would run it on arguments nobody gave)
            return self._fail(job, start, "undecodable", task,
                              f"the job's stored arguments do not decode: {job.undecodable}",
                              final=True)
        if task is None:
            return self._fail(job, start, "unknown_task", None,
                              f"unknown task {job.task!r}: no worker task is registered "
                              "under that name", final=True)
        try:
            if task.is_async:
                fut = self.async_runner.submit(task, job, gate)
                if on_future is not None:
                    on_future(fut)
                result = fut.result()
            else:
                # A sync task cannot be stopped at its timeout: the worker's supervisor fails
                # the attempt when its next check (every 0.1 s, between its own writes) sees
                # it late. One that returned before that check was taken as done, success
                # or error, however late: its return is checked here too, as an async
                # task's is by its own deadline.
                ctx = _current.set(job)
                pid = os.getpid()
                try:
                    try:
                        result = task.fn(*job.args, **job.kwargs)
                    finally:
                        _end_a_forked_child(pid)
                except BaseException:
                    if time.perf_counter() - start > job.timeout:
                        raise Overran from None
                    raise
                finally:
                    _current.reset(ctx)
                if time.perf_counter() - start > job.timeout:
                    raise Overran
        except NotStarted:
            return Outcome("not_started", time.perf_counter() - start)
        except Overran:
            return self._fail(job, start, "timeout", task,
                              f"timeout: attempt {job.attempts} ran over {job.timeout:g}s")
        except concurrent.futures.CancelledError:
            return self._fail(job, start, "cancelled", task, "cancelled by the worker")
        except NonRetryable as exc:
            return self._fail(job, start, "failed", task, _error_text(exc), final=True)
        except TypeError as exc:
            # Checked only on failure (binding every call costs more than a no-op task):
            # arguments that cannot fit the signature will never succeed, so no retry.
            mismatch = _mismatch(task, job)
            if mismatch is not None:
                return self._fail(job, start, "bad_arguments", task,
                                  f"arguments do not match {job.task}{task.signature}: {mismatch}",
                                  final=True)
            return self._fail(job, start, "failed", task, _error_text(exc))
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a task is a failure too
            return self._fail(job, start, "failed", task, _error_text(exc))
        result_json, note = validate.result_json(result)
        return Outcome(
            "succeeded", time.perf_counter() - start,
            completion=Completion(job.id, job.lease_token, result_json, note, job.batch_item),
        )

    def failure_for(
        self, job: ClaimedJob, task: Task | None, error: str, final: bool = False
    ) -> Failure:
        """The failure to record: retry after the task's backoff unless attempts are spent."""
        retry_in = None
        if not final and task is not None and job.attempts < job.max_attempts:
            try:
                retry_in = float(task.retry_delay(job.attempts))
                if not 0 <= retry_in <= validate.MAX_DELAY_SECONDS:
                    raise ValueError(f"backoff gave {retry_in!r} seconds")
            except Exception as exc:  # noqa: BLE001 - a broken custom backoff
                retry_in = Backoff().delay(job.attempts)
                error += f"\n(the task's backoff failed: {exc!r}; used the default backoff)"
        return Failure(job.id, job.lease_token, validate.error_text(error), retry_in,
                       job.batch_item)

    def _fail(
        self, job: ClaimedJob, start: float, kind: str, task: Task | None, error: str,
        final: bool = False,
    ) -> Outcome:
        return Outcome(kind, time.perf_counter() - start,
                       failure=self.failure_for(job, task, error, final))
