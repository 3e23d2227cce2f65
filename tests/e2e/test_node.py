"""The kubelet plugin against a real kube-apiserver, the kubelet's part played by the kubelet
simulator: its token (bound to a pod on its node) names the node; its ResourceSlice is accepted
and listed by ``kubectl get resourceslices -o wide``; kube-scheduler allocates the claims of
examples/two-pods-fractional-share on its GPUs; NodePrepareResources writes the claims' CDI specs,
a share's measured usage reaches its claim's status and NodeUnprepareResources removes the specs;
its log has no 403 (the chart's RBAC and policies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.cdi import spec_file_name
from sharegpuctl.local.kubelet import KubeletSim
from tests.deploy.helpers import load_documents
from tests.e2e.binaries import missing_binaries
from tests.e2e.controlplane import ControlPlane
from tests.e2e.node import NODE_NAME_EXTRA, RunningPlugin, chart_flag, node_slices, token_user
from tests.e2e.processes import assert_no_forbidden, step, wait_until
from tests.paths import EXAMPLES_DIR

NAMESPACE = "e2e-node-claims"
EXAMPLE = EXAMPLES_DIR / "two-pods-fractional-share" / "two-pods-fractional-share.yaml"
#: The example's claims and the cores each asks for.
SHARES = {"small-share": "30", "large-share": "50"}


def test_plugin_token_names_its_node(crds: ControlPlane, plugin: RunningPlugin) -> None:
    user = token_user(crds, plugin.kubeconfig)
    with step("the plugin's token carries its node (KEP-4193)", "kubectl auth whoami -o json"):
        assert user["username"].startswith("system:serviceaccount:"), user
        assert user.get("extra", {}).get(NODE_NAME_EXTRA) == [plugin.node], user


def test_plugin_slices_are_accepted_and_listed(
    crds: ControlPlane, plugin: RunningPlugin, chart: list[dict[str, Any]]
) -> None:
    driver_name = chart_flag(chart, "--driver-name")
    (published,) = node_slices(crds, plugin.node)
    with step("the plugin's ResourceSlice as the API server stores it", "kubectl get -o json"):
        spec = published["spec"]
        assert spec["driver"] == driver_name and spec["pool"]["name"] == plugin.node, spec
        assert len(spec["devices"]) == int(_argument(plugin, "--mock-gpus")), spec
        assert all(d.get("allowMultipleAllocations") for d in spec["devices"]), spec
    table = crds.kubectl(
        "get", "resourceslices", "-o", "wide", step_name="kubectl get resourceslices -o wide"
    ).stdout
    with step("kubectl get resourceslices -o wide", "kubectl get resourceslices -o wide"):
        header = table.splitlines()[0].split()
        assert header[:4] == ["NAME", "NODE", "DRIVER", "POOL"], table
        (row,) = [
            r.split()
            for r in table.splitlines()[1:]
            if r.split()[0] == published["metadata"]["name"]
        ]
        assert row[1:4] == [plugin.node, driver_name, plugin.node], table


def _argument(plugin: RunningPlugin, flag: str) -> str:
    """The value of ``flag`` on the plugin's command line."""
    return next(a.split("=", 1)[1] for a in plugin.process.argv if a.startswith(flag + "="))


def _example_on(node: str) -> list[dict[str, Any]]:
    """The example's claims and pods, the pods pinned to ``node``."""
    docs = load_documents(EXAMPLE.read_text())
    for doc in docs:
        if doc["kind"] == "Pod":
            doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return docs


def _claims(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    out = plane.kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "json").stdout
    return {c["metadata"]["name"]: c for c in json.loads(out)["items"]}


