"""Lists under real processes: 8 reservers with random k over one list, two of them killed
with kill -9 midway and one stopped with SIGSTOP past its time to run and then continued.
Every position is completed exactly once, the stopped process's late completion is
refused, and the list's on_complete is enqueued once. (1,000,000 items with
JUSTONCE_LONG_TESTS=1; 50,000 in the CI run.)"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import proc_app
from conftest import LONG
from fleet import Procs, sqlite_write_lock_free, stop, wait_for
from justonce import App

pytestmark = pytest.mark.slow

ITEMS = 1_000_000 if LONG else 50_000
TTR = 2.0
PAUSE = 0.01


def read_log(path: Path) -> list[tuple[str, str, list[int]]]:
    out = []
    for line in path.read_text().splitlines():
        kind, *rest = line.split(" ", 2)
        token = rest[0] if rest else ""
        positions = [int(p) for p in rest[1].split()] if len(rest) > 1 else []
        out.append((kind, token, positions))
    return out


def last_line(path: Path) -> str:
    text = path.read_text() if path.exists() else ""
    return text.splitlines()[-1] if text.strip() else ""


def stop_while_holding(pid: int, log: Path, url: str, tries: int = 400) -> None:
    """SIGSTOP the process at a moment when it holds a reservation and works on it (its
    last log line is a reserve: it is not inside a transaction), and, on SQLite, not
    inside a write (a process stopped there holds the one
    write lock of the file: README, "SQLite and frozen processes")."""
    for _ in range(tries):
        stop(pid)
        if last_line(log).startswith("R ") and (
                not url.startswith("sqlite") or sqlite_write_lock_free(url, 0.2)):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.003)
    raise AssertionError(f"process {pid} never held a reservation at a stop")


def test_reservers_killed_and_stopped_complete_every_position_once(
    db_url: str, procs: Procs, tmp_path: Path
) -> None:
    app = App(db_url, strict=False)
    app.migrate()
    app.lists.create("big", items=range(ITEMS), on_complete="list_done")
    logs = [tmp_path / f"reserver-{i}.log" for i in range(8)]
    workers = [procs.start(proc_app.list_reserver, db_url, "big", i, str(logs[i]), TTR, PAUSE)
               for i in range(8)]
    wait_for(lambda: app.lists.progress("big").done >= ITEMS // 4, 300, "a quarter done")
    killed = workers[:2]
    for w in killed:
        os.kill(w.pid, signal.SIGKILL)
        w.join(10)
    zombie, zlog = workers[2], logs[2]
    stop_while_holding(zombie.pid, zlog, db_url)
    held = read_log(zlog)[-1]
    # Past its TTR, and until someone else has completed what it held.
    time.sleep(TTR + 0.5)
    wait_for(lambda: app.lists.progress("big").done >= ITEMS // 2, 300, "half done")
    os.kill(zombie.pid, signal.SIGCONT)
    for w in workers[2:]:
        w.join(600)
        assert w.exitcode == 0, f"reserver {w.pid} exited {w.exitcode}"
    info = app.lists.get("big")
    assert info.state == "completed" and info.progress.done == ITEMS
    assert len(app.list_jobs(task="list_done", limit=10)) == 1

    entries = {i: read_log(p) for i, p in enumerate(logs)}
    accepted = Counter(p for lines in entries.values() for kind, _, ps in lines if kind == "C"
                       for p in ps)
    twice = [p for p, n in accepted.items() if n > 1]
    assert not twice, f"positions completed twice: {twice[:20]}"
    # What no log shows as completed was completed by a killed process that died before
    # writing its line: only positions of those processes' last reservations.
    lost_lines = set(range(ITEMS)) - set(accepted)
    dying = {p for i in (0, 1) for p in next(
        (ps for kind, _, ps in reversed(entries[i]) if kind == "R"), [])}
    assert lost_lines <= dying, sorted(lost_lines - dying)[:20]
    # The zombie's late completion was refused, and what it held was done by others.
    refused = [(t, ps) for kind, t, ps in entries[2] if kind == "X"]
    assert refused and refused[0][0] == held[1], (held, entries[2][-3:])
    others = Counter(p for i, lines in entries.items() if i != 2 for kind, _, ps in lines
                     if kind == "C" for p in ps)
    assert all(others[p] == 1 or p in lost_lines for p in refused[0][1])
    app.close()
