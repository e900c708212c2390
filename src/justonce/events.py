"""Every event the library reports, in one table, and the one function that reports them.

An event is logged as one JSON line (see :mod:`justonce.logs`) with ``"event": <its name>``
and its fields, on the logger and at the level the table gives, and it is handed to every
subscriber (Prometheus metrics, a dashboard, your own code)::

    from justonce.events import Event, subscribe

    def on_event(event: Event, fields: Mapping[str, Any]) -> None:
        if event is Event.JOB_DROPPED:
            page_someone(fields["count"])

    unsubscribe = subscribe(on_event)

Subscribers run in the thread that emits (a worker's slot, acker or supervisor thread), so
they must be quick and must not block; the fields mapping is shared between subscribers
and must not be changed. A subscriber that raises never breaks the caller: its first
failure of each kind is logged (``events.subscriber_error``) and the event goes on to the
other subscribers.

Cost: with no subscriber and the event's level off, :func:`emit` is one tuple check and
one ``Logger.isEnabledFor`` (cached by :mod:`logging`); hot paths ask :func:`wanted` once
per batch and skip building the fields altogether.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

Subscriber = Callable[["Event", Mapping[str, Any]], None]

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR


class Event(StrEnum):
    """An event's name (its value, as logged), default level, logger and meaning."""

    level: int
    logger_name: str
    meaning: str
    log: logging.Logger

    def __new__(cls, name: str, level: int, logger_name: str, meaning: str) -> Event:
        obj = str.__new__(cls, name)
        obj._value_ = name
        obj.level = level
        obj.logger_name = logger_name
        obj.meaning = meaning
        obj.log = logging.getLogger(logger_name)
        return obj

    # -- jobs (worker) ------------------------------------------------------------------
    JOB_CLAIMED = ("job.claimed", DEBUG, "justonce.worker",
                   "A job was leased to this worker (queue_wait: seconds it had been ready).")
    JOB_SUCCEEDED = ("job.succeeded", INFO, "justonce.worker",
                     "A job's success was written (reply_lost: the write's reply was lost, and "
                     "the job's row showed it written under this worker's lease).")
    JOB_FAILED = ("job.failed", INFO, "justonce.worker",
                  "An attempt raised; state says whether the job will be retried or is dead.")
    JOB_TIMEOUT = ("job.timeout", INFO, "justonce.worker",
                   "An attempt ran over its timeout and was failed (retried or dead).")
    JOB_INTERRUPTED = ("job.interrupted", WARNING, "justonce.worker",
                       "A running attempt was given up (a stop past its grace, a slot's failed "
                       "bookkeeping): it counts; retried at once, or dead on the last attempt.")
    JOB_UNKNOWN_TASK = ("job.unknown_task", INFO, "justonce.worker",
                        "The job names a task this worker's app does not register.")
    JOB_BAD_ARGUMENTS = ("job.bad_arguments", INFO, "justonce.worker",
                         "The job's arguments do not fit its task's signature.")
    JOB_UNDECODABLE = ("job.undecodable", WARNING, "justonce.worker",
                       "The job's stored arguments do not decode (a row corrupted outside "
                       "the library): failed for good, its task not called.")
    JOB_REJECTED = ("job.rejected", WARNING, "justonce.worker",
                    "A late write was rejected: the job's lease was lost before its outcome was written. "
                    "(A write whose reply was lost and that landed all the same is logged as the "
                    "outcome it was, with reply_lost.)")
    JOB_DISCARDED = ("job.discarded", WARNING, "justonce.worker",
                     "An attempt's outcome was thrown away: its lease was lost or it had timed out.")
    JOB_LEASE_LOST = ("job.lease_lost", WARNING, "justonce.worker",
                      "A renewal found the job's lease gone: it was re-offered or cancelled.")
    JOB_DROPPED = ("job.dropped", WARNING, "justonce.worker",
                   "Leased jobs were given back unstarted: their lease or slot may have run out.")
    JOB_FAIL_WRITE_ERROR = ("job.fail_write_error", ERROR, "justonce.worker",
                            "A failure could not be written; the lease will expire and the job return.")
    JOB_CANCELLED = ("job.cancelled", INFO, "justonce",
                     "A job was cancelled through the API.")
    QUEUE_PAUSED = ("queue.paused", INFO, "justonce",
                    "A queue was paused: workers claim none of its jobs until it is resumed.")
    QUEUE_RESUMED = ("queue.resumed", INFO, "justonce",
                     "A paused queue was resumed: its ready jobs are claimed again.")
    # -- the worker process -------------------------------------------------------------
    WORKER_STARTED = ("worker.started", INFO, "justonce.worker", "A worker started its threads.")
    QUEUE_PAUSE_SEEN = ("worker.queue_paused", INFO, "justonce.worker",
                        "A job the worker had leased, of a queue paused since, was given back unstarted.")
    WORKER_STOPPED = ("worker.stopped", INFO, "justonce.worker",
                      "A worker stopped, with its totals.")
    WORKER_KILL = ("worker.kill", WARNING, "justonce.worker",
                   "A second signal: the worker stops without waiting for its jobs.")
    WORKER_PAUSED = ("worker.paused", WARNING, "justonce.worker",
                     "The process did not run for longer than a heartbeat (measured across the "
                     "supervisor's sleep, not its waits on the database); unstarted jobs were dropped.")
    WORKER_RELEASED = ("worker.released", WARNING, "justonce.worker",
                       "The grace period ran out: jobs still running were given back, "
                       "their attempt counted (ready again, or dead on their last attempt).")
    WORKER_UNWRITTEN = ("worker.unwritten", ERROR, "justonce.worker",
                        "Completions could not be written before stopping; their jobs will return.")
    SLOT_ERROR = ("slot.error", ERROR, "justonce.worker",
                  "A slot's own bookkeeping failed: its job was given back, or, between jobs, it goes on.")
    CLAIM_ERROR = ("claim.error", WARNING, "justonce.worker", "A claim failed; retried.")
    ACK_ERROR = ("ack.error", WARNING, "justonce.worker",
                 "Completions could not be written; retried.")
    HEARTBEAT_ERROR = ("heartbeat.error", WARNING, "justonce.worker",
                       "A lease renewal failed; retried at the next heartbeat.")
    RELEASE_ERROR = ("release.error", WARNING, "justonce.worker",
                     "Jobs could not be given back; their leases will expire.")
    SUPERVISOR_ERROR = ("supervisor.error", ERROR, "justonce.worker",
                        "A supervisor round (leases, timeouts) failed; the next one runs as usual "
                        "(a traceback only for an error that is not justonce's own).")
    MAINTENANCE_ERROR = ("maintenance.error", WARNING, "justonce.worker",
                         "A housekeeping round failed; retried.")
    # -- housekeeping -------------------------------------------------------------------
    LEASES_RESCUED = ("leases.rescued", WARNING, "justonce.maintenance",
                      "Expired job leases were re-offered (or their jobs ended dead).")
    BATCHES_EXPIRED = ("batches.expired", WARNING, "justonce.maintenance",
                       "Idle open batches expired.")
    # -- partitions ---------------------------------------------------------------------
    PARTITION_ACQUIRED = ("partition.acquired", INFO, "justonce.partitions",
                          "A partition slot was taken.")
    PARTITION_RENEWED = ("partition.renewed", DEBUG, "justonce.partitions",
                         "A partition slot's lease was extended (until: by the database's clock).")
    PARTITION_RELEASED = ("partition.released", DEBUG, "justonce.partitions",
                          "A partition slot was given up (a standby may take it at once).")
    PARTITION_LOST = ("partition.lost", WARNING, "justonce.worker",
                      "A partition slot's lease expired or another holder took it over.")
    PARTITION_RENEW_ERROR = ("partition.renew_error", WARNING, "justonce.worker",
                             "A slot's renewal failed; retried while the lease lasts.")
    PARTITION_RELEASE_ERROR = ("partition.release_error", WARNING, "justonce.worker",
                               "A slot could not be released; it expires on its own.")
    PARTITION_RELEASE_SKIPPED = ("partition.release_skipped", WARNING, "justonce.partitions",
                                 "A slot held by an open fenced transaction was left to expire.")
    PARTITION_ERROR = ("partition.error", WARNING, "justonce.worker",
                       "A worker's partition round failed; retried.")
    PARTITION_ACQUIRE_ERROR = ("partition.acquire_error", WARNING, "justonce.partitions",
                               "A standby's try to take a slot failed (the database was away); "
                               "it waits on and tries again.")
    # -- effects ------------------------------------------------------------------------
    EFFECT_OVERTAKEN = ("effect.overtaken", WARNING, "justonce.effects",
                        "An effect was marked done after its claim was taken over: it ran twice.")
    EFFECT_RELEASE_ERROR = ("effect.release_error", ERROR, "justonce.effects",
                            "A failed effect could not be released; its lease puts it in doubt.")
    EFFECT_FINISH_RETRY = ("effect.finish_retry", WARNING, "justonce.effects",
                           "Marking effects done failed with the database away (maybe after its "
                           "commit); tried again while their lease lasts.")
    EFFECT_LATE = ("effect.late", WARNING, "justonce.effects",
                   "Claims whose lease (nearly) ran out before their fn started were given back "
                   "unstarted (the process was paused, or a chunk outlasted its lease).")
    EFFECT_LEFT_IN_DOUBT = ("effect.left_in_doubt", WARNING, "justonce.effects",
                            "Effects whose fn raised EffectInDoubt (they may have happened) were "
                            "left claimed: in doubt once their lease runs out.")
    # -- metrics ------------------------------------------------------------------------
    METRICS_STARTED = ("metrics.started", INFO, "justonce.metrics",
                       "The worker's metrics are served (host, port, path).")
    METRICS_READ_ERROR = ("metrics.read_error", WARNING, "justonce.metrics",
                          "A /metrics read of the database failed; justonce_database_up is 0.")
    # -- fault tests (justonce.failpoints) ----------------------------------------------
    FAILPOINT_HIT = ("failpoint.hit", WARNING, "justonce.failpoints",
                     "A failpoint set by JUSTONCE_FAILPOINTS acts now (point, action).")
    # -- this module --------------------------------------------------------------------
    SUBSCRIBER_ERROR = ("events.subscriber_error", ERROR, "justonce.events",
                        "An event subscriber raised (logged once per subscriber and error type).")