def test_scheduler_allocates_and_the_plugin_prepares(
    crds: ControlPlane, plugin: RunningPlugin, chart: list[dict[str, Any]]
) -> None:
    if missing_binaries(("kube-scheduler",)):
        pytest.skip("e2e: kube-scheduler not built (tests/e2e/build-binaries.sh kube-scheduler)")
    driver_name = chart_flag(chart, "--driver-name")
    crds.kubectl("create", "namespace", NAMESPACE, check=False)
    crds.kubectl(
        "apply",
        "-n",
        NAMESPACE,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(_example_on(plugin.node)),
        step_name="apply the example, pods pinned to the plugin's node",
    )

    def allocated() -> bool:
        claims = _claims(crds)
        return set(claims) == set(SHARES) and all(
            c.get("status", {}).get("allocation") and c["status"].get("reservedFor")
            for c in claims.values()
        )

    wait_until(allocated, "kube-scheduler allocates the claims", "both claims allocated")
    claims = _claims(crds)
    with step("claims allocated on the plugin's GPUs", "kubectl get resourceclaims -o json"):
        for name, claim in claims.items():
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["pool"] == plugin.node and result["driver"] == driver_name, result
            assert result["consumedCapacity"]["cores"] == SHARES[name], result
    refs = [
        ClaimRef(NAMESPACE, c["metadata"]["uid"], c["metadata"]["name"]) for c in claims.values()
    ]
    specs = {ref.name: plugin.cdi_dir / spec_file_name(driver_name, ref.uid) for ref in refs}
    with (
        step(
            "NodePrepareResources through the kubelet simulator",
            "KubeletSim.prepare",
            plugin.process.log,
        ),
        KubeletSim(plugin.registry) as kubelet,
        kubelet.register(driver_name) as registered,
    ):
        results = registered.prepare(refs)
        for ref in refs:
            assert results[ref.uid].error == "", results[ref.uid]
            (device,) = results[ref.uid].devices
            assert device.pool_name == plugin.node, device
            assert device.cdi_device_ids, device
        for name, path in specs.items():
            _check_cdi_spec(path, SHARES[name])
        _check_usage_written(crds, plugin, claims["small-share"])
        assert registered.unprepare(refs) == {ref.uid: "" for ref in refs}
        assert not [p for p in specs.values() if p.exists()], specs
    assert_no_forbidden(plugin.process, "the plugin prepares with the chart's RBAC")


def _check_cdi_spec(path: Path, cores: str) -> None:
    """The claim's CDI spec: one device whose edits name the share's cores (MPS)."""
    assert path.exists(), f"no CDI spec {path}"
    spec = json.loads(path.read_text())
    (device,) = spec["devices"]
    env = dict(e.split("=", 1) for e in device["containerEdits"].get("env", []))
    assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == cores, env


def _check_usage_written(plane: ControlPlane, plugin: RunningPlugin, claim: dict[str, Any]) -> None:
    """A process of ``claim`` on its GPU (the mock usage source) reaches the claim's
    ``status.devices`` through the plugin's status update (the chart's
    ``resourceclaims/status`` and ``associated-node:update`` rules)."""
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    index = int(result["device"].rsplit("-", 1)[1])
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    plugin.usage_file.write_text(f"{index}: [{{claim: {uid}, mpsClient: true, memory: 2Gi}}]\n")
    written: list[Any] = []

    def usage_in_status() -> bool:
        out = plane.kubectl("get", "resourceclaim", name, "-n", NAMESPACE, "-o", "json").stdout
        devices = json.loads(out).get("status", {}).get("devices", [])
        written[:] = [d.get("data") for d in devices if d.get("device") == result["device"]]
        return bool(written) and (written[0] or {}).get("usedMemory") == "2Gi"

    wait_until(
        usage_in_status,
        "the plugin writes the share's usage into the claim's status",
        f"status.devices of {NAMESPACE}/{name} with usedMemory 2Gi",
        process=plugin.process,
    )
    (data,) = written
    assert data["kind"] == "ShareUsage" and data["processes"] == 1, data
    plugin.usage_file.unlink()


def test_plugin_log_has_no_forbidden_answer(plugin: RunningPlugin) -> None:
    assert_no_forbidden(plugin.process, "kubelet plugin with the chart's RBAC")
