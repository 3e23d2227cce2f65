"""Shared builders of the kube-runtime tests (and of the daemons' lifecycle tests), and the
clients of the bounded HTTP server's tests (also used by the tests of the daemons' servers)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import time
from collections.abc import Callable

from sharegpu.kube.httpserve import ServerLimits
from tests.helpers import PATIENCE_S, eventually


class Recorder:
    """A lifecycle component that records ``start <name>`` and ``stop <name>`` in ``events``;
    ``fail_start`` makes its start raise."""

    def __init__(self, name: str, events: list[str], fail_start: bool = False) -> None:
        self.name = name
        self.events = events
        self.fail_start = fail_start

    def start(self) -> None:
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.events.append(f"start {self.name}")

    def stop(self) -> None:
        self.events.append(f"stop {self.name}")


def short_limits(
    request_timeout_s: float = 1.0, max_connections: int = 64, **sizes: int
) -> ServerLimits:
    """Limits with one-second timeouts (the request deadline as given)."""
    return ServerLimits(
        request_timeout_s=request_timeout_s,
        idle_timeout_s=1.0,
        write_timeout_s=1.0,
        max_connections=max_connections,
        **sizes,
    )


def stall(port: int, first: bytes = b"G") -> socket.socket:
    """A connection that sends ``first`` (one byte of a request by default) and nothing more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)
    with contextlib.suppress(OSError):  # closed by the server (at its cap): is_closed() tells
        sock.sendall(first)
    return sock


def is_closed(sock: socket.socket) -> bool:
    """True when the server closed ``sock`` (EOF or reset); does not wait."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def all_closed(
    socks: list[socket.socket],
    timeout_s: float = PATIENCE_S,
    meanwhile: Callable[[], None] = lambda: None,
) -> None:
    """Wait until the server closed every one of ``socks`` (the test fails at ``timeout_s``);
    ``meanwhile`` (an invariant that asserts) is checked at every poll until then."""
    pending = list(socks)

    def done() -> bool:
        meanwhile()
        pending[:] = [s for s in pending if not is_closed(s)]
        return not pending

    eventually(done, f"the server closing {len(socks)} connections", timeout_s=timeout_s)


def trickle(
    socks: list[socket.socket], data: bytes, interval_s: float = 0.5, timeout_s: float = PATIENCE_S
) -> list[socket.socket]:
    """Send ``data[1:]`` one byte per ``interval_s`` on each of ``socks`` (the first byte is
    sent already) until the server closed them all or ``timeout_s`` passed; those still open."""
    open_ = list(socks)
    end = time.monotonic() + timeout_s
    sent = 1
    while open_ and time.monotonic() < end and sent < len(data):
        time.sleep(interval_s)
        for sock in list(open_):
            try:
                sock.send(data[sent : sent + 1])
            except OSError:
                open_.remove(sock)
                continue
            if is_closed(sock):
                open_.remove(sock)
        sent += 1
    return open_


def get(port: int, path: str = "/", timeout_s: float = PATIENCE_S) -> tuple[int, bytes]:
    """One GET on a new connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def get_with_retries(port: int, path: str = "/", timeout_s: float = PATIENCE_S) -> int:
    """GET, retried while the server closes the connection at its cap; the status."""
    errors: list[Exception] = []

    def status() -> int | None:
        try:
            return get(port, path, timeout_s=timeout_s)[0]
        except (OSError, http.client.HTTPException) as exc:
            errors.append(exc)
            return None

    return eventually(
        status,
        lambda: f"an answer to GET {path} (last error: {errors[-1] if errors else None!r})",
        timeout_s=timeout_s,
    )
