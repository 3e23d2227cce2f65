"""The plugin's two gRPC servers: the DRA endpoint and the kubelet registration socket.

Order matters: :meth:`PluginServer.start` serves the DRA endpoint (``<data-dir>/dra.sock``) first
and only then the registration socket (``<registry-dir>/<driver>-reg.sock``), so kubelet never
learns of an endpoint that is not answering yet. :meth:`PluginServer.stop` closes registration
first, then the endpoint, and removes both sockets (kubelet then deregisters the driver).

Calls run on a thread pool with no lock in this layer, so prepares of different claims run in
parallel; serialising where needed is the :class:`ClaimPreparer`'s business. Kubelet restarts
need no action: kubelet re-probes the same registration socket and reconnects to the endpoint.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import grpc

from kubeletplugin.kubelet.draservice import DraService, DraV1beta1Servicer, DraV1Servicer
from kubeletplugin.kubelet.grpcapi.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2_grpc,
)
from kubeletplugin.kubelet.healthservice import (
    HEALTH_APIS,
    MAX_HEALTH_STREAMS,
    HealthServicer,
    HealthSource,
)
from kubeletplugin.kubelet.preparer import ClaimPreparer
from kubeletplugin.kubelet.registration import (
    RegistrationServicer,
    registration_socket_path,
    supported_versions,
)
from kubeletplugin.kubelet.sockets import SocketPathError, UnixSocketPath

log = logging.getLogger(__name__)

DRA_SOCKET_NAME = "dra.sock"
# Long-lived health streams get their own workers (one per stream the health servicer allows)
# so they never starve prepares.
HEALTH_STREAM_WORKERS = MAX_HEALTH_STREAMS
REGISTRATION_WORKERS = 2
#: How long the liveness self-check waits for the DRA endpoint to answer.
LIVENESS_TIMEOUT_S = 5.0


def dra_socket_path(data_dir: Path) -> Path:
    """``<plugin-data-dir>/dra.sock``."""
    return data_dir / DRA_SOCKET_NAME


class PluginServer:
    """Serves DRA v1 and v1beta1 (plus health v1 and v1alpha1 when a source is given) and
    registers with kubelet, advertising exactly those services.

    Paths are made absolute (not symlink-resolved: kubelet must see the same path). ``start`` may
    be called once; ``stop`` any number of times. Use as a context manager to stop on every exit
    path. ``stop`` waits for in-flight calls: on SIGTERM/SIGINT, let the handler only set a flag
    or event and call ``stop`` from the main flow, not from inside the handler.
    """

    def __init__(
        self,
        driver_name: str,
        registry_dir: Path,
        data_dir: Path,
        preparer: ClaimPreparer,
        health_source: HealthSource | None = None,
        max_workers: int = 32,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.driver_name = driver_name
        self.dra_socket = UnixSocketPath(dra_socket_path(Path(data_dir).absolute()))
        self.registration_socket = UnixSocketPath(
            registration_socket_path(Path(registry_dir).absolute(), driver_name)
        )
        self.service = DraService(preparer)
        health_services = [api.service for api in HEALTH_APIS] if health_source is not None else []
        self.registration = RegistrationServicer(
            driver_name, self.dra_socket.path, supported_versions(health_services)
        )
        self._health_source = health_source
        self._max_workers = max_workers
        self._dra_server: grpc.Server | None = None
        self._registration_server: grpc.Server | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> None:
        """Bind and serve the DRA endpoint, then the registration socket."""
        with self._lock:
            if self._dra_server is not None or self._stopped:
                raise RuntimeError("PluginServer.start may be called only once")
            workers = self._max_workers
            if self._health_source is not None:
                workers += HEALTH_STREAM_WORKERS
            dra = grpc.server(ThreadPoolExecutor(workers, thread_name_prefix="dra-grpc"))
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1Servicer(self.service), dra)
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                DraV1beta1Servicer(self.service), dra
            )
            if self._health_source is not None:
                HealthServicer(self._health_source).add_to_server(dra)
            self._dra_server = dra
            _serve(dra, self.dra_socket)
            log.info("serving DRA endpoint %s", self.dra_socket.path)

            reg = grpc.server(
                ThreadPoolExecutor(REGISTRATION_WORKERS, thread_name_prefix="dra-registration")
            )
            pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(
                self.registration, reg
            )
            self._registration_server = reg
            try:
                _serve(reg, self.registration_socket)
            except BaseException:
                self._stop_locked(grace=None)
                raise
            log.info("serving kubelet registration on %s", self.registration_socket.path)

    def responsive(self, timeout_s: float = LIVENESS_TIMEOUT_S) -> bool:
        """Whether the DRA endpoint answers an empty ``NodePrepareResources`` on its own socket
        within ``timeout_s``: the liveness check, which fails when every worker is stuck (or
        the socket is gone). True while the server is not running (nothing to probe)."""
        with self._lock:
            if self._dra_server is None:
                return True
        try:
            with grpc.insecure_channel(f"unix:{self.dra_socket.path}") as channel:
                dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(), timeout=timeout_s
                )
        except grpc.RpcError as exc:
            log.warning(
                "liveness: the DRA endpoint did not answer within %gs (%s)",
                timeout_s,
                exc.code() if isinstance(exc, grpc.Call) else exc,
            )
            return False
        return True

    def stop(self, grace: float | None = 5.0) -> None:
        """Stop both servers (in-flight calls get ``grace`` seconds) and remove the sockets."""
        with self._lock:
            self._stop_locked(grace)

    def _stop_locked(self, grace: float | None) -> None:
        self._stopped = True
        for server, socket in (
            (self._registration_server, self.registration_socket),
            (self._dra_server, self.dra_socket),
        ):
            if server is not None:
                server.stop(grace).wait()
            socket.remove()
        self._registration_server = None
        self._dra_server = None

    def __enter__(self) -> PluginServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _serve(server: grpc.Server, socket: UnixSocketPath) -> None:
    socket.prepare()
    try:
        server.add_insecure_port(socket.address)
    except RuntimeError as err:
        raise SocketPathError(f"cannot bind gRPC server to {socket.path}: {err}") from err
    socket.restrict()
    server.start()
