"""The kubelet side of a DRA plugin, for ``sharegpu demo`` and the tests: a gRPC client over the
plugin's real unix sockets (:class:`KubeletSim` -> :meth:`KubeletSim.register` ->
:class:`RegisteredPlugin` with ``prepare``, ``unprepare`` and ``watch_health``).

Invariants, as kubelet does it: registration is ``GetInfo`` on ``<registry>/<driver>-reg.sock``,
the type and name checked, the first of the *plugin's* ``supported_versions`` this kubelet
supports, a wait until the endpoint answers, then ``NotifyRegistrationStatus`` (with no common
version, or ``reject=``, ``plugin_registered=False`` and :class:`RegistrationRejected`). The
health service is the first of *kubelet's* health versions, newest first, that the plugin
advertises (:func:`health_versions`; 1.37 knows ``v1`` and ``v1alpha1``). Calls carry kubelet's
45 s deadline; ``share_id`` is None when absent on the wire (always for v1beta1)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import grpc

from kubeletplugin.kubelet.grpcapi.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

KUBELET_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
#: The Kubernetes version the simulated kubelet has unless told otherwise.
DEFAULT_KUBERNETES_VERSION = "1.37"
#: Kubernetes minor versions the simulator knows (the driver's range).
KNOWN_MINORS = range(34, 38)
CALL_TIMEOUT_S = 45.0

_DRA_APIS: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
_HEALTH_APIS: dict[str, tuple[Any, Any]] = {
    "v1.DRAResourceHealth": (drahealth_v1_pb2, drahealth_v1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc),
}


def health_versions(kubernetes_version: str) -> tuple[str, ...]:
    """The health services a kubelet of ``kubernetes_version`` ("1.N") consumes, newest first.

    Raises ValueError naming the allowed versions for anything else."""
    major, _, minor = kubernetes_version.partition(".")
    if major != "1" or not minor.isdigit() or int(minor) not in KNOWN_MINORS:
        allowed = ", ".join(f"1.{m}" for m in KNOWN_MINORS)
        raise ValueError(f"kubernetes_version: {kubernetes_version!r} is not one of {allowed}")
    if int(minor) >= 37:
        return ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
    return ("v1alpha1.DRAResourceHealth",)


class RegistrationRejected(RuntimeError):
    """The simulated kubelet refused the plugin (and told it so)."""


@dataclass(frozen=True)
class SimDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True)
class SimClaimResult:
    devices: tuple[SimDevice, ...]
    error: str


@dataclass(frozen=True)
class SimDeviceHealth:
    pool_name: str
    device_name: str
    health: str  # "UNKNOWN" | "HEALTHY" | "UNHEALTHY"
    last_updated_time: int
    health_check_timeout_seconds: int
    message: str


@dataclass(frozen=True)
class SimPluginInfo:
    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


class ClaimKey(Protocol):
    """What kubelet sends about a claim: its namespace, UID and name (any object with them, such
    as a :class:`ClaimRef`)."""

    @property
    def namespace(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class ClaimRef:
    """A claim as kubelet names it in NodePrepareResources and NodeUnprepareResources."""

    namespace: str
    uid: str
    name: str


def _unix_channel(path: str | Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix:{path}")


def _claim_messages(pb: Any, claims: Iterable[ClaimKey]) -> list[Any]:
    return [pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


class HealthWatch:
    """Reads one NodeWatchResources stream of health service ``version`` in a background
    thread."""

    def __init__(self, channel: grpc.Channel, version: str) -> None:
        self.version = version
        pb, pb_grpc = _HEALTH_APIS[version]
        self._pb = pb
        stub = pb_grpc.DRAResourceHealthStub(channel)
        self._call = stub.NodeWatchResources(pb.NodeWatchResourcesRequest())
        self._updates: queue.Queue[list[SimDeviceHealth] | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._read, name="kubelet-sim-health", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self._updates.put(
                    [
                        SimDeviceHealth(
                            pool_name=d.device.pool_name,
                            device_name=d.device.device_name,
                            health=self._pb.HealthStatus.Name(d.health),
                            last_updated_time=d.last_updated_time,
                            health_check_timeout_seconds=d.health_check_timeout_seconds,
                            message=d.message,
                        )
                        for d in response.devices
                    ]
                )
        except grpc.RpcError as err:
            self._updates.put(err)
        else:
            self._updates.put(EOFError("health stream ended"))

    def next(self, timeout: float = 10.0) -> list[SimDeviceHealth]:
        """The next complete device list; raises queue.Empty on timeout, or the stream's end."""
        item = self._updates.get(timeout=timeout)
        if isinstance(item, BaseException):
            self._updates.put(item)
            raise item
        return item

    def close(self) -> None:
        """Disconnect (cancel the stream) and wait for the reader to finish."""
        self._call.cancel()
        self._thread.join(timeout=10.0)


