"""SQLite on a full disk (a small tmpfs the test mounts): a clear error, nothing half
written, no corruption, and the work resumes when space returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from justonce import App, DatabaseUnavailable, Worker
from justonce.testing.torture import fill, sqlite_integrity, tmpfs, tmpfs_unavailable

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    why = tmpfs_unavailable()
    if why is not None:
        pytest.skip(why)
    disk = tmp_path / "disk"
    disk.mkdir()
    with tmpfs(disk, 2):
        yield disk


def test_a_full_disk_refuses_writes_clearly_and_the_work_resumes_when_space_returns(
        small_disk: Path) -> None:
    db = small_disk / "jobs.db"
    app = App(f"sqlite:///{db}")
    app.migrate()
    ran: list[int] = []
    lock = threading.Lock()

    @app.task(max_attempts=50)
    def work(n: int, pad: str) -> int:
        with lock:
            ran.append(n)
        return n

    before = [app.enqueue(work, [n, "x" * 100]).id for n in range(20)]
    worker = Worker(app, concurrency=2, lease=2.0, poll=0.05, housekeeping_interval=0.2)
    worker.start()
    try:
        filler = fill(small_disk)
        accepted, refused = [], []
        for n in range(20, 400):
            try:
                accepted.append(app.enqueue(work, [n, "x" * 500]).id)
            except DatabaseUnavailable as exc:
                refused.append(str(exc))
                if len(refused) >= 3:
                    break
        assert refused, "the disk never filled up"
        assert all("full" in r for r in refused), refused
        assert "nothing of this call was written" in refused[0]
        time.sleep(1.0)  # the worker meets the full disk too (claims, acks, renewals)
        assert sqlite_integrity(db) is None
        filler.unlink()
        after = [app.enqueue(work, [n, "y"]).id for n in range(1000, 1010)]
        ids = before + accepted + after
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(app.get_job(i).state == "succeeded" for i in ids):
                break
            time.sleep(0.2)
        states = {i: app.get_job(i).state for i in ids}
        assert all(s == "succeeded" for s in states.values()), states
    finally:
        worker.stop()
        worker.join()
    total = len(app.list_jobs(limit=10000))
    assert total == len(ids)  # refused enqueues wrote nothing
    assert set(ran) >= {app.get_job(i).args[0] for i in ids}
    assert sqlite_integrity(db) is None
    app.close()
