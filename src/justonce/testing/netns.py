"""A worker host cut off from the database: a network namespace of the test's own.

:class:`CutOffHost` makes a namespace with one veth link to this host (a /30 of
10.231.0.0/16, chosen at random) and a TCP forwarder on this host's end of the link to the
database server, so a process started in the namespace (:meth:`CutOffHost.command`)
reaches the server only through that link. :meth:`CutOffHost.cut` takes this host's end of
the link down: packets are lost, not refused, as when a switch or a cable fails, so the
process's connections hang instead of failing fast. :meth:`CutOffHost.restore` brings it
back and the connections carry on where they stopped (TCP retransmits).

Only the namespace's own link and loopback are ever touched; the host's other interfaces
and routes are left alone. Needs root (or CAP_NET_ADMIN) and ``ip`` (Debian: iproute2).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["CutOffHost", "NetnsUnavailable", "unavailable"]


class NetnsUnavailable(RuntimeError):
    """This machine (or user) cannot make network namespaces."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out


def unavailable() -> str | None:
    """Why no namespace can be made here, or None."""
    if shutil.which("ip") is None:
        return "ip is not installed (Debian: apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    try:
        with CutOffHost("127.0.0.1", 9):
            return None
    except NetnsUnavailable as exc:
        return str(exc)


class CutOffHost:
    """A network namespace whose only way out is a link to this host that the test can cut.

    ``target_host:target_port`` is the database server as this host reaches it; inside the
    namespace it is :attr:`host`:``port`` (see :meth:`url`).
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        tag = f"{random.randrange(16**6):06x}"
        self.name = f"jo-{tag}"
        self._outer, self._inner = f"jo{tag}h", f"jo{tag}n"
        a, b = random.randrange(256), random.randrange(64) * 4
        self.host, self.inside = f"10.231.{a}.{b + 1}", f"10.231.{a}.{b + 2}"
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cuts = 0

    # -- lifetime ----------------------------------------------------------------------
    def __enter__(self) -> CutOffHost:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self._outer, "type", "veth", "peer", "name", self._inner)
        _ip("link", "set", self._inner, "netns", self.name)
        _ip("addr", "add", f"{self.host}/30", "dev", self._outer)
        _ip("link", "set", self._outer, "up")
        inside = ["netns", "exec", self.name, "ip"]
        _ip(*inside, "addr", "add", f"{self.inside}/30", "dev", self._inner)
        _ip(*inside, "link", "set", self._inner, "up")
        _ip(*inside, "link", "set", "lo", "up")
        listener = socket.create_server((self.host, 0))
        self._listener = listener
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name=f"{self.name}-forward").start()

    def close(self) -> None:
        """Stop forwarding and remove the namespace and its link (idempotent)."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()
        _ip("link", "del", self._outer, check=False)  # takes its peer with it
        _ip("netns", "del", self.name, check=False)

    # -- the link ----------------------------------------------------------------------
    def cut(self) -> None:
        """Drop the link: from now on packets both ways are lost."""
        _ip("link", "set", self._outer, "down")
        self.cuts += 1

    def restore(self) -> None:
        _ip("link", "set", self._outer, "up")

    # -- what runs inside --------------------------------------------------------------
    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def url(self, url: str) -> str:
        """``url`` (whose server is the target) as a process inside the namespace reaches it."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = (userinfo + "@" if userinfo else "") + f"{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- the forwarder -----------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
            left = [2]  # the pipes still running for this pair; the last one closes both
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b, left), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, left: list[int]) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self._lock:
            left[0] -= 1
            last = left[0] == 0
            if last:
                self._conns = [c for c in self._conns if c is not src and c is not dst]
        if last:
            src.close()
            dst.close()
