"""MPS daemons as pods: the pod made for a claim on a GPU, its phase read from its status (a
crashed or zombie daemon is dead), and daemons that outlive a plugin restart, through a fake pod
API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.gpuconfig import DriverConfigs
from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.hosts.simtools import SimulatedNvidiaTools
from kubeletplugin.sharing.daemonpods import (
    ANNOTATION_NODE,
    DAEMON_CONTAINER,
    LABEL_DAEMON,
    LABEL_GPU,
    LABEL_NODE,
    MAX_POD_NAME,
    MAX_TEMPLATE_NAME,
    SET_DEFAULTS_SCRIPT,
    PodLauncher,
    TemplateError,
    daemon_pod,
    load_pod_template,
    pod_phase,
)
from kubeletplugin.sharing.daemons import DaemonError, DaemonPhase, DaemonSpec
from kubeletplugin.sharing.enforcer import SharingEnforcer
from kubeletplugin.sharing.mpspaths import DAEMON_ID_LENGTH, MpsPaths, daemon_id, short_id
from kubeletplugin.sharing.strategies.mps import MpsNode
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.sharing.helpers import GI, FakePodApi, Tools, decided, record

NS = "sharegpu-system"
NODE = "gpu-node-1"
U = "GPU-11111111-2222-3333-4444-555555555555"
CLAIM = "claim-a"

TEMPLATE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "sharegpu-mps", "labels": {"app": "mps"}},
    "spec": {
        "priorityClassName": "system-node-critical",
        "containers": [
            {
                "name": DAEMON_CONTAINER,
                "image": "sharegpu:test",
                "command": ["tini", "--", "nvidia-cuda-mps-control", "-f"],
            }
        ],
    },
}


def spec(root: Path = Path("/run/sharegpu/mps")) -> DaemonSpec:
    paths = MpsPaths.of(root, CLAIM, U)
    return DaemonSpec(
        paths,
        {"CUDA_VISIBLE_DEVICES": U, "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe)},
        uuid=U,
        claim_uid=CLAIM,
    )


def test_the_pod_runs_on_its_node_with_the_claims_directories() -> None:
    pod = daemon_pod(TEMPLATE, spec(), namespace=NS, node_name=NODE)
    sid = daemon_id(CLAIM, U)
    assert pod["metadata"]["name"] == f"sharegpu-mps-{NODE}-{sid}"
    assert pod["metadata"]["namespace"] == NS
    assert pod["metadata"]["labels"] == {
        "app": "mps",
        LABEL_DAEMON: sid,
        LABEL_GPU: short_id(U),
        LABEL_NODE: short_id(NODE),
    }
    assert pod["metadata"]["annotations"] == {
        "mps.sharegpu.dev/gpu-uuid": U,
        "mps.sharegpu.dev/claim-uid": CLAIM,
        "mps.sharegpu.dev/node-name": NODE,
    }
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    ]
    [container] = pod["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "mps-pipe": f"/run/sharegpu/mps/{sid}/pipe",
        "mps-shm": "/dev/shm",
        "mps-log": f"/run/sharegpu/mps/{sid}/log",
    }
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    assert hosts == {
        "mps-pipe": f"/run/sharegpu/mps/{sid}/pipe",
        "mps-shm": f"/run/sharegpu/mps/{sid}/shm",
        "mps-log": f"/run/sharegpu/mps/{sid}/log",
    }
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": U} in container["env"]
    # Every (re)start of the daemon container sets the share's defaults again.
    assert container["lifecycle"]["postStart"]["exec"]["command"] == [
        "sh",
        "-c",
        SET_DEFAULTS_SCRIPT,
    ]
    assert '"$SHAREGPU_MPS_DEFAULTS" | nvidia-cuda-mps-control' in SET_DEFAULTS_SCRIPT
    # The template is left as it was (it makes every GPU's pod).
    assert "volumes" not in TEMPLATE["spec"] and "namespace" not in TEMPLATE["metadata"]


@pytest.mark.parametrize(
    ("status", "deleting", "phase"),
    [
        (None, False, DaemonPhase.ABSENT),
        ({"phase": "Pending"}, False, DaemonPhase.STARTING),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": DAEMON_CONTAINER, "ready": True, "state": {"running": {}}}
                ],
            },
            False,
            DaemonPhase.RUNNING,
        ),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": DAEMON_CONTAINER, "ready": False, "state": {"running": {}}}
                ],
            },
            False,
            DaemonPhase.STARTING,
        ),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": DAEMON_CONTAINER, "state": {"terminated": {"exitCode": 139}}}
                ],
            },
            False,
            DaemonPhase.FAILED,
        ),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": DAEMON_CONTAINER,
                        "restartCount": 3,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    }
                ],
            },
            False,
            DaemonPhase.FAILED,
        ),
        ({"phase": "Failed"}, False, DaemonPhase.FAILED),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": DAEMON_CONTAINER, "ready": True, "state": {"running": {}}}
                ],
            },
            True,
            DaemonPhase.FAILED,
        ),
    ],
)
def test_phase_from_pod_status(status: Any, deleting: bool, phase: DaemonPhase) -> None:
    pod = None
    if status is not None:
        pod = {"metadata": {"name": "p"}, "status": status}
        if deleting:
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_phase(pod) is phase


def test_launch_is_idempotent_and_present_lists_this_nodes_pods() -> None:
    api = FakePodApi(SimulatedNvidiaTools())
    launcher = PodLauncher(api, TEMPLATE, namespace=NS, node_name=NODE)
    other = PodLauncher(api, TEMPLATE, namespace=NS, node_name="other-node")
    launcher.launch(spec())
    launcher.launch(spec())
    assert api.created == 1
    assert launcher.phase(spec()) is DaemonPhase.RUNNING
    assert launcher.present() == [daemon_id(CLAIM, U)] and other.present() == []
    launcher.remove(spec())
    assert launcher.phase(spec()) is DaemonPhase.ABSENT and api.sim.daemons == {}


def test_remove_waits_for_the_pod_to_be_gone_and_says_when_it_is_not() -> None:
    api = FakePodApi(SimulatedNvidiaTools())
    naps: list[float] = []
    launcher = PodLauncher(
        api, TEMPLATE, namespace=NS, node_name=NODE, remove_timeout=1.0, sleep=naps.append
    )
    launcher.launch(spec())
    api.delete = lambda namespace, name, grace_seconds: None  # type: ignore[method-assign]
    name = f"sharegpu-mps-{NODE}-{daemon_id(CLAIM, U)}"
    with pytest.raises(DaemonError, match=f"pod {NS}/{name} is still"):
        launcher.remove(spec())
    assert naps  # it polled, with a bounded back-off


def test_names_carry_the_node_and_stay_within_a_dns_subdomain() -> None:
    longest = {**TEMPLATE, "metadata": {"name": "x" * MAX_TEMPLATE_NAME}}
    node = "n" * (MAX_POD_NAME - MAX_TEMPLATE_NAME - 2 - DAEMON_ID_LENGTH)
    a = daemon_pod(longest, spec(), namespace=NS, node_name=node)
    assert a["metadata"]["name"] == f"{'x' * MAX_TEMPLATE_NAME}-{node}-{daemon_id(CLAIM, U)}"
    assert len(a["metadata"]["name"]) == MAX_POD_NAME
    assert daemon_pod(longest, spec(), namespace=NS, node_name=node) == a  # stable
    too_long = {**TEMPLATE, "metadata": {"name": "x" * (MAX_TEMPLATE_NAME + 1)}}
    with pytest.raises(TemplateError, match=r"metadata\.name must be"):
        PodLauncher(FakePodApi(SimulatedNvidiaTools()), too_long, namespace=NS, node_name=NODE)


def test_a_node_name_too_long_for_the_pod_name_is_a_daemon_error() -> None:
    api = FakePodApi(SimulatedNvidiaTools())
    longest = {**TEMPLATE, "metadata": {"name": "x" * MAX_TEMPLATE_NAME}}
    node = "n" * (MAX_POD_NAME - MAX_TEMPLATE_NAME - 1 - DAEMON_ID_LENGTH)
    launcher = PodLauncher(api, longest, namespace=NS, node_name=node)
    with pytest.raises(DaemonError, match="longer than 253 characters: node name"):
        launcher.launch(spec())
    assert api.pods == {}


def _squat(api: FakePodApi, pod: dict[str, Any]) -> None:
    api.pods[(NS, pod["metadata"]["name"])] = pod


@pytest.mark.parametrize(
    ("forge", "this_node"),
    [
        # another node's plugin creates a pod under this node's name: the policy pins it there
        (
            lambda pod: pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"][0]["matchFields"][0].update(values=["other-node"]),
            False,
        ),
        (lambda pod: pod["metadata"]["annotations"].update({ANNOTATION_NODE: "x"}), False),
        (lambda pod: pod["metadata"]["labels"].pop(LABEL_DAEMON), False),
        (lambda pod: pod["spec"].update(nodeName="other-node"), False),
        # this node's pod, but not of this GPU: no claim's daemon, a leftover to stop
        (lambda pod: pod["metadata"]["labels"].update({LABEL_GPU: "00000000"}), True),
    ],
)
def test_a_pod_of_the_name_that_is_not_this_nodes_daemon_is_never_adopted(
    forge: Any, this_node: bool
) -> None:
    api = FakePodApi(SimulatedNvidiaTools())
    launcher = PodLauncher(api, TEMPLATE, namespace=NS, node_name=NODE)
    squatter = daemon_pod(TEMPLATE, spec(), namespace=NS, node_name=NODE)
    forge(squatter)
    squatter["status"] = {"phase": "Running"}
    _squat(api, squatter)
    for call in (launcher.phase, launcher.launch, launcher.remove):
        with pytest.raises(DaemonError, match="is not this node's MPS daemon"):
            call(spec())
    assert (NS, squatter["metadata"]["name"]) in api.pods and api.created == 0
    assert launcher.present() == ([daemon_id(CLAIM, U)] if this_node else [])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("kind: Deployment\napiVersion: apps/v1\n", "not a v1 Pod manifest"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: ''}\n", "metadata.name must be"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a}]}\n",
            f"no container named '{DAEMON_CONTAINER}'",
        ),
        ("{[", "cannot read it"),
    ],
)
def test_a_bad_template_is_a_clear_error(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    with pytest.raises(TemplateError) as info:
        load_pod_template(path)
    assert str(info.value).startswith(f"MPS daemon pod template {path}: ")
    assert problem in str(info.value)


# --- through the enforcer: survival across plugin restarts, crash detection ---------------------


def enforcer(tools: Tools, api: FakePodApi, data_dir: Path) -> SharingEnforcer:
    launcher = PodLauncher(api, TEMPLATE, namespace=NS, node_name=NODE, sleep=lambda _: None)
    return SharingEnforcer(
        tools.fake, data_dir, driver_name=h.DRIVER, launcher=launcher, mps_root=tools.mps_root
    )


def share(cores: int, memory: int, share_id: str) -> DeviceRecord:
    return record(h.gpus()[0], "gpu-0", ("gpu",), cores, memory, share_id=share_id)


def test_daemon_pods_survive_a_plugin_restart_and_are_adopted_not_restarted(
    tmp_path: Path,
) -> None:
    tools = Tools.new()
    api = FakePodApi(tools.sim)
    uuid = h.gpus()[0].uuid
    first = enforcer(tools, api, tmp_path)
    done = first.apply("claim-a", [share(30, 10 * GI, "s-1")], DriverConfigs())
    state = first.export_state()
    daemon = daemon_id("claim-a", uuid)
    assert state["mps"][daemon]["daemon"] == f"pod {NS}/sharegpu-mps-{NODE}-{daemon}"
    # The plugin container restarts (or the DaemonSet rolls): the daemon pod stays.
    second = enforcer(tools, api, tmp_path)
    second.restore(
        state,
        {"claim-a": decided([share(30, 10 * GI, "s-1")], done)},
        node_gpus=[g.uuid for g in h.gpus()],
    )
    assert api.created == 1 and tools.sim.daemons_started == 1
    assert second.node_of(MpsNode).manager.running()[daemon].adopted
    # The next claim gets a daemon of its own; releasing the first leaves it alone.
    second.apply("claim-b", [share(20, 5 * GI, "s-2")], DriverConfigs())
    assert api.created == 2
    second.release("claim-a")
    assert len(api.pods) == 1 and tools.sim.daemons_started == 2
    second.release("claim-b")
    assert api.pods == {} and tools.sim.mode(uuid) == "DEFAULT"


def test_a_restart_stops_daemon_pods_no_prepared_claim_needs(tmp_path: Path) -> None:
    tools = Tools.new()
    api = FakePodApi(tools.sim)
    uuid = h.gpus()[0].uuid
    enforcer(tools, api, tmp_path).apply("claim-a", [share(30, 10 * GI, "s-1")], DriverConfigs())
    # The checkpoint is lost and with it every record: the pod alone tells.
    import shutil

    shutil.rmtree(tools.mps_root)
    enforcer(tools, api, tmp_path).restore(None, {}, node_gpus=[g.uuid for g in h.gpus()])
    assert api.pods == {} and tools.sim.mode(uuid) == "DEFAULT"


def test_a_crashed_daemon_pod_is_replaced_before_the_next_share_attaches(tmp_path: Path) -> None:
    tools = Tools.new()
    api = FakePodApi(tools.sim)
    uuid = h.gpus()[0].uuid
    plugin = enforcer(tools, api, tmp_path)
    plugin.apply("claim-a", [share(30, 10 * GI, "s-1")], DriverConfigs())
    api.crash(NS, f"sharegpu-mps-{NODE}-{daemon_id('claim-a', uuid)}")
    tools.fake.clear()
    # A re-prepare of the claim (kubelet retries) replaces its crash-looping daemon.
    plugin.apply("claim-a", [share(30, 10 * GI, "s-1")], DriverConfigs())
    assert api.created == 2 and tools.sim.daemons_started == 2
    [pod] = api.pods.values()
    assert pod_phase(pod) is DaemonPhase.RUNNING
