"""The one error tree of justonce. Every public entry raises one of these.

The CLI maps them to one-line messages and a non-zero exit; the HTTP layer to status codes.
"""

from __future__ import annotations


class JustonceError(Exception):
    """Base of every error justonce raises on purpose."""


class ConfigurationError(JustonceError):
    """Bad configuration: a malformed database URL, an app path that does not import…"""


class DatabaseUnavailable(JustonceError):
    """The database cannot be reached (down, refused, timed out, the connection lost).
    Nothing was written, unless the connection broke after a COMMIT had been sent: a
    write that cannot know whether its commit landed (an enqueue, say) can be retried
    safely only when it is idempotent (a keyed enqueue returns the job if it did)."""


class LockTimeout(DatabaseUnavailable):
    """A row lock (an effect's ledger entry, your row under ``lock_row``) was not granted
    within its timeout: another transaction holds it. Nothing was written; try again."""


class SchemaError(JustonceError):
    """The database schema is missing or newer than this version of justonce."""


class ValidationError(JustonceError, ValueError):
    """Input that justonce refuses before touching the database."""


class UnknownTask(ValidationError):
    """A task name that the app has not registered."""


class InvalidArguments(ValidationError):
    """Task arguments that are not JSON (or not a list / an object)."""


class PayloadTooLarge(ValidationError):
    """Arguments or a result over the documented size limit."""


class InvalidName(ValidationError):
    """An empty, too long or badly formed queue name, task name or key."""


class InvalidOption(ValidationError):
    """An option out of range: negative delay, zero attempts, both delay and run_at…"""


class JobNotFound(JustonceError, LookupError):
    """No job with that id."""


class InvalidItemId(ValidationError):
    """A batch item id that is not ``"<batch>:<group>:<index>"``."""


class BatchNotFound(JustonceError, LookupError):
    """No batch with that id (never opened, or removed after its retention)."""


class ItemNotFound(JustonceError, LookupError):
    """A well-formed item id whose group the batch does not have, or whose index is past
    the end of its group (a forged or mistyped id)."""


class InvalidTransition(JustonceError):
    """The job or batch is not in a state that allows the operation (retry a running job,
    add items to a sealed batch…)."""


class BatchExpired(InvalidTransition):
    """The batch expired (no activity for its ``expire_after``): it takes no more items,
    acks or seals, and its callbacks never run."""


class KeyConflict(InvalidTransition):
    """Another live job holds the key, so this job cannot be made live again."""


class TokenNotFound(JustonceError, LookupError):
    """No API token with that id."""


class CountChanged(InvalidTransition):
    """"Apply to all matching": more jobs match now than the preview counted (beyond the
    tolerance the caller gave). Nothing was changed; preview again."""


class PartitionSetNotFound(JustonceError, LookupError):
    """No partition set of that name (no process ever acquired a slot of it)."""


class EffectNotFound(JustonceError, LookupError):
    """No effect-ledger entry for that (scope, key)."""


class EffectInDoubt(JustonceError):
    """Raise it from an effect's function when the effect may have happened and you cannot
    tell (the request went out and its answer was lost): the entry is left in doubt, as if
    the process had died there, instead of released to be done again. Under at most once it
    waits for an operator's verdict; under at least once the next claim after its lease
    redoes it."""


class LeaseLost(JustonceError):
    """A partition lease is no longer this holder's: another process took the slot (its
    token is newer), so writes fenced by the old token are refused."""


class NoFreeSlot(JustonceError, TimeoutError):
    """Every slot of the partition set stayed held for the whole timeout of ``acquire``."""


class PartitionConflict(InvalidTransition):
    """The partition set is held with another number of slots: ``n`` can change only when
    no slot is held (otherwise two holders could share keys)."""


class NonRetryable(JustonceError):
    """Raise from a task to fail its job at once (state ``dead``) without further attempts."""


class ListNotFound(JustonceError, LookupError):
    """No list of that name."""


class ListExists(InvalidTransition):
    """A list of that name exists already (names are unique; drop the old one first)."""


class ListNotSealed(InvalidTransition):
    """The list is still loading: positions are handed out only once it is sealed."""


class ListSealed(InvalidTransition):
    """The list is sealed: its items are immutable, nothing can be appended."""


class StaleReservation(JustonceError):
    """A reservation token that no longer holds its positions: it timed out (its time to
    run passed by the database's clock), was released, buried, finished, or never existed.
    Writes with it are refused and change nothing; its unfinished positions are (or will
    be) handed to someone else."""


class PositionNotReserved(JustonceError, ValueError):
    """A position that the reservation does not hold (outside its ranges, or buried or
    released from it)."""
