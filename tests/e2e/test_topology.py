"""Topology constraints under the real kube-scheduler and kubelet:
examples/gpu-and-nic-same-pcie-root with a second DRA driver on the node (the test NIC driver,
:mod:`tests.e2e.nicdriver`), and examples/multi-gpu-nvlink on mock GPUs bridged in pairs. Each
placement is checked against the devices' attributes in the node's ResourceSlices, each pod's
environment against its claim's CDI specs, and ``sharegpu explain``, given the slices and claims
of the cluster, gives the same answer offline: where the pod went, or why it stays pending.

The cluster may hold more than the real node's slices: earlier tests of the run leave the
host-process plugin's node (``conftest.PLUGIN_NODE``, the mock's default GPUs, all eight in one
NVSwitch domain) publishing. The examples' pods are pinned to the real node, so kube-scheduler
tries that node only, and explain is told so (``--node``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from api import names
from tests.e2e import nicdriver, plugindaemon
from tests.e2e import test_real_node_dra as realnode
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import RealNode
from tests.e2e.plugindaemon import PluginDaemon
from tests.e2e.processes import step, wait_until
from tests.paths import EXAMPLES_DIR

NIC_EXAMPLE = EXAMPLES_DIR / "gpu-and-nic-same-pcie-root"
NVLINK_EXAMPLE = EXAMPLES_DIR / "multi-gpu-nvlink"
#: Mock GPUs of a PCIe board bridged in pairs: gpu-0 and gpu-1 in pair-0, and so on.
PAIRS = "".join(f"- {{nvlinkDomain: pair-{i // 2}}}\n" for i in range(8))


def _json(plane: ControlPlane, *args: str) -> Any:
    return json.loads(plane.kubectl("get", *args, "-o", "json", step_name="kubectl get").stdout)


def _devices(plane: ControlPlane, node: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(driver, device) -> device, for every ResourceSlice of ``node``."""
    slices = _json(plane, "resourceslices", f"--field-selector=spec.nodeName={node}")["items"]
    return {
        (s["spec"]["driver"], d["name"]): d for s in slices for d in s["spec"].get("devices", [])
    }


def _attribute(device: dict[str, Any], name: str) -> str:
    return str(device["attributes"][name]["string"])


def _apply_pods(
    real_node: RealNode, namespace: str, example: Path, renames: dict[str, str] | None = None
) -> None:
    """The example's documents (pods pinned to the node, busybox), pods renamed by ``renames``."""
    docs = [
        d for f in sorted(example.glob("*.yaml")) for d in realnode._example_on(real_node.name, f)
    ]
    if renames is not None:
        docs = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] in renames]
        for d in docs:
            d["metadata"]["name"] = renames[d["metadata"]["name"]]
    real_node.plane.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
        step_name=f"apply examples/{example.name}, pods pinned to the real node",
    )


def _pod(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = _json(plane, "pod", name, "-n", namespace)
    return pod


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in pod["status"].get("conditions", []) if c["type"] == kind), {})


def _wait_ready(real_node: RealNode, namespace: str, pod: str) -> None:
    wait_until(
        lambda: _condition(_pod(real_node.plane, namespace, pod), "Ready").get("status") == "True",
        f"{namespace}/{pod} runs on the real kubelet",
        "the pod Ready",
        process=real_node.kubelet,
        deadline_s=240,
    )


def _wait_unschedulable(real_node: RealNode, namespace: str, pod: str) -> dict[str, Any]:
    wait_until(
        lambda: (
            _condition(_pod(real_node.plane, namespace, pod), "PodScheduled").get("reason")
            == "Unschedulable"
        ),
        f"kube-scheduler finds no place for {namespace}/{pod}",
        "PodScheduled False, reason Unschedulable",
        process=real_node.kubelet,
        deadline_s=180,
    )
    pod_obj = _pod(real_node.plane, namespace, pod)
    assert pod_obj["status"]["phase"] == "Pending"
    assert not pod_obj["spec"].get("nodeName")
    return pod_obj


