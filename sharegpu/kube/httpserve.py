"""One bounded HTTP(S) server for every port the daemons open (``/metrics``, the controller's
JSON API and probes, the admission webhook): :class:`BoundedHTTPServer` with a handler derived
from :class:`BoundedRequestHandler`, bounded by :class:`ServerLimits` (docs/security.md, "Bind
addresses and limits", lists each port's values). Invariants, whatever clients do:

- at most ``max_connections + EVICTING_MAX`` connection threads plus the serving thread (with a
  ``trusted`` test: that many per pool, below, and ``max_trusted_connections`` more); one peer
  address holds at most ``max_connections_per_peer`` of them (evicted ones not counted);
- at a cap, a new connection evicts the connection (of that peer) that has waited longest for a
  complete request, or is closed by the accepting thread, which never reads from a client;
- a request (line, headers, body; the TLS handshake for the first) is read in full within
  ``request_timeout_s``, a body of ``n`` bytes within ``body_grace_s + n / min_body_rate`` of
  its head, the next request starts within ``idle_timeout_s``, and each write progresses within
  ``write_timeout_s``;
- a head takes at most ``max_header_bytes`` plus one read buffer; a declared body above
  ``max_body_bytes`` is answered 413 unread; the body is read before the handler runs;
- connection threads are daemon threads, and ``server_close`` shuts the open connections down.

With a ``trusted`` test (the admission webhook: a client certificate its client CA verified),
a connection is first counted in a handshake pool (the same caps, each per peer and in all),
where one is evicted only after :data:`HANDSHAKE_GRACE_S`; at that pool's caps a new connection
waits, without a thread, in a queue of at most :data:`PENDING_MAX` sockets for at most
``request_timeout_s``. After its handshake a trusted connection moves to a pool of its own
(``max_trusted_connections``) that no cap of a peer touches and no eviction picks; any other
connection then takes a slot of its peer (the same caps, evicting a staller of that peer, or of
anyone at the cap) or is closed. So a peer that carries many clients' trusted connections (the
API server) is never refused for its address, and untrusted peers stay capped.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import io
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, Self

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """The bounds of one :class:`BoundedHTTPServer` (see the module docstring)."""

    #: Seconds to read one request in full (the first one: from the accept, TLS included).
    request_timeout_s: float = 10.0
    #: Seconds a kept-alive connection may wait for the first byte of its next request.
    idle_timeout_s: float = 5.0
    #: Seconds each write of an answer may wait for the client to read.
    write_timeout_s: float = 10.0
    #: Connections served at once; at the cap a new one evicts a staller or is closed.
    max_connections: int = 64
    #: Bytes of the request line and headers (one read buffer more may be read).
    max_header_bytes: int = 64 * 1024
    #: Largest ``Content-Length`` accepted; larger requests are answered 413 unread.
    max_body_bytes: int = 64 * 1024
    #: Connections one peer address may hold (0: a quarter of ``max_connections``, at least 1).
    max_connections_per_peer: int = 0
    #: Bytes per second a body must arrive at, after ``body_grace_s``.
    min_body_rate: int = 64 * 1024
    #: Seconds a body may take beyond what ``min_body_rate`` gives it.
    body_grace_s: float = 1.0
    #: Connections a ``trusted`` test accepted that are served at once beside the others.
    max_trusted_connections: int = 256

    def __post_init__(self) -> None:
        timeouts = (self.request_timeout_s, self.idle_timeout_s, self.write_timeout_s)
        if min(timeouts) <= 0 or self.max_connections < 1:
            raise ValueError(f"server limits must be positive: {self}")
        if self.max_header_bytes < 1 or self.max_body_bytes < 0:
            raise ValueError(f"server limits must be positive: {self}")
        if self.max_connections_per_peer < 0 or self.min_body_rate < 1 or self.body_grace_s < 0:
            raise ValueError(f"server limits must be positive: {self}")
        if self.max_trusted_connections < 0:
            raise ValueError(f"server limits must be positive: {self}")

    @property
    def per_peer(self) -> int:
        """The connections one peer address may hold."""
        if self.max_connections_per_peer:
            return min(self.max_connections_per_peer, self.max_connections)
        return max(1, self.max_connections // 4)


#: The limits of a server constructed without its own (read at construction time).
DEFAULT_LIMITS = ServerLimits()
#: Evicted connections whose threads may still be ending; no more are evicted meanwhile.
EVICTING_MAX: Final = 8
#: Accepted sockets waiting, without a thread, for a handshake slot (servers with a
#: ``trusted`` test only); more are closed.
PENDING_MAX: Final = 128
#: Seconds a TLS handshake runs before it may be evicted for another connection (servers with
#: a ``trusted`` test only: a client's handshake takes milliseconds, a burst of them more).
HANDSHAKE_GRACE_S: Final = 1.0

#: Pools a connection is counted in: its TLS handshake (servers with a ``trusted`` test),
#: its peer's slots, the trusted pool.
HANDSHAKE: Final = "handshake"
OPEN: Final = "open"
TRUSTED: Final = "trusted"


class _Connection:
    """Book-keeping of one admitted connection; its fields are guarded by the server's lock."""

    __slots__ = ("evicted", "peer", "pool", "since", "sock", "waiting_since")

    def __init__(self, sock: socket.socket, peer: str, now: float, pool: str = OPEN) -> None:
        #: The socket to shut down on eviction (the TLS socket once the handshake is done).
        self.sock = sock
        #: The peer's address (without the port).
        self.peer = peer
        #: Since when the connection waits for a complete request (head and body); None while
        #: an answer is computed or written.
        self.waiting_since: float | None = now
        self.evicted = False
        #: :data:`HANDSHAKE`, :data:`OPEN` or :data:`TRUSTED`.
        self.pool = pool
        #: When it was accepted.
        self.since = now


