"""Lists: pre-loaded work handed out in O(1), nothing lost, no position completed twice.

A producer ``create``s a list and loads its items (any number, streamed), which get dense
positions ``0..n-1``; sealing makes them immutable. Consumers then ``reserve`` the next ``k``
positions in one atomic step (a cursor moves: no scan, no per-item lock) and get a
reservation with a fencing token and a time to run (TTR). As in beanstalkd, ``touch``
extends it, ``release`` gives positions back (optionally after a delay), ``bury`` parks
positions that keep failing and ``kick`` revives them. Positions are completed by token; a
token that no longer holds them (it timed out, was released, ...) is refused with
:class:`~justonce.errors.StaleReservation`, never a silent success. A reservation whose TTR
passes is handed out again before new positions, and only its unfinished positions. The done
positions are bits, so ten million items cost megabytes of bookkeeping. A list completes
exactly once: its ``on_complete`` job is enqueued in the transaction that completes the last
position (it is a batch underneath: ``backends/liststore.py``).

``run_next`` is the trigger of an HTTP request (``POST /lists/{name}/next``): reserve one
position, run the list's task on its item here and now, complete it, answer with the result.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import failpoints, validate
from .errors import (
    InvalidArguments,
    InvalidName,
    InvalidOption,
    ListNotFound,
    PayloadTooLarge,
    StaleReservation,
    UnknownTask,
)
from .items import MAX_GROUP_ITEMS
from .models import BuriedRange, ListCompletion, ListInfo, ListProgress, Reservation
from .tasks import Enqueue, Task

if TYPE_CHECKING:
    from .app import App

LIST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}\Z")
MAX_RESERVE = 10_000
"""Positions one reserve may ask for."""
MAX_ITEMS = MAX_GROUP_ITEMS
"""Items one list may hold."""
MAX_ITEM_BYTES = validate.MAX_PAYLOAD_BYTES
"""One item's JSON text, at most (256 KiB)."""
MAX_TTR = 7 * 86400.0
DEFAULT_TTR = 60.0
DEFAULT_MAX_ATTEMPTS = 5
LOAD_CHUNK = 10_000
"""Items appended per transaction while loading (a crash loses at most the open one)."""
MAX_REQUEST_ID = 200
_TOKEN = re.compile(r"^([1-9][0-9]{0,18})\.([0-9a-f]{16})\Z")
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
Target = Reservation | str


@dataclass(frozen=True, slots=True)
class ListRun:
    """What ``run_next`` did with one position: ``outcome`` is ``completed`` (``result``
    is the task's return value as a job keeps it: JSON, at most 64 KiB, else None and a
    ``note``), ``released`` (it raised; the position is handed out
    again after a backoff), ``buried`` (it raised on its last attempt) or ``stale`` (the
    reservation timed out while the task ran: the position is someone else's now) or
    ``late`` (the time to run had (nearly) run out before the task could start, as in a
    process paused between the reserve and the task: given back, the task not run)."""

    list: str
    position: int
    item: Any
    attempt: int
    outcome: str
    result: Any = None
    error: str | None = None
    list_completed: bool = False
    note: str | None = None
    """Why ``result`` is None although the task returned something: what a job's result
    would keep (a value that is not JSON, or one over 64 KiB, is dropped with this note;
    the position is completed all the same)."""


def list_name(value: Any) -> str:
    if not isinstance(value, str) or not LIST_NAME.match(value):
        raise InvalidName(f"a list name is 1-63 letters, digits, '_', '.', ':' or '-' "
                          f"starting with a letter or digit, not {validate.shown(value)}")
    return str.__str__(value)


def parse_token(token: Any) -> tuple[int, str]:
    """``"<reservation id>.<secret>"`` → (id, secret); a malformed token is refused the same
    way as a stale one (it holds nothing)."""
    if not isinstance(token, str):
        raise InvalidOption(f"a reservation token is a string, not {type(token).__name__}")
    m = _TOKEN.match(token)
    # A row id past 2**63 - 1 (the pattern allows 19 digits) names no reservation.
    if m is None or int(m.group(1)) >= 2**63:
        raise StaleReservation("not a reservation token (they look like 123.0123456789abcdef)")
    return int(m.group(1)), m.group(2)