def _claim_of(plane: ControlPlane, namespace: str, pod: str) -> dict[str, Any]:
    (status,) = _pod(plane, namespace, pod)["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = _json(
        plane, "resourceclaim", status["resourceClaimName"], "-n", namespace
    )
    return claim


def _check_env(
    real_node: RealNode, namespace: str, pod: str, claim: dict[str, Any]
) -> dict[str, str]:
    """The pod's environment holds every variable its claim's CDI specs set (both drivers')."""
    promised = realnode._spec_env(real_node.cdi_dir, claim["metadata"]["uid"])
    out = real_node.plane.kubectl(
        "exec", pod, "-n", namespace, "--", "env", step_name="kubectl exec"
    )
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    with step(f"the environment of {namespace}/{pod} is its claim's CDI edits", "kubectl exec"):
        assert promised, f"no CDI spec for the claim of {pod}"
        assert {k: env.get(k) for k in promised} == promised, env
    return env


def _slice_summary(path: Path) -> list[str]:
    """One line per ResourceSlice of a ``kubectl get -o yaml`` dump: name, node, pool and
    generation, and each device with its NVLink domain and PCIe root (for failure messages)."""
    lines = []
    for s in yaml.safe_load(path.read_text())["items"]:
        spec = s["spec"]
        devices = [
            "{}({})".format(
                d["name"],
                ",".join(
                    str(d.get("attributes", {}).get(a, {}).get("string", "-"))
                    for a in (names.ATTR_NVLINK_DOMAIN, names.ATTR_PCIE_ROOT)
                ),
            )
            for d in spec.get("devices", [])
        ]
        lines.append(
            f"{s['metadata']['name']}: node {spec.get('nodeName')}, driver {spec['driver']}, "
            f"pool {spec['pool']['name']} generation {spec['pool']['generation']}: "
            + " ".join(devices)
        )
    return lines


def _explain(
    plane: ControlPlane, tmp: Path, claims: Path, node: str, *extra: str
) -> dict[str, Any]:
    """``sharegpu explain`` offline, on the cluster's slices, classes and (with ``--allocated``
    in ``extra``) claims, dumped to files under ``tmp`` first, for ``node`` only: the node the
    examples' pods are pinned to, the only one kube-scheduler tries for them. The report gets
    ``slices``, a summary of the dumped slices (:func:`_slice_summary`) for failure messages."""
    for kind in ("resourceslices", "deviceclasses"):
        (tmp / f"{kind}.yaml").write_text(plane.kubectl("get", kind, "-o", "yaml").stdout)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sharegpuctl",
            "explain",
            "-f",
            str(claims),
            "--slices",
            str(tmp / "resourceslices.yaml"),
            "--classes",
            str(tmp / "deviceclasses.yaml"),
            "--node",
            node,
            *extra,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["nodes"] == [node], report["nodes"]
    report["slices"] = _slice_summary(tmp / "resourceslices.yaml")
    return report


def _dump_claims(plane: ControlPlane, namespace: str, path: Path, name: str | None = None) -> Path:
    items = _json(plane, "resourceclaims", "-n", namespace)["items"]
    path.write_text(
        yaml.safe_dump_all([c for c in items if name is None or c["metadata"]["name"] == name])
    )
    return path


def _delete_namespace(real_node: RealNode, namespace: str, uids: list[str]) -> None:
    real_node.plane.kubectl(
        "delete",
        "namespace",
        namespace,
        "--wait=true",
        "--timeout=180s",
        step_name=f"delete the namespace {namespace}",
    )
    wait_until(
        lambda: not any(realnode._spec_files(real_node.cdi_dir, uid) for uid in uids),
        f"{namespace}: NodeUnprepareResources of both drivers removes the CDI specs",
        "no CDI spec of the namespace's claims",
        process=real_node.kubelet,
    )


