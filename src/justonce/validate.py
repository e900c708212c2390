"""Validation of everything a caller hands to justonce, and the documented limits.

Every check raises a :class:`~justonce.errors.ValidationError` subclass with a message that
names the bad value, before anything touches the database.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from .errors import InvalidArguments, InvalidName, InvalidOption, PayloadTooLarge

MAX_PAYLOAD_BYTES = 256 * 1024
"""Arguments of one job (args + kwargs as JSON text)."""
MAX_RESULT_BYTES = 64 * 1024
"""A task's return value as JSON text; larger results are dropped with a note."""
MAX_JSON_DEPTH = 64
"""Nesting of arguments and results (the outer list or dict counts as 1): deeper JSON is
refused, as the service could not write it back out (its JSON encoder stops at 255)."""
MAX_ERROR_CHARS = 4000
MAX_KEY_CHARS = 512
_KEY_INTS = (-(10 ** (MAX_KEY_CHARS - 1)), 10**MAX_KEY_CHARS)
"""An integer key strictly between these has at most MAX_KEY_CHARS characters, a sign included."""
MAX_DELAY_SECONDS = 10 * 365 * 86400
MAX_TIMEOUT_SECONDS = 7 * 86400
MAX_ATTEMPTS = 1000
PRIORITY_RANGE = (-1000, 1000)

SHOWN_CHARS = 80
"""How much of a refused value an error message shows (see :func:`shown`)."""

SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}\Z")
SQL_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?\Z")
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}\Z")
TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:<>-]{0,199}\Z")


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = SHOWN_CHARS
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 6, 6, 4


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters: a refusal
    names what it refused without echoing a hostile 10,000-character name (or a list of
    a million numbers, or a list nested 10,000 deep) back whole."""
    try:
        text = _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a __repr__ of the caller's that fails
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


_DIGITS = re.compile(r"(?:0|[1-9][0-9]{0,18})\Z")


def plain_int(text: Any, *, zero: bool = False) -> int | None:
    """A count or id written in text (a URL, a form, a command line) as numbers are
    written: ASCII digits without sign, leading zero, space or underscore, below 2**63
    (``zero``: 0 too); else None. int() would read "1_5" as 15, " 01" and "١" as 1, so a
    malformed id would name another job."""
    if not isinstance(text, str) or not _DIGITS.match(text):
        return None
    n = int(text)
    return n if n < 2**63 and (zero or n > 0) else None


_SIGNED_DIGITS = re.compile(r"[+-]?[0-9]+\Z")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_LONGEST_NUMBER = 400
"""Characters of a number in text read at most: past this (4,300 digits) int() raises an
error of its own, and no option of ours takes a number near that long."""


def text_int(text: Any) -> int | None:
    """An integer option written on a command line or in a URL: ASCII digits with an
    optional sign, nothing else; else None. int() also reads "1_0" as 10, " 7 " as 7 and
    "\u0663" (an Arabic-Indic three) as 3: a typo would be taken for another number."""
    if not isinstance(text, str) or len(text) > _LONGEST_NUMBER or not _SIGNED_DIGITS.match(text):
        return None
    return int(text)


def text_float(text: Any) -> float | None:
    """A finite number written in text as decimals are (``1``, ``-0.5``, ``.5``,
    ``1e3``): ASCII only, no underscore, space, ``nan`` or ``inf``, and not so large that
    it overflows to infinity; else None (float() reads all of those)."""
    if not isinstance(text, str) or len(text) > _LONGEST_NUMBER or not _DECIMAL.match(text):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def exact_int(value: Any) -> int | None:
    """``value`` as a plain ``int`` when it is an integer (not a bool), else None. A subclass
    (an IntEnum, an ``int`` with its own ``__str__``) is read by its value: drivers may
    format a subclass with its own ``__str__`` (PyMySQL wrote ``'P.HIGH'``, which MySQL
    refused with an error of the driver's), and a key took that text for its value."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int.__index__(value)


def queue_name(value: Any) -> str:
    return _name(value, QUEUE_NAME, "queue name")


def set_name(value: Any) -> str:
    return _name(value, SET_NAME, "partition set name")


def _name(value: Any, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise InvalidName(
            f"bad {what} {shown(value)}: 1-63 characters of letters, digits, '_', '.', ':' "
            "or '-', starting with a letter or digit"
        )
    return str.__str__(value)  # (a str Enum by its value: f-strings and drivers use its name)


def sql_identifier(value: Any) -> str:
    """A column (or ``table.column``) to put into generated SQL: letters, digits and '_'
    only, so it can never carry SQL of its own."""
    if not isinstance(value, str) or not SQL_IDENTIFIER.match(value):
        raise InvalidName(
            f"bad SQL identifier {shown(value)}: letters, digits and '_' (optionally table.column)")
    return str.__str__(value)


def task_name(value: Any) -> str:
    if not isinstance(value, str) or not TASK_NAME.match(value):
        raise InvalidName(
            f"bad task name {shown(value)}: 1-200 characters of letters, digits, '_', '.', ':' "
            "or '-', starting with a letter or '_'"
        )
    return str.__str__(value)


def owner(value: Any) -> str:
    """Who holds a lease or a claim, as shown in listings: 1-200 characters of text."""
    if value == "":
        raise InvalidOption("an owner must not be empty")
    return text(value, "owner", 200)


def flag(value: Any, what: str) -> bool:
    """True or False, and nothing else ("no" and None are not False)."""
    if not isinstance(value, bool):
        raise InvalidOption(f"{what} must be True or False, not {shown(value)}")
    return value


def optional_key(value: Any, what: str = "key") -> str | None:
    if value is None:
        return None
    if (number := exact_int(value)) is not None:
        value = number
        # (Measured before str(): past 4,300 digits str() raises a ValueError of its own.)
        if not _KEY_INTS[0] < value < _KEY_INTS[1]:
            raise InvalidName(f"bad {what}: an integer longer than {MAX_KEY_CHARS} characters "
                              f"(a key is at most {MAX_KEY_CHARS})")
        value = str(value)
    if isinstance(value, str):
        value = str.__str__(value)  # (a subclass by its characters, not by its __str__)
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS or "\x00" in value:
        raise InvalidName(f"bad {what} {shown(value)}: a non-empty string of at most {MAX_KEY_CHARS} "
                          "characters")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidName(f"bad {what} {shown(value)}: it contains a lone surrogate, which the "
                          "database cannot store") from None
    return value


# One encoder for every call: json.dumps with options builds a new encoder each time, which
# costs more than encoding a small argument list.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


# A JSON string (unrolled: no backtracking per character), or a number Python wrote with
# a positive exponent (the repr of a float of 1e16 or more: always a whole number).
_STRING_OR_BIG_FLOAT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?\d+(?:\.\d+)?e\+\d+)')


def _whole_float(m: re.Match[str]) -> str:
    big = m.group(1)
    return m.group() if big is None else f"{int(float(big))}.0"


def keep_floats(text: str) -> str:
    """JSON text (as this module encodes it) with every float written so that each
    database gives back a float: Postgres' jsonb keeps a number's value, not its spelling,
    and writes ``1e+16`` back as ``10000000000000000``, which reads as an int. Such floats
    (1e16 and more, all whole numbers) are written out in digits with ``.0``, which every
    backend reads as the same float. Sizes and depths are checked on the text before
    this (1e300 grows from 6 bytes to 302: the limits stay what they were). Text with no
    digit before an "e+" is left as it is."""
    at = text.find("e+")
    while at > 0:
        if text[at - 1].isdigit():  # (else an "e+" in a string: some+one@example.com)
            return _STRING_OR_BIG_FLOAT.sub(_whole_float, text)
        at = text.find("e+", at + 2)
    return text


def json_text(value: Any) -> str:
    """:func:`keep_floats` of a value's JSON text."""
    return keep_floats(_ENCODER.encode(value))


def _dumps(value: Any, what: str) -> str:
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArguments(f"{what} are not JSON-serialisable: {exc}") from None


# A JSON string (brackets inside it are text); a list or dict with no list or dict inside;
# a bracket.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_INNERMOST = re.compile(r"[\[{][^\[\]{}]*[\]}]")
_BRACKET = re.compile(r"[\[\]{}]")
_PASSES = 4
"""Arguments are rarely nested deeper: past this the brackets left are counted one by one."""


def _too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """JSON text (as json.dumps writes it) nested more than ``limit`` deep. Each pass of a
    regex removes the innermost lists and dicts (a document ``d`` deep is gone after ``d``
    passes, and one pass leaves it ``d - 1`` deep): the usual arguments take a few passes
    in C, where counting every bracket in Python cost 0.9 ms a bulk enqueue of 1,000
    calls. What is deeper is counted bracket by bracket, and stops as soon as it is too
    deep (a hostile document costs no more than its first ``limit`` levels)."""
    if text.count("[") + text.count("{") <= limit:  # the usual case: cannot be deeper
        return False
    if '"' in text:
        text = _STRING.sub("", text)
    for _ in range(min(limit, _PASSES)):
        text, found = _INNERMOST.subn("", text)
        if not found:
            return False
        limit -= 1
    depth = 0
    for m in _BRACKET.finditer(text):
        if m.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


# An escaped NUL: "\u0000" preceded by an even number of backslashes.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _storable(text: str) -> bool:
    """JSON text the databases can store: no NUL (Postgres text and jsonb refuse it) and
    valid UTF-8 (no lone surrogates)."""
    if "\\u0000" in text and _NUL.search(text) is not None:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _storable_size(text: str, what: str) -> int:
    if not _storable(text):
        raise InvalidArguments(f"{what} contain a NUL character or a lone surrogate, which the "
                               "database cannot store")
    return len(text.encode())


def arguments(args: Any, kwargs: Any) -> tuple[str, str]:
    """(args_json, kwargs_json), checked for type, JSON-ness and size."""
    if args is None:
        args = []
    if isinstance(args, (str, bytes, dict)) or not isinstance(args, (list, tuple)):
        raise InvalidArguments(f"args must be a list or tuple, not {type(args).__name__}")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise InvalidArguments(f"kwargs must be a dict, not {type(kwargs).__name__}")
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise InvalidArguments(f"kwargs keys must be strings, got {shown(bad[0])}")
    args_json = _dumps(list(args), "args")
    kwargs_json = _dumps(kwargs, "kwargs") if kwargs else "{}"
    size = _storable_size(args_json, "arguments") + _storable_size(kwargs_json, "arguments")
    if _too_deep(args_json) or _too_deep(kwargs_json):
        raise InvalidArguments(f"arguments are nested more than {MAX_JSON_DEPTH} deep")
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"job arguments are {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}"
        )
    return keep_floats(args_json), keep_floats(kwargs_json)


