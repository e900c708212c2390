"""A job row whose stored arguments do not decode, against every backend: the row is
corrupted directly with SQL (SQLite's TEXT and MariaDB's LONGTEXT take any text; Postgres's
jsonb holds only valid JSON, so there the arguments are valid JSON of the wrong shape).
The worker fails that job at once, for good (``undecodable``), and runs the rest of the
batch it was claimed with; one such row used to stop the batch, claimed again and again
until every job of it was dead unrun. Reads show the job with ``Job.undecodable`` set
instead of raising."""

from __future__ import annotations

from typing import Any

import pytest

import proc_app
from fleet import error_kinds
from justonce import App, JobState


def corrupt(url: str, job_id: int, column: str, text: str) -> None:
    """Store ``text`` in ``column`` of the job's row as it is, behind the library's back."""
    conn = proc_app.ledger_connect(url)
    try:
        cast = "::jsonb" if url.startswith("postgres") else ""
        conn.execute(proc_app._sql(conn, f"UPDATE justonce_jobs SET {column} = ?{cast} WHERE id = ?"),
                     (text, job_id))
    finally:
        conn.close()


def broken(url: str, column: str) -> str:
    """Stored text that is not a list of arguments (resp. an object of keyword arguments)."""
    if url.startswith("postgres"):  # (jsonb: valid JSON only, so the wrong shape)
        return '"not a list"' if column == "args" else "[1, 2]"
    return '["broken' if column == "args" else '{"a": '


@pytest.mark.parametrize("column", ["args", "kwargs"])
def test_an_undecodable_job_fails_for_good_and_the_rest_of_its_batch_runs(
        app: App, db_url: str, worker_factory: Any, column: str) -> None:
    ran: list[int] = []

    @app.task(name="record", max_attempts=5)
    def record(n: int, **kw: Any) -> int:
        ran.append(n)
        return n

    jobs = [record.enqueue(n) for n in range(8)]
    bad = jobs[3]
    corrupt(db_url, bad.id, column, broken(db_url, column))
    shown = app.get_job(bad.id)  # (read before any worker: no raise, a marker)
    assert shown.undecodable is not None and column in shown.undecodable
    assert (shown.args, shown.kwargs, shown.state) == ([], {}, JobState.READY)
    worker_factory(concurrency=4, prefetch=8)  # (the bad job is claimed with the others)
    for job in jobs:
        app.wait(job.id, 20)
    final = app.get_job(bad.id)
    assert final.state is JobState.DEAD
    assert final.attempts == 1
    assert "do not decode" in (final.last_error or "") and column in (final.last_error or "")
    assert error_kinds(final) == ["undecodable"]
    for job in jobs:
        if job.id != bad.id:
            got = app.get_job(job.id)
            assert got.state is JobState.SUCCEEDED and got.undecodable is None, got
    assert sorted(ran) == [0, 1, 2, 4, 5, 6, 7]


def test_listings_show_an_undecodable_job_with_its_marker(app: App, db_url: str) -> None:
    client = App(app.database_url, strict=False)
    try:
        good = client.enqueue("some.task", [1], {"x": 2})
        bad = client.enqueue("some.task", [2])
    finally:
        client.close()
    corrupt(db_url, bad.id, "args", broken(db_url, "args"))
    listed = {j.id: j for j in app.list_jobs()}
    assert listed[good.id].undecodable is None and listed[good.id].args == [1]
    assert listed[bad.id].undecodable is not None and listed[bad.id].args == []
    page, _ = app.list_jobs_page()
    assert {j.id: j.undecodable is not None for j in page} == {good.id: False, bad.id: True}


def test_a_corrupt_result_is_shown_as_its_stored_text(app: App, db_url: str,
                                                     worker_factory: Any) -> None:
    if not db_url.startswith("sqlite"):
        pytest.skip("Postgres's jsonb and MariaDB's JSON_VALID check keep a result valid JSON")

    @app.task(name="give")
    def give() -> dict[str, int]:
        return {"a": 1}

    job = give.enqueue()
    worker_factory()
    assert app.wait(job.id, 10).result == {"a": 1}
    corrupt(db_url, job.id, "result", '{"a": ')
    got = app.get_job(job.id)
    assert got.result == '{"a": ' and got.undecodable is not None and "result" in got.undecodable
    assert got.state is JobState.SUCCEEDED


def test_a_double_encoded_argument_list_reads_as_the_claim_finds_it(app: App, db_url: str) -> None:
    """A valid JSON text whose value is a string ('"[1,2]"'): get_job decoded it twice and
    showed [1, 2] while the claim found no list and failed the job as undecodable."""
    @app.task(name="t.x")
    def x(*args: Any) -> None:
        return None

    job = x.enqueue(5)
    corrupt(db_url, job.id, "args", '"[1,2]"')
    shown = app.get_job(job.id)
    assert shown.args == [] and shown.undecodable and "not a JSON list" in shown.undecodable
    claimed = app.backend.job_claim("default", 1, "me", 30.0)
    assert [c.undecodable is not None for c in claimed] == [True]
