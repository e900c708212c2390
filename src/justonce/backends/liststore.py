"""The list operations, written once over every dialect (dialect.py).

A list is a row with a cursor (``next_position``) over items with dense positions
``0..total-1``, and a batch of one group of ``total`` items whose bits say which positions
are done (batchstore.py), so that a list completes exactly once, as a batch does.

Who holds which positions is the reservation table. A row holds ``held`` (ranges) in one of
four states: active (a reservation: its id and secret are the token, until ``due_at``, its
time to run), free (given back or timed out, handed out again from ``due_at`` on), buried
(parked until kicked) and done (kept for its request id only). **The rows of a list never
hold a position twice**: a reserve moves positions from the cursor or from a due row into a
new active row, and release and bury move them out of an active row into a free or buried
one. So a completion checks its positions against its own row only (no scan, no overlap
query), and a timed-out holder is refused because the re-offer took its positions (and its
state) under the same row lock that its completion needs.

Lock order: list row (reserve, seal, kick), reservation rows (id order), chunks (key
order), batch row, list row by ``list_finish`` (only the completion of the last position,
which holds no reservation lock a reserve waits for: a reserve skips locked rows and reads
the bits without locking them).
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..errors import (
    InvalidOption,
    ListExists,
    ListNotFound,
    ListNotSealed,
    ListSealed,
    PositionNotReserved,
    StaleReservation,
)
from ..items import CHUNK_BITS
from ..models import BuriedRange, ListCompletion, ListInfo, ListProgress, Ranges, Reservation
from .batchstore import BatchOps
from .dialect import Dialect, Key

REOFFER_ROUNDS = 16
"""Due rows whose positions all turned out done, dropped by one reserve before it takes
fresh positions (the next reserve goes on)."""

NO_BUDGET = 2**62
"""A byte budget that is never reached (list_items takes one)."""

_dumps = json.JSONEncoder(separators=(",", ":")).encode


# -- ranges ------------------------------------------------------------------------------------
def to_ranges(positions: Iterable[int]) -> Ranges:
    """Sorted distinct positions as half-open ranges."""
    out: list[tuple[int, int]] = []
    for p in sorted(set(positions)):
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return tuple(out)


def each(ranges: Ranges) -> Iterator[int]:
    for lo, hi in ranges:
        yield from range(lo, hi)


def size(ranges: Ranges) -> int:
    return sum(hi - lo for lo, hi in ranges)


def parse_ranges(text: str) -> Ranges:
    return tuple((int(lo), int(hi)) for lo, hi in json.loads(text))


def ranges_json(ranges: Ranges) -> str:
    return _dumps([[lo, hi] for lo, hi in ranges])


def contains(ranges: Ranges, p: int) -> bool:
    return any(lo <= p < hi for lo, hi in ranges)


@dataclass(frozen=True, slots=True)
class Row:
    """One reservation row."""

    id: int
    list_id: int
    secret: str
    request_id: str | None
    state: str
    due_at: Any
    ranges: Ranges
    held: Ranges
    pending: int
    attempt: int
    ttr: float
    error: str | None
    created_at: Any
    expired: bool


@dataclass(frozen=True, slots=True)
class ListRow:
    id: int
    state: str
    total: int
    next_position: int
    ttr: float
    max_attempts: int
    batch_id: int | None
    group_id: str | None


def _row(r: Sequence[Any]) -> Row:
    return Row(int(r[0]), int(r[1]), r[2], r[3], r[4], r[5], parse_ranges(r[6]),
               parse_ranges(r[7]), int(r[8]), int(r[9]), float(r[10]), r[11], r[12], bool(r[13]))


def _list_row(r: Sequence[Any]) -> ListRow:
    return ListRow(int(r[0]), r[1], int(r[2]), int(r[3]), float(r[4]), int(r[5]),
                   None if r[6] is None else int(r[6]), r[7])


def token_of(row_id: int, secret: str) -> str:
    return f"{row_id}.{secret}"


class ListOps:
    """The Backend protocol's list operations (``backend.lists``) over a dialect."""

    def __init__(self, d: Dialect, batches: BatchOps) -> None:
        self.d = d
        self.batches = batches

    # -- loading ------------------------------------------------------------------------------
    def create(self, name: str, task: str | None, ttr: float, max_attempts: int,
               callbacks: dict[str, Any], items: Sequence[str] = (),
               seal: str | None = None, conn: Any = None) -> int:
        """Create a list with its first ``items`` (JSON texts), and seal it when ``seal``
        (the batch's description) is given, in one transaction (``conn``: the caller's):
        nobody sees the list before its items, so a seal racing the create finds no list
        or a loaded one, and a create that fails leaves nothing. ``ListExists`` when the
        name is taken."""
        params = {"name": name, "task": task, "ttr": ttr, "max_attempts": max_attempts,
                  "callbacks": _dumps(callbacks)}

        def run(c: Any) -> int:
            list_id = int(self.d.rows(c, "list_create", params)[0][0])
            if items:
                self.insert_items(c, list_id, 0, items)
                self.d.many(c, "list_grow", [{"id": list_id, "total": len(items)}])
            if seal is not None:
                self._seal(c, name, seal)
            return list_id

        try:
            return self.d.tx(conn, run)
        except Exception as exc:
            if self.d.is_unique_violation(exc):
                raise ListExists(f"a list named {name!r} exists already") from None
            raise

    def append(self, name: str, items: Sequence[str], max_total: int,
               conn: Any = None, list_id: int | None = None) -> tuple[int, int, int]:
        """Append items (JSON texts) at the end, in one transaction; (first position, new
        total, the list's id). ``list_id``: only to that list (see _lock)."""
        def run(c: Any) -> tuple[int, int, int]:
            lst = self._lock(c, name, list_id)
            if lst.state != "loading":
                raise ListSealed(f"list {name!r} is sealed: its items cannot change")
            start = lst.total
            if start + len(items) > max_total:
                raise InvalidOption(f"a list holds at most {max_total} items: {name!r} has "
                                    f"{start}, {len(items)} more would pass that")
            self.insert_items(c, lst.id, start, items)
            self.d.many(c, "list_grow", [{"id": lst.id, "total": start + len(items)}])
            return start, start + len(items), lst.id

        return self.d.tx(conn, run)

    def insert_items(self, c: Any, list_id: int, start: int, items: Sequence[str]) -> None:
        """Insert items at positions ``start, start+1, ...`` (a dialect may do it faster)."""
        self.d.many(c, "list_item_insert", [
            {"list_id": list_id, "position": start + i, "item": item} for i, item in enumerate(items)
        ])

    def seal(self, name: str, description: str, conn: Any = None, list_id: int | None = None) -> bool:
        """Seal a loading list: its batch is opened, given one group of ``total`` items and
        sealed, in one transaction (an empty list completes here). False when it was sealed
        already. ``list_id``: only that list (see _lock)."""
        return self.d.tx(conn, lambda c: self._seal(c, name, description, list_id))

    def _seal(self, c: Any, name: str, description: str, list_id: int | None = None) -> bool:
        lst = self._lock(c, name, list_id)
        if lst.state != "loading":
            return False
        callbacks = json.loads(self.d.rows(c, "list_callbacks", {"id": lst.id})[0][0])
        batch_id, group_id, completed = self.batches.open_sealed(
            c, description, callbacks, lst.total)
        self.d.many(c, "list_seal", [{"id": lst.id, "batch_id": batch_id, "group_id": group_id}])
        if completed:
            self.d.many(c, "list_finish", [{"batch_id": batch_id}])
        return True

    def drop(self, name: str) -> bool:
        def run(c: Any) -> bool:
            rows = self.d.rows(c, "list_lock", {"name": name})
            if not rows:
                return False
            lst = _list_row(rows[0])
            for stmt in ("list_drop_items", "list_drop_reservations", "list_drop"):
                self.d.many(c, stmt, [{"id": lst.id}])
            if lst.batch_id is not None:
                self.batches.drop(c, lst.batch_id)
            return True

        return self.d.tx(None, run)

    # -- handing out --------------------------------------------------------------------------
    def reserve(self, name: str, k: int, ttr: float | None,
                request_id: str | None, conn: Any = None) -> Reservation | None:
        """Up to ``k`` positions: first those of a due row (timed out, released, kicked),
        then fresh ones from the cursor. None when there is nothing to hand out now."""
        if request_id is not None:
            again = self._by_request(name, request_id, conn)
            if again is not None:
                return again
        try:
            return self.d.tx(conn, lambda c: self._reserve(c, name, k, ttr, request_id))
        except Exception as exc:
            # Two calls with one request id raced: the other one's reservation is the answer.
            if request_id is not None and self.d.is_unique_violation(exc):
                again = self._by_request(name, request_id, conn)
                if again is not None:
                    return again
            raise

    def _reserve(self, c: Any, name: str, k: int, ttr: float | None,
                 request_id: str | None) -> Reservation | None:
        lst = self._lock(c, name)
        if lst.state == "loading":
            raise ListNotSealed(f"list {name!r} is still loading: seal it first")
        ttr = lst.ttr if ttr is None else ttr
        for _ in range(REOFFER_ROUNDS):
            due = self.d.rows(c, "list_due", {"list_id": lst.id})
            if not due:
                break
            row = _row(due[0])
            open_ = self._unfinished(c, lst, row.held)
            take, rest = open_[:k], open_[k:]
            if rest:
                self._set(c, row.id, "free", 0.0, to_ranges(rest), len(rest), row.attempt, row.error)
            else:
                self._finish_row(c, row)
            if take:
                got = to_ranges(take)
                return self._insert(c, lst, name, got, row.attempt + 1, ttr, request_id)
        if lst.next_position >= lst.total:
            return None
        lo, hi = lst.next_position, min(lst.total, lst.next_position + k)
        self.d.many(c, "list_advance", [{"id": lst.id, "next_position": hi}])
        return self._insert(c, lst, name, ((lo, hi),), 1, ttr, request_id)

    def _insert(self, c: Any, lst: ListRow, name: str, got: Ranges, attempt: int, ttr: float,
                request_id: str | None) -> Reservation:
        secret = secrets.token_hex(8)
        text = ranges_json(got)
        rows = self.d.rows(c, "list_reservation_insert", {
            "list_id": lst.id, "secret": secret, "request_id": request_id, "state": "active",
            "due_in": ttr, "ranges": text, "held": text, "pending": size(got),
            "attempt": attempt, "ttr": ttr, "error": None})
        row_id, due_at = rows[0]
        return Reservation(name, token_of(int(row_id), secret), got,
                           self.d.time(due_at), attempt, ttr, request_id)  # type: ignore[arg-type]

    def _read(self, conn: Any, name: str, params: dict[str, Any]) -> list[Any]:
        """A read on the caller's transaction when there is one (what it sees, and no second
        connection taken from the pool while it holds one), else on one of ours."""
        if conn is None:
            return self.d.read(name, params)
        return self.d.on(conn, lambda c: self.d.rows(c, name, params))

    def _by_request(self, name: str, request_id: str, conn: Any = None) -> Reservation | None:
        rows = self._read(conn, "list_reservation_by_request", {"name": name, "request_id": request_id})
        if not rows:
            return None
        row = _row(rows[0])
        # A live row's expiry is its due_at; a finished one has none left, and answers the
        # expiry it was handed out with (created in the same statement as its first due_at).
        expires = self.d.time(row.due_at) if row.state == "active" else None
        if expires is None:
            created = self.d.time(row.created_at)
            assert created is not None
            expires = created + timedelta(seconds=row.ttr)
        return Reservation(name, token_of(row.id, row.secret), row.ranges, expires,
                           row.attempt, row.ttr, request_id)

    # -- the holder's writes --------------------------------------------------------------------
    def complete(self, name: str, row_id: int, secret: str,
                 positions: Sequence[int] | None, conn: Any = None) -> ListCompletion:
        def run(c: Any) -> ListCompletion:
            row, lst = self._holder(c, name, row_id, secret)
            want = list(each(row.held)) if positions is None else self._inside(row, positions)
            if not want:
                return ListCompletion(0)
            assert lst.batch_id is not None and lst.group_id is not None
            by_chunk: dict[Key, set[int]] = defaultdict(set)
            for p in want:
                by_chunk[(lst.batch_id, lst.group_id, p // CHUNK_BITS)].add(p % CHUNK_BITS)
            flips = self.d.flip(c, by_chunk)
            already = tuple(sorted(key[2] * CHUNK_BITS + bit for key, f in flips.items()
                                   for bit in f.was_set))
            newly = len(set(want)) - len(already)
            pending = row.pending - newly
            if pending <= 0:
                self._finish_row(c, row)
            elif newly:
                self.d.many(c, "list_reservation_pending", [{"id": row.id, "pending": pending}])
            completed = False
            if (any(f.pending_after == 0 for f in flips.values())
                    and self.batches.complete_if_done(c, [lst.batch_id])):
                self.d.many(c, "list_finish", [{"batch_id": lst.batch_id}])
                completed = True
            return ListCompletion(newly, already, completed)

        return self.d.tx(conn, run)

    def touch(self, name: str, row_id: int, secret: str, ttr: float | None,
              conn: Any = None) -> datetime:
        def run(c: Any) -> datetime:
            row, _ = self._holder(c, name, row_id, secret)
            self.d.many(c, "list_reservation_touch",
                        [{"id": row.id, "due_in": row.ttr if ttr is None else ttr}])
            rows = self.d.rows(c, "list_reservation_due", {"id": row.id})
            return self.d.time(rows[0][0])  # type: ignore[return-value]

        return self.d.tx(conn, run)

    def release(self, name: str, row_id: int, secret: str, delay: float,
                positions: Sequence[int] | None, conn: Any = None) -> int:
        """Give positions back (all held ones by default), to be handed out again after
        ``delay`` s; the number given back that were not done."""
        return self._move_out(name, row_id, secret, positions, "free", delay, None, conn)

    def bury(self, name: str, row_id: int, secret: str, positions: Sequence[int] | None,
             reason: str | None, conn: Any = None) -> int:
        return self._move_out(name, row_id, secret, positions, "buried", None, reason, conn)

    def _move_out(self, name: str, row_id: int, secret: str, positions: Sequence[int] | None,
                  state: str, delay: float | None, reason: str | None, conn: Any = None) -> int:
        def run(c: Any) -> int:
            row, lst = self._holder(c, name, row_id, secret)
            out = list(each(row.held)) if positions is None else self._inside(row, positions)
            open_ = set(self._unfinished(c, lst, to_ranges(out)))
            keep = [p for p in each(row.held) if p not in set(out)]
            if not keep:
                # The whole reservation moves: the row itself changes state (its token dies).
                self._set(c, row.id, state, delay, to_ranges(sorted(open_)), len(open_),
                          row.attempt, reason)
                return len(open_)
            if open_:
                moved = to_ranges(sorted(open_))
                self.d.rows(c, "list_reservation_insert", {
                    "list_id": lst.id, "secret": secrets.token_hex(8), "request_id": None,
                    "state": state, "due_in": delay, "ranges": ranges_json(moved),
                    "held": ranges_json(moved), "pending": len(open_), "attempt": row.attempt,
                    "ttr": row.ttr, "error": reason})
            self.d.many(c, "list_reservation_hold", [{
                "id": row.id, "held": ranges_json(to_ranges(keep)),
                "pending": row.pending - len(open_)}])
            return len(open_)

        return self.d.tx(conn, run)

    # -- operators ----------------------------------------------------------------------------
    def kick(self, name: str, limit: int, conn: Any = None) -> int:
        """Buried rows (oldest first) back to be handed out now, with their attempts
        counted from zero, until ``limit`` positions are kicked; how many were."""
        def run(c: Any) -> int:
            lst = self._lock(c, name)
            kicked = 0
            for r in self.d.rows(c, "list_buried_lock", {"list_id": lst.id, "limit": limit}):
                row = _row(r)
                if kicked + row.pending > limit and kicked:
                    break
                self._set(c, row.id, "free", 0.0, row.held, row.pending, 0, row.error)
                kicked += row.pending
            return kicked

        return self.d.tx(conn, run)

    def buried(self, name: str, limit: int) -> list[BuriedRange]:
        rows = self.d.read("list_buried", {"name": name, "limit": limit})
        return [BuriedRange(parse_ranges(r[0]), int(r[1]), r[2], self.d.time(r[3]))  # type: ignore[arg-type]
                for r in rows]

    def items(self, name: str, ranges: Ranges, budget: int = NO_BUDGET) -> list[tuple[int, str]]:
        """The items (JSON texts) at ``ranges`` (sorted), in position order, from the first
        for as long as their text adds up to at most ``budget`` bytes of UTF-8: fewer rows
        than positions means the next item would pass the budget. The database stops at
        the budget, so what is read is bounded by it whatever the sizes of the items."""
        if not ranges:
            return []
        if any(a[1] > b[0] for a, b in zip(ranges, ranges[1:], strict=False)):
            ranges = to_ranges(each(ranges))  # (a Reservation built by hand)
        rows = self.d.read("list_items", {"name": name, "ranges": ranges_json(ranges),
                                          "positions": _dumps(list(each(ranges))), "budget": budget})
        return [(int(p), item) for p, item in rows]

    def task(self, name: str, conn: Any = None) -> tuple[str | None, int] | None:
        """(task name, max_attempts) of a list, None if there is none: a cheap read."""
        rows = self._read(conn, "list_task", {"name": name})
        return (rows[0][0], int(rows[0][1])) if rows else None

    def info(self, name: str, conn: Any = None) -> ListInfo | None:
        """The list as committed, or (``conn``) as the caller's transaction sees it."""
        rows = self._read(conn, "list_get", {"name": name})
        return self._info(rows[0], conn) if rows else None

    def all(self, limit: int) -> list[ListInfo]:
        return [self._info(r) for r in self.d.read("list_all", {"limit": limit})]

    def prune(self, retention: float, limit: int = 1000) -> int:
        """Delete up to ``limit`` done rows (kept for their request ids) older than
        ``retention`` s."""
        return self.d.write_count("lists_prune_done", {"retention": retention, "limit": limit})

    # -- the algorithm's parts --------------------------------------------------------------------
    def _lock(self, c: Any, name: str, list_id: int | None = None) -> ListRow:
        """The list named ``name``, its row locked. ``list_id``: a load that made the list
        (or began on it) goes on only while the name still means that list: one dropped and
        made again under its name meanwhile is another list, and would get the rest of the
        load (a load of 300,000 items filled a new list that its maker meant to load
        itself, and sealed it)."""
        rows = self.d.rows(c, "list_lock", {"name": name})
        if not rows:
            raise ListNotFound(f"no list named {name!r}")
        lst = _list_row(rows[0])
        if list_id is not None and lst.id != list_id:
            raise ListNotFound(f"list {name!r} was dropped during this load (a list of that name "
                               "was made again since: it is another list, left as it is)")
        return lst

    def _holder(self, c: Any, name: str, row_id: int, secret: str) -> tuple[Row, ListRow]:
        """The reservation ``row_id`` locked, if it is the caller's: active, its time to run
        not passed (by the database's clock), of list ``name``, with this secret."""
        rows = self.d.rows(c, "list_reservation_lock", {"id": row_id, "name": name})
        if not rows:
            raise StaleReservation(f"reservation {row_id} of list {name!r} is not held: it is "
                                   "finished, or never existed")
        r = rows[0]
        row, lst = _row(r[:14]), _list_row(r[14:])
        if not hmac.compare_digest(row.secret.encode(), secret.encode()):
            raise StaleReservation(f"reservation {row_id} of list {name!r}: wrong token")
        if row.state != "active":
            how = {"free": "given back (released, or timed out and re-offered)",
                   "buried": "buried", "done": "finished"}[row.state]
            raise StaleReservation(f"reservation {row_id} of list {name!r} was {how}")
        if row.expired:
            raise StaleReservation(f"reservation {row_id} of list {name!r} timed out: its "
                                   "positions will be handed out again")
        return row, lst

    @staticmethod
    def _inside(row: Row, positions: Sequence[int]) -> list[int]:
        want = sorted(set(positions))
        for p in want:
            if not contains(row.held, p):
                raise PositionNotReserved(
                    f"position {p} is not held by this reservation (it holds "
                    f"{', '.join(f'{lo}..{hi - 1}' for lo, hi in row.held[:5])}"
                    f"{' ...' if len(row.held) > 5 else ''})")
        return want

    def _unfinished(self, c: Any, lst: ListRow, ranges: Ranges) -> list[int]:
        """The positions of ``ranges`` that are not done, in order (bits read, not locked:
        a position of a row this transaction holds locked changes only through that row)."""
        if not ranges:
            return []
        assert lst.batch_id is not None
        lo_chunk, hi_chunk = ranges[0][0] // CHUNK_BITS, (ranges[-1][1] - 1) // CHUNK_BITS
        bits = {int(ch): self.d.bits(b) for ch, b in self.d.rows(c, "list_bits", {
            "batch_id": lst.batch_id, "group_id": lst.group_id, "lo": lo_chunk, "hi": hi_chunk})}
        out = []
        for p in each(ranges):
            chunk = bits.get(p // CHUNK_BITS)
            bit = p % CHUNK_BITS
            if chunk is None or not chunk[bit >> 3] & (1 << (bit & 7)):
                out.append(p)
        return out

    def _set(self, c: Any, row_id: int, state: str, due_in: float | None, held: Ranges,
             pending: int, attempt: int, error: str | None) -> None:
        self.d.many(c, "list_reservation_set", [{
            "id": row_id, "state": state, "due_in": due_in, "held": ranges_json(held),
            "pending": pending, "attempt": attempt, "error": error}])

    def _finish_row(self, c: Any, row: Row) -> None:
        """A row with nothing left to do: kept as done for its request id, else deleted."""
        if row.request_id is None:
            self.d.many(c, "list_reservation_delete", [{"id": row.id}])
        else:
            self._set(c, row.id, "done", None, (), 0, row.attempt, row.error)

    def _info(self, r: Sequence[Any], conn: Any = None) -> ListInfo:
        (list_id, name, task, state, total, next_position, ttr, max_attempts, batch_id,
         callbacks, created_at, sealed_at, finished_at, undone) = r[:14]
        total, next_position = int(total), int(next_position)
        counts: dict[str, int] = defaultdict(int)
        for st, expired, pending in self._read(conn, "list_reservation_counts", {"id": list_id}):
            counts["ready" if st == "free" or (st == "active" and expired) else st] += int(pending or 0)
        if state == "completed":
            done = total
        elif undone is None:
            done = 0
        else:
            done = total - int(undone)
        reserved, buried = counts["active"], counts["buried"]
        progress = ListProgress(total, total - done - reserved - buried, reserved, done, buried)
        spec = json.loads(callbacks) if isinstance(callbacks, str) else callbacks
        return ListInfo(
            id=int(list_id), name=name, task=task, state=state, progress=progress,
            ttr=float(ttr), max_attempts=int(max_attempts),
            created_at=self.d.time(created_at), sealed_at=self.d.time(sealed_at),  # type: ignore[arg-type]
            finished_at=self.d.time(finished_at),
            on_complete=(spec.get("complete") or {}).get("task"),
            batch_id=None if batch_id is None else int(batch_id),
        )
