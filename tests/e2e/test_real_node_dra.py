"""The driver's kubelet plugin under a real kubelet: the chart installed with ``helm install``
(mock backend, the driver's image built without docker), whose DaemonSet's pod registers through
the kubelet's plugin registration directory, later ``helm upgrade`` to other values; the pods of
examples/two-pods-fractional-share, pinned to the node, reach Running after the kubelet's
NodePrepareResources; inside each container (``kubectl exec``) the environment is what the
claim's CDI spec promised; deleting the pods and claims makes the kubelet call
NodeUnprepareResources, which removes the specs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeletplugin.hosts.simtools import PID_FILE as MPS_PID_FILE
from sharegpuctl.cli.demo_inputs import DEMO_EXAMPLES
from tests.deploy.helpers import load_documents
from tests.e2e import plugindaemon
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import BUSYBOX_IMAGE, RealNode
from tests.e2e.node import chart_flag, node_slices
from tests.e2e.plugindaemon import PluginDaemon
from tests.e2e.processes import step, wait_until
from tests.paths import EXAMPLES_DIR

NAMESPACE = "e2e-real-node"
EXAMPLE = EXAMPLES_DIR / "two-pods-fractional-share" / "two-pods-fractional-share.yaml"
#: The example's claims (and pods of the same name) and the cores each asks for.
SHARES = {"small-share": "30", "large-share": "50"}
#: What each container prints and then does: the environment the example's pods print, then
#: sleep (the busybox image has no Python or CUDA for the rest of the example's command).
COMMAND = "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|SHAREGPU_|CUDA_MPS_)' | sort; exec sleep 3600"


def _example_on(node: str, path: Path = EXAMPLE) -> list[dict[str, Any]]:
    """The example's documents; the pods (and pod templates) pinned to ``node``, their
    containers running :data:`COMMAND` from the busybox image with no resources but their
    claims."""
    docs = load_documents(path.read_text())
    for doc in docs:
        if doc["kind"] not in ("Pod", "Deployment", "Job"):
            continue
        spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        spec["terminationGracePeriodSeconds"] = 1
        for container in spec["containers"]:
            claims = container.get("resources", {}).get("claims")
            container.update(
                image=BUSYBOX_IMAGE,
                imagePullPolicy="Never",
                command=["sh", "-c", COMMAND],
                args=[],
                resources={"claims": claims} if claims else {},
            )
    return docs


def _claim_uids(plane: ControlPlane, namespace: str = NAMESPACE) -> dict[str, str]:
    out = plane.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
    return {c["metadata"]["name"]: c["metadata"]["uid"] for c in json.loads(out)["items"]}


def _spec_files(cdi_dir: Path, uid: str) -> list[Path]:
    return [p for p in cdi_dir.glob("*") if uid in p.name]


def test_kubelet_registers_the_plugin(
    real_node: RealNode, node_plugin: PluginDaemon, chart: list[dict[str, Any]]
) -> None:
    assert real_node.kubelet is not None
    kubelet = real_node.kubelet
    driver_name = chart_flag(chart, "--driver-name")
    # The kubelet's DRA plugin manager logs the connection to the plugin's DRA socket.
    pattern = re.compile(
        rf'"Connection changed".*driverName="{re.escape(driver_name)}".*connected=true'
    )

    def registered() -> bool:
        return bool(pattern.search(kubelet.log.read_text(errors="replace")))

    wait_until(
        registered,
        "the kubelet registers the plugin",
        f"a kubelet log line matching {pattern.pattern!r}",
        process=kubelet,
    )


def test_example_pods_run_with_their_shares_and_unprepare(
    real_node: RealNode, node_plugin: PluginDaemon, chart: list[dict[str, Any]]
) -> None:
    plane = real_node.plane
    plane.create_namespace(NAMESPACE)
    plane.kubectl(
        "apply",
        "-n",
        NAMESPACE,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(_example_on(real_node.name)),
        step_name="apply examples/two-pods-fractional-share, pods pinned to the real node",
    )
    for pod in SHARES:
        plane.kubectl(
            "wait",
            "--for=condition=Ready",
            f"pod/{pod}",
            "-n",
            NAMESPACE,
            "--timeout=240s",
            step_name=f"pod {pod} Running after the kubelet's NodePrepareResources",
        )
    uids = _claim_uids(plane)
    for pod, cores in SHARES.items():
        out = plane.kubectl("exec", pod, "-n", NAMESPACE, "--", "env", step_name="kubectl exec env")
        env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        with step(
            f"the environment of {pod} is its claim's CDI edits", f"kubectl exec {pod} -- env"
        ):
            assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == cores, env
            assert env.get("NVIDIA_VISIBLE_DEVICES"), env
        logs = plane.kubectl("logs", pod, "-n", NAMESPACE, step_name="kubectl logs").stdout
        with step(f"{pod} printed its share", f"kubectl logs {pod}"):
            assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={cores}" in logs, logs
        with step(f"the CDI spec of {pod}'s claim", f"ls {real_node.cdi_dir}"):
            assert _spec_files(real_node.cdi_dir, uids[pod]), list(real_node.cdi_dir.iterdir())
    _check_fault_reaches_pod_status(plane, node_plugin, "small-share")
    plane.kubectl(
        "delete",
        "pods",
        *SHARES,
        "-n",
        NAMESPACE,
        "--wait=true",
        "--timeout=120s",
        step_name="delete the pods",
    )
    plane.kubectl(
        "delete",
        "resourceclaims",
        *SHARES,
        "-n",
        NAMESPACE,
        "--wait=true",
        "--timeout=120s",
        step_name="delete the claims",
    )
    wait_until(
        lambda: not any(_spec_files(real_node.cdi_dir, uid) for uid in uids.values()),
        "the kubelet's NodeUnprepareResources removes the CDI specs",
        f"no CDI spec of the claims {sorted(uids.values())} in {real_node.cdi_dir}",
        process=real_node.kubelet,
    )
    node_plugin.check_no_forbidden("the plugin's pod on the real node with the chart's RBAC")


def _check_fault_reaches_pod_status(plane: ControlPlane, daemon: PluginDaemon, pod: str) -> None:
    """A fault of the pod's mock GPU (the plugin's health file) reaches the pod's
    ``allocatedResourcesStatus`` through the kubelet's health stream (ResourceHealthStatus, beta
    and on by default in 1.37)."""
    out = plane.kubectl("get", "resourceclaim", pod, "-n", NAMESPACE, "-o", "json").stdout
    (result,) = json.loads(out)["status"]["allocation"]["devices"]["results"]
    index = int(result["device"].rsplit("-", 1)[1])
    daemon.health_file.write_text(f'{index}: {{healthy: false, reason: "XID 79"}}\n')
    seen: list[Any] = []

    def unhealthy() -> bool:
        out = plane.kubectl("get", "pod", pod, "-n", NAMESPACE, "-o", "json").stdout
        statuses = json.loads(out)["status"].get("containerStatuses", [])
        seen[:] = [s.get("allocatedResourcesStatus") for s in statuses]
        return any(
            r.get("health") == "Unhealthy"
            for s in statuses
            for entry in s.get("allocatedResourcesStatus") or []
            for r in entry.get("resources") or []
        )

    try:
        wait_until(
            unhealthy,
            "a mock GPU fault reaches the pod's status through the kubelet",
            f"{pod}: allocatedResourcesStatus with health Unhealthy",
            process=daemon.node.kubelet,
            deadline_s=120,
        )
    finally:
        daemon.health_file.unlink(missing_ok=True)
    with step("the unhealthy resource is the claim's device", "kubectl get pod -o json"):
        ids = [r["resourceID"] for e in seen[0] for r in e.get("resources") or []]
        assert any(result["device"] in i for i in ids), seen


def test_plugin_restart_while_pods_start(real_node: RealNode, node_plugin: PluginDaemon) -> None:
    """The plugin's pod deleted (the DaemonSet starts a new one) and the example's pods created at
    once: they reach Running with their shares once the new pod serves, the node's ResourceSlices
    are the same objects, unchanged, and the new pod unprepares the claims it prepared."""
    plane = real_node.plane
    namespace = "e2e-plugin-restart"
    plane.create_namespace(namespace)
    before = _untainted_slices(real_node, "the restart")
    old = node_plugin.pod()
    assert old is not None
    plane.kubectl(
        "delete", "pod", old["metadata"]["name"], "-n", old["metadata"]["namespace"], "--wait=false"
    )
    plane.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(_example_on(real_node.name)),
        step_name="apply examples/two-pods-fractional-share while the plugin restarts",
    )

    def restarted() -> bool:
        pod = node_plugin.pod()
        return (
            pod is not None
            and pod["metadata"]["uid"] != old["metadata"]["uid"]
            and any(s.get("ready") for s in pod["status"].get("containerStatuses", []))
        )

    wait_until(restarted, "the DaemonSet restarts the plugin", "a new plugin pod ready")
    for pod, cores in SHARES.items():
        plane.kubectl(
            "wait",
            "--for=condition=Ready",
            f"pod/{pod}",
            "-n",
            namespace,
            "--timeout=240s",
            step_name=f"pod {pod} Running after the plugin's restart",
        )
        out = plane.kubectl("exec", pod, "-n", namespace, "--", "env", step_name="kubectl exec")
        with step(f"{pod} has its share after the plugin's restart", f"kubectl exec {pod} -- env"):
            assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={cores}" in out.stdout, out.stdout
    _check_slices_unchanged(real_node, before, "the restarted plugin")
    uids = _claim_uids(plane, namespace)
    plane.kubectl(
        "delete",
        "namespace",
        namespace,
        "--wait=true",
        "--timeout=180s",
        step_name="delete the namespace",
    )
    wait_until(
        lambda: not any(_spec_files(real_node.cdi_dir, uid) for uid in uids.values()),
        "the restarted plugin unprepares the claims",
        "no CDI spec of the claims",
        process=real_node.kubelet,
    )


def test_helm_upgrade_while_pods_start(real_node: RealNode, node_plugin: PluginDaemon) -> None:
    """``helm upgrade`` to another image of the plugin while the example's pods are created, with
    the example running already in another namespace: the new pods reach Running with their
    shares once the upgraded pod serves; the running pods never restart, and their claims'
    CDI specs and MPS daemon directories (pid file and sockets) stay; the node's ResourceSlices
    are the same objects, not rewritten; no pod fails."""
    plane = real_node.plane
    running_ns, starting_ns = "e2e-upgrade-running", "e2e-upgrade-starting"
    for namespace in (running_ns, starting_ns):
        plane.create_namespace(namespace)
    _apply_example(real_node, running_ns, "apply examples/two-pods-fractional-share")
    _wait_ready(plane, running_ns, "before the upgrade")
    prepared = _claim_uids(plane, running_ns)
    specs = {uid: sorted(_spec_files(real_node.cdi_dir, uid)) for uid in prepared.values()}
    mps_root = real_node.root / "mps"
    daemons = sorted({d for uid in prepared.values() for d in _mps_daemons(real_node, uid)})
    with step("the running claims' MPS daemons are there before the upgrade", f"ls {mps_root}"):
        assert all(specs.values()), specs
        assert daemons and all((d / "pipe" / MPS_PID_FILE).is_file() for d in daemons), daemons
    pods_before = _pod_states(plane, running_ns)
    before = _untainted_slices(real_node, "the upgrade")
    image = f"{node_plugin.image.rsplit(':', 1)[0]}:{plugindaemon.UPGRADE_TAG}"
    upgraded = plugindaemon.upgrade(
        node_plugin,
        image=image,
        meanwhile=lambda: _apply_example(
            real_node, starting_ns, "apply examples/two-pods-fractional-share during the upgrade"
        ),
    )
    pod = upgraded.pod()
    with step("the upgraded plugin pod runs the new image", "kubectl get pods"):
        assert pod is not None
        (container,) = pod["spec"]["containers"]
        assert container["image"] == image, container["image"]
    _wait_ready(plane, starting_ns, "after the upgrade")
    for name, cores in SHARES.items():
        out = plane.kubectl("exec", name, "-n", starting_ns, "--", "env", step_name="kubectl exec")
        with step(f"{name} has its share after the upgrade", f"kubectl exec {name} -- env"):
            assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={cores}" in out.stdout, out.stdout
    with step("the running pods and their prepared claims survived the upgrade", "kubectl get"):
        assert _pod_states(plane, running_ns) == pods_before
        after_specs = {uid: sorted(_spec_files(real_node.cdi_dir, uid)) for uid in specs}
        assert after_specs == specs
        assert all((d / "pipe" / MPS_PID_FILE).is_file() for d in daemons), daemons
    with step("no pod failed during the upgrade", "kubectl get pods"):
        for namespace in (running_ns, starting_ns):
            states = _pod_states(plane, namespace)
            assert states and all(s[0] == "Running" and s[2] == 0 for s in states.values()), states
    _check_slices_unchanged(real_node, before, "the upgrade")
    node_plugin.check_no_forbidden("the upgraded plugin with the chart's RBAC")
    uids = {**prepared, **{f"starting/{k}": v for k, v in _claim_uids(plane, starting_ns).items()}}
    for namespace in (running_ns, starting_ns):
        plane.kubectl(
            "delete",
            "namespace",
            namespace,
            "--wait=true",
            "--timeout=180s",
            step_name="delete the namespace",
        )
    wait_until(
        lambda: not any(_spec_files(real_node.cdi_dir, uid) for uid in uids.values()),
        "the upgraded plugin unprepares the claims of before and after the upgrade",
        "no CDI spec of the claims",
        process=real_node.kubelet,
    )


def _apply_example(real_node: RealNode, namespace: str, step_name: str) -> None:
    real_node.plane.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(_example_on(real_node.name)),
        step_name=step_name,
    )


def _wait_ready(plane: ControlPlane, namespace: str, when: str) -> None:
    for pod in SHARES:
        plane.kubectl(
            "wait",
            "--for=condition=Ready",
            f"pod/{pod}",
            "-n",
            namespace,
            "--timeout=240s",
            step_name=f"pod {pod} of {namespace} Running {when}",
        )


def _pod_states(plane: ControlPlane, namespace: str) -> dict[str, tuple[str, str, int]]:
    """Each pod's phase, uid and the restart count of its containers."""
    out = plane.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
    return {
        p["metadata"]["name"]: (
            p["status"].get("phase", ""),
            p["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", [])),
        )
        for p in json.loads(out)["items"]
    }


