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

``run_many(scope, keys, fn)`` does the same for many keys, a chunk at a time: one
transaction claims a chunk, ``fn`` runs for each claimed key, one transaction marks them
done (or releases those whose ``fn`` raised). Two transactions per chunk instead of two per
key; a crash leaves in doubt only the unfinished keys of the chunk it was in. The claimed
entries are held by the chunk (one row of its own, with the chunk's lease): when they all
returned the same result, the done mark is written once, on the chunk's row.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from . import failpoints, validate
from .backends.effectstore import AT_LEAST_ONCE, AT_MOST_ONCE
from .errors import (
    DatabaseUnavailable,
    EffectInDoubt,
    EffectNotFound,
    InvalidOption,
    InvalidTransition,
)
from .events import Event, emit
from .models import EffectInfo
from .owner import default_owner
from .types import JSON

if TYPE_CHECKING:
    from .app import App


POLICIES = (AT_MOST_ONCE, AT_LEAST_ONCE)
MAX_SCOPE = 200
MAX_CHUNK = 10_000
"""The largest chunk of ``run_many``: one claim statement's key list."""
MAX_CHUNK_KEY_TEXT = 2 * 1024 * 1024
"""At most this much JSON text of keys in one chunk (a claim sends its keys as one list):
512-character keys of emoji are ~6 KB each as JSON, and 2,500 of them passed MySQL's
max_allowed_packet. Keys of digits never reach it before ``MAX_CHUNK``."""
LATE_ROUNDS = 3
"""How many times a claim whose lease ran out before ``fn`` could start is claimed anew."""
LATE_NOTE = "given back unstarted: the claim's lease had (nearly) run out before fn could start"
FINISH_TRIES = 5
"""How many times a done mark (a chunk's finish, a claim's ``done``) is tried when the
database is away, while the claim's lease lasts."""
FINISH_WAIT = 0.05
"""The first wait between two tries of a done mark, doubled after each."""
T = TypeVar("T")


def _finishing(write: Callable[[bool], T], deadline: float | None, scope: str, keys: int) -> T:
    """``write(again)``: a done mark, tried again when it fails with the database away
    (DatabaseUnavailable: a killed connection, a restart, a network blip; or a failpoint's
    ``raise``, which stands for one), at most FINISH_TRIES times and only while the
    claim's lease lasts (``deadline``, by the process's clock; None: no retry, as in the
    caller's transaction, which is gone with its connection). The fn of every key has
    returned by then: without a retry, one lost reply put the whole chunk in doubt. Marks
    are fenced by token and chunk, so a try may be repeated; ``again`` tells the write
    that an earlier try may have committed (its reply lost). Another error (a refused
    key, a bug) is not retried."""
    wait = FINISH_WAIT
    for attempt in range(FINISH_TRIES):
        try:
            return write(attempt > 0)
        except (DatabaseUnavailable, failpoints.FailpointError):
            if (deadline is None or attempt + 1 >= FINISH_TRIES
                    or time.monotonic() + wait >= deadline):
                raise
            emit(Event.EFFECT_FINISH_RETRY, "marking effects done failed; trying again",
                 scope=scope, keys=keys, attempt=attempt + 1, exc_info=True)
        time.sleep(wait)
        wait *= 2
    raise AssertionError("unreachable")  # (the last try returns or raises)


def _key_text(key: str) -> int:
    """An upper bound of the key's length as a JSON string (with its comma)."""
    return len(key) + 3 if key.isascii() and key.isalnum() else 12 * len(key) + 3


def _cut(keys: builtins.list[str], size: int) -> Iterator[builtins.list[str]]:
    """``keys`` in chunks of at most ``size`` keys and ``MAX_CHUNK_KEY_TEXT`` of JSON."""
    at = 0
    while at < len(keys):
        end, text = at, 0
        while end < len(keys) and end - at < size:
            text += _key_text(keys[end])
            if text > MAX_CHUNK_KEY_TEXT and end > at:
                break
            end += 1
        yield keys[at:end]
        at = end


def _margin(lease: float) -> float:
    """What is left of a lease when ``fn`` may no longer start: as the worker's jobs, a
    fifth of the lease, at most 2 s (``fn`` itself must also fit in what remains)."""
    return min(lease / 5, 2.0)


@dataclass(frozen=True, slots=True)
class EffectOutcome:
    """What ``run`` did. ``ran``: ``fn`` ran now; ``state`` "done" (and the entry is marked
    done) or "overtaken" (at least once: ``fn`` outlived its lease and another claim redid
    the effect, whose done mark stands). Otherwise ``state`` says why ``fn`` did not run:
    "done" (before), "running" (another holder is at it now), "in_doubt" (a holder died
    mid-effect, at most once: left for an operator) or "late" (claimed, but the claim's
    lease had (nearly) run out before ``fn`` could start, three times in a row: given back
    unstarted, claimable again)."""

    ran: bool
    state: str
    idempotency_key: str
    result: JSON = None


@dataclass(frozen=True, slots=True)
class EffectsOutcome:
    """What ``run_many`` did, in numbers. Every distinct key is counted once: ``done``
    (``fn`` ran now and the entry is marked done), ``skipped`` (``fn`` did not run, by
    reason: "done" before, "running" under another holder's live claim, "in_doubt" under
    at most once), ``failed`` (``fn`` raised: the entry is released, claimable again; key →
    error) or ``overtaken`` (at least once: ``fn`` returned after its lease ran out and
    another claim redid the effect: it ran twice). ``redone`` counts the ``done`` keys
    that were in doubt (at least once). ``held`` names the keys skipped as "running":
    another claim had them, and ends done or (if its holder dies) in doubt, so a caller
    that must see every key settled looks at these again later. ``late`` names the keys
    whose ``fn`` never started because their claims' lease had (nearly) run out first,
    again after being claimed anew (the process paused, or ``fn`` slower than the lease
    allows): given back unstarted, claimable again. ``str()`` is a one-line report."""

    scope: str
    keys: int
    """Distinct keys asked for."""
    chunks: int
    """Chunks claimed: one claim and one finishing transaction each."""
    done: int
    redone: int
    skipped: Mapping[str, int]
    failed: Mapping[str, str]
    overtaken: tuple[str, ...]
    seconds: float
    held: tuple[str, ...] = ()
    late: tuple[str, ...] = ()
    left_in_doubt: tuple[str, ...] = ()
    """Keys whose ``fn`` raised EffectInDoubt (it may have happened): left claimed, in doubt
    once the chunk's lease runs out."""

    @property
    def ran(self) -> int:
        """How many times ``fn`` was called."""
        return self.done + len(self.failed) + len(self.overtaken) + len(self.left_in_doubt)

    @property
    def per_second(self) -> float:
        """``fn`` calls per second of the whole call (claims and marks included)."""
        return self.ran / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()) if n) or "none"
        # "(0 redone)" read, after an operator's redo, as if nothing had been sent again:
        # redone counts only entries found in doubt and redone at least once.
        return (f"{self.scope}: {self.keys} keys in {self.chunks} chunks, {self.done} done"
                + (f" ({self.redone} of them in doubt, redone)" if self.redone else "")
                + f", skipped {skipped}, {len(self.failed)} failed, "
                f"{len(self.overtaken)} overtaken, "
                + (f"{len(self.late)} late, " if self.late else "")
                + (f"{len(self.left_in_doubt)} left in doubt, " if self.left_in_doubt else "")
                + f"{self.seconds:.2f}s "
                f"({self.per_second:.0f} effects/s)")


