"""``sharegpu status`` against the in-process API server's GPU objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import names
from api.names import SHARE_USAGE_KIND
from controller.reconcile import reconcile
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import allocate_many
from sharegpuctl.cli import main
from sharegpuctl.cli.common import default_device_class
from sharegpuctl.cli.gpurows import COLUMNS, gpu_rows
from sharegpuctl.cli.status import usage_rows
from sharegpuctl.local.apiserver import KubeAPIServer, default_resources
from tests.controller import helpers as h

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


def measured(claim: Obj, **data: Any) -> None:
    """Record ``data`` as the node plugin's usage of each of the claim's allocated devices."""
    results = claim["status"]["allocation"]["devices"]["results"]
    claim["status"]["devices"] = [
        {
            "driver": r["driver"],
            "pool": r["pool"],
            "device": r["device"],
            "shareID": r["shareID"],
            "data": {"apiVersion": names.GROUP_VERSION, "kind": SHARE_USAGE_KIND, **data},
        }
        for r in results
    ]


def store(apiserver: KubeAPIServer, slices: list[Obj], claims: list[Obj]) -> list[Obj]:
    """The GPU objects reconcile makes of ``slices`` and ``claims``, stored with their status."""
    objects = [g.manifest() for g in reconcile(slices, claims, [], DRIVER).values()]
    for obj in objects:
        status = obj.pop("status")
        created = apiserver.store.create(names.GPU_PLURAL, obj)
        created["status"] = status
        apiserver.store.update_status(names.GPU_PLURAL, created)
    return objects


def allocated_claims(slices: list[Obj], *claims: Obj) -> list[Obj]:
    """``claims`` allocated on node-a, with their allocation in their status."""
    outcomes = allocate_many(list(claims), slices, [default_device_class()], node="node-a")
    for c, outcome in zip(claims, outcomes, strict=True):
        assert outcome.allocation is not None
        c["status"] = {"allocation": outcome.allocation}
    return list(claims)


@pytest.fixture
def gpu_objects(apiserver: KubeAPIServer) -> list[Obj]:
    """GPU objects of two nodes, as the controller's reconcile makes them, stored."""
    slices = node_slices("node-a", 2) + node_slices("node-b", 1)
    claims = allocated_claims(
        slices, share_claim("small", "30", "10Gi"), share_claim("large", "50", "20Gi")
    )
    return store(apiserver, slices, claims)


@pytest.fixture
def measured_objects(apiserver: KubeAPIServer) -> list[Obj]:
    """As :func:`gpu_objects`, with usage measured for two of three claims: ``large`` within
    its reservation, ``small`` over it in memory and compute."""
    slices = node_slices("node-a", 2) + node_slices("node-b", 1)
    small, large, idle = allocated_claims(
        slices,
        share_claim("small", "30", "10Gi"),
        share_claim("large", "50", "20Gi"),
        share_claim("idle", "10", "5Gi"),
    )
    measured(
        small,
        usedMemory="12Gi",
        smUtilization=55,
        processes=2,
        overcommitted=["memory", "compute"],
    )
    measured(large, usedMemory="5368709120", processes=1)
    return store(apiserver, slices, [small, large, idle])


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
        "OVERCOMMITTED",
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