def call_list(calls: Any) -> list[Any]:
    """The calls of an ``enqueue_calls`` as a list (each is checked as it is encoded)."""
    if isinstance(calls, (str, bytes, dict)) or not isinstance(calls, Iterable):
        raise InvalidArguments(f"calls must be an iterable of argument tuples or keyword dicts, "
                               f"not {type(calls).__name__}")
    return list(calls)


def batch_arguments(calls: Sequence[Any]) -> tuple[str, str]:
    """(args_doc, kwargs_doc): JSON arrays with one entry per call (a list/tuple of
    positional arguments, or a dict of keyword arguments), encoded with one call each.
    Any problem is reported as :func:`arguments` would report it for that job."""
    args_list: list[Any] = []
    kwargs_list: list[Any] = []
    for call in calls:
        if isinstance(call, dict):
            if any(not isinstance(k, str) for k in call):
                arguments((), call)  # raises with the message for this job
            args_list.append(())
            kwargs_list.append(call)
        elif isinstance(call, (list, tuple)):
            args_list.append(call)
            kwargs_list.append(_EMPTY)
        else:
            raise InvalidArguments(
                f"each call must be a tuple of arguments or a dict of keyword arguments, "
                f"not {type(call).__name__}"
            )
    try:
        args_doc = _ENCODER.encode(args_list)
        kwargs_doc = _ENCODER.encode(kwargs_list)
    except (TypeError, ValueError, RecursionError):
        args_doc = kwargs_doc = ""
    if not args_doc or not _storable(args_doc) or not _storable(kwargs_doc) or (
            len(args_doc.encode()) + len(kwargs_doc.encode()) > MAX_PAYLOAD_BYTES) or (
            _too_deep(args_doc, MAX_JSON_DEPTH + 1) or _too_deep(kwargs_doc, MAX_JSON_DEPTH + 1)):
        # Rare: find the job at fault (or check each job's size) one by one.
        for a, k in zip(args_list, kwargs_list, strict=True):
            arguments(a, k)
        if not args_doc:  # pragma: no cover - a job above must have raised
            raise InvalidArguments("arguments are not JSON-serialisable")
    return keep_floats(args_doc), keep_floats(kwargs_doc)


