"""Prometheus metrics: what a worker sees (fed by :mod:`justonce.events`), and what the
database knows (queue depths, oldest ready job, running, dead, open batches).

Worker side: ``justonce worker --metrics-port 9464`` serves :class:`WorkerMetrics` at
``http://127.0.0.1:9464/metrics``. Service side: :class:`DatabaseCollector` (or
:func:`service_metrics`, body and content type for a web route) reads the database at most
once per ``cache_seconds`` however many scrapers ask.

Every metric has a ``justonce_`` prefix, units in its name and ``_total`` on counters. No
label ever carries a job id or arguments: labels are queue and task names (bounded by what
the app registers; anything else is counted as ``other``), outcomes and states.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import validate
from .errors import InvalidOption
from .events import Event, emit, subscribe
from .types import JobState

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .app import App
    from .worker import Worker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The content type of :func:`service_metrics`'s body (Prometheus text format 0.0.4)."""

OTHER = "other"
"""The label value that stands for every name past the cardinality cap, or not registered."""

RUN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
               30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0, 600.0, 1800.0, 3600.0, 6 * 3600.0, 86400.0)

_FAILURE_REASONS = {
    Event.JOB_FAILED.value: "error", Event.JOB_TIMEOUT.value: "timeout",
    Event.JOB_INTERRUPTED.value: "interrupted",
    Event.JOB_UNKNOWN_TASK.value: "unknown_task", Event.JOB_BAD_ARGUMENTS.value: "bad_arguments",
    Event.JOB_UNDECODABLE.value: "undecodable",
}
_SUCCEEDED, _CLAIMED = Event.JOB_SUCCEEDED, Event.JOB_CLAIMED
_CACHE_MAX = 10_000
"""Raw (queue, task) names whose labelled children are remembered (names past it are
still counted, just looked up each time)."""


class _Names:
    """Bounded label values: the known names pass; with no known set, the first ``cap``
    names seen pass; everything else is ``other``."""

    def __init__(self, known: Iterable[str] | None, cap: int) -> None:
        self.known = None if known is None else frozenset(known)
        self.cap = cap
        self.seen: set[str] = set()

    def __call__(self, name: Any) -> str:
        if not isinstance(name, str):
            return OTHER
        if self.known is not None:
            return name if name in self.known else OTHER
        if name in self.seen:
            return name
        if len(self.seen) < self.cap:
            self.seen.add(name)
            return name
        return OTHER


