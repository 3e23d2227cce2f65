"""The bounded HTTP server: connection cap, request deadline, idle and write timeouts, sizes.

Clients are plain sockets driven from the test thread, so the only threads that come and go are
the server's. No test asserts how fast an answer came: a client answered while the stallers it
competes with are still connected (their deadline not reached) was answered because the server
made room for it, and a server that does not ends the client's wait at the client's own generous
timeout (``PATIENCE_S``), shorter than those stallers' deadline.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme

from sharegpu.kube import httpserve
from sharegpu.kube.httpserve import (
    EVICTING_MAX,
    BoundedHTTPServer,
    BoundedRequestHandler,
    ServerLimits,
)
from sharegpu.kube.telemetry import Telemetry, serve_metrics
from tests.helpers import PATIENCE_S, eventually
from tests.kube.helpers import (
    all_closed,
    get,
    get_with_retries,
    is_closed,
    short_limits,
    stall,
    trickle,
)

STALLERS = 300
#: The deadline of stallers that must not be waited for: longer than a client's patience, so a
#: client answered at all was answered while they still held their slots.
HELD_S = 2 * PATIENCE_S


class _Hello(BoundedRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        size = int(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/bytes/") else 3
        body = b"ok\n" if size == 3 else b"x" * size
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


Serve = Callable[..., BoundedHTTPServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[BoundedHTTPServer] = []

    def start(
        limits: ServerLimits, tls_context: Callable[[], ssl.SSLContext] | None = None
    ) -> BoundedHTTPServer:
        server = BoundedHTTPServer(("127.0.0.1", 0), _Hello, limits, tls_context=tls_context)
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def _close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def test_stallers_above_the_cap_get_no_thread_and_are_all_cut(serve: Serve) -> None:
    """300 connections that send one header byte and stall, against a cap of 16 and a 1 s
    deadline: the server never runs more than 16 connection threads (plus evicted ones
    ending), a well-behaved client is answered, and every staller is cut."""
    cap = 16
    baseline = threading.active_count()
    server = serve(short_limits(max_connections=cap))
    stallers: list[socket.socket] = []
    peak = 0
    try:
        for _ in range(STALLERS):
            stallers.append(stall(server.port))
            peak = max(peak, threading.active_count())
        assert get_with_retries(server.port) == 200
        peak = max(peak, threading.active_count())
        all_closed(stallers)
        peak = max(peak, threading.active_count())
    finally:
        _close_all(stallers)
    # The serving thread plus at most `cap` connection threads and the evicted ones ending.
    assert peak <= baseline + 1 + cap + EVICTING_MAX, (peak, baseline)
    assert server.rejected + server.evicted > 0  # the cap was reached
    eventually(lambda: server.active_connections == 0)
    eventually(lambda: threading.active_count() <= baseline + 1)


def test_a_client_is_answered_while_stallers_hold_every_slot(serve: Serve) -> None:
    """With every slot held by a staller (and their deadline far away), a new client takes
    the slot of the one that has waited longest and is answered at once; the others stay."""
    cap = 16
    # One peer may take every slot here (the per-peer cap has its own tests).
    server = serve(
        short_limits(request_timeout_s=HELD_S, max_connections=cap, max_connections_per_peer=cap)
    )
    stallers = [stall(server.port) for _ in range(STALLERS)]
    try:
        eventually(lambda: server.active_connections == cap)
        assert get_with_retries(server.port) == 200
        # Answered while (nearly) every staller still holds its slot: by eviction, not by
        # waiting for their deadline (the client gives up after PATIENCE_S).
        still_open = [s for s in stallers if not is_closed(s)]
        assert len(still_open) >= cap - EVICTING_MAX - 1
        assert server.evicted >= 1
    finally:
        _close_all(stallers)


def test_clients_are_answered_while_stallers_keep_reconnecting(serve: Serve) -> None:
    """A slowloris that keeps opening connections as fast as it can (one byte each, never
    closed) does not starve clients that send their request at once: each is answered (long
    before the stallers' deadline frees a slot), and the server's threads stay within the
    cap."""
    cap = 16
    baseline = threading.active_count()
    server = serve(
        short_limits(request_timeout_s=HELD_S, max_connections=cap, max_connections_per_peer=cap)
    )
    stop = threading.Event()
    held: list[socket.socket] = []

    def attack() -> None:
        while not stop.is_set() and len(held) < 3000:
            held.append(stall(server.port))

    attacker = threading.Thread(target=attack, name="slowloris", daemon=True)
    attacker.start()
    peak = 0
    try:
        eventually(lambda: server.active_connections >= cap)
        for _ in range(10):
            assert get_with_retries(server.port) == 200
            peak = max(peak, threading.active_count())
    finally:
        stop.set()
        attacker.join(PATIENCE_S)
        _close_all(held)
    # The attacker's thread, the serving thread, the cap and the evicted ones ending.
    assert peak <= baseline + 2 + cap + EVICTING_MAX, (peak, baseline)
    assert len(held) > cap  # the attack was on while the clients were answered


def test_tricklers_are_cut_at_the_deadline_while_others_are_answered(
    serve: Serve,
) -> None:
    """300 connections that each send one header byte every 0.5 s (each read would finish well
    within any per-read timeout) are all cut at the 5 s request deadline; meanwhile, with all
    of them connected, a well-behaved client is answered (while they are still connected)."""
    server = serve(
        short_limits(
            request_timeout_s=5.0,
            max_connections=STALLERS + 50,
            max_connections_per_peer=STALLERS + 50,
        )
    )
    request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    before = time.monotonic()
    tricklers = [stall(server.port, request[:1]) for _ in range(STALLERS)]
    try:
        eventually(lambda: server.active_connections == STALLERS)
        assert get(server.port) == (200, b"ok\n")
        assert not any(is_closed(s) for s in tricklers[:10])  # still connected meanwhile
        still_open = trickle(tricklers, request)
        assert not still_open, f"{len(still_open)} tricklers still connected"
        assert time.monotonic() - before >= 5.0  # cut at the deadline, not before
    finally:
        _close_all(tricklers)
    eventually(lambda: server.active_connections == 0)


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(
    serve: Serve,
) -> None:
    server = serve(short_limits())
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=PATIENCE_S)
    try:
        for _ in range(3):  # kept alive between requests sent at once
            conn.request("GET", "/")
            assert conn.getresponse().read() == b"ok\n"
        assert conn.sock is not None
        all_closed([conn.sock])
    finally:
        conn.close()
    eventually(lambda: server.active_connections == 0)


def test_a_client_that_does_not_read_its_answer_is_cut(
    serve: Serve,
) -> None:
    server = serve(short_limits())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(PATIENCE_S)
    try:
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"GET /bytes/67108864 HTTP/1.1\r\nHost: x\r\n\r\n")
        eventually(lambda: server.active_connections == 1)
        eventually(lambda: server.active_connections == 0)
    finally:
        sock.close()


def test_oversized_bodies_and_heads_are_refused_unread(
    serve: Serve,
) -> None:
    server = serve(short_limits(max_body_bytes=1000, max_header_bytes=16384))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=PATIENCE_S)
    try:
        conn.request("POST", "/", body=b"x" * 1000)
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"x" * 1000)
        conn.putrequest("POST", "/")
        conn.putheader("Content-Length", "1001")
        conn.endheaders()  # the body is never sent: the answer comes first
        resp = conn.getresponse()
        assert resp.status == 413 and resp.getheader("Connection") == "close"
        resp.read()
    finally:
        conn.close()
    sock = stall(server.port, b"GET / HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
    try:
        assert b" 413 " in sock.recv(100).split(b"\r\n")[0]
    finally:
        sock.close()
    head = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 500) for i in range(50))
    sock = stall(server.port, head)
    try:
        assert b" 431 " in sock.recv(100).split(b"\r\n")[0]
    finally:
        sock.close()


def test_tls_handshakes_run_in_connection_threads_under_the_deadline(
    serve: Serve, tmp_path: Path
) -> None:
    """Clients that open TCP and never finish the TLS handshake block neither the accept loop
    nor a thread past the deadline; TLS clients are answered meanwhile."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    server = serve(short_limits(max_connections=8), tls_context=lambda: server_context)
    stallers = [stall(server.port, b"\x16") for _ in range(4)]  # half a TLS record header
    try:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=client_context, timeout=PATIENCE_S
        )
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"ok\n"
        conn.close()
        all_closed(stallers)
    finally:
        _close_all(stallers)
    eventually(lambda: server.active_connections == 0)


