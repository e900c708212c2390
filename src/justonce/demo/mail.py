"""Mail for ``justonce demo push``: a Push email as bytes, one SMTP connection per thread,
the demo's own SMTP server (which counts what it receives), and the plain senders' ceiling.

The ceiling is what the same mail server takes from the same number of plain ``smtplib``
senders (one connection each, a message rendered once, no database at all), measured for a
few seconds at the start of a run: the Push's rate is reported as a share of it, so the
report says how much of the mail server's speed the bookkeeping costs.
"""

from __future__ import annotations

import os
import smtplib
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from typing import Any

from .. import validate
from ..errors import EffectInDoubt, InvalidOption

SMTP_ENV = "JUSTONCE_DEMO_SMTP"
SENDER = "pushes@justonce.example"


def render(push_id: int, to: str, variant: str, phase: str, content: dict[str, str],
           idempotency_key: str) -> bytes:
    """One Push email. The Message-ID is the effect's idempotency key, so a mail server
    (or an operator reading its log) can tell a resend from a new message."""
    return (f"From: {SENDER}\r\nTo: {to}\r\nSubject: {content['subject']}\r\n"
            f"Message-ID: <{idempotency_key}@justonce.example>\r\n"
            f"X-Justonce-Push: {push_id}\r\nX-Justonce-Variant: {variant}\r\n"
            f"X-Justonce-Phase: {phase}\r\nMIME-Version: 1.0\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n{content['body']}\r\n").encode()


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets: ``[::1]:2525``) as (host, port); ValueError
    if it is not one."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or ":" not in host:
            raise ValueError(f"not an IPv6 address in brackets: {address!r}")
    elif ":" in host or "[" in host or "]" in host:
        raise ValueError(f"an IPv6 host goes in brackets ([::1]:2525): {address!r}")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, not {address!r}")
    try:  # (a host socket.create_connection cannot encode: mail..example.com)
        validate.host(host, "the SMTP host")
    except InvalidOption as exc:
        raise ValueError(str(exc)) from None
    return host, int(port)


def smtp_address() -> tuple[str, int]:
    return split_address(os.environ.get(SMTP_ENV, "127.0.0.1:8025"))


class ThreadSMTP:
    """One SMTP connection per thread, opened on first use and kept."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _conn(self) -> smtplib.SMTP:
        conn = getattr(self._local, "smtp", None)
        if conn is None:
            host, port = smtp_address()
            conn = self._local.smtp = smtplib.SMTP(host, port, timeout=30)
        return conn

    def send(self, to: str, message: bytes) -> None:
        """Send on this thread's connection (the steps of ``sendmail``, one by one). A
        connection found closed before the message went out (the server dropped it while it
        was idle) is replaced and the envelope sent again: nothing of this message was
        taken. A failure once DATA was sent may come after the server took the message (it
        queued it, then the connection broke before its reply): that raises EffectInDoubt,
        and the ledger leaves the user in doubt rather than send again. (Retrying there sent
        every such user a second email.)"""
        try:
            conn = self._envelope(self._conn(), to)
        except (smtplib.SMTPServerDisconnected, ConnectionError):
            self._local.smtp = None
            conn = self._envelope(self._conn(), to)
        except OSError:
            self._local.smtp = None
            raise
        try:
            code, reply = conn.data(message)
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self._local.smtp = None
            raise EffectInDoubt(f"the connection to the mail server broke after DATA ({exc!r}): "
                                "it may have taken the message") from exc
        if code != 250:
            conn.rset()
            raise smtplib.SMTPDataError(code, reply)

    @staticmethod
    def _envelope(conn: smtplib.SMTP, to: str) -> smtplib.SMTP:
        conn.ehlo_or_helo_if_needed()
        code, reply = conn.mail(SENDER)
        if code != 250:
            conn.rset()
            raise smtplib.SMTPSenderRefused(code, reply, SENDER)
        code, reply = conn.rcpt(to)
        if code not in (250, 251):
            conn.rset()
            raise smtplib.SMTPRecipientsRefused({to: (code, reply)})
        return conn


# -- the demo's own SMTP server ------------------------------------------------------------------


class Recorder:
    """An aiosmtpd handler that counts what it receives, per Push: messages per recipient,
    per (variant, phase), and the Message-IDs (the idempotency keys) it accepted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.per_recipient: dict[str, Counter[str]] = {}
        self.per_variant: dict[str, Counter[tuple[str, str]]] = {}
        self.message_ids: dict[str, set[str]] = {}

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        headers = BytesHeaderParser().parsebytes(envelope.content)
        push = headers.get("X-Justonce-Push", "?")
        with self.lock:
            rcpts = self.per_recipient.setdefault(push, Counter())
            for rcpt in envelope.rcpt_tos:
                rcpts[rcpt] += 1
            self.per_variant.setdefault(push, Counter())[
                (headers.get("X-Justonce-Variant", "?"), headers.get("X-Justonce-Phase", "?"))] += 1
            self.message_ids.setdefault(push, set()).add(
                str(headers.get("Message-ID", "")).strip("<>").rpartition("@")[0])
        return "250 OK"

    def received(self, push: str) -> int:
        """How many messages of this Push the server has accepted so far."""
        with self.lock:
            return sum(self.per_recipient.get(push, Counter()).values())

    def delivered(self, push: str, idempotency_key: str) -> bool:
        """Whether the server accepted the message of this idempotency key (its log)."""
        with self.lock:
            return idempotency_key in self.message_ids.get(push, ())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_smtp() -> tuple[Any, Recorder, str]:
    """The demo's own SMTP server on a free loopback port: (controller, recorder, address)."""
    from aiosmtpd.controller import Controller

    port = free_port()
    recorder = Recorder()
    controller = Controller(recorder, hostname="127.0.0.1", port=port)
    controller.start()
    return controller, recorder, f"127.0.0.1:{port}"


