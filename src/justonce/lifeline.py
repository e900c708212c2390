"""A child process that ends with the process that started it.

A process killed with SIGKILL cannot stop its children; they are handed to init and go on:
a demo's workers went on polling the database, and the processes of ``justonce serve
--workers N`` went on serving (holding the port, so a restart failed with "address already
in use"). A child that calls :func:`end_with_parent` notices its parent has gone within
half a second and stops itself gracefully, with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import threading
import time


def end_with_parent(parent: int, name: str = "justonce-parent") -> None:
    """Send SIGTERM to this process once its parent is no longer ``parent`` (a daemon
    thread polls every 0.5 s). Nothing when ``parent`` has gone already: the check is made
    by the thread, which then stops the process at once."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name=name, daemon=True).start()
