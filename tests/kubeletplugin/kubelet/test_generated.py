"""The committed generated gRPC code matches the .proto sources, and the wire contract (packages,
services, methods, field numbers) matches kubelet's upstream API."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import Descriptor, FileDescriptor

from kubeletplugin.kubelet.grpcapi import generate
from kubeletplugin.kubelet.grpcapi.gen import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    drahealth_v1_pb2,
    drahealth_v1alpha1_pb2,
    pluginregistration_v1_pb2,
)


def test_regenerating_changes_nothing() -> None:
    drift = generate.diff_against(generate.GEN_DIR)
    assert drift == [], "".join(drift[:80])


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "gen"
    generate.generate(stale)
    (stale / "dra_v1_pb2.py").write_text("# edited by hand\n", encoding="utf-8")
    assert any("edited by hand" in line for line in generate.diff_against(stale))
    assert generate.main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_generated_modules_import_each_other_as_package_modules() -> None:
    for path in generate.GEN_DIR.glob("*_pb2_grpc.py"):
        text = path.read_text(encoding="utf-8")
        assert f"from {generate.GEN_PACKAGE} import {path.stem.removesuffix('_grpc')} as" in text


def _fields(message: Descriptor) -> dict[str, int]:
    return {f.name: f.number for f in message.fields}


def _services(file: FileDescriptor) -> dict[str, list[str]]:
    return {s.full_name: [m.name for m in s.methods] for s in file.services_by_name.values()}


DRA_MESSAGES = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}
DEVICE_V1BETA1 = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}


@pytest.mark.parametrize(
    ("module", "package", "device_fields"),
    [
        (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1", {**DEVICE_V1BETA1, "share_id": 5}),
        (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1", DEVICE_V1BETA1),
    ],
)
def test_dra_wire_contract(module: ModuleType, package: str, device_fields: dict[str, int]) -> None:
    file: FileDescriptor = module.DESCRIPTOR
    assert file.package == package
    assert _services(file) == {
        f"{package}.DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"]
    }
    messages = file.message_types_by_name
    assert {name: _fields(messages[name]) for name in DRA_MESSAGES} == DRA_MESSAGES
    assert _fields(messages["Device"]) == device_fields
    if "share_id" in device_fields:
        assert messages["Device"].fields_by_name["share_id"].has_presence


def test_registration_wire_contract() -> None:
    file = pluginregistration_v1_pb2.DESCRIPTOR
    assert file.package == "pluginregistration"
    assert _services(file) == {
        "pluginregistration.Registration": ["GetInfo", "NotifyRegistrationStatus"]
    }
    messages = file.message_types_by_name
    assert _fields(messages["PluginInfo"]) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert _fields(messages["RegistrationStatus"]) == {"plugin_registered": 1, "error": 2}
    assert _fields(messages["RegistrationStatusResponse"]) == {}
    assert _fields(messages["InfoRequest"]) == {}


@pytest.mark.parametrize(
    ("module", "package"), [(drahealth_v1_pb2, "v1"), (drahealth_v1alpha1_pb2, "v1alpha1")]
)
def test_health_wire_contract(module: ModuleType, package: str) -> None:
    file: FileDescriptor = module.DESCRIPTOR
    assert file.package == package
    assert _services(file) == {f"{package}.DRAResourceHealth": ["NodeWatchResources"]}
    method = file.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
    assert method.server_streaming and not method.client_streaming
    messages = file.message_types_by_name
    assert _fields(messages["NodeWatchResourcesRequest"]) == {}
    assert _fields(messages["DeviceIdentifier"]) == {"pool_name": 1, "device_name": 2}
    assert _fields(messages["DeviceHealth"]) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert _fields(messages["NodeWatchResourcesResponse"]) == {"devices": 1}
    status = file.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
