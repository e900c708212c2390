"""A MySQL database made by an earlier justonce migrates, jobs and all: schema v6 (before
migration 0008's due_at and partition_state, and 0009's chunks of the effect ledger) with
jobs in every state and effects done, in doubt and pending, migrated to the latest schema,
ends with the same jobs table as a fresh database; housekeeping, the dashboard and the
partitioned claim still find each job by its state, time and key, and the ledger's
entries read and claim as they did."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from conftest import mysql_database, mysql_or_skip
from justonce import App, JobState
from justonce.backends.mysql import backend as mysql_backend
from justonce.models import Completion, Failure, SlotFence

OWNER = "upgrade-test"


def _jobs_table(app: App) -> str:
    with app.backend.transaction() as conn, conn.cursor() as cur:
        cur.execute("SHOW CREATE TABLE justonce_jobs")
        text = cur.fetchone()[1]
    return re.sub(r" AUTO_INCREMENT=\d+", "", text)


def _generated(app: App) -> list[tuple[Any, ...]]:
    """Each job's (state, due_at, the time due_at must be for that state, partition_state,
    the state partition_state must be)."""
    with app.backend.transaction() as conn, conn.cursor() as cur:
        cur.execute("SELECT state, due_at, CASE state WHEN 'scheduled' THEN run_at"
                    " WHEN 'running' THEN lease_expires_at WHEN 'ready' THEN NULL"
                    " ELSE finished_at END, partition_state,"
                    " IF(partition_key IS NULL, NULL, state) FROM justonce_jobs")
        return list(cur.fetchall())


def test_a_v6_database_with_jobs_in_every_state_migrates_and_its_duties_still_find_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with mysql_database(mysql_or_skip()) as old_url, mysql_database(mysql_or_skip()) as new_url:
        fresh = App(new_url)
        fresh.migrate()
        app = App(old_url)
        try:
            # The earlier version: migrations up to 0006 only (0007 is the lists, 0008 this).
            before = [m for m in mysql_backend.MIGRATIONS if m[0] <= 6]
            monkeypatch.setattr(mysql_backend, "MIGRATIONS", before)
            monkeypatch.setattr(app.backend.mysql, "latest", 6)
            app.migrate()
            assert app.backend.schema_version() == 6
            # The claims below are this version's statements, which read v10's paused
            # queues: the table is lent to the v6 database for the set-up, and taken back
            # before the real migration makes it.
            _sql(app, "CREATE TABLE justonce_queue_pauses (queue VARCHAR(63) PRIMARY KEY)")

            @app.task(name="t")
            def t(n: int) -> None:
                return None

            b = app.backend
            done, dead, expired = t.enqueue_many([(1,), (2,), (3,)])
            t.enqueue_many([(4,), (5,)])  # stay ready
            claimed = {j.id: j for j in b.job_claim("default", 3, OWNER, 0.2)}
            assert b.job_complete_many([Completion(done, claimed[done].lease_token, None)]) == {done}
            b.job_fail(Failure(dead, claimed[dead].lease_token, "boom", None))
            soon = t.configure(delay=0.2).enqueue(6).id
            t.configure(delay=3600).enqueue(7)  # scheduled, not due
            keyed = [t.configure(partition_key=k).enqueue(8).id for k in ("a", "a", "b")]
            # Ledger entries as v6 wrote them (no chunks): done, in doubt, released.
            with app.backend.transaction() as conn, conn.cursor() as cur:
                cur.execute(
                    "INSERT INTO justonce_effects (scope, `key`, state, policy, token, owner,"
                    " attempts, lease_expires_at, result, done_at) VALUES"
                    " ('old', 'done', 'done', 'at_most_once', 1, 'o', 1, NULL, '\"sent\"', NOW(6)),"
                    " ('old', 'doubt', 'running', 'at_most_once', 1, 'o', 1, NOW(6), NULL, NULL),"
                    " ('old', 'again', 'pending', 'at_most_once', 1, 'o', 1, NULL, NULL, NULL)")
            time.sleep(0.4)  # the lease of `expired` runs out; `soon` falls due
            _sql(app, "DROP TABLE justonce_queue_pauses")

            monkeypatch.undo()
            assert app.migrate() == ["0007_lists", "0008_fewer_index_writes", "0009_effect_chunks",
                                     "0010_queue_pauses"]
            assert app.backend.schema_version() == mysql_backend.LATEST
            assert _jobs_table(app) == _jobs_table(fresh)
            rows = _generated(app)
            assert {r[0] for r in rows} == {"ready", "running", "scheduled", "succeeded", "dead"}
            for state, due_at, due_expected, partition_state, partition_expected in rows:
                assert (due_at, partition_state) == (due_expected, partition_expected), state

            assert [j.id for j in b.dash_running(10)] == [expired]
            assert [j.id for j in b.dash_dead(10)] == [dead]
            assert b.jobs_promote() == 1 and app.get_job(soon).state is JobState.READY
            rescued = b.jobs_rescue()
            assert (rescued.rescued, rescued.dead) == (1, 0)
            assert app.get_job(expired).state is JobState.READY
            assert b.jobs_prune(0.0, 0.0) == 2  # the succeeded and the dead job
            # The partitioned claim: the first job of each key, then nothing of key "a"
            # while its first job runs.
            lease = app.partitions.try_acquire("s", 1, lease=60)
            assert lease is not None
            fence = SlotFence("s", 1, ((lease.slot, lease.token),))
            got = b.job_claim("default", 10, OWNER, 30.0, fence)
            assert sorted(j.id for j in got) == [keyed[0], keyed[2]]
            assert b.job_claim("default", 10, OWNER, 30.0, fence) == []

            assert {j.state for j in app.list_jobs(limit=100)} == {
                JobState.READY, JobState.SCHEDULED, JobState.RUNNING}

            assert app.effects.counts("old") == {"done": 1, "in_doubt": 1, "pending": 1}
            assert [e.key for e in app.effects.in_doubt("old")] == ["doubt"]
            assert app.effects.get("old", "done").result == "sent"
            calls: list[str] = []
            out = app.effects.run_many("old", ["done", "doubt", "again", "new"], calls.append)
            assert (out.done, out.skipped["done"], out.skipped["in_doubt"]) == (2, 1, 1)
            assert sorted(calls) == ["old:again", "old:new"]
            assert app.effects.resolve_many("old", ["doubt"], done=True) == ["doubt"]
            assert app.effects.counts("old") == {"done": 4}
        finally:
            app.close()
            fresh.close()


def _sql(app: App, statement: str) -> None:
    with app.backend.transaction() as conn, conn.cursor() as cur:
        cur.execute(statement)
