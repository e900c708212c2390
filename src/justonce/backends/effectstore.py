"""The effect-ledger operations, written once over every dialect (the ``effect_*``
statements), like batchstore.py.

A claim is "check state, change state" in one transaction: make sure the entry exists,
lock it (waiting at most ``lock_timeout``: Postgres ``lock_timeout``, SQLite's busy wait
for its write lock), read its state, and take it with a new token only when it may be
done now. The effect itself runs after that transaction (unless the caller passed its own
connection); ``effect_done`` marks it done only if the token is still the claim's.

In bulk (``effect_claim_many`` / ``effect_finish_many``) the same rules hold per key, a
chunk at a time: one claim transaction makes the chunk's row (``justonce_effect_chunks``:
its lease, later its done mark and result), inserts the chunk's missing entries already
claimed by it, locks the others in key order (the lock order of every bulk statement, so
overlapping chunks wait instead of deadlocking) and takes the claimable ones; one finishing
transaction releases the failed ones and marks the chunk done.

An entry a chunk holds (``chunk_id``) keeps state 'running' and no lease of its own: its
state is the chunk's — done once the chunk is, else running until the chunk's lease, then
in doubt. Every other change of an entry (a failure released, an operator's verdict, a
single claim, a result of its own) is written on the entry and takes it out of the chunk,
so a chunk's finisher marks done exactly the entries still pointing at it; the others were
taken over. Locks are taken entries first (in key order), then chunks: a claim that takes
an entry in doubt from a chunk, or an operator's verdict on one, share-locks the chunk, so
that its finisher (which locks the chunk's row to mark it) either comes first, and the
entry is done, or after, and finds it gone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from .. import failpoints
from ..errors import InvalidOption
from ..models import EffectInfo
from .dialect import Dialect

T = TypeVar("T")
AT_MOST_ONCE = "at_most_once"
AT_LEAST_ONCE = "at_least_once"
RESOLVE_CHUNK = 5000


class EffectOps:
    """The Backend protocol's ``effect_*`` operations over a dialect."""

    def __init__(self, d: Dialect) -> None:
        self.d = d

    def effect_claim(self, scope: str, key: str, policy: str, owner: str, lease: float,
                     lock_timeout: float, conn: Any = None) -> tuple[str, int | None]:
        """(what the claim found, the new token or None). Found: "new" (claimed),
        "pending" (claimed: released by an earlier failure), "done", "running" (another
        holder's lease is live), "in_doubt" (a holder's lease expired mid-effect; claimed
        again only under at-least-once, when the answer is "in_doubt" with a token)."""
        params = {"scope": scope, "key": key, "policy": policy, "owner": owner, "lease": lease}

        def run(c: Any) -> tuple[str, int | None]:
            self.d.many(c, "effect_ensure", [params])
            row = self.d.rows(c, "effect_lock", params)[0]
            stored = row[1]
            if stored != policy:
                raise InvalidOption(
                    f"effect {scope}:{key} is {stored}, not {policy}: one effect has one policy "
                    "(an at-most-once entry in doubt must never be redone by an at-least-once caller)")
            found = self._found(row, self._chunks(c, _holders([row]), policy == AT_LEAST_ONCE))
            if found in ("done", "running") or (found == "in_doubt" and policy == AT_MOST_ONCE):
                return found, None
            return found, int(self.d.rows(c, "effect_take", params)[0][0])

        return self.d.locked_tx(conn, lock_timeout, run)

    def _chunks(self, c: Any, ids: set[int], share: bool) -> dict[int, tuple[str, bool]]:
        """(state, lease expired) of the chunks ``ids`` that hold entries this transaction
        has locked, read by a statement of its own after the lock (one that began before
        the lock's wait would not see a chunk committed during it, and would take the
        entry for one whose chunk is gone). ``share``: share-locked, where an entry in
        doubt may be taken from its chunk (an at-least-once claim, an operator's verdict):
        the chunk's finisher must then come after (and find the entry gone) or before (and
        the entry is done)."""
        if not ids:
            return {}
        name = "effect_chunks_share" if share else "effect_chunks_read"
        return {int(i): (str(state), bool(expired)) for i, state, expired in
                self.d.rows(c, name, {"ids": self.d.array(sorted(ids))})}

    @staticmethod
    def _found(row: Sequence[Any], chunks: dict[int, tuple[str, bool]]) -> str:
        """What a claim finds in an entry it has locked: ``row`` is (state, policy, token,
        expired, chunk_id), ``chunks`` the states of the chunks (see _chunks). An entry
        that a chunk holds has the chunk's state; one whose chunk's row is gone is in doubt
        (nobody can mark it done any more)."""
        state, _, token, expired, chunk = row[:5]
        if chunk is not None and state == "running":
            chunk_state, chunk_expired = chunks.get(int(chunk), ("running", True))
            if chunk_state == "done":
                return "done"
            return "in_doubt" if chunk_expired else "running"
        if state == "done":
            return "done"
        if state == "running":
            return "in_doubt" if expired else "running"
        return "new" if int(token) == 0 else "pending"

    def effect_claim_many(self, scope: str, keys: Sequence[str], policy: str, owner: str,
                          lease: float, lock_timeout: float,
                          conn: Any = None) -> tuple[int, list[tuple[str, str, int | None]]]:
        """``effect_claim`` for a chunk of distinct keys, in one transaction: the chunk's id
        (for :meth:`effect_finish_many`) and (key, what the claim found, the new token or
        None) for every key, in key order. The keys claimed are held by the chunk, whose
        lease they share. An entry of another policy refuses the whole chunk
        (InvalidOption, nothing claimed)."""
        ordered = sorted(keys)

        def run(c: Any) -> tuple[int, list[tuple[str, str, int | None]]]:
            chunk = int(self.d.rows(c, "effect_chunk_open", {"scope": scope, "lease": lease})[0][0])
            params = {"scope": scope, "keys": self.d.array(ordered), "policy": policy,
                      "owner": owner, "chunk": chunk}
            # New keys are inserted claimed; the rest are locked, checked and taken.
            tokens = {k: int(t) for k, t in self.d.claim_new_effects(c, params, len(ordered))}
            found = dict.fromkeys(tokens, "new")
            existing = [k for k in ordered if k not in tokens]
            rows = (self.d.rows(c, "effect_lock_many", {**params, "keys": self.d.array(existing)})
                    if existing else [])
            for key, _, stored, *_ in rows:
                if stored != policy:
                    raise InvalidOption(
                        f"effect {scope}:{key} is {stored}, not {policy}: one effect has one "
                        "policy (an at-most-once entry in doubt must never be redone by an "
                        "at-least-once caller)")
            chunks = self._chunks(c, _holders(r[1:] for r in rows), policy == AT_LEAST_ONCE)
            for key, *row in rows:
                found[key] = self._found(row, chunks)
            take = [k for k in existing if found.get(k) in ("new", "pending")
                    or (found.get(k) == "in_doubt" and policy == AT_LEAST_ONCE)]
            if take:
                tokens.update((k, int(t)) for k, t in
                              self.d.rows(c, "effect_take_many", {**params, "keys": self.d.array(take)}))
            if not tokens:
                self.d.rows(c, "effect_chunk_drop", {"chunk": chunk})
                self.d.wrote_nothing(c)
            # A key the lock did not return is done (the lock leaves done entries out).
            return chunk, [(k, found.get(k, "done"), tokens.get(k)) for k in ordered]

        return self.d.locked_tx(conn, lock_timeout, run)

    def effect_finish_many(self, scope: str, chunk: int, done: Sequence[tuple[str, int, str | None]],
                           failed: Sequence[tuple[str, int, str]],
                           conn: Any = None, left: int = 0,
                           again: bool = False) -> tuple[set[str], set[str]]:
        """In one transaction: mark done the ``done`` claims (key, token, result JSON) of
        chunk ``chunk`` and release the ``failed`` ones (key, token, error), each fenced by
        its token and the chunk. Returns (keys marked done, keys released); a key in
        neither was taken over meanwhile (an at-least-once claim after the lease, or an
        operator's verdict).

        When every done key returned the same result, the chunk's own row is marked done
        (one row, whatever the chunk's size) and its entries follow it; the failed ones are
        released first, each on its own entry. Otherwise each entry is marked by itself.
        Rows are locked entries first, then the chunk, as every claim does.

        Every key the chunk claimed must come back once, in ``done`` or in ``failed``
        (run_many's chunks do): a key left out would be marked done by the chunk's row
        with the others. The finish refuses (AssertionError) a key given twice, and a
        chunk that still holds more entries than the done mark is for; it cannot tell a
        key left out while another was taken over meanwhile (the count matches), which
        is why the contract is the caller's.

        ``left``: how many claimed keys are in neither (their function raised
        EffectInDoubt): the done keys are then marked on their own entries and the chunk's
        row is not marked at all, so it keeps holding those keys until its lease runs out,
        and they are in doubt from then on, as if the process had died there.

        ``again``: this is a retry after a try that failed with its outcome unknown (the
        connection was lost, maybe after the COMMIT landed). The marks are fenced, so the
        retry writes nothing the first try wrote; but a first try that committed has taken
        every entry out of the chunk (or marked the chunk done), and the retry's own marks
        find nothing. So a key the retry did not mark is read back: done (through the
        chunk or by itself) with the claim's token is marked by this finish (nothing else
        marks an entry done without a new token but an operator's verdict on it once in
        doubt, which says the same: it happened), pending with it is released. Only retries
        read: the first try costs what it did."""
        if not done and not failed:
            return set(), set()  # (nothing to mark: a chunk of keys left in doubt stays as it is)
        if len({k for k, _, _ in done} | {k for k, _, _ in failed}) != len(done) + len(failed):
            raise AssertionError(f"chunk {chunk}: a key finished twice")
        # The done claims the chunk's row marks together (all of them, when they share one
        # result); the rest are marked on their own entries.
        together = done if not left and len({r for _, _, r in done}) <= 1 else []
        each = [(k, t, r, None) for k, t, r in done if not together] + [(k, t, None, e) for k, t, e in failed]
        marked, released = self.d.tx(conn, lambda c: self._finish(c, scope, chunk, sorted(each),
                                                                  together, close=not left))
        if again:
            marked |= self._already(scope, [(k, t) for k, t, _ in done if k not in marked],
                                    "done", conn)
            released |= self._already(scope, [(k, t) for k, t, _ in failed if k not in released],
                                      "pending", conn)
        return marked, released

    def _already(self, scope: str, claims: Sequence[tuple[str, int]], state: str,
                 conn: Any) -> set[str]:
        """The keys of ``claims`` (key, token) whose entry is ``state`` with the claim's
        token: a retried finish's first try committed these (see effect_finish_many)."""
        out = set()
        for key, token in claims:
            info = self.effect_get(scope, key, conn)
            if info is not None and info.token == token and info.state == state:
                out.add(key)
        return out

    def _finish(self, c: Any, scope: str, chunk: int,
                rows: Sequence[tuple[str, int, str | None, str | None]],
                together: Sequence[tuple[str, int, str | None]],
                close: bool = True) -> tuple[set[str], set[str]]:
        out = []
        for piece in _pieces(rows, self.d.statement_bytes):
            out += self.d.finish_effects(c, scope, chunk, piece)
        if failpoints.ACTIVE:
            failpoints.hit("effect.in_finish")  # (inside the finish's transaction, uncommitted)
        marked = {k for k, state in out if state == "done"}
        released = {k for k, state in out if state == "pending"}
        if not close:  # (keys left in doubt: the chunk holds them until its lease runs out)
            return marked, released
        result = together[0][2] if together else None
        closed = self.d.rows(c, "effect_chunk_done", {"chunk": chunk, "scope": scope, "result": result})
        if closed:
            # The chunk holds a subset of the keys it claimed: entries join a chunk only in
            # its claim, and every change of one entry since (a release or a mark above, a
            # take-over, a verdict) takes it out. Those marked on their own entries left
            # above, so if it holds as many entries as the done mark is for (none, when
            # each was marked by itself), it holds exactly those, with the claim's tokens:
            # a count says so without reading 500 keys back (on MariaDB, PyMySQL's parse
            # of them was 5 us a key of the worker's time). Otherwise the keys say which.
            args = {"chunk": chunk, "scope": scope}
            if int(self.d.rows(c, "effect_chunk_held", args)[0][0]) == len(together):
                marked |= {k for k, _, _ in together}
                return marked, released
            held = {(str(k), int(t)) for k, t in self.d.rows(c, "effect_chunk_keys", args)}
            wanted = {(k, int(t)) for k, t, _ in together}
            if held - wanted:
                # Every claimed key of a chunk ends done or failed: one that is neither (or
                # a token that is not the claim's) would be marked done by the chunk
                # without its effect confirmed. (Rolled back: the chunk goes in doubt.)
                raise AssertionError(f"chunk {chunk} holds keys that were not finished: "
                                     f"{sorted(held - wanted)[:5]}")
            marked |= {k for k, _ in held}
        return marked, released

    def effect_done(self, scope: str, key: str, token: int, result_json: str | None,
                    conn: Any = None, again: bool = False) -> bool:
        params = {"scope": scope, "key": key, "token": token, "result": result_json}
        if bool(self.d.tx(conn, lambda c: self.d.rows(c, "effect_done", params))):
            return True
        # (a retry whose first try committed finds the entry done with its own token)
        return again and bool(self._already(scope, [(key, token)], "done", conn))

    def effect_release(self, scope: str, key: str, token: int, error: str,
                       conn: Any = None) -> bool:
        params = {"scope": scope, "key": key, "token": token, "error": error}
        return bool(self.d.tx(conn, lambda c: self.d.rows(c, "effect_release", params)))

    def effect_resolve(self, scope: str, key: str, state: str, note: str | None,
                       force: bool, conn: Any = None, lock_timeout: float = 5.0) -> bool:
        return bool(self.effect_resolve_many(scope, [key], state, note, force, conn, lock_timeout))

    def effect_resolve_many(self, scope: str, keys: Sequence[str], state: str, note: str | None,
                            force: bool, conn: Any = None, lock_timeout: float = 5.0) -> list[str]:
        """Per transaction of up to RESOLVE_CHUNK keys: the running entries locked in key
        order, the chunks that hold some of them share-locked (so that a chunk's finisher
        cannot mark an entry done while it is resolved: it finds it taken), then those in
        doubt (or, with ``force``, running) given the verdict, on the entry itself. Lock
        waits are bounded as a claim's are: a holder frozen inside its chunk's finish keeps
        the chunk locked, and an operator's verdict waited for it with no limit."""
        ordered, out = sorted(keys), []
        for at in range(0, len(ordered), RESOLVE_CHUNK):
            part = ordered[at:at + RESOLVE_CHUNK]

            def run(c: Any, part: list[str] = part) -> list[str]:
                rows = self.d.rows(c, "effect_resolve_lock", {"scope": scope, "keys": self.d.array(part)})
                live = self._chunks(c, {int(r[2]) for r in rows if r[2] is not None}, share=True)
                # Each running entry read as a claim reads it (through its chunk, if one
                # holds it): in doubt is resolvable, running only with force, done never.
                found = {str(key): self._found(("running", None, None, expired, chunk), live)
                         for key, expired, chunk in rows}
                pick = [k for k, f in found.items() if f == "in_doubt" or (force and f == "running")]
                if not pick:
                    return []
                params = {"scope": scope, "keys": self.d.array(pick), "state": state, "note": note}
                return [str(r[0]) for r in self.d.rows(c, "effect_resolve_set", params)]

            out += self.d.locked_tx(conn, lock_timeout, run)
        return sorted(out)

    def effect_get(self, scope: str, key: str, conn: Any = None) -> EffectInfo | None:
        params = {"scope": scope, "key": key}
        rows = (self.d.read("effect_get", params) if conn is None
                else self.d.on(conn, lambda c: self.d.rows(c, "effect_get", params)))
        return self._effect(rows[0]) if rows else None

    def effects_in_doubt(self, scope: str | None, limit: int) -> list[EffectInfo]:
        return [self._effect(r) for r in self.d.read("effects_in_doubt", {"scope": scope, "limit": limit})]

    def effects_list(self, scope: str, state: str | None, limit: int,
                     after: str | None = None) -> list[EffectInfo]:
        params = {"scope": scope, "state": state, "limit": limit, "after": after}
        return [self._effect(r) for r in self.d.read("effects_list", params)]

    def effects_count(self, scope: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for state, in_doubt, count in self.d.read("effects_count", {"scope": scope}):
            name = "in_doubt" if in_doubt else state
            out[name] = out.get(name, 0) + int(count)
        return out

    def _effect(self, r: Any) -> EffectInfo:
        result = self.d.json(r[9])
        return EffectInfo(
            scope=r[0], key=r[1], state="in_doubt" if r[13] else r[2], policy=r[3],
            token=int(r[4]), owner=r[5], attempts=int(r[6]),
            lease_expires_at=self.d.time(r[7]), last_error=r[8], result=result,
            created_at=self.d.time(r[10]), updated_at=self.d.time(r[11]),  # type: ignore[arg-type]
            done_at=self.d.time(r[12]),
        )


def _holders(rows: Iterable[Sequence[Any]]) -> set[int]:
    """The chunks that hold the running entries among locked ``rows`` (state, policy, token,
    expired, chunk_id)."""
    return {int(r[4]) for r in rows if r[4] is not None and r[0] == "running"}


def _pieces(rows: Sequence[tuple[str, int, str | None, str | None]],
            budget: int) -> Iterator[Sequence[tuple[str, int, str | None, str | None]]]:
    """``rows`` (a chunk's done marks, in key order) cut so that each piece, sent as one
    JSON list, stays well under ``budget`` bytes: results of up to 64 KiB each made 500
    of them ~40 MB as JSON, past MySQL's max_allowed_packet (the chunk's finish failed
    after every fn had run). A piece of the usual chunk (short keys, no result) is all of
    it, found without serialising anything."""
    if not rows:
        return
    rough = sum(len(k) + len(r or "") + len(e or "") + 24 for k, _, r, e in rows)
    if 12 * rough < budget // 2:
        yield rows
        return
    at, size, limit = 0, 0, budget // 4  # (JSON escaping, then the driver's, may each double)
    for i, row in enumerate(rows):
        n = len(json.dumps(row))
        if size and size + n > limit:
            yield rows[at:i]
            at, size = i, 0
        size += n
    yield rows[at:]
