"""Batch item ids and the bitfields that track them.

An item id is ``"<batch>:<group>:<index>"``: the batch's id, the random id of the group that
``add`` created, and the item's position in that group (0-based). ``add`` returns only the
group id and its size, and a client builds every item id of the group itself, so adding a
million items sends three values back, not a million ids. The random group id makes ids
hard to forge: a guessed id names a group the batch does not have and is refused.

A group is stored as chunks of :data:`CHUNK_BITS` items. Each chunk is one row with one bit
per item (1 = resolved, that is acked or failed) and a count of the items still pending, so
a million items take about 150 KB of rows, and acks of items in different chunks lock
different rows. How the bits are laid out is each backend's own business: SQLite keeps a
blob (item ``n`` is bit ``n % 8``, least significant first, of byte ``n // 8``), Postgres a
bit string (item ``n`` is its ``n``-th bit), so that one UPDATE can OR many bits into it.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import InvalidItemId, InvalidOption
from .validate import exact_int, shown

CHUNK_BITS = 2048
"""Items per stored chunk (256 bytes of bits): small enough that 4 ackers of a 20,000-item
batch rarely wait for each other's row lock, large enough that a million items are 489
rows (about 150 KB)."""
MAX_GROUP_ITEMS = 100_000_000
"""Items one ``add`` may create (12 MB of bits); a batch may have any number of groups."""
_ITEM_ID = re.compile(r"([1-9][0-9]{0,18}):([0-9a-f]{12}):(0|[1-9][0-9]{0,8})")


@dataclass(frozen=True, slots=True, order=True)
class ItemRef:
    """One item, parsed from its id."""

    batch_id: int
    group_id: str
    index: int

    @property
    def chunk(self) -> int:
        return self.index // CHUNK_BITS

    @property
    def bit(self) -> int:
        return self.index % CHUNK_BITS

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.group_id}:{self.index}"


@dataclass(frozen=True, slots=True)
class ItemGroup:
    """What ``add`` returns: enough to build the ids of all ``count`` items."""

    batch_id: int
    group_id: str
    count: int

    def item_id(self, index: int) -> str:
        number = exact_int(index)
        if number is None or not 0 <= number < self.count:
            raise InvalidOption(f"index must be in [0, {self.count}), not {shown(index)}")
        return f"{self.batch_id}:{self.group_id}:{number}"

    def item_ids(self) -> list[str]:
        prefix = f"{self.batch_id}:{self.group_id}:"
        return [f"{prefix}{i}" for i in range(self.count)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.item_ids())

    def __len__(self) -> int:
        return self.count


def parse_item_id(value: Any) -> ItemRef:
    """Parse ``"<batch>:<group>:<index>"``; raise :class:`InvalidItemId` for anything else."""
    if isinstance(value, ItemRef):
        return value
    m = _ITEM_ID.fullmatch(value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) >= 2**63:
        raise InvalidItemId(
            f"malformed batch item id {shown(value)}: expected '<batch id>:<group id>:<index>' "
            "as returned by add(), for example '12:3f9a0c1d2b4e:0'"
        )
    return ItemRef(int(m.group(1)), m.group(2), int(m.group(3)))


def parse_item_ids(values: Iterable[Any] | str, limit: int = 100_000) -> list[ItemRef]:
    """Parse one id (a string) or many (any iterable of strings). Duplicates are kept: the
    caller reports them as already acked. More than ``limit`` ids are refused before any
    is parsed past the limit."""
    if isinstance(values, (str, ItemRef)):
        return [parse_item_id(values)]
    if isinstance(values, (bytes, bytearray)) or not isinstance(values, Iterable):
        raise InvalidItemId(
            f"expected an item id or an iterable of item ids, not {type(values).__name__}")
    refs = [parse_item_id(v) for v in itertools.islice(values, limit + 1)]
    if len(refs) > limit:
        raise InvalidOption(f"at most {limit} item ids per call")
    return refs


def new_group_id() -> str:
    return secrets.token_hex(6)


def chunk_sizes(count: int) -> list[int]:
    """Sizes of the chunks that hold a group of ``count`` items."""
    full, rest = divmod(count, CHUNK_BITS)
    return [CHUNK_BITS] * full + ([rest] if rest else [])