def test_stop_closes_the_open_connections() -> None:
    server = BoundedHTTPServer(("127.0.0.1", 0), _Hello, ServerLimits(request_timeout_s=60)).start()
    stallers = [stall(server.port) for _ in range(5)]
    try:
        eventually(lambda: server.active_connections == 5)
        server.stop()
        all_closed(stallers, timeout_s=5.0)
        eventually(lambda: server.active_connections == 0, timeout_s=5.0)
    finally:
        _close_all(stallers)


def test_handlers_must_be_bounded_and_limits_positive() -> None:
    from http.server import BaseHTTPRequestHandler

    with pytest.raises(TypeError, match="BoundedRequestHandler"):
        BoundedHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        ServerLimits(max_connections=0)
    with pytest.raises(ValueError, match="positive"):
        ServerLimits(request_timeout_s=0)


def test_an_ipv6_host_binds_an_ipv6_socket() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        server = BoundedHTTPServer(("::1", 0), _Hello).start()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert server.socket.family == socket.AF_INET6
        conn = http.client.HTTPConnection("::1", server.port, timeout=PATIENCE_S)
        conn.request("GET", "/")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.stop()


def test_serve_metrics_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """``/metrics`` (both daemons): a request not read within the deadline is cut, and
    connections above the cap get no thread."""
    monkeypatch.setattr(httpserve, "DEFAULT_LIMITS", short_limits(max_connections=4))
    baseline = threading.active_count()
    telemetry = Telemetry("test-metrics")
    server = serve_metrics(telemetry, "127.0.0.1:0")
    port = server.server_address[1]

    def within_the_cap() -> None:
        assert threading.active_count() <= baseline + 1 + 4 + EVICTING_MAX

    stallers = [stall(port) for _ in range(20)]
    try:
        # Every staller is served or refused and then cut; until the last one is, the server's
        # threads stay within the cap (plus evicted ones ending).
        all_closed(stallers, meanwhile=within_the_cap)
        assert get_with_retries(port, "/metrics") == 200
    finally:
        _close_all(stallers)
        server.shutdown()
        server.server_close()
        telemetry.shutdown()