def _mps_daemons(real_node: RealNode, uid: str) -> set[Path]:
    """The MPS daemon directories (``<mps root>/<daemon id>``) the CDI specs of claim ``uid``
    mount into its containers."""
    root = real_node.root / "mps"
    found: set[Path] = set()
    for path in _spec_files(real_node.cdi_dir, uid):
        spec = json.loads(path.read_text())
        edits = [spec.get("containerEdits") or {}]
        edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
        for edit in edits:
            for mount in edit.get("mounts") or []:
                host = Path(mount.get("hostPath", "/"))
                if host.is_relative_to(root) and host != root:
                    found.add(root / host.relative_to(root).parts[0])
    return found


def _devices(slice_: dict[str, Any]) -> list[dict[str, Any]]:
    return list(slice_["spec"].get("devices", []))


def _untainted_slices(real_node: RealNode, before_what: str) -> dict[str, dict[str, Any]]:
    """The node's ResourceSlices by name, once no device has a taint: a fault injected by an
    earlier test taints a device until enough healthy probes pass."""
    plane = real_node.plane
    wait_until(
        lambda: (
            not any(
                d.get("taints") for sl in node_slices(plane, real_node.name) for d in _devices(sl)
            )
        ),
        f"the node's devices are untainted before {before_what}",
        "no device with taints",
        process=real_node.kubelet,
    )
    return {sl["metadata"]["name"]: sl for sl in node_slices(plane, real_node.name)}


