"""Kubelet plugin registration (``pluginregistration.Registration``) for a DRA driver.

Kubelet watches its plugin registry directory, finds ``<driver>-reg.sock``, calls ``GetInfo``,
connects to the advertised endpoint with the first service version in *our* list that it also
supports, and reports the outcome with ``NotifyRegistrationStatus``. A rejected registration is
logged with kubelet's error; the server keeps serving so that kubelet can retry (it restarts the
handshake from scratch on any failure, and again after its own restarts).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from kubeletplugin.kubelet.grpcapi.gen import pluginregistration_v1_pb2 as pb

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_V1_SERVICE = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE = "v1beta1.DRAPlugin"


def supported_versions(health_services: Sequence[str] = ()) -> list[str]:
    """Services advertised to kubelet: the DRA services, most preferred first (kubelet uses the
    first it knows), then ``health_services``, which must be exactly the health services the
    endpoint serves (kubelet 1.37 picks among them in its own order, newest first; on a version
    advertised but not served its stream ends UNIMPLEMENTED and kubelet stops watching the
    driver's health until the driver registers again)."""
    return [DRA_V1_SERVICE, DRA_V1BETA1_SERVICE, *health_services]


def registration_socket_path(registry_dir: Path, driver_name: str) -> Path:
    """``<plugin-registry-dir>/<driver>-reg.sock``."""
    return registry_dir / f"{driver_name}-reg.sock"


@dataclass(frozen=True)
class RegistrationStatus:
    """What kubelet last reported through NotifyRegistrationStatus."""

    registered: bool
    error: str


class RegistrationServicer:
    """Answers kubelet's registration handshake for one driver endpoint.

    ``endpoint`` must be the absolute path of the DRA socket as kubelet sees it.
    """

    def __init__(self, driver_name: str, endpoint: Path, versions: Sequence[str]) -> None:
        if not endpoint.is_absolute():
            raise ValueError(f"registration endpoint {endpoint} must be an absolute path")
        self._driver_name = driver_name
        self._endpoint = str(endpoint)
        self._versions = list(versions)
        self._lock = threading.Lock()
        self._status: RegistrationStatus | None = None
        self._registered = threading.Event()

    @property
    def status(self) -> RegistrationStatus | None:
        """The last status kubelet reported, or None before the first report."""
        with self._lock:
            return self._status

    def wait_registered(self, timeout: float | None = None) -> bool:
        """Block until kubelet has reported a successful registration; False on timeout."""
        return self._registered.wait(timeout)

    def GetInfo(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.PluginInfo:
        log.info("kubelet asked for plugin info of %s", self._driver_name)
        return pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver_name,
            endpoint=self._endpoint,
            supported_versions=self._versions,
        )

    def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> pb.RegistrationStatusResponse:
        status = RegistrationStatus(bool(request.plugin_registered), str(request.error))
        with self._lock:
            self._status = status
        if status.registered:
            log.info("kubelet registered driver %s at %s", self._driver_name, self._endpoint)
            self._registered.set()
        else:
            self._registered.clear()
            log.error(
                "kubelet rejected the registration of driver %s: %s (still serving; kubelet "
                "will retry)",
                self._driver_name,
                status.error or "no reason given",
            )
        return pb.RegistrationStatusResponse()
