"""The effect-ledger operations, written once over every dialect (the ``effect_*``
statements), like batchstore.py.

A claim is "check state, change state" in one transaction: make sure the entry exists,
lock it (waiting at most ``lock_timeout``: Postgres ``lock_timeout``, SQLite's busy wait
for its write lock), read its state, and take it with a new token only when it may be
done now. The effect itself runs after that transaction (unless the caller passed its own
connection); ``effect_done`` marks it done only if the token is still the claim's.

In bulk (``effect_claim_many`` / ``effect_finish_many``) the same rules hold per key, a
chunk at a time: one claim transaction inserts the chunk's missing entries already claimed,
locks the others in key order (the lock order of every bulk statement, so overlapping
chunks wait instead of deadlocking) and takes the claimable ones; one finishing transaction
marks done or releases them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

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
            state, stored, token, expired = self.d.rows(c, "effect_lock", params)[0]
            if stored != policy:
                raise InvalidOption(
                    f"effect {scope}:{key} is {stored}, not {policy}: one effect has one policy "
                    "(an at-most-once entry in doubt must never be redone by an at-least-once caller)")
            if state == "done":
                return "done", None
            if state == "running" and not expired:
                return "running", None
            found = "in_doubt" if state == "running" else ("new" if token == 0 else "pending")
            if found == "in_doubt" and policy == AT_MOST_ONCE:
                return found, None
            return found, int(self.d.rows(c, "effect_take", params)[0][0])

        return self.d.locked_tx(conn, lock_timeout, run)

    def effect_claim_many(self, scope: str, keys: Sequence[str], policy: str, owner: str,
                          lease: float, lock_timeout: float,
                          conn: Any = None) -> list[tuple[str, str, int | None]]:
        """``effect_claim`` for a chunk of distinct keys, in one transaction: (key, what the
        claim found, the new token or None) for every key, in key order. An entry of
        another policy refuses the whole chunk (InvalidOption, nothing claimed)."""
        ordered = sorted(keys)
        params = {"scope": scope, "keys": self.d.array(ordered), "policy": policy, "owner": owner,
                  "lease": lease}

        def run(c: Any) -> list[tuple[str, str, int | None]]:
            # New keys are inserted claimed; the rest are locked, checked and taken.
            tokens = {k: int(t) for k, t in self.d.claim_new_effects(c, params, len(ordered))}
            found = dict.fromkeys(tokens, "new")
            existing = [k for k in ordered if k not in tokens]
            rows = (self.d.rows(c, "effect_lock_many", {**params, "keys": self.d.array(existing)})
                    if existing else [])
            for key, state, stored, token, expired in rows:
                if stored != policy:
                    raise InvalidOption(
                        f"effect {scope}:{key} is {stored}, not {policy}: one effect has one "
                        "policy (an at-most-once entry in doubt must never be redone by an "
                        "at-least-once caller)")
                if state == "running" and not expired:
                    found[key] = "running"
                elif state == "running":
                    found[key] = "in_doubt"
                else:
                    found[key] = "new" if int(token) == 0 else "pending"
            take = [k for k in existing if found.get(k) in ("new", "pending")
                    or (found.get(k) == "in_doubt" and policy == AT_LEAST_ONCE)]
            if take:
                tokens.update((k, int(t)) for k, t in
                              self.d.rows(c, "effect_take_many", {**params, "keys": self.d.array(take)}))
            # A key the lock did not return is done (the lock leaves done entries out).
            return [(k, found.get(k, "done"), tokens.get(k)) for k in ordered]

        return self.d.locked_tx(conn, lock_timeout, run)

    def effect_finish_many(self, scope: str, done: Sequence[tuple[str, int, str | None]],
                           failed: Sequence[tuple[str, int, str]],
                           conn: Any = None) -> tuple[set[str], set[str]]:
        """In one transaction: mark done the ``done`` claims (key, token, result JSON) and
        release the ``failed`` ones (key, token, error), each fenced by its token. Returns
        (keys marked done, keys released); a key in neither was taken over meanwhile."""
        rows = sorted([(k, t, r, None) for k, t, r in done] + [(k, t, None, e) for k, t, e in failed])
        if not rows:
            return set(), set()
        out = self.d.tx(conn, lambda c: self.d.finish_effects(c, scope, rows))
        return ({k for k, state in out if state == "done"},
                {k for k, state in out if state == "pending"})

    def effect_done(self, scope: str, key: str, token: int, result_json: str | None,
                    conn: Any = None) -> bool:
        params = {"scope": scope, "key": key, "token": token, "result": result_json}
        return bool(self.d.tx(conn, lambda c: self.d.rows(c, "effect_done", params)))

    def effect_release(self, scope: str, key: str, token: int, error: str,
                       conn: Any = None) -> bool:
        params = {"scope": scope, "key": key, "token": token, "error": error}
        return bool(self.d.tx(conn, lambda c: self.d.rows(c, "effect_release", params)))

    def effect_resolve(self, scope: str, key: str, state: str, note: str | None,
                       force: bool) -> bool:
        params = {"scope": scope, "key": key, "state": state, "note": note, "force": force}
        return bool(self.d.tx(None, lambda c: self.d.rows(c, "effect_resolve", params)))

    def effect_resolve_many(self, scope: str, keys: Sequence[str], state: str, note: str | None,
                            force: bool) -> list[str]:
        ordered, out = sorted(keys), []
        for at in range(0, len(ordered), RESOLVE_CHUNK):
            params = {"scope": scope, "keys": self.d.array(ordered[at:at + RESOLVE_CHUNK]),
                      "state": state, "note": note, "force": force}

            def run(c: Any, p: dict[str, Any] = params) -> list[Any]:
                return self.d.rows(c, "effect_resolve_many", p)

            out += [str(r[0]) for r in self.d.tx(None, run)]
        return sorted(out)

    def effect_get(self, scope: str, key: str) -> EffectInfo | None:
        rows = self.d.read("effect_get", {"scope": scope, "key": key})
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
