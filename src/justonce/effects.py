"""Effects: do a side effect once per ``(scope, key)`` — an email per user per Push, a
charge per order — even when jobs run twice.

``run(scope, key, fn)`` claims the ledger entry ("check state, change state" under its row
lock, waiting at most ``lock_timeout``), calls ``fn(idempotency_key)`` only when the effect
is not done, and marks it done only after ``fn`` returned. An exception releases the entry
(claimable again). A process that dies inside ``fn`` leaves the entry *in doubt*: under
``at_most_once`` (the default) nobody redoes it — an operator lists it
(``justonce effects in-doubt``) and resolves it; under ``at_least_once`` the next claim after
the lease expired redoes it. Pass the idempotency key (``"scope:key"``) to providers that
accept one, and the effect is exactly once end to end.

With ``conn=`` (your open transaction) the claim, your writes in ``fn`` and the done mark
commit or roll back together: for an effect inside the same database, exactly once.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import validate
from .backends.effectstore import AT_LEAST_ONCE, AT_MOST_ONCE
from .errors import EffectNotFound, InvalidOption, InvalidTransition
from .events import Event, emit
from .models import EffectInfo
from .owner import default_owner
from .types import JSON

if TYPE_CHECKING:
    from .app import App


POLICIES = (AT_MOST_ONCE, AT_LEAST_ONCE)
MAX_SCOPE = 200


@dataclass(frozen=True, slots=True)
class EffectOutcome:
    """What ``run`` did. ``ran``: ``fn`` ran now; ``state`` "done" (and the entry is marked
    done) or "overtaken" (at least once: ``fn`` outlived its lease and another claim redid
    the effect, whose done mark stands). Otherwise ``state`` says why ``fn`` did not run:
    "done" (before), "running" (another holder is at it now), "in_doubt" (a holder died
    mid-effect, at most once: left for an operator)."""

    ran: bool
    state: str
    idempotency_key: str
    result: JSON = None


class EffectClaim:
    """A claim on one entry (from :meth:`Effects.claim`). When ``claimed`` is False the
    effect must not be done (``state`` says why). Otherwise do it, then call :meth:`done`
    (or :meth:`release` when it failed)."""

    def __init__(self, effects: Effects, scope: str, key: str, found: str, token: int | None,
                 conn: Any) -> None:
        self._effects, self.scope, self.key = effects, scope, key
        self.state, self.token, self._conn = found, token, conn
        self.idempotency_key = f"{scope}:{key}"

    @property
    def claimed(self) -> bool:
        return self.token is not None

    def done(self, result: Any = None) -> bool:
        """Mark the effect done (only after it succeeded). False when the claim was
        taken over meanwhile (at-least-once, lease expired): the effect ran twice."""
        token = self._token()
        result_json, _ = validate.result_json(result)
        ok = self._effects.app.backend.effect_done(self.scope, self.key, token, result_json,
                                                   conn=self._conn)
        if not ok:
            emit(Event.EFFECT_OVERTAKEN, "effect done after its claim was taken over",
                 scope=self.scope, key=self.key)
        return ok

    def release(self, error: str = "released") -> bool:
        """Give the entry back (the effect did not happen): claimable again."""
        token = self._token()
        return self._effects.app.backend.effect_release(
            self.scope, self.key, token, validate.error_text(error), conn=self._conn)

    def _token(self) -> int:
        if self.token is None:
            raise InvalidTransition(f"effect {self.idempotency_key} was not claimed ({self.state})")
        return self.token


class Effects:
    """The effect ledger of an :class:`~justonce.App` (``app.effects``)."""

    def __init__(self, app: App) -> None:
        self.app = app

    def claim(self, scope: str, key: Any, *, policy: str = AT_MOST_ONCE,
              lease: float | timedelta = 60.0, lock_timeout: float | timedelta = 5.0,
              conn: Any = None, owner: str | None = None) -> EffectClaim:
        """Claim the entry of (scope, key) if the effect may be done now."""
        scope, key = _scope(scope), _key(key)
        if policy not in POLICIES:
            raise InvalidOption(f"policy must be one of {POLICIES}, not {policy!r}")
        lease_s = validate.bounded(lease, "lease", 0.01, 7 * 86400)
        wait = validate.bounded(lock_timeout, "lock_timeout", 0.001, 3600)
        found, token = self.app.backend.effect_claim(
            scope, key, policy, owner or _owner(), lease_s, wait, conn=conn)
        return EffectClaim(self, scope, key, found, token, conn)

    def run(self, scope: str, key: Any, fn: Callable[[str], Any], *, policy: str = AT_MOST_ONCE,
            lease: float | timedelta = 60.0, lock_timeout: float | timedelta = 5.0,
            conn: Any = None) -> EffectOutcome:
        """Do ``fn(idempotency_key)`` unless the effect of (scope, key) is done or being
        done; mark it done after ``fn`` returns, release it when ``fn`` raises (and
        re-raise). ``lease``: how long ``fn`` may take before the claim is in doubt."""
        if not callable(fn):
            raise InvalidOption("fn must be a callable taking the idempotency key")
        claim = self.claim(scope, key, policy=policy, lease=lease, lock_timeout=lock_timeout,
                           conn=conn)
        if not claim.claimed:
            return EffectOutcome(False, claim.state, claim.idempotency_key)
        try:
            result = fn(claim.idempotency_key)
        except BaseException as exc:
            try:
                claim.release(f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - the lease will put it in doubt instead
                emit(Event.EFFECT_RELEASE_ERROR, "could not release an effect after its failure",
                     exc_info=True)
            raise
        if not claim.done(result):
            # At least once: the lease ran out while fn ran, and another claim redid it.
            return EffectOutcome(True, "overtaken", claim.idempotency_key, result)
        return EffectOutcome(True, "done", claim.idempotency_key, result)

    def get(self, scope: str, key: Any) -> EffectInfo:
        info = self.app.backend.effect_get(_scope(scope), _key(key))
        if info is None:
            raise EffectNotFound(f"no effect {scope}:{key}")
        return info

    def in_doubt(self, scope: str | None = None, limit: int = 1000) -> list[EffectInfo]:
        """Entries whose holder's lease expired mid-effect (oldest first)."""
        return self.app.backend.effects_in_doubt(
            _scope(scope) if scope is not None else None, validate.count(limit, "limit", 100_000))

    def resolve(self, scope: str, key: Any, *, done: bool, note: str | None = None,
                force: bool = False) -> EffectInfo:
        """An operator's verdict on an entry in doubt: ``done=True`` (it happened: never
        redo) or ``done=False`` (it did not: claimable again). ``force`` also resolves an
        entry whose lease has not expired yet."""
        scope, key = _scope(scope), _key(key)
        if note is not None:
            note = validate.text(note, "note", 4000)
        ok = self.app.backend.effect_resolve(scope, key, "done" if done else "pending", note, bool(force))
        if not ok:
            info = self.get(scope, key)
            raise InvalidTransition(
                f"effect {scope}:{key} is {info.state}: only entries in doubt can be resolved"
                + (" (or pass force=True for a running one)" if info.state == "running" else ""))
        return self.get(scope, key)

    def list(self, scope: str, state: str | None = None, limit: int = 1000) -> builtins.list[EffectInfo]:
        """The entries of a scope (``state``: pending, running or done), by key."""
        if state not in (None, "pending", "running", "done"):
            raise InvalidOption(f"state must be pending, running or done, not {state!r}")
        return self.app.backend.effects_list(_scope(scope), state, validate.count(limit, "limit", 10_000_000))

    def counts(self, scope: str) -> dict[str, int]:
        """How many entries of a scope are pending, running, in doubt and done."""
        return self.app.backend.effects_count(_scope(scope))

    def lock_row(self, conn: Any, table: str, column: str, value: Any, *,
                 timeout: float | timedelta = 5.0) -> bool:
        """Lock your own row ``table.column = value`` in your open transaction on ``conn``
        (``SELECT … FOR UPDATE`` with ``lock_timeout`` on Postgres; SQLite's write lock,
        waited for at most ``timeout``). Raises :class:`LockTimeout` when it stays locked;
        returns False when there is no such row. The lock lasts until you commit."""
        return self.app.backend.row_lock(
            conn, validate.sql_identifier(table), validate.sql_identifier(column), value,
            validate.bounded(timeout, "timeout", 0.001, 3600))


def _scope(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_SCOPE:
        raise InvalidOption(f"scope must be a non-empty string of at most {MAX_SCOPE}, not {value!r}")
    return validate.text(value, "scope", MAX_SCOPE)


def _key(value: Any) -> str:
    key = validate.optional_key(value, "effect key") if value is not None else None
    if key is None:
        raise InvalidOption("an effect key is a non-empty string or an int, not None")
    return key


def _owner() -> str:
    return default_owner()
