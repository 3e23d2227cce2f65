"""``sharegpu status`` against the in-process API server's GPU objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api import names
from controller.reconcile import reconcile
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import allocate_many
from sharegpu.cli import main
from sharegpu.cli.common import default_device_class
from sharegpu.local.apiserver import KubeAPIServer, default_resources

DRIVER = names.DEFAULT_DRIVER_NAME
Obj = dict[str, Any]


def node_slices(node: str, gpus: int) -> list[Obj]:
    objects = resource_slice_objects(
        desired_slices(
            node_devices(MockBackend(node, gpus).discover(), names.SHARING_MODE_CONSUMABLE)
        ),
        DRIVER,
        node,
        None,
        1,
    )
    for i, obj in enumerate(objects):
        obj["metadata"] = {"name": f"{node}-slice-{i}"}
    return objects


def share_claim(name: str, cores: str, memory: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "capacity": {"requests": {"cores": cores, "memory": memory}},
                        },
                    }
                ]
            }
        },
    }


@pytest.fixture
def gpu_objects(apiserver: KubeAPIServer) -> list[Obj]:
    """GPU objects of two nodes, as the controller's reconcile makes them, stored."""
    slices = node_slices("node-a", 2) + node_slices("node-b", 1)
    claims = [share_claim("small", "30", "10Gi"), share_claim("large", "50", "20Gi")]
    outcomes = allocate_many(claims, slices, [default_device_class()], node="node-a")
    for c, outcome in zip(claims, outcomes, strict=True):
        assert outcome.allocation is not None
        c["status"] = {"allocation": outcome.allocation}
    objects = [g.manifest() for g in reconcile(slices, claims, [], DRIVER).values()]
    for obj in objects:
        status = obj.pop("status")
        created = apiserver.store.create(names.GPU_PLURAL, obj)
        created["status"] = status
        apiserver.store.update_status(names.GPU_PLURAL, created)
    return objects


def test_status_rows(
    apiserver: KubeAPIServer,
    gpu_objects: list[Obj],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(["status", "--kubeconfig", kubeconfig, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = [(r["NODE"], r["GPU"], r["CORES"], r["MEMORY"], r["CLAIMS"]) for r in report["gpus"]]
    assert rows == [
        ("node-a", "0", "80/100", "30Gi/79.1Gi", "ml/large,ml/small"),
        ("node-a", "1", "0/100", "0/79.1Gi", "-"),
        ("node-b", "0", "0/100", "0/79.1Gi", "-"),
    ]
    assert {r["MODEL"] for r in report["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert len(report["objects"]) == len(gpu_objects)

    assert main(["status", "--kubeconfig", kubeconfig, "--node", "node-b", "-o", "text"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "1 GPU(s) in node node-b"
    assert lines[1].split() == [
        "NODE",
        "GPU",
        "MODEL",
        "HEALTH",
        "CORES",
        "MEMORY",
        "CLAIMS",
        "PODS",
    ]
    assert lines[2].split()[:2] == ["node-b", "0"]
    assert "Healthy" in lines[2] and "0/100" in lines[2]


def test_status_without_gpu_resource(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    resources = [r for r in default_resources() if r.plural != names.GPU_PLURAL]
    with KubeAPIServer(resources=resources) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        assert main(["status", "--kubeconfig", kubeconfig]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "sharegpu status: error: the cluster serves no gpus.resource.sharegpu.dev "
        "(is the sharegpu chart installed?)"
    )


def test_status_bad_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