def _check_slices_unchanged(
    real_node: RealNode, before: dict[str, dict[str, Any]], who: str
) -> None:
    """The node's ResourceSlices are the objects of ``before``: same names, spec, generation and
    resourceVersion (not rewritten at all)."""
    after = {sl["metadata"]["name"]: sl for sl in node_slices(real_node.plane, real_node.name)}
    with step(f"{who} left the node's ResourceSlices as they were", "kubectl get resourceslices"):
        assert sorted(after) == sorted(before)
        changed = {n: _changes(before[n], after[n]) for n in after}
        assert not any(changed.values()), changed
        versions = {
            n: (before[n]["metadata"]["resourceVersion"], sl["metadata"]["resourceVersion"])
            for n, sl in after.items()
        }
        assert all(a == b for a, b in versions.values()), versions


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The top-level spec fields (and metadata.generation) that differ between two versions of
    a ResourceSlice."""
    keys = sorted(set(old["spec"]) | set(new["spec"]))
    changed = [f"spec.{k}" for k in keys if old["spec"].get(k) != new["spec"].get(k)]
    if old["metadata"].get("generation") != new["metadata"].get("generation"):
        changed.append("metadata.generation")
    return changed


#: The consumable-mode examples (those ``sharegpu demo`` runs, the burstable share with its own
#: DeviceClass among them, and time-slicing's Deployment), besides two-pods-fractional-share.
OTHER_EXAMPLES = (
    *(e for e in DEMO_EXAMPLES if e != EXAMPLE.parent.name),
    "time-slicing",
)


def _spec_env(cdi_dir: Path, uid: str) -> dict[str, str]:
    """The environment every CDI spec of claim ``uid`` adds (spec-wide and per device)."""
    env: dict[str, str] = {}
    for path in _spec_files(cdi_dir, uid):
        spec = json.loads(path.read_text())
        edits = [spec.get("containerEdits") or {}]
        edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
        for edit in edits:
            env.update(e.split("=", 1) for e in edit.get("env", []))
    return env


#: Variables some examples' pods must see, by example and pod: what the example's README says
#: the driver gives them (the burstable share: its limit enforced, its request reported).
EXPECTED_ENV: dict[str, dict[str, dict[str, str]]] = {
    "burstable-shares": {
        "burstable-share": {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
            "SHAREGPU_CORES": "25",
            "SHAREGPU_MEMORY": str(8 * 1024**3),
        }
    },
}


@pytest.mark.parametrize("example", OTHER_EXAMPLES)
def test_example_runs_on_the_real_node(
    real_node: RealNode, node_plugin: PluginDaemon, example: str
) -> None:
    envs = _run_example(real_node, example)
    for pod, expected in EXPECTED_ENV.get(example, {}).items():
        with step(f"{example}: {pod} sees what its README says", "kubectl exec"):
            assert {k: envs[pod].get(k) for k in expected} == expected, envs[pod]


#: The partitions-mode examples, run after the plugin's DaemonSet is switched to that mode.
PARTITION_EXAMPLES = ("partitions", "admin-device-classes")


def test_partition_examples_after_switching_the_plugin(
    real_node: RealNode, node_plugin: PluginDaemon
) -> None:
    """The release upgraded with ``kubeletPlugin.sharingMode=partitions``: a new pod
    publishes partitions (devices drawing on shared counters), and the partitions examples run."""
    plugindaemon.upgrade(node_plugin, "kubeletPlugin.sharingMode=partitions")

    def partitions_published() -> bool:
        devices = [
            d
            for sl in node_slices(real_node.plane, real_node.name)
            for d in sl["spec"].get("devices", [])
        ]
        return any(d.get("consumesCounters") for d in devices)

    wait_until(
        partitions_published,
        "the plugin publishes partitions after the switch",
        "a device of the node with consumesCounters",
        process=real_node.kubelet,
    )
    for example in PARTITION_EXAMPLES:
        _run_example(real_node, example)


def test_dynamic_mig_example_after_switching_the_plugin(
    real_node: RealNode, node_plugin: PluginDaemon
) -> None:
    """The release upgraded with ``kubeletPlugin.mig=dynamic`` as well (the mock GPUs are then
    in MIG mode): a new pod publishes MIG placements, and examples/mig-dynamic runs, each pod on
    the MIG device created for its claim."""
    plugindaemon.upgrade(
        node_plugin, "kubeletPlugin.sharingMode=partitions", "kubeletPlugin.mig=dynamic"
    )

    def placements_published() -> bool:
        return any(
            "-mig-" in d["name"]
            for sl in node_slices(real_node.plane, real_node.name)
            for d in sl["spec"].get("devices", [])
        )

    wait_until(
        placements_published,
        "the plugin publishes MIG placements after the switch",
        "a device of the node named gpu-<i>-mig-<profile>-<slice>",
        process=real_node.kubelet,
    )
    _run_example(real_node, "mig-dynamic")


def _run_example(real_node: RealNode, example: str) -> dict[str, dict[str, str]]:
    """Each pod of the example runs; inside each container the environment holds every variable
    the CDI specs of its pod's claims set; deleting the namespace unprepares every claim. Returns
    each pod's environment, by pod name."""
    plane = real_node.plane
    namespace = f"e2e-{example}"
    plane.create_namespace(namespace)
    docs = [
        d
        for f in sorted((EXAMPLES_DIR / example).glob("*.yaml"))
        for d in _example_on(real_node.name, f)
    ]
    plane.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
        step_name=f"apply examples/{example}, pods pinned to the real node",
    )
    pods: list[dict[str, Any]] = []

    def all_ready() -> bool:
        out = plane.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
        pods[:] = json.loads(out)["items"]
        return bool(pods) and all(
            any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions", [])
            )
            for p in pods
        )

    wait_until(
        all_ready,
        f"the pods of examples/{example} run on the real kubelet",
        "every pod Ready",
        process=real_node.kubelet,
        deadline_s=240,
    )
    claims = json.loads(
        plane.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
    )["items"]
    uid_of = {c["metadata"]["name"]: c["metadata"]["uid"] for c in claims}
    envs: dict[str, dict[str, str]] = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        promised: dict[str, str] = {}
        for status in pod["status"].get("resourceClaimStatuses", []):
            promised.update(_spec_env(real_node.cdi_dir, uid_of[status["resourceClaimName"]]))
        for claim_source in pod["spec"].get("resourceClaims", []):
            if claim_source.get("resourceClaimName"):
                promised.update(
                    _spec_env(real_node.cdi_dir, uid_of[claim_source["resourceClaimName"]])
                )
        out = plane.kubectl("exec", name, "-n", namespace, "--", "env", step_name="kubectl exec")
        env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        envs[name] = env
        with step(f"{example}: the environment of {name} is its claims' CDI edits", "kubectl exec"):
            assert promised, f"no CDI spec for the claims of {name}"
            assert {k: env.get(k) for k in promised} == promised, env
    plane.kubectl(
        "delete",
        "namespace",
        namespace,
        "--wait=true",
        "--timeout=180s",
        step_name=f"delete the namespace of examples/{example}",
    )
    wait_until(
        lambda: not any(_spec_files(real_node.cdi_dir, uid) for uid in uid_of.values()),
        f"{example}: NodeUnprepareResources removes the CDI specs",
        "no CDI spec of the example's claims",
        process=real_node.kubelet,
    )
    return envs