@dataclass
class _Tally:
    done: int = 0
    redone: int = 0
    chunks: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: dict[str, str] = field(default_factory=dict)
    overtaken: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    left_in_doubt: list[str] = field(default_factory=list)


class _NotRun(InvalidOption):
    """fn handed back a coroutine or generator (see ``_not_run``)."""


class EffectClaim:
    """A claim on one entry (from :meth:`Effects.claim`). When ``claimed`` is False the
    effect must not be done (``state`` says why). Otherwise do it, then call :meth:`done`
    (or :meth:`release` when it failed)."""

    def __init__(self, effects: Effects, scope: str, key: str, found: str, token: int | None,
                 conn: Any, deadline: float | None = None) -> None:
        # Built by claim; checked all the same, as its fields go to SQL when it is done.
        scope, key = _scope(scope), _key(key)
        if token is not None:
            validate.int64(token, "token")
        self._effects, self.scope, self.key = effects, scope, key
        self.state, self.token, self._conn = found, token, conn
        self.idempotency_key = f"{scope}:{key}"
        # (the lease's end by this process's clock: a done mark lost with the connection is
        # tried again until then; None in the caller's transaction, which goes with it)
        self._deadline = deadline if conn is None else None

    @property
    def claimed(self) -> bool:
        return self.token is not None

    def done(self, result: Any = None) -> bool:
        """Mark the effect done (only after it succeeded). False when the claim was
        taken over meanwhile (at-least-once, lease expired): the effect ran twice."""
        token = self._token()
        result_json, _ = validate.result_json(result)
        backend = self._effects.app.backend

        def mark(again: bool) -> bool:
            ok = backend.effect_done(self.scope, self.key, token, result_json, conn=self._conn,
                                     again=again)
            if failpoints.ACTIVE:
                failpoints.hit("effect.after_finish")
            return ok

        ok = _finishing(mark, self._deadline, self.scope, 1)
        if not ok:
            emit(Event.EFFECT_OVERTAKEN, "effect done after its claim was taken over",
                 scope=self.scope, key=self.key)
        return ok

    def release(self, error: str = "released") -> bool:
        """Give the entry back (the effect did not happen): claimable again."""
        token = self._token()
        if not isinstance(error, str):
            raise InvalidOption(f"error must be a string, not {validate.shown(error)}")
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
        _policy(policy)
        lease_s = validate.bounded(lease, "lease", 0.01, 7 * 86400)
        wait = validate.bounded(lock_timeout, "lock_timeout", 0.001, 3600)
        who = _owner() if owner is None else validate.owner(owner)
        failpoints.hit("effect.before_claim")
        sent = time.monotonic()
        found, token = self.app.backend.effect_claim(
            scope, key, policy, who, lease_s, wait, conn=conn)
        return EffectClaim(self, scope, key, found, token, conn, sent + lease_s)

    def run(self, scope: str, key: Any, fn: Callable[[str], Any], *, policy: str = AT_MOST_ONCE,
            lease: float | timedelta = 60.0, lock_timeout: float | timedelta = 5.0,
            conn: Any = None) -> EffectOutcome:
        """Do ``fn(idempotency_key)`` unless the effect of (scope, key) is done or being
        done; mark it done after ``fn`` returns, release it when ``fn`` raises (and
        re-raise). ``lease``: how long ``fn`` may take before the claim is in doubt."""
        _check_fn(fn)
        lease_s = validate.bounded(lease, "lease", 0.01, 7 * 86400)
        for _ in range(LATE_ROUNDS):
            started = time.monotonic()
            claim = self.claim(scope, key, policy=policy, lease=lease, lock_timeout=lock_timeout,
                               conn=conn)
            if not claim.claimed:
                return EffectOutcome(False, claim.state, claim.idempotency_key)
            # fn starts only while the claim's lease (counted from before the claim was
            # sent, so never later than the database's) has more than a margin left: a
            # process paused past it finds its entry in doubt, maybe resolved and redone.
            # (In your open transaction nobody else sees the claim until you commit.)
            if (self._uncommitted(conn)
                    or time.monotonic() < started + lease_s - _margin(lease_s)):
                break
            emit(Event.EFFECT_LATE, "an effect's claim ran out before fn started: given back",
                 scope=claim.scope, keys=1)
            self._give_back(claim)
        else:
            return EffectOutcome(False, "late", claim.idempotency_key)
        try:
            call = functools.partial(_call, fn, claim.idempotency_key)
            # (with conn=, a failing fn's writes leave your transaction with it)
            result = call() if conn is None else self.app.backend.callers_savepoint(conn, call)
        except EffectInDoubt:
            # (left claimed: in doubt once its lease runs out, as if the process had died here)
            emit(Event.EFFECT_LEFT_IN_DOUBT, "an effect whose outcome is unknown was left in doubt",
                 scope=claim.scope, keys=1)
            raise
        except BaseException as exc:
            try:
                claim.release(validate.exception_text(exc))
            except Exception:  # noqa: BLE001 - the lease will put it in doubt instead
                emit(Event.EFFECT_RELEASE_ERROR, "could not release an effect after its failure",
                     exc_info=True)
            raise
        failpoints.hit("effect.after_fn")
        if not claim.done(result):
            # At least once: the lease ran out while fn ran, and another claim redid it.
            return EffectOutcome(True, "overtaken", claim.idempotency_key, result)
        return EffectOutcome(True, "done", claim.idempotency_key, result)

    def _uncommitted(self, conn: Any) -> bool:
        """Whether the claim just made on ``conn`` waits for the caller's commit (nobody
        sees it meanwhile, so its lease cannot run out under ``fn``). On a connection in
        autocommit mode it committed at once, as the App's own claims do, and the lease
        counts from then: the same deadline as without ``conn``."""
        return conn is not None and self.app.backend.caller_in_transaction(conn)

    @staticmethod
    def _give_back(claim: EffectClaim) -> None:
        try:
            claim.release(LATE_NOTE)  # (refused if the entry moved on: it is not ours)
        except Exception:  # noqa: BLE001 - its lease puts it in doubt instead
            emit(Event.EFFECT_RELEASE_ERROR, "could not give back a late effect claim",
                 exc_info=True)

    def run_many(self, scope: str, keys: Iterable[Any], fn: Callable[[str], Any], *,
                 policy: str = AT_MOST_ONCE, lease: float | timedelta = 60.0,
                 lock_timeout: float | timedelta = 5.0, chunk: int = 500,
                 conn: Any = None) -> EffectsOutcome:
        """``run`` for many keys of one scope, with the same promises, a chunk at a time.

        ``keys``: any iterable of keys as ``run`` takes them (not a string); all are
        checked before anything is written, and duplicates (``42`` and ``"42"`` too)
        collapse. They are cut into chunks of ``chunk`` keys (and at most
        ``MAX_CHUNK_KEY_TEXT`` of keys as JSON) in the order given; per
        chunk, ONE transaction makes the missing entries, locks the chunk's entries in key
        order (waiting at most ``lock_timeout``, LockTimeout past it) and claims those that
        may be done now, by ``run``'s rules; then ``fn(idempotency_key)`` runs for each
        claimed key, in key order; then ONE transaction marks done every key whose ``fn``
        returned (its result stored, as ``run`` does; fenced by the key's token: a claim
        taken over meanwhile is counted ``overtaken``) and releases those whose ``fn``
        raised (the error kept). ``lease`` covers the whole chunk: all its ``fn`` calls
        together must end within it, or (at least once) another caller may redo them.
        No ``fn`` starts once the chunk's lease has less than a fifth of itself (at most
        2 s) left by this process's clock: the keys not started are given back in the
        chunk's done transaction and claimed again as a chunk of their own, with a fresh
        lease (a chunk slower than its lease goes on in smaller chunks; a process paused
        past its lease starts nothing of the chunk it held when it wakes). Keys late
        three claims in a row are left claimable and named in ``late``.
        The chunk's entries point at a row of the chunk's own, which holds its lease;
        when every ``fn`` of the chunk returned the same result (None, say), the done
        mark is that one row, however big the chunk (else each entry is marked by
        itself). Every read of an entry (``get``, ``list``, ``counts``, ``in_doubt``,
        a claim) sees it through its chunk.

        An exception from ``fn`` is recorded for its key and the run goes on. A
        BaseException that is not an Exception (KeyboardInterrupt, SystemExit) marks done
        what returned, releases the rest of the chunk and is re-raised. A process that dies
        leaves in doubt exactly the claimed, unmarked keys of its current chunk: chunks
        before it are done, chunks after it untouched. LockTimeout, an entry of another
        policy (InvalidOption) or a database error also stop the run, with the chunks
        before it done (call again: they are skipped).

        With ``conn=`` (your open transaction) the whole call is one chunk in that
        transaction: claims, your writes in ``fn`` and the done marks commit or roll back
        together. (On a connection in autocommit mode the claims commit at once: the
        lease's deadline holds as without ``conn``.)"""
        scope = _scope(scope)
        _check_fn(fn)
        _policy(policy)
        lease_s = validate.bounded(lease, "lease", 0.01, 7 * 86400)
        wait = validate.bounded(lock_timeout, "lock_timeout", 0.001, 3600)
        size = validate.count(chunk, "chunk", MAX_CHUNK)
        ordered = _many_keys(keys)
        if conn is not None:
            size = max(1, len(ordered))
        owner, tally, started = _owner(), _Tally(), time.monotonic()
        for keys_now in _cut(ordered, size):
            rounds = 0
            first_found: dict[str, str] = {}  # (a key given back and claimed anew was in doubt)
            while keys_now:
                late, progressed = self._chunk(scope, keys_now, fn, policy, owner, lease_s,
                                               wait, conn, tally, first_found)
                rounds = 0 if progressed else rounds + 1
                if late and rounds >= LATE_ROUNDS:
                    tally.late += late
                    break
                keys_now = late
        return EffectsOutcome(
            scope=scope, keys=len(ordered), chunks=tally.chunks, done=tally.done,
            redone=tally.redone,
            skipped={why: tally.skipped[why] for why in ("done", "running", "in_doubt")},
            failed=tally.failed, overtaken=tuple(tally.overtaken),
            seconds=time.monotonic() - started, held=tuple(tally.held), late=tuple(tally.late),
            left_in_doubt=tuple(tally.left_in_doubt))

    def _chunk(self, scope: str, keys: builtins.list[str], fn: Callable[[str], Any], policy: str,
               owner: str, lease: float, wait: float, conn: Any,
               tally: _Tally, first_found: dict[str, str]) -> tuple[builtins.list[str], bool]:
        """Claim, run and finish one chunk: (the claimed keys whose ``fn`` did not start
        because the lease ran short, given back; whether any ``fn`` started)."""
        backend = self.app.backend
        failpoints.hit("effect.before_claim")
        claimed_at = time.monotonic()
        chunk, claims = backend.effect_claim_many(scope, keys, policy, owner, lease, wait,
                                                  conn=conn)
        # (in your open transaction nobody else sees the claims until you commit: no deadline)
        deadline = None if self._uncommitted(conn) else claimed_at + lease - _margin(lease)
        tally.chunks += 1
        todo = []
        for key, found, token in claims:
            if token is None:
                tally.skipped[found] += 1
                if found == "running":
                    tally.held.append(key)
            else:
                todo.append((key, token, found))
        done: builtins.list[tuple[str, int, str | None]] = []
        failed: builtins.list[tuple[str, int, str]] = []
        late: builtins.list[tuple[str, int, str]] = []
        doubt: builtins.list[str] = []  # (fn raised EffectInDoubt: neither done nor released)
        try:
            for n, (key, token, _) in enumerate(todo):
                if deadline is not None and time.monotonic() >= deadline:
                    late = [(k, t, LATE_NOTE) for k, t, _ in todo[n:]]
                    break
                try:
                    call = functools.partial(_call, fn, f"{scope}:{key}")
                    result = call() if conn is None else backend.callers_savepoint(conn, call)
                except _NotRun:
                    raise
                except EffectInDoubt:
                    doubt.append(key)
                    tally.left_in_doubt.append(key)
                    continue
                except Exception as exc:  # noqa: BLE001 - recorded for its key; the run goes on
                    error = validate.exception_text(exc)
                    failed.append((key, token, error))
                    tally.failed[key] = error
                    continue
                done.append((key, token, validate.result_json(result)[0]))
                if failpoints.ACTIVE:
                    failpoints.hit("effect.after_fn")
        except BaseException as exc:
            # KeyboardInterrupt, SystemExit: keep what returned, give the rest back, stop.
            ended = {k for k, _, _ in done} | {k for k, _, _ in failed} | set(doubt)
            note = NOT_RUN if isinstance(exc, _NotRun) else f"interrupted: {type(exc).__name__}"
            failed += [(k, t, note) for k, t, _ in todo if k not in ended]
            try:
                backend.effect_finish_many(scope, chunk, done, failed, conn=conn, left=len(doubt))
            except Exception:  # noqa: BLE001 - the lease will put them in doubt instead
                emit(Event.EFFECT_RELEASE_ERROR, "could not finish a chunk of effects after "
                     "an interruption", exc_info=True)
            raise

        def finish(again: bool) -> tuple[set[str], set[str]]:
            out = backend.effect_finish_many(scope, chunk, done, failed + late, conn=conn,
                                             left=len(doubt), again=again)
            if failpoints.ACTIVE:
                failpoints.hit("effect.after_finish")  # (a raise here: a reply lost after COMMIT)
            return out

        # (retried while the chunk's lease lasts: counted from before its claim was sent)
        marked, _ = _finishing(finish, None if conn is not None else claimed_at + lease,
                               scope, len(done) + len(failed) + len(late))
        if doubt:
            emit(Event.EFFECT_LEFT_IN_DOUBT, "effects whose outcome is unknown were left in doubt",
                 scope=scope, keys=len(doubt))
        failpoints.hit("effect.after_chunk")
        if late:
            emit(Event.EFFECT_LATE, "a chunk's lease ran short: its unstarted keys were given "
                 "back and are claimed again", scope=scope, keys=len(late))
        for k, _, f in todo:
            first_found.setdefault(k, f)
        tally.done += len(marked)
        tally.redone += sum(1 for k in marked if first_found[k] == "in_doubt")
        overtaken = [k for k, _, _ in done if k not in marked]
        if overtaken:
            tally.overtaken += overtaken
            emit(Event.EFFECT_OVERTAKEN, "effects done after their claims were taken over",
                 scope=scope, keys=len(overtaken))
        return [k for k, _, _ in late], len(late) < len(todo)

    def get(self, scope: str, key: Any) -> EffectInfo:
        return self._get(scope, key)

    def _get(self, scope: str, key: Any, conn: Any = None) -> EffectInfo:
        info = self.app.backend.effect_get(_scope(scope), _key(key), conn)
        if info is None:
            raise EffectNotFound(f"no effect {scope}:{key}")
        return info

    def in_doubt(self, scope: str | None = None, limit: int = 1000) -> list[EffectInfo]:
        """Entries whose holder's lease expired mid-effect (oldest first)."""
        return self.app.backend.effects_in_doubt(
            _scope(scope) if scope is not None else None, validate.count(limit, "limit", 100_000))

    def resolve(self, scope: str, key: Any, *, done: bool, note: str | None = None,
                force: bool = False, conn: Any = None,
                lock_timeout: float | timedelta = 5.0) -> EffectInfo:
        """An operator's verdict on an entry in doubt: ``done=True`` (it happened: never
        redo) or ``done=False`` (it did not: claimable again). ``force`` also resolves an
        entry whose lease has not expired yet. ``conn``: in your open transaction,
        committed with it (the entry returned is as that transaction sees it). The entry's
        lock (and its chunk's) is waited for at most ``lock_timeout``: LockTimeout past it,
        nothing written."""
        scope, key = _scope(scope), _key(key)
        done, force = validate.flag(done, "done"), validate.flag(force, "force")
        if note is not None:
            note = validate.text(note, "note", 4000)
        wait = validate.bounded(lock_timeout, "lock_timeout", 0.001, 3600)
        ok = self.app.backend.effect_resolve(scope, key, "done" if done else "pending", note, force,
                                             conn, wait)
        if not ok:
            info = self._get(scope, key, conn)
            raise InvalidTransition(
                f"effect {scope}:{key} is {info.state}: only entries in doubt can be resolved"
                + (" (or pass force=True for a running one)" if info.state == "running" else ""))
        return self._get(scope, key, conn)

    def resolve_many(self, scope: str, keys: Iterable[Any], *, done: bool, note: str | None = None,
                     force: bool = False,
                     lock_timeout: float | timedelta = 5.0) -> builtins.list[str]:
        """:meth:`resolve` for many keys of one scope (after a crash left a chunk in doubt):
        every key is checked first; returns the keys resolved, sorted. A key that was not
        in doubt (not running, or, without ``force``, its lease still live) or that names
        no entry is left as it is and is not in the answer. Keys are resolved in
        transactions of a few thousand, each entry under its row lock, each transaction's
        lock waits bounded by ``lock_timeout`` (LockTimeout past it: the transactions before
        it stay committed, the rest are not tried)."""
        scope, ordered = _scope(scope), _many_keys(keys)
        done, force = validate.flag(done, "done"), validate.flag(force, "force")
        if note is not None:
            note = validate.text(note, "note", 4000)
        wait = validate.bounded(lock_timeout, "lock_timeout", 0.001, 3600)
        return self.app.backend.effect_resolve_many(scope, ordered, "done" if done else "pending",
                                                    note, force, lock_timeout=wait)

    def list(self, scope: str, state: str | None = None, limit: int = 1000,
             after: Any = None) -> builtins.list[EffectInfo]:
        """The entries of a scope (``state``: pending, running or done), by key, at most
        ``limit``. ``after``: only keys after this one, in the database's order of strings
        (``"10"`` comes before ``"9"``); pass the last key of a page to read the next, so a
        scope of any size is read a page at a time, each page costing the same."""
        if state not in (None, "pending", "running", "done"):
            raise InvalidOption(f"state must be pending, running or done, not {validate.shown(state)}")
        return self.app.backend.effects_list(_scope(scope), state, validate.count(limit, "limit", 10_000_000),
                                             None if after is None else _key(after))

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


