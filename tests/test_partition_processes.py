"""Partitions under real processes: 2N processes for N slots with a holder killed, a
SIGSTOP'd holder fenced out, a partitioned scan with a worker killed, and per-key order
under 4 partitioned workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import proc_app
from conftest import LONG
from fleet import HERE, Fleet, Procs, ledger, proc_app_on, stop_outside_a_write, wait_for
from justonce import App, BatchState, Enqueue

pytestmark = pytest.mark.slow

LEASE = 2.0
RENEW = LEASE / 3


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    with proc_app_on(db_url) as a:
        proc_app.create_partition_tables(db_url)
        yield a


def lease_log(url: str) -> list[tuple[int, int, int, str, float, float]]:
    conn = proc_app.ledger_connect(url)
    try:
        return [tuple(r) for r in conn.execute(
            "SELECT slot, token, pid, event, expires, at FROM lease_log ORDER BY id").fetchall()]
    finally:
        conn.close()


def assert_no_two_live_holders(log: list[tuple[int, int, int, str, float, float]]) -> None:
    """For each slot, every holder's lease (from its acquisition to the last expiry it
    renewed to) ends before the next holder acquires, and tokens grow with each holder."""
    by_slot: dict[int, dict[int, list[float]]] = defaultdict(dict)
    acquired: dict[tuple[int, int], float] = {}
    for slot, token, _pid, event, expires, _at in log:
        if event == "acquired":
            assert (slot, token) not in acquired, f"token {token} of slot {slot} given twice"
            acquired[(slot, token)] = expires - LEASE
        if event in ("acquired", "renewed"):
            by_slot[slot].setdefault(token, []).append(expires)
    for slot, tokens in by_slot.items():
        ordered = sorted(tokens)
        for older, newer in zip(ordered, ordered[1:], strict=False):
            assert newer > older
            assert acquired[(slot, newer)] >= max(tokens[older]) - 0.001, (
                f"slot {slot}: token {newer} acquired while token {older} was live")


def test_2n_processes_for_n_slots_n_hold_n_wait_and_a_standby_takes_a_killed_holders_slot(
    app: App, db_url: str, procs: Procs
) -> None:
    """6 processes for 3 slots: 3 hold a slot and renew it, 3 wait. kill -9 one holder: a
    standby holds its slot within the lease plus one renewal interval (plus scheduling
    slack), with a newer token; at no time do two processes hold one slot."""
    n = 3
    workers = [procs.start(proc_app.hold_slot, db_url, "scan", n, LEASE) for _ in range(2 * n)]

    def acquisitions() -> list[tuple[int, int, int, str, float, float]]:
        return [r for r in lease_log(db_url) if r[3] == "acquired"]

    wait_for(lambda: len(acquisitions()) >= n, 60, "3 holders")
    time.sleep(2 * RENEW)
    assert len(acquisitions()) == n and sorted(r[0] for r in acquisitions()) == [0, 1, 2]
    assert all(w.is_alive() for w in workers)  # the other 3 stand by
    held = [s for s in app.partitions.list("scan") if s.held]
    assert len(held) == n
    victim_slot, victim_token, victim_pid = acquisitions()[0][:3]
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: len(acquisitions()) > n, 30, "a standby to take the slot", interval=0.02)
    took = time.monotonic() - killed_at
    new = acquisitions()[n]
    assert new[0] == victim_slot and new[1] == victim_token + 1 and new[2] != victim_pid
    assert took <= LEASE + RENEW + 1.5, f"takeover took {took:.2f}s"
    time.sleep(2 * RENEW)
    assert_no_two_live_holders(lease_log(db_url))
    assert sum(1 for s in app.partitions.list("scan") if s.held) == n


def test_a_holder_stopped_past_its_lease_is_fenced_out_when_it_resumes(
    app: App, db_url: str, procs: Procs
) -> None:
    """A holder writes under its fence every 50 ms; SIGSTOP it past its lease, let a
    standby take the slot, SIGCONT it: its next fenced write is refused (it logs
    write_rejected), and none of its rows was committed after the takeover."""
    zombie = procs.start(proc_app.fenced_writer, db_url, "fence", 1, LEASE)
    wait_for(lambda: [r for r in lease_log(db_url) if r[3] == "acquired"], 60, "the holder")
    time.sleep(0.5)
    stop_outside_a_write(zombie.pid, db_url, slot=("fence", 0))
    standby = procs.start(proc_app.fenced_writer, db_url, "fence", 1, LEASE)
    wait_for(lambda: len([r for r in lease_log(db_url) if r[3] == "acquired"]) == 2, 30,
             "the standby to take over")
    time.sleep(0.3)
    os.kill(zombie.pid, signal.SIGCONT)
    wait_for(lambda: [r for r in lease_log(db_url) if r[3] == "write_rejected"], 15,
             "the zombie's write to be refused")
    zombie.join(10)
    log = lease_log(db_url)
    new = next(r for r in log if r[3] == "acquired" and r[2] == standby.pid)
    assert [r[2] for r in log if r[3] == "write_rejected"] == [zombie.pid]
    conn = proc_app.ledger_connect(db_url)
    try:
        rows = conn.execute("SELECT token, pid, at FROM fenced_writes").fetchall()
    finally:
        conn.close()
    zombie_rows = [r for r in rows if r[1] == zombie.pid]
    assert zombie_rows and all(r[0] == 1 for r in zombie_rows)
    assert max(r[2] for r in zombie_rows) <= new[4] - LEASE + 0.001
    assert any(r[1] == standby.pid and r[0] == 2 for r in rows)
    assert_no_two_live_holders(log)


def test_a_partitioned_scan_of_100000_rows_survives_a_killed_worker(
    app: App, db_url: str, fleet: Fleet
) -> None:
    """8 slot jobs over 100,000 rows, 4 worker processes; one is killed with kill -9
    midway. Every row is in the ledger of processed rows exactly once, and the scan's
    completion callback runs once."""
    conn = proc_app.ledger_connect(db_url)
    try:
        if db_url.startswith("sqlite"):
            conn.execute("WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < 100000) "
                         "INSERT INTO scan_rows SELECT x FROM s")
        elif db_url.startswith("mysql"):
            conn.execute(f"INSERT INTO scan_rows {proc_app.integers_sql(1, 100000)}")
        else:
            conn.execute("INSERT INTO scan_rows SELECT generate_series(1, 100000)")
    finally:
        conn.close()
    workers = [fleet.start(concurrency=1, ready=False) for _ in range(4)]
    fleet.wait_ready(*workers)
    batch = app.partitions.scan(proc_app.scan_slot, column="r.id", n=8,
                                on_complete=proc_app.batch_done)

    def processed() -> list[tuple[int, int]]:
        c = proc_app.ledger_connect(db_url)
        try:
            return [tuple(r) for r in c.execute("SELECT id, pid FROM processed").fetchall()]
        finally:
            c.close()

    wait_for(lambda: len(processed()) >= 20_000, 120, "the scan to get going", interval=0.02)
    busy = Counter(pid for _, pid in processed())
    victim = next(w for w in workers if w.pid in busy)
    victim.signal(signal.SIGKILL)
    victim.wait(10)
    wait_for(lambda: batch.info().state is BatchState.COMPLETED, 120,
             f"the scan to complete ({batch.info()})", interval=0.25)
    wait_for(lambda: ledger(db_url, "batch_done"), 30, "the callback to run")
    rows = processed()
    ids = Counter(i for i, _ in rows)
    assert len(ids) == 100_000 and set(ids.values()) == {1}
    assert len(ledger(db_url, "batch_done")) == 1
    assert batch.info().acked == 8


PER_KEY = 1000 if LONG else 100



def test_jobs_of_one_key_run_strictly_in_order_under_4_partitioned_workers(
    app: App, db_url: str, tmp_path: Path
) -> None:
    """Three keys, jobs 1..1000 each (200 in the short form), enqueued interleaved; 4 worker
    processes started with --partitions ordered:4 (concurrency 4 each). Per key, the jobs run
    one at a time (each starts after the previous one ended) in enqueue order."""
    keys = ["alpha", "beta", "gamma"]
    app.enqueue_many(Enqueue(proc_app.ordered_step, args=(k, i), partition_key=k)
                     for i in range(1, PER_KEY + 1) for k in keys)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    env.pop("JUSTONCE_DATABASE_URL", None)
    procs = []
    for w in range(4):
        log = open(tmp_path / f"pw-{w}.log", "wb")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "justonce", "worker", "--app", "proc_app:app",
             "--database-url", db_url, "--queues", "ordered", "--partitions", "ordered:4",
             "--concurrency", "4", "--lease", str(LEASE), "--heartbeat", "0.5", "--poll", "0.2"],
            cwd=tmp_path, env=env, stdout=log, stderr=log, start_new_session=True), log))
    try:
        def done() -> int:
            c = proc_app.ledger_connect(db_url)
            try:
                return c.execute("SELECT count(*) FROM order_log WHERE event = 'done'").fetchone()[0]
            finally:
                c.close()

        wait_for(lambda: done() == 3 * PER_KEY, 240, f"{3 * PER_KEY} ordered jobs", interval=0.5)
    finally:
        for p, _ in procs:
            p.send_signal(signal.SIGTERM)
        for p, log in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
            log.close()
    conn = proc_app.ledger_connect(db_url)
    try:
        sql = proc_app._sql(conn, 'SELECT "key", i, event FROM order_log ORDER BY id')
        events = conn.execute(sql).fetchall()
    finally:
        conn.close()
    for key in keys:
        seq = [(i, e) for k, i, e in events if k == key]
        expected = [(i, e) for i in range(1, PER_KEY + 1) for e in ("start", "done")]
        diff = next((x for x in zip(seq, expected, strict=False) if x[0] != x[1]), None)
        assert seq == expected, f"{key}: {len(seq)} events, first difference {diff}"
