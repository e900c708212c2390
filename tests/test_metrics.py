"""Events go through one seam (justonce.events), and Prometheus reads them: a real
``justonce worker --metrics-port`` process is scraped over HTTP, and the database
collector is read on a known database, on SQLite and Postgres."""

from __future__ import annotations

import logging
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import proc_app
from fleet import Fleet, proc_app_on, wait_for
from justonce import App, Enqueue, Worker, events
from justonce.cli import cli
from justonce.errors import InvalidOption
from justonce.events import Event, emit, subscribe, wanted
from justonce.metrics import (
    CONTENT_TYPE,
    OTHER,
    DatabaseCollector,
    WorkerMetrics,
    port_number,
    serve_worker_metrics,
    service_metrics,
)
from justonce.models import Completion, Failure

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "justonce"

# The names logs carried before the seam existed: they must not change.
NAMES_BEFORE = {
    "job.succeeded", "job.failed", "job.timeout", "job.unknown_task", "job.bad_arguments",
    "job.rejected", "job.discarded", "job.lease_lost", "job.dropped", "job.fail_write_error",
    "worker.started", "worker.stopped", "worker.kill", "worker.paused", "worker.released",
    "worker.unwritten", "slot.error", "claim.error", "ack.error", "heartbeat.error",
    "release.error", "supervisor.error", "maintenance.error", "leases.rescued",
    "batches.expired", "partition.acquired", "partition.lost", "partition.renew_error",
    "partition.release_error", "partition.release_skipped", "partition.error",
    "effect.overtaken", "effect.release_error",
}


def scrape(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse(r.read().decode())


def parse(text: str) -> dict[str, Any]:
    """{sample name: {frozenset(labels.items()): value}} and the raw text."""
    out: dict[str, Any] = {"_text": text}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def value(m: dict[str, Any], name: str, **labels: str) -> float:
    return m.get(name, {}).get(frozenset(labels.items()), 0.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def justonce_logs_reach_caplog() -> Iterator[None]:
    """`justonce worker` (run in-process by CliRunner) points the justonce logger at stderr
    and stops its propagation: undo that around every test here."""
    lg = logging.getLogger("justonce")
    saved = (lg.propagate, lg.handlers[:], lg.level)
    lg.propagate, lg.handlers[:] = True, []
    yield
    lg.propagate, lg.handlers[:], lg.level = saved[0], saved[1], saved[2]


@pytest.fixture
def collected() -> Iterator[list[tuple[Event, dict[str, Any]]]]:
    got: list[tuple[Event, dict[str, Any]]] = []
    unsubscribe = subscribe(lambda e, f: got.append((e, dict(f))))
    yield got
    unsubscribe()


# -- the one seam ------------------------------------------------------------------------------


def test_no_event_name_is_spelled_inline_in_the_library() -> None:
    inline = re.compile(r"""["']event["']\s*:\s*(f?["'])""")
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
                 for p in SRC.rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if inline.search(line)]
    assert offenders == []


def test_every_event_is_emitted_somewhere_and_keeps_the_name_logs_used_before() -> None:
    source = "\n".join(p.read_text() for p in SRC.rglob("*.py"))
    never = [e.name for e in Event if f"Event.{e.name}" not in source]
    assert never == []
    assert {e.value for e in Event} >= NAMES_BEFORE
    for e in Event:
        assert e.meaning and e.logger_name.startswith("justonce") and e.level in (
            logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)


def test_the_readme_lists_the_events_from_the_one_table() -> None:
    assert events.table() in (ROOT / "README.md").read_text()


def test_emit_logs_the_same_json_fields_on_the_tables_logger_and_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="justonce"):
        emit(Event.JOB_DROPPED, "dropped", jobs=[1, 2], count=2)
        emit(Event.PARTITION_LOST, "lost", logger=logging.getLogger("justonce.partitions"),
             slot=3)
    dropped, lost = [r for r in caplog.records if hasattr(r, "event")]
    assert (dropped.name, dropped.levelno, dropped.getMessage()) == (
        "justonce.worker", logging.WARNING, "dropped")
    assert (dropped.event, dropped.jobs, dropped.count) == ("job.dropped", [1, 2], 2)  # type: ignore[attr-defined]
    assert (lost.name, lost.event, lost.slot) == ("justonce.partitions", "partition.lost", 3)  # type: ignore[attr-defined]