def item_json(item: Any) -> str:
    """One item as stored: JSON text, at most MAX_ITEM_BYTES, nested at most 64 deep."""
    try:
        text = _ENCODER.encode(item)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArguments(f"a list item must be JSON-serialisable: {exc}") from None
    if validate._too_deep(text):
        raise InvalidArguments(f"a list item may nest at most {validate.MAX_JSON_DEPTH} deep")
    n = validate._storable_size(text, "list items")
    if n > MAX_ITEM_BYTES:
        raise PayloadTooLarge(f"a list item is at most {MAX_ITEM_BYTES} bytes of JSON, not {n}")
    return text


class Lists:
    """The list API of an :class:`~justonce.App` (``app.lists``)."""

    def __init__(self, app: App) -> None:
        self.app = app

    # -- loading --------------------------------------------------------------------------
    def create(self, name: str, *, task: str | Task | None = None,
               items: Iterable[Any] | None = None, seal: bool = True,
               ttr: float = DEFAULT_TTR, max_attempts: int | None = None,
               on_complete: str | Task | Enqueue | None = None, conn: Any = None) -> ListInfo:
        """Create a list and (``items``) load it, then seal it (``seal=False``: leave it
        open for ``append``). Up to ``LOAD_CHUNK`` items are stored, and the list sealed,
        in the transaction that creates it: such a create happens whole or not at all. A
        longer stream goes on in transactions of ``LOAD_CHUNK`` items, then seals; the list
        is visible (loading) meanwhile.

        ``task``: what ``run_next`` runs on each item (``task(item)``); lists that are only
        reserved and completed by their consumers need none. ``ttr``: the default time to
        run of a reservation, in seconds. ``max_attempts``: how often ``run_next`` hands
        out a position whose task raises before it buries it (default: the task's, else 5).
        ``on_complete``: a task enqueued once when every position is done, with the
        keyword argument ``batch`` (a dict: ``description`` is ``"list:<name>"``, ``total``).

        ``conn``: all of it in your open transaction (from ``app.backend.transaction()``
        or your own connection, as for ``enqueue``), committed with it or not at all; every
        method of ``app.lists`` that changes a list takes it. The service commits each
        call and its audit row so.
        """
        name = list_name(name)
        task_name = None
        if task is not None:
            task_name, known = self.app._resolve(task)
            if max_attempts is None and known is not None:
                max_attempts = known.max_attempts
            why = known.argument_error((None,)) if known is not None else None
            if why is not None:  # (it is called as task(item))
                raise InvalidArguments(f"a list's task takes one item: {why}")
        attempts = validate.attempts(DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts)
        ttr = validate.bounded(ttr, "ttr", 0.001, MAX_TTR)
        callbacks = {}
        if on_complete is not None:
            callbacks["complete"] = self.app.batches._callback("complete", on_complete)
        seal = validate.flag(seal, "seal")
        given = () if items is None else _iterable(items)
        checked: Iterator[builtins.list[str]] = iter(())  # (chunks after the first, checked)
        rest: Iterator[Any] | None = None  # (items after those, unchecked)
        if isinstance(given, (builtins.list, tuple)) and len(given) > LOAD_CHUNK:
            # All here already: every item is checked before anything is written (a bad one
            # far down left a list half loaded, which a corrected call then found taken).
            checked = _chunks([item_json(x) for x in given], LOAD_CHUNK)
            first, more = next(checked), True
        else:
            # The first chunk is checked before the list exists, and the list is created
            # with it (and sealed, when it is all) in one transaction: a bad item in it
            # leaves nothing behind, and nobody can seal the list before its first items
            # are in. (A chunk of a stream further on keeps the chunks before it: see append.)
            stream = iter(given)
            first = [item_json(x) for x in itertools.islice(stream, LOAD_CHUNK)]
            after = next(stream, _END)
            more = after is not _END
            rest = itertools.chain([after], stream) if more else None
        sealed = f"list:{name}" if seal and not more else None
        list_id = self.app.backend.lists.create(name, task_name, ttr, attempts, callbacks, first,
                                                sealed, conn)
        if more:
            self._load(name, checked, rest, conn, kept=len(first), list_id=list_id)
            if seal:
                return self.seal(name, conn=conn, list_id=list_id)
        return self._get(name, conn)

    def append(self, name: str, items: Iterable[Any], *, conn: Any = None,
               list_id: int | None = None) -> int:
        """Append items to a list that is still loading, in transactions of ``LOAD_CHUNK``
        (each item checked before its transaction starts); how many were appended.

        Every chunk goes to the list the name meant when the call began (a list dropped and
        made again under the name meanwhile refuses the rest: ListNotFound); ``list_id``
        (``ListInfo.id``): to that list only, for a load made of several calls."""
        name = list_name(name)
        n = self._load(name, (), iter(_iterable(items)), conn, list_id=_list_id(list_id))
        if n == 0:
            self._get(name, conn)  # an unknown name still says so
        return n

    def _load(self, name: str, checked: Iterable[builtins.list[str]], rest: Iterator[Any] | None,
              conn: Any = None, kept: int = 0, list_id: int | None = None) -> int:
        """Append the ``checked`` chunks (items already checked), then the rest of the
        stream in chunks of LOAD_CHUNK, each checked before its transaction, to list
        ``list_id`` of that name (None: the list the first chunk finds); how many.
        ``kept``: items the list has already from this load (for the note of an error)."""
        backend = self.app.backend.lists
        n = 0
        chunks = itertools.chain(checked, () if rest is None else (
            [item_json(x) for x in chunk] for chunk in _chunks(rest, LOAD_CHUNK)))
        try:
            for texts in chunks:
                # (the first chunk's list is the one the rest go to)
                list_id = backend.append(name, texts, MAX_ITEMS, conn, list_id)[2]
                n += len(texts)
                failpoints.hit("list.after_append_chunk")
        except Exception as exc:
            if n + kept:
                exc.add_note(f"list {name!r} keeps the {n + kept} items appended before this error "
                             "and is not sealed: append the rest, then seal it (or drop it)")
            raise
        return n

    def seal(self, name: str, *, conn: Any = None, list_id: int | None = None) -> ListInfo:
        """Seal a list: its items become immutable and its positions can be reserved. An
        empty list completes at once. Sealing a sealed list changes nothing. ``list_id``
        (``ListInfo.id``): only if the name still means that list (ListNotFound if it was
        dropped and made again)."""
        name = list_name(name)
        self.app.backend.lists.seal(name, f"list:{name}", conn, _list_id(list_id))
        return self._get(name, conn)

    def drop(self, name: str) -> bool:
        """Delete a list, its items, reservations and bookkeeping; False if there was none."""
        return self.app.backend.lists.drop(list_name(name))

    # -- handing out ----------------------------------------------------------------------
    def reserve(self, name: str, k: int = 1, *, ttr: float | None = None,
                request_id: str | None = None, conn: Any = None) -> Reservation | None:
        """Reserve up to ``k`` positions for ``ttr`` seconds (default: the list's): those of
        a reservation that timed out or was given back first, else the next fresh ones.
        None when nothing can be handed out now (all done, or all held by others).

        ``request_id``: a caller whose answer was lost asks again with the same id and
        gets the same reservation (same token, same positions)."""
        name = list_name(name)
        k = validate.count(k, "k", MAX_RESERVE)
        if k < 1:
            raise InvalidOption(f"k must be at least 1, not {k}")
        if ttr is not None:
            ttr = validate.bounded(ttr, "ttr", 0.001, MAX_TTR)
        if request_id is not None:
            request_id = validate.text(request_id, "request_id", MAX_REQUEST_ID)
            if not request_id:
                raise InvalidOption("request_id must not be empty")
        got = self.app.backend.lists.reserve(name, k, ttr, request_id, conn)
        if got is None:
            self._exists(name, conn)
        return got

    def items(self, reservation: Reservation) -> list[tuple[int, Any]]:
        """The reservation's (position, item) pairs, in position order."""
        if not isinstance(reservation, Reservation):
            raise InvalidOption("items() takes a Reservation")
        name, ranges = list_name(reservation.list), _ranges(reservation.ranges)
        return [(p, json.loads(text)) for p, text in self.app.backend.lists.items(name, ranges)]

    def complete(self, target: Target, token: str | None = None,
                 positions: Iterable[int] | None = None, *, conn: Any = None) -> ListCompletion:
        """Mark positions done (default: every position the reservation holds). Give the
        :class:`Reservation`, or the list's name and the token. Positions the reservation
        does not hold raise :class:`~justonce.errors.PositionNotReserved`, a stale token
        :class:`~justonce.errors.StaleReservation`; either way nothing changes."""
        name, row_id, secret = self._target(target, token)
        failpoints.hit("list.before_complete")
        return self.app.backend.lists.complete(name, row_id, secret, _positions(positions), conn)

    def touch(self, target: Target, token: str | None = None, *,
              ttr: float | None = None, conn: Any = None) -> datetime:
        """Extend a reservation's time to run to ``ttr`` seconds from now (default: its
        own TTR); the new expiry time."""
        name, row_id, secret = self._target(target, token)
        if ttr is not None:
            ttr = validate.bounded(ttr, "ttr", 0.001, MAX_TTR)
        return self.app.backend.lists.touch(name, row_id, secret, ttr, conn)

    def release(self, target: Target, token: str | None = None, *, delay: float = 0.0,
                positions: Iterable[int] | None = None, conn: Any = None) -> int:
        """Give positions back (default: all), to be handed out again after ``delay``
        seconds; the number given back (done ones are not). Releasing all of them ends
        the reservation: its token is refused from then on."""
        name, row_id, secret = self._target(target, token)
        delay = validate.bounded(delay, "delay", 0.0, validate.MAX_DELAY_SECONDS)
        return self.app.backend.lists.release(name, row_id, secret, delay, _positions(positions), conn)

    def bury(self, target: Target, token: str | None = None, *,
             positions: Iterable[int] | None = None, reason: str | None = None,
             conn: Any = None) -> int:
        """Park positions (default: all) until an operator kicks them: they are not handed
        out, and the list cannot complete while any is buried."""
        name, row_id, secret = self._target(target, token)
        if reason is not None:
            reason = validate.error_text(validate.text(reason, "reason", validate.MAX_ERROR_CHARS))
        return self.app.backend.lists.bury(name, row_id, secret, _positions(positions), reason, conn)

    def kick(self, name: str, limit: int = MAX_ITEMS, *, conn: Any = None) -> int:
        """Hand buried positions out again (oldest first, up to ``limit``), with their
        attempts counted afresh; how many were kicked."""
        name = list_name(name)
        limit = validate.count(limit, "limit", MAX_ITEMS)
        self._exists(name, conn)
        return self.app.backend.lists.kick(name, limit, conn)

    # -- reading --------------------------------------------------------------------------
    def get(self, name: str) -> ListInfo:
        return self._get(name)

    def _get(self, name: str, conn: Any = None) -> ListInfo:
        info = self.app.backend.lists.info(list_name(name), conn)
        if info is None:
            raise ListNotFound(f"no list named {name!r}")
        return info

    def progress(self, name: str) -> ListProgress:
        return self.get(name).progress

    def list(self, limit: int = 100) -> builtins.list[ListInfo]:
        return self.app.backend.lists.all(validate.count(limit, "limit", 10_000))

    def buried(self, name: str, limit: int = 100) -> builtins.list[BuriedRange]:
        name = list_name(name)
        self._exists(name)
        return self.app.backend.lists.buried(name, validate.count(limit, "limit", 10_000))

    def prune(self, retention: float = 86400.0) -> int:
        """Forget finished reservations kept for their request ids, older than ``retention``
        seconds (a request id asked again after that gets new positions)."""
        return self.app.backend.lists.prune(
            validate.bounded(retention, "retention", 0.0, validate.MAX_DELAY_SECONDS))

    # -- the trigger ----------------------------------------------------------------------
    def run_next(self, name: str, *, ttr: float | None = None,
                 on_step: Callable[[Any, ListRun], None] | None = None) -> ListRun | None:
        """Reserve the next position, run the list's task on its item here, and complete
        it. A task that raises releases the position after its backoff, or buries it on
        the list's last attempt. None when nothing can be handed out now.

        A run commits in two steps, around the task: the reservation, then its end
        (completion, release or burial). ``on_step(conn, run)`` is called in each step's
        transaction before it commits, so what it writes on ``conn`` commits with that
        step or not at all (the service writes its audit rows so): once with outcome
        ``running`` (``item`` None) when the position is reserved, once with the outcome
        (for ``stale``, which changes nothing, in a transaction of its own)."""
        name = list_name(name)
        if on_step is not None and not callable(on_step):
            raise InvalidOption(f"on_step must be callable, not {validate.shown(on_step)}")
        if ttr is not None:
            ttr = validate.bounded(ttr, "ttr", 0.001, MAX_TTR)
        meta = self.app.backend.lists.task(name)
        if meta is None:
            raise ListNotFound(f"no list named {name!r}")
        task_name, max_attempts = meta
        if task_name is None:
            raise InvalidOption(f"list {name!r} has no task: reserve and complete it instead")
        task = self.app.tasks.get(task_name)
        if task is None:
            raise UnknownTask(f"list {name!r} runs task {task_name!r}, which is not registered here")
        started = time.monotonic()
        if on_step is None:
            res = self.reserve(name, 1, ttr=ttr)
        else:
            with self.app.backend.transaction() as conn:
                res = self.reserve(name, 1, ttr=ttr, conn=conn)
                if res is not None:
                    on_step(conn, ListRun(name, res.ranges[0][0], None, res.attempt, "running"))
        if res is None:
            return None
        (position, item), = self.items(res)
        if time.monotonic() >= started + res.ttr - min(res.ttr / 5, 2.0):
            # Paused past (nearly) all of the time to run before the task could start: the
            # position may be another reserver's by now. Give it back, start nothing.
            def late(conn: Any) -> ListRun:
                with contextlib.suppress(StaleReservation):
                    if res.attempt >= max_attempts:
                        # (a time to run shorter than a reserve takes would hand the
                        # position out for ever: the last attempt buries it, as a failure)
                        why = "the time to run ran out before the task could start"
                        self.bury(res, reason=why, conn=conn)
                        return ListRun(name, position, item, res.attempt, "buried", error=why)
                    self.release(res, conn=conn)
                return ListRun(name, position, item, res.attempt, "late")

            return self._end(late, on_step)
        try:
            returned = asyncio.run(task.fn(item)) if task.is_async else task.fn(item)
        except Exception as exc:  # noqa: BLE001 - the task's failure is the answer
            error = validate.exception_text(exc)

            def failed(conn: Any) -> ListRun:
                try:
                    if res.attempt >= max_attempts:
                        self.bury(res, reason=error, conn=conn)
                        return ListRun(name, position, item, res.attempt, "buried", error=error)
                    self.release(res, delay=task.retry_delay(res.attempt), conn=conn)
                    return ListRun(name, position, item, res.attempt, "released", error=error)
                except StaleReservation:
                    return ListRun(name, position, item, res.attempt, "stale", error=error)

            return self._end(failed, on_step)

        # What a job would store of its result: the answer is JSON whatever the task returned.
        text, note = validate.result_json(returned)
        result = None if text is None else json.loads(text)

        def succeeded(conn: Any) -> ListRun:
            try:
                done = self.complete(res, conn=conn)
            except StaleReservation as exc:
                return ListRun(name, position, item, res.attempt, "stale", result, str(exc),
                               note=note)
            return ListRun(name, position, item, res.attempt, "completed", result,
                           list_completed=done.list_completed, note=note)

        return self._end(succeeded, on_step)

    def _end(self, step: Callable[[Any], ListRun],
             on_step: Callable[[Any, ListRun], None] | None) -> ListRun:
        """Run the step that ends a run, with ``on_step`` in its transaction (a stale
        reservation's step is rolled back to its savepoint: the transaction goes on)."""
        if on_step is None:
            return step(None)
        with self.app.backend.transaction() as conn:
            run = step(conn)
            on_step(conn, run)
        return run

    def drain(self, name: str, *, poll: float = 0.2, stop: Any = None) -> Iterator[ListRun]:
        """``run_next`` until the list has nothing ready or reserved (positions held by
        others are waited for: they may time out and come back), yielding each run.
        ``stop``: an object with ``is_set()`` (a threading.Event) that ends it early.
        Its arguments are checked when it is called, before the first run."""
        name = list_name(name)
        poll = validate.bounded(poll, "poll", 0.001, 3600)
        if stop is not None and not callable(getattr(stop, "is_set", None)):
            raise InvalidOption(f"stop must have is_set() (a threading.Event), not {validate.shown(stop)}")
        return self._drain(name, poll, stop)

    def _drain(self, name: str, poll: float, stop: Any) -> Iterator[ListRun]:
        while stop is None or not stop.is_set():
            run = self.run_next(name)
            if run is not None:
                yield run
                continue
            p = self.progress(name)
            if p.ready == 0 and p.reserved == 0:
                return
            time.sleep(poll)

    # -- helpers --------------------------------------------------------------------------
    def _exists(self, name: str, conn: Any = None) -> None:
        if self.app.backend.lists.task(name, conn) is None:
            raise ListNotFound(f"no list named {name!r}")

    @staticmethod
    def _target(target: Target, token: str | None) -> tuple[str, int, str]:
        if isinstance(target, Reservation):
            if token is not None:
                raise InvalidOption("give a Reservation, or a list name and a token, not both")
            name, token = list_name(target.list), target.token
        else:
            name = list_name(target)
            if token is None:
                raise InvalidOption("a reservation token is needed with a list name")
        row_id, secret = parse_token(token)
        return name, row_id, secret