def stall_from(port: int, source: str, first: bytes) -> socket.socket:
    """A connection from the loopback address ``source`` (127.0.0.0/8) that sends ``first``
    and nothing more."""
    sock = socket.create_connection(
        ("127.0.0.1", port), timeout=PATIENCE_S, source_address=(source, 0)
    )
    with contextlib.suppress(OSError):
        sock.sendall(first)
    return sock


def slow_body_head(length: int = 60_000) -> bytes:
    """A complete request head declaring a body of ``length`` bytes, and the body's first byte."""
    return f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode() + b"x"


def test_one_peer_holds_at_most_its_share_of_the_slots(serve: Serve) -> None:
    """40 stallers from one address against 16 slots, 4 per peer: that peer keeps 4 (each new
    one evicts its own oldest), so clients from elsewhere are answered without evicting."""
    server = serve(
        short_limits(request_timeout_s=60.0, max_connections=16, max_connections_per_peer=4)
    )
    stallers = [stall_from(server.port, "127.0.0.2", b"G") for _ in range(40)]
    try:
        # Every one accepted: 36 evicted (or closed at once while 8 evictions were ending).
        eventually(lambda: server.evicted + server.rejected == 36)
        eventually(lambda: server.active_connections == 4)
        evicted = server.evicted
        assert get(server.port) == (200, b"ok\n")
        assert server.evicted == evicted
        assert sum(not is_closed(s) for s in stallers) == 4
    finally:
        _close_all(stallers)


def test_slow_bodies_are_evicted_at_the_cap(serve: Serve) -> None:
    """Every slot held by a connection that sent its head and trickles its body (from several
    addresses, so no per-peer cap applies): a new client takes the slot of the oldest and is
    answered. These used to be unevictable past their head."""
    server = serve(
        short_limits(request_timeout_s=60.0, max_connections=8, min_body_rate=1, body_grace_s=60.0)
    )
    holders = [stall_from(server.port, f"127.0.0.{2 + i}", slow_body_head()) for i in range(8)]
    try:
        eventually(lambda: server.active_connections == 8)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=PATIENCE_S)
        try:
            conn.request("POST", "/", body=b"hello")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"hello")
        finally:
            conn.close()
        assert server.evicted >= 1
    finally:
        _close_all(holders)


def test_a_body_slower_than_the_minimum_rate_is_cut_long_before_the_deadline(
    serve: Serve,
) -> None:
    """A declared 60,000-byte body at a byte a second: at 64 KiB/s after a 1 s grace it must
    arrive within about 2 s, so it is cut then, not at the 60 s request deadline."""
    server = serve(short_limits(request_timeout_s=60.0, max_connections=8))
    slow = [stall_from(server.port, "127.0.0.2", slow_body_head()) for _ in range(2)]
    try:
        assert trickle(slow, b"x" * 100, interval_s=1.0, timeout_s=PATIENCE_S) == []
    finally:
        _close_all(slow)
