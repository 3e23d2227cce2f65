"""Kubelet registration handshake over the real sockets."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from kubeletplugin.kubelet.healthservice import HealthBroadcaster
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.kubelet.registration import RegistrationStatus, registration_socket_path
from sharegpuctl.local.kubelet import KubeletSim, RegistrationRejected
from tests.kubeletplugin.kubelet.helpers import (
    DRIVER,
    Dirs,
    FakePreparer,
    running_server,
)


def test_get_info_advertises_driver_endpoint_and_versions(dirs: Dirs) -> None:
    with running_server(dirs) as server, KubeletSim(dirs.registry) as kubelet:
        assert kubelet.registration_sockets() == [dirs.registry / f"{DRIVER}-reg.sock"]
        info = kubelet.get_info(DRIVER)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(dirs.data / "dra.sock")
        assert info.endpoint == str(server.dra_socket.path)
        assert info.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def test_both_health_services_are_advertised_when_enabled(dirs: Dirs) -> None:
    with running_server(dirs, health_source=HealthBroadcaster()), KubeletSim(dirs.registry) as k:
        assert k.get_info(DRIVER).supported_versions == (
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        )


def _watch_status(endpoint: str, service: str) -> grpc.StatusCode:
    """The status of a ``NodeWatchResources`` stream of ``service``, opened with raw bytes (so
    any service name can be asked, also one with no generated stubs); OK once a message came."""
    with grpc.insecure_channel(f"unix:{endpoint}") as channel:
        call = channel.unary_stream(f"/{service}/NodeWatchResources")(b"", timeout=30)
        try:
            next(iter(call))
        except grpc.RpcError as err:
            return err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
        call.cancel()
        return grpc.StatusCode.OK


@pytest.mark.parametrize("health", [True, False])
def test_advertised_health_services_are_exactly_the_served_ones(dirs: Dirs, health: bool) -> None:
    """Every health service advertised answers a stream; every one not advertised (including
    an upstream version the plugin does not implement) is unknown to the endpoint."""
    broadcaster = HealthBroadcaster()
    broadcaster.publish([])
    source = broadcaster if health else None
    candidates = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth", "v1beta1.DRAResourceHealth")
    with running_server(dirs, health_source=source) as server, KubeletSim(dirs.registry) as k:
        advertised = set(k.get_info(DRIVER).supported_versions)
        served = {
            service
            for service in candidates
            if _watch_status(str(server.dra_socket.path), service) == grpc.StatusCode.OK
        }
        unknown = {
            service
            for service in candidates
            if _watch_status(str(server.dra_socket.path), service) == grpc.StatusCode.UNIMPLEMENTED
        }
    assert served == advertised & set(candidates)
    assert unknown == set(candidates) - served
    assert served == ({"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} if health else set())


def test_full_handshake_picks_v1_and_reports_success(dirs: Dirs) -> None:
    with running_server(dirs) as server, KubeletSim(dirs.registry) as kubelet:
        plugin = kubelet.register(DRIVER)
        assert plugin.version == "v1.DRAPlugin"
        assert server.registration.wait_registered(timeout=10)
        assert server.registration.status == RegistrationStatus(registered=True, error="")
        assert plugin.prepare([ClaimRef("ns", "uid-1", "c1")])["uid-1"].error == ""


def test_older_kubelet_gets_v1beta1(dirs: Dirs) -> None:
    with running_server(dirs), KubeletSim(dirs.registry, supported=["v1beta1.DRAPlugin"]) as k:
        plugin = k.register(DRIVER)
        assert plugin.version == "v1beta1.DRAPlugin"
        assert plugin.prepare([ClaimRef("ns", "uid-1", "c1")])["uid-1"].error == ""


def test_rejected_registration_is_logged_and_server_keeps_serving(
    dirs: Dirs, caplog: pytest.LogCaptureFixture
) -> None:
    with running_server(dirs) as server, KubeletSim(dirs.registry, supported=["v9.DRAPlugin"]) as k:
        with caplog.at_level(logging.ERROR), pytest.raises(RegistrationRejected):
            k.register(DRIVER)
        status = server.registration.status
        assert status is not None and not status.registered
        assert "none of the plugin's versions" in status.error
        assert any("rejected the registration" in r.getMessage() for r in caplog.records)
        assert any(status.error in r.getMessage() for r in caplog.records)
        # Kubelet retries, this time successfully (e.g. after an upgrade).
        k.supported = ("v1.DRAPlugin",)
        k.register(DRIVER)
        assert server.registration.wait_registered(timeout=10)


def test_kubelet_restart_registers_again_on_the_same_sockets(dirs: Dirs) -> None:
    preparer = FakePreparer()
    with running_server(dirs, preparer) as server:
        for _ in range(3):  # each simulated kubelet lifetime repeats the whole handshake
            with KubeletSim(dirs.registry) as kubelet:
                plugin = kubelet.register(DRIVER)
                result = plugin.prepare([ClaimRef("ns", "uid-1", "c1")])
                assert result["uid-1"].error == ""
        assert len(preparer.prepare_calls) == 3
        assert server.registration.status == RegistrationStatus(registered=True, error="")


def test_the_local_kubelet_finds_the_registration_socket_where_the_plugin_serves_it(
    tmp_path: Path,
) -> None:
    for driver in ("gpu.sharegpu.dev", "gpu.example.com"):
        assert KubeletSim(tmp_path).registration_socket(driver) == registration_socket_path(
            tmp_path, driver
        )