def _default_gpus(plane: ControlPlane, node: str) -> bool:
    """Whether the node publishes the chart's default mock GPUs: 8 shareable GPUs, 4 under
    each of ``pci0000:00`` and ``pci0000:80``."""
    gpus = [
        d for (driver, _), d in _devices(plane, node).items() if driver == names.DEFAULT_DRIVER_NAME
    ]
    roots = sorted(_attribute(d, names.ATTR_PCIE_ROOT) for d in gpus)
    return roots == ["pci0000:00"] * 4 + ["pci0000:80"] * 4 and all(
        d.get("allowMultipleAllocations") for d in gpus
    )


def test_gpu_and_nic_of_two_drivers_share_a_pcie_root(
    real_node: RealNode, node_plugin: PluginDaemon, tmp_path: Path
) -> None:
    """The NIC driver beside sharegpu's plugin: the example's pod gets a GPU share and ``nic-0``
    under one PCIe root (``pci0000:80``), explain agrees offline; a second such pod stays pending
    (``nic-1``'s root has no GPU) and explain says so."""
    plane = real_node.plane
    if not _default_gpus(plane, real_node.name):  # an earlier test left other values
        plugindaemon.upgrade(node_plugin)
        wait_until(
            lambda: _default_gpus(plane, real_node.name),
            "the plugin publishes the chart's default mock GPUs again",
            "8 shareable GPUs, 4 under pci0000:00 and 4 under pci0000:80",
            process=real_node.kubelet,
        )
    plane.kubectl(
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump(nicdriver.device_class()),
        step_name="apply the NIC class",
    )
    with step("start the NIC driver's kubelet plugin on the real node"):
        driver = nicdriver.start(plane, real_node)
    namespace = "e2e-gpu-and-nic"
    uids: list[str] = []
    try:
        plane.create_namespace(namespace)
        _apply_pods(real_node, namespace, NIC_EXAMPLE)
        _wait_ready(real_node, namespace, "gpu-and-nic")
        claim = _claim_of(plane, namespace, "gpu-and-nic")
        uids.append(claim["metadata"]["uid"])
        results = claim["status"]["allocation"]["devices"]["results"]
        devices = _devices(plane, real_node.name)
        placed = {r["request"]: (r["driver"], r["device"]) for r in results}
        with step("kube-scheduler placed the GPU and the NIC under one PCIe root"):
            assert placed["nic"] == (nicdriver.DRIVER, "nic-0"), placed
            assert placed["gpu"][0] == names.DEFAULT_DRIVER_NAME, placed
            roots = {r: _attribute(devices[d], names.ATTR_PCIE_ROOT) for r, d in placed.items()}
            assert roots == {"gpu": "pci0000:80", "nic": "pci0000:80"}, roots
        env = _check_env(real_node, namespace, "gpu-and-nic", claim)
        assert env.get("NIC_DEVICES") == "nic-0" and env.get("NIC_PCIE_ROOTS") == "pci0000:80", env
        with step("sharegpu explain offline places the example's claim on the same pair"):
            report = _explain(plane, tmp_path, NIC_EXAMPLE, real_node.name)
            (entry,) = report["claims"]
            assert entry["allocated"], (entry, report["slices"])
            assert entry["node"] == real_node.name, (entry, report["slices"])
            offline = {r["request"]: (r["driver"], r["device"]) for r in entry["results"]}
            assert offline["nic"] == placed["nic"], offline
            assert _attribute(devices[offline["gpu"]], names.ATTR_PCIE_ROOT) == "pci0000:80"

        _apply_pods(real_node, namespace, NIC_EXAMPLE, {"gpu-and-nic": "gpu-and-nic-2"})
        _wait_unschedulable(real_node, namespace, "gpu-and-nic-2")
        pending = _claim_of(plane, namespace, "gpu-and-nic-2")
        uids.append(pending["metadata"]["uid"])
        assert not (pending.get("status") or {}).get("allocation"), pending["status"]
        with step("sharegpu explain offline says why the second pod's claim does not fit"):
            name = pending["metadata"]["name"]
            allocated = _dump_claims(plane, namespace, tmp_path / "allocated.yaml")
            mine = _dump_claims(plane, namespace, tmp_path / "pending.yaml", name)
            report = _explain(plane, tmp_path, mine, real_node.name, "--allocated", str(allocated))
            (entry,) = report["claims"]
            assert not entry["allocated"], (entry, report["slices"])
            text = json.dumps(entry)
            assert f"already allocated to {namespace}/{claim['metadata']['name']}" in text
            assert (
                "matchAttribute resource.kubernetes.io/pcieRoot: device has pci0000:40, but no "
                "eligible device of request gpu has that value"
            ) in text, text
    finally:
        _delete_namespace(real_node, namespace, uids)
        plane.processes.stop(driver)
        plane.kubectl(
            "delete",
            "deviceclass",
            nicdriver.DEVICE_CLASS,
            "--ignore-not-found",
            step_name="delete the NIC class",
        )


