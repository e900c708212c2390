"""The worker side of ``justonce demo push``: one task, ``send_push_email``, that sends one
user one email of one Push through SMTP — at most once per (Push, user), whatever runs twice.

Workers run it with ``justonce worker --app justonce.demo.push_app:app --partitions …``;
the jobs carry ``partition_key=user_id``, so each user's jobs go to the worker holding slot
``user_id mod N``, one at a time. The effect ledger (scope ``push:<id>``, key the user id)
makes the send itself at most once: a second job for the same user — the A/B phase and the
"rest of the list" phase racing, a job retried after a crash — finds the effect done.
"""

from __future__ import annotations

import json
import os
import smtplib
import sqlite3
import threading
from email.message import EmailMessage
from typing import Any

from ..app import App
from ..retry import Backoff
from . import connect

app = App(strict=True)
_local = threading.local()
_pushes: dict[int, dict[str, Any]] = {}
_lock = threading.Lock()
SMTP_ENV = "JUSTONCE_DEMO_SMTP"


def _db() -> Any:
    conn = getattr(_local, "db", None)
    if conn is None:
        conn = _local.db = connect(app.database_url)
    return conn


def _push(push_id: int) -> dict[str, Any]:
    with _lock:
        if push_id not in _pushes:
            ph = "?" if isinstance(_db(), sqlite3.Connection) else "%s"
            row = _db().execute(f"SELECT name, variants FROM demo_pushes WHERE id = {ph}",
                                (push_id,)).fetchone()
            variants = row[1] if isinstance(row[1], dict) else json.loads(row[1])
            _pushes[push_id] = {"name": row[0], "variants": variants}
        return _pushes[push_id]


def _smtp() -> smtplib.SMTP:
    conn = getattr(_local, "smtp", None)
    if conn is None:
        host, _, port = os.environ.get(SMTP_ENV, "127.0.0.1:8025").rpartition(":")
        conn = _local.smtp = smtplib.SMTP(host, int(port), timeout=30)
    return conn


def _send(message: EmailMessage) -> None:
    """Send on this thread's connection. Only a connection found closed before sending is
    retried (on a fresh one): a failure later in the exchange may come after the server
    took the message, and is left to the effect ledger (the job fails and is retried)."""
    try:
        _smtp().send_message(message)
    except smtplib.SMTPServerDisconnected:
        _local.smtp = None
        _smtp().send_message(message)
    except OSError:
        _local.smtp = None
        raise


class SendInProgress(Exception):
    """Another claim of this user's email is live: look again shortly (it ends done, or in
    doubt if its worker died)."""


@app.task(name="demo.send_push_email", queue="push", max_attempts=30, timeout=60,
          backoff=Backoff(base=1.0, factor=1.5, cap=5.0, jitter=0.2))
def send_push_email(push_id: int, user_id: int, variant: str, phase: str) -> dict[str, Any]:
    push = _push(push_id)

    def send(idempotency_key: str) -> dict[str, str]:
        ph = "?" if isinstance(_db(), sqlite3.Connection) else "%s"
        email = _db().execute(f"SELECT email FROM demo_users WHERE id = {ph}", (user_id,)).fetchone()[0]
        content = push["variants"][variant]
        msg = EmailMessage()
        msg["From"] = "pushes@justonce.example"
        msg["To"] = email
        msg["Subject"] = content["subject"]
        msg["Message-ID"] = f"<{idempotency_key}@justonce.example>"
        msg["X-Justonce-Push"] = str(push_id)
        msg["X-Justonce-Variant"] = variant
        msg["X-Justonce-Phase"] = phase
        msg.set_content(content["body"])
        _send(msg)
        return {"variant": variant, "phase": phase}

    outcome = app.effects.run(f"push:{push_id}", user_id, send, lease=10)
    if outcome.state == "running":
        raise SendInProgress(f"user {user_id}: another send of push {push_id} is in progress")
    return {"sent": outcome.ran, "state": outcome.state}