_EMPTY: dict[str, Any] = {}


def result_json(value: Any) -> tuple[str | None, str | None]:
    """(json, note): a result that cannot be stored is dropped and the note says why."""
    if value is None:
        return None, None
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return None, f"result dropped: not JSON-serialisable ({type(exc).__name__}: {exc})"
    if not _storable(text):
        return None, "result dropped: it contains a NUL character or a lone surrogate"
    if _too_deep(text):
        return None, f"result dropped: nested more than {MAX_JSON_DEPTH} deep"
    size = len(text.encode())
    if size > MAX_RESULT_BYTES:
        return None, f"result dropped: {size} bytes over the {MAX_RESULT_BYTES} limit"
    return keep_floats(text), None


def _number(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    # Read by value, not through the number's own __float__ (a subclass's may say nan).
    if (number := exact_int(value)) is not None:
        try:
            return float(number)
        except OverflowError:  # an int past a float's range: too many seconds for any bound
            return math.inf if number > 0 else -math.inf
    if isinstance(value, float) and not math.isnan(seconds := float.__float__(value)):
        return seconds
    raise InvalidOption(f"{what} must be a number of seconds, not {shown(value)}")


def delay(value: Any) -> float:
    seconds = _number(value, "delay")
    if seconds < 0:
        raise InvalidOption(f"delay must be >= 0 seconds, not {seconds:g}")
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidOption(f"delay of {seconds:g} seconds is over the limit of {MAX_DELAY_SECONDS} seconds")
    return seconds


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def run_at(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidOption(f"run_at must be a datetime, not {type(value).__name__}")
    try:
        offset = value.utcoffset()
    except Exception as exc:  # noqa: BLE001 - a tzinfo of the caller's that fails or is out of range
        raise InvalidOption(f"run_at's timezone gives no usable offset: {exc}") from None
    if value.tzinfo is None or offset is None:
        raise InvalidOption("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    # A sanity bound only (the caller's clock): the database's clock decides when it runs.
    if value > datetime.now(UTC) + timedelta(seconds=MAX_DELAY_SECONDS):
        raise InvalidOption(f"run_at {value.isoformat()} is more than 10 years ahead")
    if value < _EPOCH:  # SQLite keeps epoch seconds: year 1 at +14:00 would read back as year 0
        raise InvalidOption(f"run_at {value.isoformat()} is before 1970")
    return value


def error_text(text: str) -> str:
    """Error text as the database can store it: NUL and lone surrogates escaped, and at
    most MAX_ERROR_CHARS characters (its head and its tail: a message says what went
    wrong first, a traceback where last). Every error kept (a job's, an effect's, a list
    position's) passes here: MariaDB refuses text past its column (TEXT: 64 KiB), and an
    effect released with a 70 KB message failed its whole chunk's finish."""
    text = text.replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[:1000] + "\n…\n" + text[-(MAX_ERROR_CHARS - 1003):]
    return text


def exception_text(exc: BaseException) -> str:
    """"Type: message" of an exception, as :func:`error_text` keeps it; the type's name
    alone when the exception's ``__str__`` itself raises."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        text = type(exc).__name__
    return error_text(text)


def bounded(value: Any, what: str, lo: float, hi: float) -> float:
    seconds = _number(value, what)
    if not lo <= seconds <= hi:
        raise InvalidOption(f"{what} must be in [{lo:g}, {hi:g}], not {seconds:g}")
    return seconds


def job_id(value: Any, what: str = "job id") -> int:
    number = exact_int(value)
    if number is None or not 0 < number < 2**63:
        raise InvalidOption(f"{what} must be a positive 64-bit integer, not {shown(value)}")
    return number


def int64(value: Any, what: str, lo: int = 0) -> int:
    """An integer the databases can store as BIGINT, at least ``lo`` (a fencing token, a
    count): past 2**63 - 1 sqlite3 raises OverflowError and Postgres and MySQL refuse it."""
    number = exact_int(value)
    if number is None or not lo <= number < 2**63:
        raise InvalidOption(f"{what} must be an integer in [{lo}, 2**63), not {shown(value)}")
    return number


def detail_json(value: Any, what: str = "detail") -> str:
    """A dict of anything as JSON text the databases can store (a value JSON does not
    know is written as its ``str``): no NUL or lone surrogate, at most MAX_JSON_DEPTH deep
    and MAX_RESULT_BYTES long."""
    if not isinstance(value, dict) or any(not isinstance(k, str) for k in value):
        raise InvalidOption(f"{what} must be a dict with string keys, not {shown(value)}")
    try:
        text = json.dumps(value, separators=(",", ":"), default=str, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidOption(f"{what} is not JSON-serialisable: {exc}") from None
    if not _storable(text) or _too_deep(text) or len(text.encode()) > MAX_RESULT_BYTES:
        raise InvalidOption(f"{what} must be JSON of at most {MAX_RESULT_BYTES} bytes, nested at most "
                            f"{MAX_JSON_DEPTH} deep, without NUL or lone surrogates")
    return text


def optional_state(value: Any, states: type[Enum]) -> str | None:
    """A state filter: None, or one of the enum's values."""
    if value is None:
        return None
    try:
        return str(states(value).value)
    except ValueError:
        raise InvalidOption(
            f"state must be one of {', '.join(str(s.value) for s in states)}, not {shown(value)}"
        ) from None


def batch_id(value: Any) -> int:
    return job_id(value, "batch id")


def count(value: Any, what: str, hi: int) -> int:
    number = exact_int(value)
    if number is None or not 1 <= number <= hi:
        raise InvalidOption(f"{what} must be an integer in [1, {hi}], not {shown(value)}")
    return number


def text(value: Any, what: str, limit: int) -> str:
    """Free text (a description, a failure reason): a string the databases can store."""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise InvalidOption(f"{what} must be a string of at most {limit} characters without NUL")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidOption(f"{what} contains a lone surrogate, which the database cannot store") from None
    return str.__str__(value)


def timeout(value: Any) -> float:
    seconds = _number(value, "timeout")
    if not 0 < seconds <= MAX_TIMEOUT_SECONDS:
        raise InvalidOption(f"timeout must be in (0, {MAX_TIMEOUT_SECONDS}] seconds, not {seconds:g}")
    return seconds


def attempts(value: Any) -> int:
    number = exact_int(value)
    if number is None or not 1 <= number <= MAX_ATTEMPTS:
        raise InvalidOption(f"max_attempts must be an integer in [1, {MAX_ATTEMPTS}], not {shown(value)}")
    return number


def priority(value: Any) -> int:
    lo, hi = PRIORITY_RANGE
    number = exact_int(value)
    if number is None or not lo <= number <= hi:
        raise InvalidOption(f"priority must be an integer in [{lo}, {hi}], not {shown(value)}")
    return number


def host(value: Any, what: str) -> str:
    """A host name or address to bind or connect to. The socket functions encode a name
    with Python's idna codec, which raises UnicodeError for a label (the text between two
    dots) that is empty or longer than 63 characters (``mail..example.com``): refused
    here, before anything starts, as a typed error."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidOption(f"{what} must be a host name or address, not {shown(value)}")
    try:
        value.encode("idna")
    except UnicodeError:
        raise InvalidOption(f"{what} {shown(value)} is not a host name: a label in it (between "
                            "dots) is empty or longer than 63 characters") from None
    return str.__str__(value)