# -- the plain senders' ceiling ------------------------------------------------------------------


@dataclass(frozen=True)
class Ceiling:
    senders: int
    messages: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


LATE = 3
"""A ceiling process's exit code when its start time came after the window had begun."""


def measure_ceiling(address: str, processes: int, threads: int, seconds: float = 3.0) -> Ceiling:
    """``processes`` × ``threads`` plain smtplib senders, one connection each, sending one
    rendered message in a loop for ``seconds`` to ``address`` (its ``X-Justonce-Push`` is
    "ceiling", so the demo's server keeps them apart from the Push).

    The clock starts only when every sender process has started and connected (each says
    so on its stdout, then waits for the start time on its stdin), and every process sends
    in the same window: a process still importing while the others send would leave the
    server to fewer senders for a while, and the sum of their counts would not be what all
    of them take at once. A process that reads the start time after the window has begun
    fails the try (its count would be short); it is tried again once with a longer lead
    (a machine so loaded that a second was not enough)."""
    try:
        return _measure(address, processes, threads, seconds, lead=1.0)
    except _Late:
        return _measure(address, processes, threads, seconds, lead=5.0)


class _Late(RuntimeError):
    pass


def _measure(address: str, processes: int, threads: int, seconds: float, lead: float) -> Ceiling:
    """One try of :func:`measure_ceiling`, giving every process ``lead`` s to read the start time."""
    cmd = [sys.executable, "-m", "justonce.demo.mail", address, str(threads), str(seconds)]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]

    def failed(p: subprocess.Popen[str], what: str) -> RuntimeError:
        p.kill()
        code = p.wait()
        if code == LATE:
            return _Late(f"a plain sender of the ceiling read its start time late ({lead:g}s lead)")
        return RuntimeError(f"a plain sender of the ceiling {what} (exit {code}; sending to {address}: "
                            "its error is on stderr above)")

    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise failed(p, "did not start")
        # Every process is connected and its threads are waiting: ``lead`` s for each to
        # read the start time (one that reads it late fails: its window would be short,
        # and the ceiling low).
        start_at = time.time() + lead
        for p in procs:
            assert p.stdin is not None
            try:
                p.stdin.write(f"{start_at!r}\n")
                p.stdin.flush()  # (communicate below closes it)
            except BrokenPipeError:
                raise failed(p, "failed") from None
        sent = 0
        for p in procs:
            # (readline above buffered nothing past "ready": the count comes seconds later)
            out, _ = p.communicate(timeout=60 + seconds)
            if p.returncode != 0 or not out.strip().isdigit():
                raise failed(p, "failed")
            sent += int(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()
    return Ceiling(processes * threads, sent, seconds)


def _plain_sender(address: str, threads: int, seconds: float) -> int:
    """One process of the ceiling: connect, start the threads, say "ready", read the start
    time (epoch seconds) from stdin, send from then for ``seconds``; the count of messages
    that ended inside the window. A thread that fails fails the process (exit 1): a
    count short of a thread would make the ceiling too low."""
    host, port = split_address(address)
    conns = [smtplib.SMTP(host, port, timeout=30) for _ in range(threads)]
    counts = [0] * threads
    errors: list[BaseException] = []
    content = {"subject": "ceiling", "body": "How fast the mail server takes plain sends."}
    window: list[float] = []  # [start, end] on the monotonic clock, set before `go`
    go = threading.Event()

    def loop(i: int) -> None:
        try:
            message = render(0, f"ceiling{i}@example.test", "-", "ceiling", content, "ceiling")
            message = message.replace(b"X-Justonce-Push: 0", b"X-Justonce-Push: ceiling")
            go.wait()
            start, end = window
            time.sleep(max(0.0, start - time.monotonic()))
            while True:
                conns[i].sendmail(SENDER, [f"ceiling{i}@example.test"], message)
                if time.monotonic() > end:
                    break  # (this one ended after the window: not counted)
                counts[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the process's exit code
            errors.append(exc)
            raise

    # Daemon threads: if no start time comes (the demo died, or stopped on an error), the
    # process ends with its main thread instead of waiting for them forever.
    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    start = time.monotonic() + (start_at - time.time())  # one clock from here on
    if start < time.monotonic():
        print(f"the start time came {time.monotonic() - start:.2f}s late", file=sys.stderr)
        raise SystemExit(LATE)
    window[:] = [start, start + seconds]
    go.set()
    for w in workers:
        w.join()
    for c in conns:
        try:
            c.quit()
        except (OSError, smtplib.SMTPException):
            pass
    if errors:
        raise SystemExit(1)
    return sum(counts)


if __name__ == "__main__":
    print(_plain_sender(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
