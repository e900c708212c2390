"""Who holds a lease: the default owner name of a worker, slot holder or effect caller."""

from __future__ import annotations

import os
import secrets
import socket


def default_owner() -> str:
    """``host:pid:random``: unique per process start, readable in listings."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