_subscribers: tuple[Subscriber, ...] = ()
_lock = threading.Lock()
# (subscriber, error type) pairs already logged. Keyed by the function itself, not its
# id(): an id is reused once a function is freed, and a new subscriber's first failure
# would then go unlogged. Entries leave with their subscriber.
_failed: set[tuple[Subscriber, type[BaseException]]] = set()


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Call ``fn(event, fields)`` for every event from now on; returns the unsubscribe
    function (idempotent)."""
    global _subscribers
    if not callable(fn):
        from .errors import InvalidOption

        raise InvalidOption("a subscriber must be callable as fn(event, fields)")
    with _lock:
        _subscribers = (*_subscribers, fn)

    def unsubscribe() -> None:
        global _subscribers
        with _lock:
            subs = list(_subscribers)
            if fn in subs:
                subs.remove(fn)
                _subscribers = tuple(subs)
            if fn not in subs:
                _failed.difference_update({k for k in _failed if k[0] is fn})

    return unsubscribe


def wanted(event: Event, logger: logging.Logger | None = None) -> bool:
    """Whether emitting ``event`` would do anything (a subscriber, or its level on). Hot
    paths ask once and skip building the fields when nobody listens."""
    return bool(_subscribers) or (logger or event.log).isEnabledFor(event.level)


def emit(event: Event, message: str | None = None, /, *, logger: logging.Logger | None = None,
         level: int | None = None, exc_info: Any = None, **fields: Any) -> None:
    """Report ``event``: log it (``extra={"event": name, **fields}``) on ``logger`` (default:
    the table's) at ``level`` (default: the table's), then call the subscribers.
    ``exc_info`` is passed to the log record (True inside an ``except`` block)."""
    lg = logger or event.log
    lvl = event.level if level is None else level
    if lg.isEnabledFor(lvl):
        fields["event"] = event.value
        lg.log(lvl, event.meaning if message is None else message, extra=fields,
               exc_info=exc_info, stacklevel=2)
        del fields["event"]
    subs = _subscribers
    if subs:
        _notify(subs, event, fields)


def _notify(subs: tuple[Subscriber, ...], event: Event, fields: Mapping[str, Any]) -> None:
    for fn in subs:
        try:
            fn(event, fields)
        except Exception as exc:  # noqa: BLE001 - a subscriber never breaks the caller
            key = (fn, type(exc))
            with _lock:
                first = key not in _failed
                if first and fn in _subscribers:
                    _failed.add(key)
            if first:
                Event.SUBSCRIBER_ERROR.log.error(
                    "event subscriber failed (further %s from it are not logged)",
                    type(exc).__name__, exc_info=True,
                    extra={"event": Event.SUBSCRIBER_ERROR.value, "subscriber": repr(fn),
                           "for_event": event.value})


def table() -> str:
    """The events as a Markdown table (the README's "Logs" section is this table)."""
    rows = ["| event | level | meaning |", "|---|---|---|"]
    for e in Event:
        rows.append(f"| `{e.value}` | {logging.getLevelName(e.level).lower()} | {e.meaning} |")
    return "\n".join(rows)