def _check_fn(fn: Any) -> None:
    """An effect's function is called, and what it returns is its result: a coroutine or
    generator function returns without running its body, so the entry would be marked
    done for an effect that never happened."""
    if not callable(fn):
        raise InvalidOption("fn must be a callable taking the idempotency key")
    call = fn if inspect.isroutine(fn) or isinstance(fn, functools.partial) else type(fn).__call__
    if inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call) or \
            inspect.isgeneratorfunction(call) or inspect.iscoroutinefunction(fn):
        raise InvalidOption(
            "fn must be a plain function: an async or generator function returns before its "
            "body runs (call it with asyncio.run inside a plain function, or finish the "
            "generator)")


def _not_run(result: Any) -> bool:
    """Whether fn handed back work it has not done (a coroutine, generator or other
    awaitable): checked at run time too, for callables the signature does not show."""
    if inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()  # (no "never awaited" warning: it is refused here)
        return True
    return False


def _call(fn: Callable[[str], Any], idempotency_key: str) -> Any:
    """``fn(idempotency_key)``; a coroutine or generator handed back raises ``_NotRun``
    (inside the savepoint, with conn=: what fn wrote before goes too). Not a failure of
    one key: fn is wrong for every key, so run_many stops as an interrupt does (what
    returned is kept, the rest given back)."""
    result = fn(idempotency_key)
    if _not_run(result):
        raise _NotRun(NOT_RUN)
    return result


