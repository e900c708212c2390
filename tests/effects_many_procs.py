"""What the spawned processes of tests/test_effects_many.py run (importable by name, as
multiprocessing's spawn needs). Each effect appends its key to this process's own log file
and flushes it before ``fn`` returns: the logs are what happened, whatever the ledger says."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import justonce


def send_many(url: str, scope: str, keys: list[int], chunk: int, policy: str, lease: float,
              log_dir: str, start: Any, results: Any, die_at: int = 0, ready: Any = None,
              stop_at: int = 0) -> None:
    """``run_many`` over ``keys`` in the order given from this process, logging each
    effect to ``log_dir/<pid>.log``. ``die_at`` > 0: SIGKILL this process on that call of
    ``fn`` (after logging it); ``stop_at`` > 0: SIGSTOP it there instead (it goes on where
    it was when sent SIGCONT). ``ready``: a queue it puts its pid on once connected, before
    it waits for ``start`` (so that a slow spawn cannot leave it nothing to do). Puts (pid,
    done, skipped, failed, overtaken, keys) on ``results`` when it lives to the end."""
    app = justonce.App(url, strict=False)
    calls = 0
    with open(Path(log_dir) / f"{os.getpid()}.log", "a", buffering=1) as log:
        def effect(idem: str) -> None:
            nonlocal calls
            calls += 1
            log.write(idem.rsplit(":", 1)[1] + "\n")
            log.flush()
            if calls == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if calls == stop_at:
                os.kill(os.getpid(), signal.SIGSTOP)

        if start is not None:
            app.effects.counts(scope)  # connected and schema checked before the start
            if ready is not None:
                ready.put(os.getpid())
            start.wait(60)
        out = app.effects.run_many(scope, keys, effect, chunk=chunk, policy=policy, lease=lease,
                                   lock_timeout=60)
    results.put((os.getpid(), out.done, dict(out.skipped), len(out.failed), len(out.overtaken),
                 out.keys))
    app.close()


def read_logs(log_dir: str) -> dict[int, list[str]]:
    """Every process's logged keys, by pid."""
    return {int(p.stem): p.read_text().split() for p in Path(log_dir).glob("*.log")}