class RegisteredPlugin:
    """A plugin that completed the handshake; talks to its DRA endpoint."""

    def __init__(self, info: SimPluginInfo, version: str, health_version: str | None) -> None:
        self.info = info
        self.version = version
        self.health_version = health_version
        self._channel = _unix_channel(info.endpoint)
        self._watches: list[HealthWatch] = []

    def wait_ready(self, timeout: float) -> None:
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def prepare(
        self, claims: Sequence[ClaimKey], version: str | None = None
    ) -> dict[str, SimClaimResult]:
        pb, pb_grpc = _DRA_APIS[version or self.version]
        stub = pb_grpc.DRAPluginStub(self._channel)
        request = pb.NodePrepareResourcesRequest(claims=_claim_messages(pb, claims))
        response = stub.NodePrepareResources(request, timeout=CALL_TIMEOUT_S)
        has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name
        return {
            uid: SimClaimResult(
                devices=tuple(
                    SimDevice(
                        request_names=tuple(d.request_names),
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        cdi_device_ids=tuple(d.cdi_device_ids),
                        share_id=d.share_id if has_share_id and d.HasField("share_id") else None,
                    )
                    for d in entry.devices
                ),
                error=entry.error,
            )
            for uid, entry in response.claims.items()
        }

    def unprepare(self, claims: Sequence[ClaimKey], version: str | None = None) -> dict[str, str]:
        pb, pb_grpc = _DRA_APIS[version or self.version]
        stub = pb_grpc.DRAPluginStub(self._channel)
        request = pb.NodeUnprepareResourcesRequest(claims=_claim_messages(pb, claims))
        response = stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT_S)
        return {uid: entry.error for uid, entry in response.claims.items()}

    def watch_health(self, version: str | None = None) -> HealthWatch:
        """Open a health stream in ``version`` (default: the one chosen at registration)."""
        chosen = version or self.health_version
        if chosen is None:
            raise RuntimeError(
                f"the plugin advertises no health service this kubelet consumes "
                f"(it advertises {list(self.info.supported_versions)})"
            )
        if chosen not in _HEALTH_APIS:
            raise ValueError(f"version: {chosen!r} is not one of {sorted(_HEALTH_APIS)}")
        watch = HealthWatch(self._channel, chosen)
        self._watches.append(watch)
        return watch

    def close(self) -> None:
        for watch in self._watches:
            watch.close()
        self._channel.close()

    def __enter__(self) -> RegisteredPlugin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class KubeletSim:
    """The registration side of kubelet for DRA plugins in one registry directory."""

    def __init__(
        self,
        registry_dir: Path,
        supported: Sequence[str] = KUBELET_VERSIONS,
        kubernetes_version: str = DEFAULT_KUBERNETES_VERSION,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.supported = tuple(supported)
        self.kubernetes_version = kubernetes_version
        self.health_supported = health_versions(kubernetes_version)
        self._plugins: list[RegisteredPlugin] = []

    def registration_sockets(self) -> list[Path]:
        """Sockets in the registry directory, ignoring dot-files as kubelet's watcher does."""
        return sorted(
            p for p in self.registry_dir.iterdir() if not p.name.startswith(".") and p.is_socket()
        )

    def registration_socket(self, driver_name: str) -> Path:
        """Where the plugin of ``driver_name`` serves its registration (``<driver>-reg.sock``)."""
        return self.registry_dir / f"{driver_name}-reg.sock"

    def get_info(self, driver_name: str, timeout: float = 10.0) -> SimPluginInfo:
        """Only the GetInfo step."""
        with _unix_channel(self.registration_socket(driver_name)) as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = stub.GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True
            )
        return SimPluginInfo(
            type=info.type,
            name=info.name,
            endpoint=info.endpoint,
            supported_versions=tuple(info.supported_versions),
        )

    def notify(self, driver_name: str, registered: bool, error: str = "") -> None:
        """Only the NotifyRegistrationStatus step."""
        with _unix_channel(self.registration_socket(driver_name)) as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(
                    plugin_registered=registered, error=error
                ),
                timeout=CALL_TIMEOUT_S,
            )

    def register(
        self, driver_name: str, timeout: float = 10.0, reject: str | None = None
    ) -> RegisteredPlugin:
        """The whole handshake; see the module docstring."""
        info = self.get_info(driver_name, timeout)
        problem = reject
        if problem is None and info.type != "DRAPlugin":
            problem = f"plugin type {info.type!r} is not DRAPlugin"
        if problem is None and info.name != driver_name:
            problem = f"plugin name {info.name!r} does not match socket of {driver_name!r}"
        version = next((v for v in info.supported_versions if v in self.supported), None)
        if problem is None and version is None:
            problem = (
                f"none of the plugin's versions {list(info.supported_versions)} is supported "
                f"(kubelet supports {list(self.supported)})"
            )
        if problem is not None or version is None:
            self.notify(driver_name, False, problem or "rejected")
            raise RegistrationRejected(problem)
        health = next((v for v in self.health_supported if v in info.supported_versions), None)
        plugin = RegisteredPlugin(info, version, health)
        try:
            plugin.wait_ready(timeout)
        except grpc.FutureTimeoutError:
            plugin.close()
            error = f"endpoint {info.endpoint} did not answer within {timeout} s"
            self.notify(driver_name, False, error)
            raise RegistrationRejected(error) from None
        self.notify(driver_name, True)
        self._plugins.append(plugin)
        return plugin

    def close(self) -> None:
        for plugin in self._plugins:
            plugin.close()
        self._plugins.clear()

    def __enter__(self) -> KubeletSim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