NOT_RUN = ("fn returned a coroutine, generator or awaitable: its body never ran, so the "
           "effect did not happen (call it with asyncio.run inside a plain function)")


def _scope(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_SCOPE:
        raise InvalidOption(
            f"scope must be a non-empty string of at most {MAX_SCOPE} characters, not {validate.shown(value)}")
    return validate.text(value, "scope", MAX_SCOPE)


def _key(value: Any) -> str:
    key = validate.optional_key(value, "effect key") if value is not None else None
    if key is None:
        raise InvalidOption("an effect key is a non-empty string or an int, not None")
    return key


def _many_keys(keys: Any) -> builtins.list[str]:
    """The distinct ledger keys of ``keys``, in the order given, all checked first."""
    if isinstance(keys, str | bytes | bytearray) or not isinstance(keys, Iterable):
        raise InvalidOption(
            f"keys must be an iterable of keys (a list, a range, a generator), not {type(keys).__name__}")
    return builtins.list(dict.fromkeys(_key(k) for k in keys))


def _policy(value: Any) -> str:
    if not isinstance(value, str) or value not in POLICIES:
        raise InvalidOption(f"policy must be one of {POLICIES}, not {validate.shown(value)}")
    return str.__str__(value)


def _owner() -> str:
    return default_owner()