class RequestTooLarge(http.client.HTTPException):
    """The request line and headers exceed ``max_header_bytes``."""


class _DeadlineReader(io.RawIOBase):
    """Reads a socket; each read waits at most until the handler's current deadline."""

    def __init__(self, sock: socket.socket, handler: BoundedRequestHandler) -> None:
        self._sock = sock
        self._handler = handler
        #: Bytes still allowed before the head is complete; None while a body is read.
        self.budget: int | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        left = self._handler.time_left()
        if left <= 0:
            raise TimeoutError("the request was not received within its deadline")
        if self.budget is not None and self.budget <= 0:
            raise RequestTooLarge("request line and headers too large")
        self._sock.settimeout(left)
        n = self._sock.recv_into(buffer)
        if self.budget is not None:
            self.budget -= n
        return n


class _TimedWriter(io.RawIOBase):
    """Writes all of each chunk to a socket; each send waits at most ``timeout_s`` for the
    client to make room (``sendall`` would bound the whole chunk instead)."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self._sock = sock
        self._timeout_s = timeout_s

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        self._sock.settimeout(self._timeout_s)
        sent = 0
        while sent < len(view):  # each send waits at most the timeout for the client to read
            sent += self._sock.send(view[sent:])
        return sent


class BoundedRequestHandler(BaseHTTPRequestHandler):
    """Base of every handler served by :class:`BoundedHTTPServer`.

    Subclasses write ``do_GET`` / ``do_POST`` as for ``BaseHTTPRequestHandler``; the request's
    body (``Content-Length`` bytes) is read in full before the handler runs and is in
    :attr:`body` (handlers never read ``rfile``); ``wfile`` writes under the write timeout.
    Answers are buffered (``wbufsize``, at least ``io.DEFAULT_BUFFER_SIZE``) and flushed after
    each request.
    """

    server: BoundedHTTPServer
    #: The body of the current request (empty without one).
    body: bytes = b""
    _deadline: float
    _reader: _DeadlineReader
    _buffered: io.BufferedReader

    def time_left(self) -> float:
        """Seconds until the deadline of the current read phase."""
        return self._deadline - time.monotonic()

    def setup(self) -> None:
        limits = self.server.limits
        self._deadline = time.monotonic() + limits.request_timeout_s
        self._requests = 0
        self._accepted = sock = self.request
        self._connection = self.server._connection(sock)
        try:
            context = self.server.tls_context
            if context is not None:
                # The handshake reads from the client: in this thread, under the deadline.
                sock.settimeout(max(self.time_left(), 0.001))
                sock = context().wrap_socket(sock, server_side=True)
                self.server._replace_socket(self._connection, sock)
                self.server._handshaken(self._connection, sock)
            if self.disable_nagle_algorithm:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        except BaseException:
            if sock is not self._accepted:
                _close(sock)
            raise
        self.request = self.connection = sock
        self._reader = _DeadlineReader(sock, self)
        self.rfile = self._buffered = io.BufferedReader(self._reader)
        self.wfile = io.BufferedWriter(
            _TimedWriter(sock, limits.write_timeout_s), max(self.wbufsize, io.DEFAULT_BUFFER_SIZE)
        )

    def handle_one_request(self) -> None:
        limits = self.server.limits
        if self._requests:
            # Kept alive: wait for the first byte of the next request, then time the request.
            self.server._waiting(self._connection, True)
            self._deadline = time.monotonic() + limits.idle_timeout_s
            try:
                more = bool(self._buffered.peek(1))
            except OSError:  # TimeoutError included: the idle timeout passed
                more = False
            if not more:
                self.close_connection = True
                return
            self._deadline = time.monotonic() + limits.request_timeout_s
        self._requests += 1
        self._reader.budget = limits.max_header_bytes
        try:
            super().handle_one_request()
        except RequestTooLarge:
            self.close_connection = True
        finally:
            self._reader.budget = None

    def parse_request(self) -> bool:
        self.body = b""
        if not super().parse_request() or self._refuse_large_body():
            return False
        self._reader.budget = None  # the head is read; a body is bounded by its length
        declared = (self.headers.get("Content-Length") or "").strip()
        length = int(declared) if declared.isdigit() else 0
        if length:
            self.body = self._read_body(length)
        self.server._waiting(self._connection, False)
        return True

    def _read_body(self, length: int) -> bytes:
        """Read ``length`` bytes of body within the minimum-rate deadline (module text); raises
        TimeoutError when the client is slower, ConnectionError when it closes early."""
        limits = self.server.limits
        by_rate = time.monotonic() + limits.body_grace_s + length / limits.min_body_rate
        self._deadline = min(self._deadline, by_rate)
        data = self._buffered.read(length)
        if len(data) < length:
            raise ConnectionError("the client closed the connection within the body")
        return data

    def handle_expect_100(self) -> bool:
        return not self._refuse_large_body() and super().handle_expect_100()

    def _refuse_large_body(self) -> bool:
        """Answer 413 (and close) when the declared body exceeds ``max_body_bytes``."""
        declared = (self.headers.get("Content-Length") or "").strip()
        limit = self.server.limits.max_body_bytes
        if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
            self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {limit} bytes")
            return True
        return False

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.connection is not self._accepted:
                # A TLS socket replaced the accepted one, which is all the server closes.
                _close(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.server.name, format % args)


def _peer(client_address: Any) -> str:
    """The address of a client (without the port)."""
    return str(client_address[0]) if isinstance(client_address, tuple) else ""


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    sock.close()


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` with the bounds of :class:`ServerLimits` (module docstring).

    ``address`` is ``(host, port)`` (``sharegpu.kube.telemetry.parse_address`` reads
    ``HOST:PORT``); an IPv6 host (``fd00::1``, as ``$(POD_IP)`` gives it) binds an IPv6
    socket. ``tls_context`` returns the context for each new connection (so certificates can
    be reloaded). ``rejected`` counts the connections closed at the cap without a thread,
    ``evicted`` those evicted there for a new one.
    """

    daemon_threads = True
    block_on_close = False
    #: Connections waiting to be accepted; the accept loop never blocks, so they drain fast.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BoundedRequestHandler],
        limits: ServerLimits | None = None,
        *,
        tls_context: Callable[[], ssl.SSLContext] | None = None,
        trusted: Callable[[ssl.SSLSocket], bool] | None = None,
        name: str = "http",
    ) -> None:
        if not issubclass(handler, BoundedRequestHandler):
            raise TypeError(f"{handler.__name__} must derive from BoundedRequestHandler")
        self.limits = DEFAULT_LIMITS if limits is None else limits
        self.tls_context = tls_context
        #: Whether a connection, its handshake done, is trusted (module text); TLS only.
        self.trusted = trusted if tls_context is not None else None
        self.name = name
        #: Connections closed at the cap without a thread, and connections evicted there.
        self.rejected = 0
        self.evicted = 0
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, _Connection] = {}
        self._evicting = 0
        #: Accepted sockets waiting for a handshake slot: (socket, address, accepted at).
        self._pending: collections.deque[tuple[socket.socket, Any, float]] = collections.deque()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self.server_address[1])

    @property
    def active_connections(self) -> int:
        """Connections that hold a thread now (evicted ones until their thread ends)."""
        with self._lock:
            return len(self._connections)

    @property
    def pending_connections(self) -> int:
        """Accepted sockets waiting, without a thread, for a handshake slot."""
        with self._lock:
            return len(self._pending)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Start a thread for the connection; at the cap (of all connections, or of its peer's)
        evict a staller for it, or queue it (with a ``trusted`` test), or close it."""
        now = time.monotonic()
        peer = _peer(client_address)
        pool = HANDSHAKE if self.trusted is not None else OPEN
        queued = False
        with self._lock:
            admitted = self._admit(peer, pool, now)
            if admitted:
                self._connections[request] = _Connection(request, peer, now, pool)
            elif pool == HANDSHAKE and len(self._pending) < PENDING_MAX:
                self._pending.append((request, client_address, now))
                queued = True
            else:
                self.rejected += 1
        if queued:
            return
        if not admitted:
            log.debug("%s: at the cap; closing the connection from %s", self.name, client_address)
            self.shutdown_request(request)
            return
        self._start_thread(request, client_address)

    def _start_thread(self, request: Any, client_address: Any) -> None:
        try:
            threading.Thread(
                target=self.process_request_thread,
                args=(request, client_address),
                name=f"{self.name}-conn",
                daemon=True,
            ).start()
        except RuntimeError:  # no thread can be started now
            self._release(request)
            log.warning("%s: cannot start a thread; closing a connection", self.name)
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)
            self._dispatch()

    def service_actions(self) -> None:
        """Between accepts: start queued connections that have room, close expired ones."""
        self._dispatch()

    def _dispatch(self) -> None:
        """Start each queued socket whose pool has room now (oldest first); close those that
        waited ``request_timeout_s``."""
        if self.trusted is None:
            return
        now = time.monotonic()
        start: list[tuple[socket.socket, Any]] = []
        expired: list[socket.socket] = []
        with self._lock:
            keep: collections.deque[tuple[socket.socket, Any, float]] = collections.deque()
            for request, address, queued_at in self._pending:
                peer = _peer(address)
                if now - queued_at >= self.limits.request_timeout_s:
                    expired.append(request)
                    self.rejected += 1
                elif self._admit(peer, HANDSHAKE, now):
                    self._connections[request] = _Connection(request, peer, now, HANDSHAKE)
                    start.append((request, address))
                else:
                    keep.append((request, address, queued_at))
            self._pending = keep
        for request in expired:
            self.shutdown_request(request)
        for request, address in start:
            self._start_thread(request, address)

    def _admit(self, peer: str, pool: str = OPEN, now: float = 0.0) -> bool:
        """Whether a new connection from ``peer`` gets a slot of ``pool``, evicting a staller
        of that pool and peer (at its per-peer cap) or of anyone (at the cap) for it. Called
        with the lock held."""
        held = sum(
            1
            for c in self._connections.values()
            if c.peer == peer and c.pool == pool and not c.evicted
        )
        if held >= self.limits.per_peer and (
            self._evicting >= EVICTING_MAX or not self._evict_one(pool, now, peer)
        ):
            return False
        in_pool = sum(1 for c in self._connections.values() if c.pool == pool and not c.evicted)
        if in_pool < self.limits.max_connections:
            return True
        return self._evicting < EVICTING_MAX and self._evict_one(pool, now)

    def _evict_one(self, pool: str = OPEN, now: float = 0.0, peer: str | None = None) -> bool:
        """Shut down the connection of ``pool`` (of ``peer``, when given) that has waited
        longest for a complete request (a handshake: at least :data:`HANDSHAKE_GRACE_S`); True
        when there was one. Called with the lock held."""
        oldest: _Connection | None = None
        oldest_since = 0.0
        for connection in self._connections.values():
            since = connection.waiting_since
            if connection.evicted or since is None or connection.pool != pool:
                continue
            if peer is not None and connection.peer != peer:
                continue
            if pool == HANDSHAKE and now - connection.since < HANDSHAKE_GRACE_S:
                continue
            if oldest is None or since < oldest_since:
                oldest, oldest_since = connection, since
        if oldest is None:
            return False
        oldest.evicted = True
        self._evicting += 1
        self.evicted += 1
        # The plain socket call, also for TLS sockets: it wakes the thread that reads.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(oldest.sock, socket.SHUT_RDWR)
        return True

    def _handshaken(self, connection: _Connection, sock: ssl.SSLSocket) -> None:
        """Move a connection out of the handshake pool (servers with a ``trusted`` test): into
        the trusted pool while it has room, else into its peer's slots at their caps. Raises
        ConnectionRefusedError (the connection is closed) when there is no slot for it."""
        if connection.pool != HANDSHAKE or self.trusted is None:
            return
        trusted = self.trusted(sock)
        with self._lock:
            connection.pool = ""  # out of the handshake pool while its new one is decided
            room = sum(1 for c in self._connections.values() if c.pool == TRUSTED)
            if trusted and room < self.limits.max_trusted_connections:
                connection.pool = TRUSTED
            elif self._admit(connection.peer, OPEN):
                connection.pool = OPEN
            else:
                self.rejected += 1
        self._dispatch()
        if not connection.pool:
            log.debug("%s: at the cap; closing the connection from %s", self.name, connection.peer)
            raise ConnectionRefusedError("at the connection cap")

    def _release(self, request: socket.socket) -> None:
        with self._lock:
            connection = self._connections.pop(request, None)
            if connection is not None and connection.evicted:
                self._evicting -= 1

    def _connection(self, request: socket.socket) -> _Connection:
        with self._lock:
            return self._connections[request]

    def _replace_socket(self, connection: _Connection, sock: socket.socket) -> None:
        """The TLS socket replaces the accepted one (same descriptor) for eviction."""
        with self._lock:
            connection.sock = sock
            evicted = connection.evicted
        if evicted:  # evicted during the handshake, while the accepted socket was detached
            raise ConnectionAbortedError("evicted at the connection cap")

    def _waiting(self, connection: _Connection, waiting: bool) -> None:
        with self._lock:
            connection.waiting_since = time.monotonic() if waiting else None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that go away, time out or fail the TLS handshake are expected: no traceback
        then; any other error is logged with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError | http.client.HTTPException):
            log.debug("%s: connection from %s failed: %s", self.name, client_address, error)
        else:
            log.error("%s: serving %s failed", self.name, client_address, exc_info=True)

    def start(self) -> Self:
        """Serve in a daemon thread named like the server; returns the server."""
        threading.Thread(
            target=self.serve_forever, args=(0.1,), name=self.name, daemon=True
        ).start()
        return self

    def server_close(self) -> None:
        """Close the listening socket and every connection still open."""
        super().server_close()
        with self._lock:
            live = [connection.sock for connection in self._connections.values()]
        for sock in live:
            # The plain socket call, also for TLS sockets: it only wakes the thread that reads.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def stop(self) -> None:
        """Stop serving and close the socket and the open connections."""
        self.shutdown()
        self.server_close()