class WorkerMetrics:
    """A worker's metrics in a registry of their own (not the global default, so that one
    process may hold several), fed by the events of this process.

    ``tasks`` / ``queues``: the label values allowed (others count as ``other``); when not
    given, the first ``max_names`` names seen. :meth:`attach` subscribes to the events and,
    given a worker, exports its running jobs; :meth:`close` unsubscribes.

    =============================================  =========================================
    ``justonce_jobs_total{queue,task,outcome}``    attempts that ended: ``succeeded``;
                                                   ``retried`` / ``dead`` (the attempt
                                                   failed, the job will run again / not);
                                                   ``rejected`` (the lease was lost before
                                                   the outcome was written)
    ``justonce_job_failures_total{queue,task,      failed attempts by reason: ``error``,
    reason}``                                      ``timeout``, ``unknown_task``,
                                                   ``bad_arguments``, ``undecodable``
    ``justonce_job_run_duration_seconds``          how long attempts ran (all outcomes)
    ``{queue,task}`` (histogram)
    ``justonce_job_queue_wait_seconds{queue}``     from due (``run_at``) to claimed, by the
    (histogram)                                    database's clock
    ``justonce_lease_takeovers_total{lease}``      leases this worker lost to expiry or
                                                   takeover: ``job``, ``partition`` slot
    ``justonce_rejected_late_writes_total``        writes refused because the lease was lost
    ``justonce_jobs_dropped_unstarted_total``      leased jobs given back unstarted (their
                                                   lease or slot may have run out)
    ``justonce_worker_jobs_running``               jobs running on this worker now
    =============================================  =========================================
    """

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 tasks: Iterable[str] | None = None, queues: Iterable[str] | None = None,
                 max_names: int = 200) -> None:
        if isinstance(max_names, bool) or not isinstance(max_names, int) or not 1 <= max_names <= 10_000:
            raise InvalidOption(f"max_names must be an integer in [1, 10000], not {validate.shown(max_names)}")
        self.registry = registry if registry is not None else CollectorRegistry()
        self._task = _Names(tasks, max_names)
        self._queue = _Names(queues, max_names)
        r = self.registry
        self.jobs = Counter("justonce_jobs", "Job attempts that ended, by outcome.",
                            ["queue", "task", "outcome"], registry=r)
        self.failures = Counter("justonce_job_failures", "Failed job attempts, by reason.",
                                ["queue", "task", "reason"], registry=r)
        self.run_duration = Histogram("justonce_job_run_duration_seconds",
                                      "How long job attempts ran.", ["queue", "task"],
                                      buckets=RUN_BUCKETS, registry=r)
        self.queue_wait = Histogram("justonce_job_queue_wait_seconds",
                                    "Seconds from a job being due to its claim.", ["queue"],
                                    buckets=WAIT_BUCKETS, registry=r)
        self.takeovers = Counter("justonce_lease_takeovers",
                                 "Leases this worker lost: expired or taken over.", ["lease"],
                                 registry=r)
        self.rejected = Counter("justonce_rejected_late_writes",
                                "Outcome writes rejected because the job's lease was lost.",
                                registry=r)
        self.dropped = Counter("justonce_jobs_dropped_unstarted",
                               "Leased jobs given back unstarted: their lease or slot may have "
                               "run out.", registry=r)
        self.running = Gauge("justonce_worker_jobs_running", "Jobs running on this worker now.",
                             registry=r)
        for lease in ("job", "partition"):
            self.takeovers.labels(lease)  # export 0 before the first one
        self._lock = threading.Lock()
        self._unsubscribe: Any = None
        self._children: dict[tuple[Any, Any, str], tuple[Any, Any, str, str]] = {}
        self._waits: dict[Any, Any] = {}

    def attach(self, worker: Worker | None = None) -> WorkerMetrics:
        """Subscribe to this process's events (and export ``worker``'s running jobs)."""
        if worker is not None:
            self.running.set_function(lambda: worker.running)
        if self._unsubscribe is None:
            self._unsubscribe = subscribe(self.on_event)
        return self

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def on_event(self, event: Event, fields: Mapping[str, Any]) -> None:
        """The subscriber: one event in, counters and histograms updated. The per-job
        events (claimed, succeeded) take the short path: module constants for the members
        (a member looked up on the Enum class is slow), and labelled children cached."""
        if event is _SUCCEEDED:
            self._ended(fields, "succeeded")
        elif event is _CLAIMED:
            wait = fields.get("queue_wait")
            if isinstance(wait, int | float):
                child = self._waits.get(fields.get("queue"))
                if child is None:
                    child = self._wait_child(fields.get("queue"))
                child.observe(wait if wait > 0 else 0.0)
        else:
            self._other(event, fields)

    def _other(self, event: Event, fields: Mapping[str, Any]) -> None:
        reason = _FAILURE_REASONS.get(event.value)
        if reason is not None:
            outcome = "dead" if fields.get("state") == JobState.DEAD.value else "retried"
            queue, task = self._ended(fields, outcome)
            self.failures.labels(queue, task, reason).inc()
        elif event is Event.JOB_REJECTED:
            self.rejected.inc()
            with self._lock:
                labels = (self._queue(fields.get("queue")), self._task(fields.get("task")))
            self.jobs.labels(*labels, "rejected").inc()
        elif event is Event.JOB_LEASE_LOST:
            self.takeovers.labels("job").inc()
        elif event is Event.PARTITION_LOST:
            self.takeovers.labels("partition").inc()
        elif event is Event.JOB_DROPPED:
            count = fields.get("count")
            self.dropped.inc(count if isinstance(count, int) and count > 0 else 1)

    def _wait_child(self, raw: Any) -> Any:
        with self._lock:
            queue = self._queue(raw)
        child = self.queue_wait.labels(queue)
        if isinstance(raw, str) and len(self._waits) < _CACHE_MAX:
            self._waits[raw] = child
        return child

    def _ended(self, fields: Mapping[str, Any], outcome: str) -> tuple[str, str]:
        key = (fields.get("queue"), fields.get("task"), outcome)
        children = self._children.get(key)
        if children is None:
            with self._lock:
                queue, task = self._queue(key[0]), self._task(key[1])
            children = (self.jobs.labels(queue, task, outcome),
                        self.run_duration.labels(queue, task), queue, task)
            if len(self._children) < _CACHE_MAX:
                self._children[key] = children
        children[0].inc()
        ms = fields.get("duration_ms")
        if isinstance(ms, int | float):
            children[1].observe(ms / 1000.0 if ms > 0 else 0.0)
        return children[2], children[3]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def port_number(port: Any) -> int:
    number = validate.exact_int(port)
    if number is None or not 1 <= number <= 65535:
        raise InvalidOption(f"the metrics port must be an integer in [1, 65535], not {validate.shown(port)}")
    return number


