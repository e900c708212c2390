"""Who holds a lease: the default owner name of a worker, slot holder or effect caller."""

from __future__ import annotations

import os
import secrets
import socket


def default_owner() -> str:
    """``host:pid:random``: unique per process start, readable in listings."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def owner_pid(owner: str | None) -> int | None:
    """The process id in a :func:`default_owner` name (None for a name of another shape,
    a caller's own ``owner=``). The host name may hold colons; the pid is the second field
    from the end."""
    parts = (owner or "").rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isascii() and parts[1].isdigit() else None
