"""The sealed network of the end-to-end run: two network namespaces of its own, no route out.

``<name>`` holds the cluster: etcd, the control plane, containerd, the kubelet, kube-proxy, the
host-process daemons, kubectl and helm, and every pod (their namespaces hang off the CNI bridge
inside it). Its node address :data:`NODE_IP` sits on one end of a veth pair, so the kubelet's
InternalIP, the ``kubernetes`` Service's endpoints and every EndpointSlice are ordinary
addresses. The default route leads to the other end, in ``<name>-edge``: a namespace with
forwarding on, no route beyond the link and no ICMP rate limit, so a packet for any address that
is neither in the cluster nor a Service with endpoints is answered at once with "network
unreachable", never forwarded and never left to time out. Neither namespace has a link to the
machine's own network namespace.

Children enter the cluster namespace with ``nsenter --net`` only (:meth:`SealedNetwork.argv`), so
they share the machine's mounts as the kubelet and containerd must. The test process itself
reaches the cluster from threads that joined the namespace (:meth:`SealedNetwork.call`, or
:func:`enter` on a thread of its own): a socket belongs to the namespace of the thread that made
it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TypeVar

#: Where ``ip netns`` keeps its namespaces.
NETNS_DIR: Final = Path("/run/netns")
#: The node's address (the kubelet's InternalIP, the API server's advertised address).
NODE_IP: Final = "172.31.250.2"
#: The edge's address: the cluster namespace's default gateway, which reaches nothing.
EDGE_IP: Final = "172.31.250.1"
PREFIX: Final = 30
NODE_LINK: Final = "sgnode0"
EDGE_LINK: Final = "sgedge0"
#: Services' ClusterIPs (kube-apiserver and kube-controller-manager) and the pods' addresses
#: (the CNI bridge's host-local range).
SERVICE_CIDR: Final = "10.96.0.0/24"
POD_CIDR: Final = "10.244.0.0/24"
#: The ``kubernetes`` Service's ClusterIP (the first of the service range).
KUBERNETES_SERVICE_IP: Final = "10.96.0.1"
#: Addresses the seal is proven with: one in the service range that no Service has, one in the
#: pod range that no pod has, and ones outside the cluster (the documentation range and a public
#: resolver's address). None may answer or leave.
SEAL_PROBES: Final = (
    ("a service address with no Service", "10.96.0.250", 443),
    ("a pod address with no pod", "10.244.0.250", 80),
    ("an outside address (documentation range)", "192.0.2.1", 80),
    ("an outside address (public)", "8.8.8.8", 443),
)
#: What a sealed connection attempt may end with: refused, or no route (the edge's answer, or a
#: neighbour on the pod bridge that never answers ARP).
SEALED_ERRNOS: Final = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNREFUSED})
#: Seconds a probe may wait before it counts as a timeout (a failed seal).
PROBE_TIMEOUT_S: Final = 20.0
_CLONE_NEWNET: Final = 0x40000000

T = TypeVar("T")


class SealBroken(AssertionError):
    """A connection from inside the sealed namespace did not fail as the seal requires."""


def missing_network_prerequisites() -> list[str]:
    """What the sealed network needs and this machine lacks."""
    return [
        f"no {tool} on PATH (iproute2, util-linux)"
        for tool in ("ip", "nsenter")
        if shutil.which(tool) is None
    ]


def _ip(*args: str) -> None:
    """Run ``ip`` with ``args``; a failure raises with ip's message."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def enter(path: Path) -> None:
    """Move the calling thread into the network namespace at ``path``: every socket it opens
    afterwards, and every thread it starts, is that namespace's. An ``OSError`` naming the path
    when ``setns`` fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    with path.open("rb") as ns:
        if libc.setns(ns.fileno(), _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns({path}): {os.strerror(code)}")


class SealedNetwork:
    """The two namespaces of one run; :meth:`create`, then :meth:`remove` (idempotent)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"sg-e2e-{uuid.uuid4().hex[:8]}"
        self.edge = f"{self.name}-edge"
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def path(self) -> Path:
        """The cluster namespace's file (for ``nsenter --net`` and ``setns``)."""
        return NETNS_DIR / self.name

    # --- lifecycle ---------------------------------------------------------------------------

    def create(self) -> None:
        """Create both namespaces, the veth pair between them, the node address and the default
        route to the edge; on failure remove what was made and raise."""
        try:
            _ip("netns", "add", self.name)
            _ip("netns", "add", self.edge)
            for ns in (self.name, self.edge):
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip(
                "-n", self.name, "link", "add", NODE_LINK, "type", "veth",
                "peer", "name", EDGE_LINK, "netns", self.edge,
            )  # fmt: skip
            _ip("-n", self.name, "addr", "add", f"{NODE_IP}/{PREFIX}", "dev", NODE_LINK)
            _ip("-n", self.edge, "addr", "add", f"{EDGE_IP}/{PREFIX}", "dev", EDGE_LINK)
            _ip("-n", self.name, "link", "set", NODE_LINK, "up")
            _ip("-n", self.edge, "link", "set", EDGE_LINK, "up")
            _ip("-n", self.name, "route", "add", "default", "via", EDGE_IP)
            # The edge answers every packet it cannot forward at once ("network unreachable").
            self._sysctl(self.edge, "net.ipv4.ip_forward", "1")
            self._sysctl(self.edge, "net.ipv4.icmp_ratelimit", "0")
            self._sysctl(self.edge, "net.ipv4.icmp_msgs_per_sec", "1000000")
            self._sysctl(self.edge, "net.ipv4.icmp_msgs_burst", "1000000")
            # Pods' traffic is routed by the node, and bridged traffic passes kube-proxy's rules.
            self._sysctl(self.name, "net.ipv4.ip_forward", "1")
            if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
                self._sysctl(self.name, "net.bridge.bridge-nf-call-iptables", "1")
        except Exception:
            self.remove()
            raise

    def remove(self) -> None:
        """Stop the namespace's threads and delete both namespaces (their interfaces go with
        them once no process is left inside)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        for ns in (self.name, self.edge):
            if (NETNS_DIR / ns).exists():
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)

    def _sysctl(self, namespace: str, key: str, value: str) -> None:
        path = Path("/proc/sys") / key.replace(".", "/")
        argv = ["nsenter", f"--net={NETNS_DIR / namespace}", "--", "sh", "-c", 'echo "$1" > "$2"']
        result = subprocess.run(
            [*argv, "sh", value, str(path)], capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            raise RuntimeError(f"sysctl {key}={value} in {namespace}: {result.stderr.strip()}")

    # --- entering ----------------------------------------------------------------------------

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the cluster namespace (network only: mounts are the machine's)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on a thread inside the cluster namespace: every socket it opens is the
        namespace's."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=4,
                thread_name_prefix=f"netns-{self.name}",
                initializer=enter,
                initargs=(self.path,),
            )
        return self._executor.submit(fn, *args).result()

    def inode(self) -> int:
        """The cluster namespace's inode (what ``/proc/<pid>/ns/net`` of a process inside it
        points to)."""
        return self.path.stat().st_ino

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` runs in the cluster namespace."""
        return os.stat(f"/proc/{pid}/ns/net").st_ino == self.inode()

    # --- the seal ----------------------------------------------------------------------------

    def probe(self, host: str, port: int) -> int:
        """Connect from inside the namespace to ``host:port``; returns the errno it failed with.
        An answer or a timeout raises :class:`SealBroken`."""

        def attempt() -> int:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(PROBE_TIMEOUT_S)
                try:
                    s.connect((host, port))
                except TimeoutError:
                    raise SealBroken(
                        f"{host}:{port}: no answer within {PROBE_TIMEOUT_S:.0f}s (a timeout: the "
                        "packet went somewhere instead of being refused)"
                    ) from None
                except OSError as exc:
                    return exc.errno or 0
                raise SealBroken(f"{host}:{port}: a connection was accepted")

        return self.call(attempt)

    def prove_sealed(self, probes: Sequence[tuple[str, str, int]] = SEAL_PROBES) -> list[str]:
        """Probe each address of ``probes``; returns one line per probe (what it got) or raises
        :class:`SealBroken` naming every probe that did not fail as it must."""
        lines: list[str] = []
        broken: list[str] = []
        for what, host, port in probes:
            try:
                code = self.probe(host, port)
            except SealBroken as exc:
                broken.append(f"{what}: {exc}")
                continue
            line = f"{what} {host}:{port}: {errno.errorcode.get(code, code)}"
            (lines if code in SEALED_ERRNOS else broken).append(line)
        if broken:
            raise SealBroken("the network namespace is not sealed:\n  " + "\n  ".join(broken))
        return lines