#: Mock GPUs for examples/mig-static: GPU 0 in MIG mode split into two 1g.10gb and one 3g.40gb
#: MIG devices (as its README shows), GPU 1 whole.
MIG_GPUS = """\
- migDevices:
    - {profile: 1g.10gb, gpuInstance: 9}
    - {profile: 1g.10gb, gpuInstance: 10}
    - {profile: 3g.40gb, gpuInstance: 2}
- {}
"""


def test_static_mig_example_after_switching_the_plugin(
    real_node: RealNode, node_plugin: PluginDaemon
) -> None:
    """The release upgraded in the default modes with ``kubeletPlugin.mock.config`` naming
    MIG devices on GPU 0: a new pod publishes them, and examples/mig-static runs."""
    plugindaemon.upgrade(
        node_plugin, json_values=(f"kubeletPlugin.mock.config={json.dumps(MIG_GPUS)}",)
    )

    def mig_devices_published() -> bool:
        names = {
            d["name"]
            for sl in node_slices(real_node.plane, real_node.name)
            for d in sl["spec"].get("devices", [])
        }
        return {"gpu-0-mig-9-0", "gpu-0-mig-10-0", "gpu-0-mig-2-0", "gpu-1"} == names

    wait_until(
        mig_devices_published,
        "the plugin publishes the MIG devices of its mock configuration",
        "devices gpu-0-mig-9-0, gpu-0-mig-10-0, gpu-0-mig-2-0 and gpu-1",
        process=real_node.kubelet,
    )
    _run_example(real_node, "mig-static")