_END = object()


def _list_id(value: Any) -> int | None:
    return None if value is None else validate.int64(value, "list_id", 1)


def _iterable(items: Any) -> Iterable[Any]:
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
        raise InvalidOption("items must be an iterable of JSON values (a list, a generator)")
    return items


def _chunks(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def _positions(positions: Iterable[int] | None) -> Sequence[int] | None:
    if positions is None:
        return None
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Iterable):
        raise InvalidOption("positions must be an iterable of integers")
    out = []
    for p in itertools.islice(positions, MAX_RESERVE + 1):
        position = validate.exact_int(p)
        if position is None or not 0 <= position < 2**63:
            raise InvalidOption(f"a position is an integer in [0, 2**63), not {validate.shown(p)}")
        out.append(position)
    if len(out) > MAX_RESERVE:
        raise InvalidOption(f"at most {MAX_RESERVE} positions per call")
    return out


def _ranges(ranges: Any) -> tuple[tuple[int, int], ...]:
    """A reservation's ranges of positions (``[lo, hi)`` pairs): a Reservation can be
    built by hand, and its ranges go to SQL."""
    out: list[tuple[int, int]] = []
    total = 0
    for r in ranges if isinstance(ranges, (tuple, list)) else [ranges]:
        lo, hi = ([validate.exact_int(x) for x in r] if isinstance(r, (tuple, list)) and len(r) == 2
                  else (None, None))
        if lo is None or hi is None or not 0 <= lo <= hi < 2**63:
            raise InvalidOption(f"a reservation's ranges are [lo, hi) pairs of positions, "
                                f"not {validate.shown(r)}")
        total += hi - lo
        if total > MAX_RESERVE:
            raise InvalidOption(f"a reservation holds at most {MAX_RESERVE} positions")
        out.append((lo, hi))
    return tuple(out)