def test_nvlink_claims_on_gpus_bridged_in_pairs(
    real_node: RealNode, node_plugin: PluginDaemon, tmp_path: Path
) -> None:
    """The release upgraded to mock GPUs bridged in pairs: the two-GPU pod of
    examples/multi-gpu-nvlink runs on one pair, the four-GPU pod stays pending, and explain,
    offline, says that at most two eligible GPUs share an NVLink domain."""
    plane = real_node.plane
    plugindaemon.upgrade(
        node_plugin, json_values=(f"kubeletPlugin.mock.config={json.dumps(PAIRS)}",)
    )

    def pairs_published() -> bool:
        found = _devices(plane, real_node.name)
        return {
            _attribute(d, names.ATTR_NVLINK_DOMAIN)
            for (driver, _), d in found.items()
            if driver == names.DEFAULT_DRIVER_NAME and names.ATTR_NVLINK_DOMAIN in d["attributes"]
        } == {f"pair-{i}" for i in range(4)}

    wait_until(
        pairs_published,
        "the plugin publishes the NVLink pairs of its mock configuration",
        "nvlinkDomain pair-0 to pair-3 on the node's GPUs",
        process=real_node.kubelet,
    )
    namespace = "e2e-multi-gpu-nvlink"
    uids: list[str] = []
    try:
        plane.create_namespace(namespace)
        _apply_pods(real_node, namespace, NVLINK_EXAMPLE)
        _wait_ready(real_node, namespace, "two-nvlink-gpus")
        claim = _claim_of(plane, namespace, "two-nvlink-gpus")
        uids.append(claim["metadata"]["uid"])
        devices = _devices(plane, real_node.name)
        picked = [
            (r["driver"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]
        ]
        with step("kube-scheduler placed the two GPUs on one NVLink pair"):
            domains = {_attribute(devices[d], names.ATTR_NVLINK_DOMAIN) for d in picked}
            assert len(set(picked)) == 2 and len(domains) == 1, (picked, domains)
        _check_env(real_node, namespace, "two-nvlink-gpus", claim)
        _wait_unschedulable(real_node, namespace, "four-nvlink-gpus")
        pending = _claim_of(plane, namespace, "four-nvlink-gpus")
        uids.append(pending["metadata"]["uid"])
        with step("sharegpu explain offline says why four GPUs do not fit on pairs"):
            allocated = _dump_claims(plane, namespace, tmp_path / "allocated.yaml")
            mine = _dump_claims(
                plane, namespace, tmp_path / "pending.yaml", pending["metadata"]["name"]
            )
            report = _explain(plane, tmp_path, mine, real_node.name, "--allocated", str(allocated))
            (entry,) = report["claims"]
            assert not entry["allocated"], (entry, report["slices"])
            assert (
                "matchAttribute gpu.sharegpu.dev/nvlinkDomain: 4 devices must share one value, "
                "at most 2 eligible do"
            ) in json.dumps(entry), (entry, report["slices"])
    finally:
        _delete_namespace(real_node, namespace, uids)