def serve_worker_metrics(worker: Worker, port: int, host: str = "127.0.0.1") -> tuple[WSGIServer,
                                                                                     WorkerMetrics]:
    """Serve ``worker``'s metrics at ``http://host:port/metrics`` from a daemon thread.
    Returns the server (``shutdown()`` it when done) and the metrics."""
    from prometheus_client import start_http_server

    port = port_number(port)
    host = validate.host(host, "the metrics host")
    metrics = WorkerMetrics(tasks=worker.app.tasks, queues=worker.queues)
    try:
        server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        raise InvalidOption(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    metrics.attach(worker)
    emit(Event.METRICS_STARTED, "metrics served", host=host, port=port, path="/metrics")
    return server, metrics


class DatabaseCollector(Collector):
    """What the database knows, read at most once per ``cache_seconds`` (concurrent
    scrapes wait for the one read in flight and share it): ``queue_stats`` (exact counts
    on a small jobs table, a bounded sample past ``App.queue_stats``'s threshold, so a
    scrape never costs a full scan of a big table) and ``metrics_snapshot`` (index probes
    only).

    ===================================================  ====================================
    ``justonce_queue_jobs{queue,state}``                 jobs per queue and state
    ``justonce_queue_oldest_ready_age_seconds{queue}``   age of the longest-waiting ready job
                                                         at the queue's head (0: none ready)
    ``justonce_jobs_running``                            running jobs, all queues
    ``justonce_jobs_dead``                               dead jobs, all queues
    ``justonce_batches_open``                            batches open or sealed, not finished
    ``justonce_database_up``                             1 if the last read worked, else 0
                                                         (and the other metrics are left out)
    ===================================================  ====================================
    """

    def __init__(self, app: App, cache_seconds: float = 5.0) -> None:
        self.app = app
        self.cache_seconds = validate.bounded(cache_seconds, "cache_seconds", 0, 3600)
        self._lock = threading.Lock()
        self._at: float | None = None
        self._families: list[GaugeMetricFamily] = []
        self.reads = 0
        """Database reads done so far (each is the two statements)."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._build(None))  # names only: registering costs no query

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            now = time.monotonic()
            if self._at is None or now - self._at >= self.cache_seconds:
                self._families = self._read()
                self._at = time.monotonic()
            return iter(self._families)

    def _read(self) -> list[GaugeMetricFamily]:
        self.reads += 1
        try:
            stats = self.app.queue_stats()
            snap = self.app.metrics_snapshot()
        except Exception as exc:  # noqa: BLE001 - a scrape reports the outage, never a 500
            emit(Event.METRICS_READ_ERROR, "metrics: the database could not be read",
                 error=f"{type(exc).__name__}: {exc}")
            up = GaugeMetricFamily("justonce_database_up",
                                   "1 if the last read of the database worked.")
            up.add_metric([], 0)
            return [up]
        return self._build((stats, snap))

    @staticmethod
    def _build(data: Any) -> list[GaugeMetricFamily]:
        depth = GaugeMetricFamily("justonce_queue_jobs", "Jobs per queue and state.",
                                  labels=["queue", "state"])
        oldest = GaugeMetricFamily("justonce_queue_oldest_ready_age_seconds",
                                   "Age of the longest-waiting ready job at the queue's head.",
                                   labels=["queue"])
        paused = GaugeMetricFamily("justonce_queue_paused",
                                   "1 while the queue is paused (no worker claims its jobs), else 0.",
                                   labels=["queue"])
        running = GaugeMetricFamily("justonce_jobs_running", "Running jobs, all queues.")
        dead = GaugeMetricFamily("justonce_jobs_dead", "Dead jobs, all queues.")
        batches = GaugeMetricFamily("justonce_batches_open", "Batches open or sealed, not finished.")
        up = GaugeMetricFamily("justonce_database_up", "1 if the last read of the database worked.")
        if data is not None:
            stats, snap = data
            by_queue = {st.queue: st.counts for st in stats}
            for queue in sorted(by_queue):
                for state in JobState:
                    depth.add_metric([queue, state.value], by_queue[queue].get(state.value, 0))
                oldest.add_metric([queue], snap.oldest_ready.get(queue, 0.0))
            for st in stats:
                paused.add_metric([st.queue], 0 if st.paused is None else 1)
            running.add_metric([], sum(c.get(JobState.RUNNING.value, 0) for c in by_queue.values()))
            dead.add_metric([], sum(c.get(JobState.DEAD.value, 0) for c in by_queue.values()))
            batches.add_metric([], snap.batches_open)
            up.add_metric([], 1)
        return [depth, oldest, paused, running, dead, batches, up]


_service_registries: weakref.WeakKeyDictionary[App, CollectorRegistry] = weakref.WeakKeyDictionary()
_service_lock = threading.Lock()


def service_metrics(app: App, cache_seconds: float = 5.0) -> tuple[bytes, str]:
    """The body and content type of a ``/metrics`` answer for ``app``'s database: one
    :class:`DatabaseCollector` per app, so many scrapers cost one read per
    ``cache_seconds`` (the first call's value)."""
    with _service_lock:
        registry = _service_registries.get(app)
        if registry is None:
            registry = CollectorRegistry()
            registry.register(DatabaseCollector(app, cache_seconds))
            _service_registries[app] = registry
    return generate_latest(registry), CONTENT_TYPE