def test_status_lists_measured_allocations_and_the_overcommitted_condition(
    apiserver: KubeAPIServer,
    measured_objects: list[Obj],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(["status", "--kubeconfig", kubeconfig, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    usage = [{k: v for k, v in row.items() if k != "usage"} for row in report["usage"]]
    shares = {
        a["claimName"]: a["shareID"]
        for o in report["objects"]
        for a in o["status"].get("allocations", [])
    }
    assert len(report["objects"]) == len(measured_objects)
    assert usage == [
        {
            "NODE": "node-a",
            "GPU": "0",
            "CLAIM": "ml/large",
            "SHARE": shares["large"],
            "MEMORY": "5Gi/20Gi",
            "SM": "-/50%",
            "PROCESSES": "1",
            "OVERCOMMITTED": "-",
        },
        {
            "NODE": "node-a",
            "GPU": "0",
            "CLAIM": "ml/small",
            "SHARE": shares["small"],
            "MEMORY": "12Gi/10Gi",
            "SM": "55%/30%",
            "PROCESSES": "2",
            "OVERCOMMITTED": "memory,compute",
        },
    ]
    assert report["usage"][1]["usage"]["usedMemory"] == "12Gi"
    # The idle claim shares GPU 0 but was not measured: no row.
    assert "ml/idle" in report["gpus"][0]["CLAIMS"]
    conditions = [(r["NODE"], r["GPU"], r["OVERCOMMITTED"]) for r in report["gpus"]]
    assert conditions == [("node-a", "0", "True"), ("node-a", "1", "-"), ("node-b", "0", "-")]
    condition = report["gpus"][0]["overcommitted"]
    assert condition["type"] == "Overcommitted" and condition["status"] == "True"
    assert "ml/small (compute, memory)" in condition["message"]
    assert "ml/large" not in condition["message"]

    assert main(["status", "--kubeconfig", kubeconfig, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["usage"] == report["usage"]

    assert main(["status", "--kubeconfig", kubeconfig, "-o", "text"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "3 GPU(s) in the cluster"
    assert lines[1].split()[-1] == "OVERCOMMITTED" and lines[2].split()[-1] == "True"
    start = lines.index("2 measured allocation(s)")
    assert lines[start + 1].split() == [
        "NODE",
        "GPU",
        "CLAIM",
        "SHARE",
        "MEMORY",
        "SM",
        "PROCESSES",
        "OVERCOMMITTED",
    ]
    assert lines[start + 3].split() == [
        "node-a",
        "0",
        "ml/small",
        shares["small"],
        "12Gi/10Gi",
        "55%/30%",
        "2",
        "memory,compute",
    ]


def test_status_without_measurements_has_an_empty_usage_table(
    apiserver: KubeAPIServer,
    gpu_objects: list[Obj],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(["status", "--kubeconfig", kubeconfig, "-o", "text"]) == 0
    out = capsys.readouterr().out
    assert "0 measured allocation(s)\n  (none)" in out
    assert main(["status", "--kubeconfig", kubeconfig, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["usage"] == []
    assert {r["OVERCOMMITTED"] for r in report["gpus"]} == {"-"}


def test_usage_rows_read_malformed_usage_as_unknown() -> None:
    obj: Obj = {
        "spec": {"node": "n", "index": 0},
        "status": {
            "allocations": [
                {
                    "claimNamespace": "a",
                    "claimName": "b",
                    "device": "gpu-0",
                    "memory": "x",
                    "cores": "many",
                    "usage": {"usedMemory": ["1"], "smUtilization": True},
                },
                {"claimNamespace": "a", "claimName": "c", "usage": None},
                "not an allocation",
            ]
        },
    }
    [row] = usage_rows([obj])
    assert (row["CLAIM"], row["SHARE"], row["MEMORY"], row["SM"], row["PROCESSES"]) == (
        "a/b",
        "gpu-0",
        "?/?",
        "-/-",
        "?",
    )


def test_gpu_rows_from_gpu_objects() -> None:
    claims = [h.claim("a", [h.result("n1", "gpu-0", cores=30, memory="10Gi")], pods=[("p", "u")])]
    objs = reconcile(
        [h.node_slice("n1", 2)], claims, [h.pod("p", "a", {"c": None}, uid="u")], h.DRIVER
    )
    rows = gpu_rows([o.manifest() for o in objs.values()])
    assert rows == gpu_rows(objs.values())
    assert list(rows[0]) == list(COLUMNS)
    assert rows[0] == {
        "NODE": "n1",
        "GPU": "0",
        "MODEL": h.MODEL,
        "HEALTH": "Healthy",
        "CORES": "30/100",
        "MEMORY": "10Gi/80Gi",
        "CLAIMS": "default/a",
        "PODS": "p(c)",
    }
    assert rows[1]["CLAIMS"] == "-" and rows[1]["CORES"] == "0/100"


def test_status_idle_lists_only_the_shares_the_controller_marked_idle(
    apiserver: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slices = node_slices("node-a", 1)
    quiet, busy = allocated_claims(
        slices, share_claim("quiet", "30", "10Gi"), share_claim("busy", "30", "10Gi")
    )
    measured(quiet, usedMemory="100Mi", smUtilization=0, processes=1)
    measured(busy, usedMemory="8Gi", smUtilization=25, processes=1)
    (obj,) = [g.manifest() for g in reconcile(slices, [quiet, busy], [], DRIVER).values()]
    # What the controller writes once "quiet" stayed under its idle threshold for the period.
    for a in obj["status"]["allocations"]:
        if a["claimName"] == "quiet":
            a["idle"] = True
            a["pods"] = [{"name": "trainer-0", "uid": "u0", "containers": ["main"]}]
    rule = "under 5% of their reserved cores and memory for 1h"
    obj["status"]["conditions"].append(
        {
            "type": names.CONDITION_SHARES_IDLE,
            "status": "True",
            "reason": "UsageBelowThreshold",
            "message": f"shares {rule}: ml/quiet (s)",
        }
    )
    status = obj.pop("status")
    created = apiserver.store.create(names.GPU_PLURAL, obj)
    apiserver.store.update_status(names.GPU_PLURAL, {**created, "status": status})
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")

    assert main(["status", "--kubeconfig", kubeconfig, "--idle", "-o", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["idle"]
    assert {k: row[k] for k in ("NODE", "GPU", "CLAIM", "PODS", "MEMORY", "SM")} == {
        "NODE": "node-a",
        "GPU": "0",
        "CLAIM": "ml/quiet",
        "PODS": "trainer-0",
        "MEMORY": "100Mi/10Gi",
        "SM": "0%/30%",
    }
    assert rule in row["message"]
    assert main(["status", "--kubeconfig", kubeconfig, "--idle"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "1 idle share(s)" and "ml/busy" not in "\n".join(lines)