def test_nothing_listens_so_nothing_is_built(caplog: pytest.LogCaptureFixture) -> None:
    logging.getLogger("justonce.worker").setLevel(logging.WARNING)
    try:
        assert not wanted(Event.JOB_SUCCEEDED)
        unsubscribe = subscribe(lambda e, f: None)
        assert wanted(Event.JOB_SUCCEEDED)
        unsubscribe()
        unsubscribe()  # idempotent
        assert not wanted(Event.JOB_SUCCEEDED)
    finally:
        logging.getLogger("justonce.worker").setLevel(logging.NOTSET)


def test_each_new_failing_subscriber_is_logged_even_where_an_old_ones_id_is_reused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The once-per-subscriber log must not be keyed by id(): a freed function's id is
    reused by the next one (the CI flake this test pins), which then failed silently."""
    with caplog.at_level(logging.ERROR, logger="justonce.events"):
        for n in range(50):
            def broken(event: Event, fields: Any, n: int = n) -> None:
                raise ValueError(f"bug {n}")

            unsubscribe = subscribe(broken)
            try:
                emit(Event.JOB_DROPPED, count=1)
                emit(Event.JOB_DROPPED, count=2)
            finally:
                unsubscribe()
            del broken
    logged = [r for r in caplog.records if getattr(r, "event", None) == "events.subscriber_error"]
    assert len(logged) == 50
    assert not events._failed  # entries leave with their subscriber


def test_subscribe_takes_only_a_callable() -> None:
    with pytest.raises(InvalidOption):
        subscribe("not a function")  # type: ignore[arg-type]


def test_subscribers_see_a_workers_claims_and_outcomes(
    app: App, worker_factory: Any, collected: list[tuple[Event, dict[str, Any]]]
) -> None:
    @app.task(name="metrics_ok")
    def ok(n: int) -> int:
        return n

    @app.task(name="metrics_bad", max_attempts=1)
    def bad() -> None:
        raise RuntimeError("nope")

    jobs = [app.enqueue(ok, args=[n]) for n in range(3)]
    failing = app.enqueue(bad)
    worker_factory(queues=["default"])
    for j in [*jobs, failing]:
        assert app.wait(j.id, 15).state in ("succeeded", "dead")
    wait_for(lambda: sum(e is Event.JOB_SUCCEEDED for e, _ in collected) == 3, 5, "3 successes")
    succeeded = [f for e, f in collected if e is Event.JOB_SUCCEEDED]
    assert sorted(f["job_id"] for f in succeeded) == [j.id for j in jobs]
    assert all(f["task"] == "metrics_ok" and f["queue"] == "default" and f["duration_ms"] >= 0
               for f in succeeded)
    claimed = [f for e, f in collected if e is Event.JOB_CLAIMED]
    assert sorted(f["job_id"] for f in claimed) == sorted(j.id for j in [*jobs, failing])
    assert all(isinstance(f["queue_wait"], float) and 0 <= f["queue_wait"] < 30 for f in claimed)
    (dead,) = [f for e, f in collected if e is Event.JOB_FAILED]
    assert (dead["job_id"], dead["state"], dead["task"]) == (failing.id, "dead", "metrics_bad")


def test_a_failing_subscriber_never_breaks_a_job_and_is_logged_once(
    app: App, worker_factory: Any, caplog: pytest.LogCaptureFixture,
    collected: list[tuple[Event, dict[str, Any]]],
) -> None:
    calls = []

    def broken(event: Event, fields: Any) -> None:
        calls.append(event)
        raise ZeroDivisionError("subscriber bug")

    unsubscribe = subscribe(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="justonce.events"):
            @app.task(name="metrics_noop")
            def noop() -> None:
                pass

            jobs = app.enqueue_many(Enqueue(noop) for _ in range(20))
            worker_factory(queues=["default"])
            for job_id in jobs:
                assert app.wait(job_id, 15).state == "succeeded"
            wait_for(lambda: sum(e is Event.JOB_SUCCEEDED for e, _ in collected) == 20, 5,
                     "the other subscriber to see every success")
    finally:
        unsubscribe()
    assert calls.count(Event.JOB_SUCCEEDED) == 20
    errors = [r for r in caplog.records if getattr(r, "event", None) == "events.subscriber_error"]
    assert len(errors) == 1 and "subscriber bug" in (errors[0].exc_text or str(errors[0].exc_info))


# -- the queue wait a claim returns ---------------------------------------------------------------


def test_a_claim_returns_how_long_the_job_was_due(app: App) -> None:
    first = app.enqueue("t1")
    time.sleep(0.3)
    app.enqueue("t1")
    (claimed,) = app.backend.job_claim("default", 1, "me", 30)
    assert claimed.id == first.id
    assert claimed.queue_wait is not None and 0.3 <= claimed.queue_wait < 10
    done = Completion(claimed.id, claimed.lease_token, None)
    accepted, more = app.backend.job_complete_and_claim([done], "default", 5, "me", 30)
    assert accepted == {first.id} and len(more) == 1
    assert more[0].queue_wait is not None and 0 <= more[0].queue_wait < 10


# -- worker metrics, in a real worker process ------------------------------------------------------


@pytest.fixture(autouse=True)
def lenient(app: App) -> None:
    app.strict = False  # these tests enqueue task names no worker needs to know


@pytest.fixture
def papp(db_url: str) -> Iterator[App]:
    with proc_app_on(db_url) as a:
        yield a


def test_a_worker_process_exports_outcomes_durations_and_waits_over_http(
    papp: App, fleet: Fleet
) -> None:
    port = free_port()
    ok = papp.enqueue_many(Enqueue(proc_app.noop) for _ in range(5))
    bad = [papp.enqueue(proc_app.boom, args=[n]) for n in range(2)]
    w = fleet.start(extra=["--metrics-port", str(port)])
    assert w.events("metrics.started")[0]["port"] == port
    for job_id in ok:
        assert papp.wait(job_id, 20).state == "succeeded"
    for j in bad:
        assert papp.wait(j.id, 20).state == "dead"

    def settled() -> dict[str, Any] | None:
        m = scrape(port)
        return m if value(m, "justonce_job_run_duration_seconds_count", queue="default",
                          task="proc_app.boom") == 4 and value(
            m, "justonce_jobs_total", queue="default", task="proc_app.noop",
            outcome="succeeded") == 5 else None

    m = wait_for(settled, 10, "the metrics to count every attempt")
    jobs = "justonce_jobs_total"
    assert value(m, jobs, queue="default", task="proc_app.boom", outcome="retried") == 2
    assert value(m, jobs, queue="default", task="proc_app.boom", outcome="dead") == 2
    assert value(m, "justonce_job_failures_total", queue="default", task="proc_app.boom",
                 reason="error") == 4
    # Histograms: cumulative buckets ending in +Inf = count; every attempt was claimed once.
    run = m["justonce_job_run_duration_seconds_bucket"]
    noop_buckets = sorted((float(dict(k)["le"]), v) for k, v in run.items()
                          if dict(k)["task"] == "proc_app.noop")
    assert noop_buckets[-1] == (float("inf"), 5)
    assert [v for _, v in noop_buckets] == sorted(v for _, v in noop_buckets)
    assert noop_buckets[0][1] >= 1  # a no-op runs in under a millisecond
    assert value(m, "justonce_job_queue_wait_seconds_count", queue="default") == 9
    wait_inf = value(m, "justonce_job_queue_wait_seconds_bucket", queue="default", le="+Inf")
    assert wait_inf == 9
    assert value(m, "justonce_job_queue_wait_seconds_sum", queue="default") >= 0
    for name in ("justonce_rejected_late_writes_total", "justonce_jobs_dropped_unstarted_total",
                 "justonce_worker_jobs_running"):
        assert name in m and value(m, name) == 0
    assert value(m, "justonce_lease_takeovers_total", lease="job") == 0
    assert value(m, "justonce_lease_takeovers_total", lease="partition") == 0
    # Never a job id or arguments as a label.
    labels = {k for samples in m.values() if isinstance(samples, dict)
              for key in samples for k, _ in key}
    assert labels <= {"queue", "task", "outcome", "reason", "lease", "le"}
    ids = {str(i) for i in [*ok, *(j.id for j in bad)]}
    assert not ids & {v for samples in m.values() if isinstance(samples, dict)
                      for key in samples for _, v in key}


def test_metrics_port_out_of_range_or_taken_is_a_clear_error(db_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["worker", "--app", "proc_app:app", "--database-url", db_url]
    for bad in ("0", "70000", "http"):
        r = runner.invoke(cli, [*base, "--metrics-port", bad])
        assert r.exit_code == 2 and "--metrics-port" in r.output, r.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with proc_app_on(db_url):
            r = runner.invoke(cli, [*base, "--metrics-port", str(port)])
    assert r.exit_code == 2 and f"cannot serve metrics on 127.0.0.1:{port}" in r.output, r.output
    for wrong in (0, 65536, "9000", True, None):
        with pytest.raises(InvalidOption):
            port_number(wrong)
    with pytest.raises(InvalidOption):
        WorkerMetrics(max_names=0)


def test_a_metrics_host_python_cannot_encode_is_refused_before_the_worker_starts(app: App) -> None:
    """An empty label (a..b) made Python's idna codec raise UnicodeError, which neither the
    CLI nor serve_worker_metrics caught: a traceback once the worker had been built."""
    r = CliRunner().invoke(cli, ["worker", "--app", "proc_app:app", "--database-url", app.database_url,
                                 "--metrics-host", "a..b", "--metrics-port", "9"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and "--metrics-host" in lines[-1] and "is not a host name" in lines[-1], r.output
    w = Worker(app, queues=["default"], concurrency=1)
    for host in ("a..b", "x" * 64, ""):
        with pytest.raises(InvalidOption, match="the metrics host"):
            serve_worker_metrics(w, 9, host)


def test_worker_metrics_cap_label_values_to_what_is_registered() -> None:
    m = WorkerMetrics(tasks=["a.known"], queues=["q"])
    for task in ("a.known", "made.up", None):
        m.on_event(Event.JOB_SUCCEEDED, {"queue": "q", "task": task, "duration_ms": 1.0})
    m.on_event(Event.JOB_SUCCEEDED, {"queue": "elsewhere", "task": "a.known", "duration_ms": 1.0})
    got = parse(m.exposition().decode())
    assert value(got, "justonce_jobs_total", queue="q", task="a.known", outcome="succeeded") == 1
    assert value(got, "justonce_jobs_total", queue="q", task=OTHER, outcome="succeeded") == 2
    assert value(got, "justonce_jobs_total", queue=OTHER, task="a.known", outcome="succeeded") == 1
    capped = WorkerMetrics(max_names=2)
    for n in range(5):
        capped.on_event(Event.JOB_SUCCEEDED, {"queue": "q", "task": f"t{n}", "duration_ms": 1})
    tasks = {dict(k)["task"] for k in parse(capped.exposition().decode())["justonce_jobs_total"]}
    assert tasks == {"t0", "t1", OTHER}


def test_two_worker_metrics_in_one_process_have_registries_of_their_own() -> None:
    a, b = WorkerMetrics().attach(), WorkerMetrics()
    try:
        emit(Event.JOB_DROPPED, "x", jobs=[], count=3)
    finally:
        a.close()
    emit(Event.JOB_DROPPED, "x", jobs=[], count=3)  # after close: not counted
    assert value(parse(a.exposition().decode()), "justonce_jobs_dropped_unstarted_total") == 3
    assert value(parse(b.exposition().decode()), "justonce_jobs_dropped_unstarted_total") == 0


# -- what the database knows -----------------------------------------------------------------------


def test_database_collector_exports_depths_ages_running_dead_and_open_batches(app: App) -> None:
    slow = app.enqueue("t", queue="a", priority=5)  # oldest, but behind a higher priority
    time.sleep(0.4)
    app.enqueue("t", queue="a", priority=0)
    app.enqueue("t", queue="a", delay=3600)
    for _ in range(3):
        app.enqueue("t", queue="b")
    running = app.backend.job_claim("b", 2, "me", 60)
    assert len(running) == 2
    fail = Failure(running[0].id, running[0].lease_token, "boom", None)
    assert app.backend.job_fail(fail, "failed") == "dead"
    app.batches.open("open")
    sealed = app.batches.open("sealed, items pending")
    sealed.add(3)
    sealed.seal()
    app.batches.open("empty: completes when sealed").seal()

    registry = CollectorRegistry()
    collector = DatabaseCollector(app, cache_seconds=60)
    registry.register(collector)
    assert collector.reads == 0  # registering costs no query
    m = parse(generate_latest(registry).decode())
    depth = "justonce_queue_jobs"
    assert value(m, depth, queue="a", state="ready") == 2
    assert value(m, depth, queue="a", state="scheduled") == 1
    assert value(m, depth, queue="a", state="running") == 0
    assert value(m, depth, queue="b", state="ready") == 1
    assert value(m, depth, queue="b", state="running") == 1
    assert value(m, depth, queue="b", state="dead") == 1
    age_a = value(m, "justonce_queue_oldest_ready_age_seconds", queue="a")
    assert 0.4 <= age_a < 30, age_a  # the priority-5 job enqueued first
    assert 0 <= value(m, "justonce_queue_oldest_ready_age_seconds", queue="b") < 30
    assert value(m, "justonce_jobs_running") == 1
    assert value(m, "justonce_jobs_dead") == 1
    assert value(m, "justonce_batches_open") == 2
    assert value(m, "justonce_database_up") == 1
    assert slow.id not in {int(v) for s in m.values() if isinstance(s, dict) for k in s
                           for _, v in k if v.isdigit()}

    # Cached: more scrapes within the window cost no read and see the same numbers.
    app.enqueue("t", queue="a")
    for _ in range(5):
        again = parse(generate_latest(registry).decode())
    assert collector.reads == 1
    assert value(again, depth, queue="a", state="ready") == 2
    collector.cache_seconds = 0.0
    fresh = parse(generate_latest(registry).decode())
    assert collector.reads == 2 and value(fresh, depth, queue="a", state="ready") == 3


def test_service_metrics_reads_the_database_once_per_window(app: App) -> None:
    app.enqueue("t", queue="s")
    body, ctype = service_metrics(app, cache_seconds=60)
    assert ctype == CONTENT_TYPE and ctype.startswith("text/plain")
    app.enqueue("t", queue="s")
    body2, _ = service_metrics(app)
    assert value(parse(body2.decode()), "justonce_queue_jobs", queue="s", state="ready") == 1
    assert body2 == body


def test_database_collector_shows_which_queues_are_paused(app: App) -> None:
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(app, cache_seconds=0))
    app.strict = False  # (a task name no worker needs to know)
    app.enqueue("metrics.t", queue="mail")
    app.pause_queue("mail")
    app.pause_queue("idle")  # (no jobs: listed all the same, to be resumed)
    m = parse(generate_latest(registry).decode())
    assert value(m, "justonce_queue_paused", queue="mail") == 1
    assert value(m, "justonce_queue_paused", queue="idle") == 1
    app.resume_queue("mail")
    m = parse(generate_latest(registry).decode())
    assert value(m, "justonce_queue_paused", queue="idle") == 1
    assert m["justonce_queue_paused"][frozenset({"queue": "mail"}.items())] == 0


def test_database_collector_reports_an_outage_instead_of_failing(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'gone.db'}")
    app.migrate()
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(app, cache_seconds=0))
    app.close()
    (tmp_path / "gone.db").unlink()
    (tmp_path / "gone.db").mkdir()  # not a database any more
    m = parse(generate_latest(registry).decode())
    assert value(m, "justonce_database_up") == 0 and "justonce_queue_jobs" not in m


def test_database_collector_rejects_a_bad_window(app: App) -> None:
    for bad in (-1, "5", float("nan"), 10_000):
        with pytest.raises(InvalidOption):
            DatabaseCollector(app, cache_seconds=bad)  # type: ignore[arg-type]


def test_worker_gauge_follows_the_worker(app: App) -> None:
    w = Worker(app, queues=["default"], concurrency=1)
    m = WorkerMetrics().attach(w)
    try:
        assert value(parse(m.exposition().decode()), "justonce_worker_jobs_running") == 0
    finally:
        m.close()
