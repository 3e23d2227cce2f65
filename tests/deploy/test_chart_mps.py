"""The chart's MPS daemon workload: the pod template the plugin makes each GPU's daemon pod from,
the RBAC that lets the plugin create those pods, the plugin's MPS flags and host directory, the
reaper as PID 1, and the driver root mounted with HostToContainer propagation."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeletplugin.config import parse_config
from kubeletplugin.sharing.daemonpods import DAEMON_CONTAINER, daemon_pod, template_problem
from kubeletplugin.sharing.daemons import DaemonSpec
from kubeletplugin.sharing.mpspaths import MpsPaths, check_socket_paths
from tests.deploy.helpers import (
    CHART_DIR,
    KUBERNETES_VERSIONS,
    render_chart,
    run_helm,
    validation_errors,
)
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.helm

NAMESPACE = "gpu-operators"
RELEASE = "sharegpu"
UUID = "GPU-33c27bfa-6498-554f-8335-0c2ead16ec2f"
CLAIM_UID = "0b7e5c1a-3f2d-4c6b-9a8e-1d2c3b4a5f60"


def render(helm: str, *set_args: str) -> list[dict[str, Any]]:
    return render_chart(
        helm,
        *(a for item in set_args for a in ("--set", item)),
        release=RELEASE,
        namespace=NAMESPACE,
    )


def find(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]


def plugin_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [ds] = find(docs, "DaemonSet")
    return dict(ds["spec"]["template"]["spec"])


def template_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [cm] = find(docs, "ConfigMap", "-mps-template")
    doc = yaml.safe_load(cm["data"]["daemon-pod.yaml"])
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def default(helm: str) -> list[dict[str, Any]]:
    return render(helm)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_daemon_pod_the_plugin_makes_validates_strictly(
    default: list[dict[str, Any]], version: str
) -> None:
    template = template_of(default)
    assert template_problem(template) == ""
    paths = MpsPaths.of(Path("/run/sharegpu/mps"), CLAIM_UID, UUID)
    pod = daemon_pod(
        template,
        DaemonSpec(
            paths,
            {"CUDA_VISIBLE_DEVICES": UUID, "CUDA_MPS_PIPE_DIRECTORY": "/p"},
            uuid=UUID,
            claim_uid=CLAIM_UID,
        ),
        namespace=NAMESPACE,
        node_name="gpu-node-1",
    )
    assert validation_errors(pod, version) == []


def test_the_daemon_pod_template_runs_the_daemon_under_tini_like_the_plugin(
    default: list[dict[str, Any]],
) -> None:
    template = template_of(default)
    spec = template["spec"]
    plugin = plugin_pod(default)
    [daemon] = spec["containers"]
    assert daemon["name"] == DAEMON_CONTAINER
    assert daemon["command"] == ["tini", "--", "nvidia-cuda-mps-control", "-f"]
    assert daemon["image"] == plugin["containers"][0]["image"]
    assert spec["restartPolicy"] == "Always"
    assert spec["priorityClassName"] == f"{RELEASE}-mps-daemon"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["automountServiceAccountToken"] is False
    # The same driver files as the plugin, from the same host directory.
    assert spec["initContainers"] == plugin["initContainers"]
    hosts = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert hosts["host-driver"] == "/usr" and hosts["dev"] == "/dev"
    # Readiness is the daemon answering on its control socket.
    assert "get_server_list" in " ".join(daemon["readinessProbe"]["exec"]["command"])
    # No node, no GPU directory: the plugin adds them per GPU.
    assert "nodeName" not in spec and "affinity" not in spec


def test_the_driver_root_is_mounted_with_host_to_container_propagation(helm: str) -> None:
    docs = render(helm, "kubeletPlugin.driverRoot=/run/nvidia/driver")
    for spec in (plugin_pod(docs), template_of(docs)["spec"]):
        [init] = spec["initContainers"]
        [mount] = [m for m in init["volumeMounts"] if m["name"] == "host-driver"]
        assert mount["mountPropagation"] == "HostToContainer" and mount["readOnly"] is True
        # A driver container's root is mounted whole: the driver container mounts it again after
        # an upgrade, which a mount of its usr/ subdirectory would not see.
        assert mount["mountPath"] == "/host-driver-root"
        hosts = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
        assert hosts["host-driver"] == "/run/nvidia/driver"
        script = init["args"][0]
        assert "libnvidia-ml.so.1" in script.split("mkdir")[0]  # waits for NVML first
        assert "nvidia-cuda-mps-control" in script
        assert "nvidia-modprobe" not in script  # the plugin does not run it (no modules there)


def test_the_plugin_may_manage_pods_in_its_namespace_only(default: list[dict[str, Any]]) -> None:
    [role] = find(default, "Role", "-mps-pods")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]}
    ]
    [binding] = find(default, "RoleBinding", "-mps-pods")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    plugin_sa = plugin_pod(default)["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": plugin_sa, "namespace": NAMESPACE}
    ]
    for cluster_role in find(default, "ClusterRole"):
        assert not any(
            "pods" in r["resources"] and "create" in r["verbs"] for r in cluster_role["rules"]
        )


def test_the_plugin_gets_the_mps_root_template_and_namespace(default: list[dict[str, Any]]) -> None:
    pod = plugin_pod(default)
    [plugin] = pod["containers"]
    assert plugin["command"] == ["tini", "-s", "--", "sharegpu-kubeletplugin"]
    assert "--mps-root=/run/sharegpu/mps" in plugin["args"]
    assert "--mps-shm-size=256Mi" in plugin["args"]
    assert "--mps-daemon-pod-template=/etc/sharegpu/mps/daemon-pod.yaml" in plugin["args"]
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["mps-root"] == volumes["mps-root"]["hostPath"]["path"] == "/run/sharegpu/mps"
    assert mounts["mps-daemon-template"] == "/etc/sharegpu/mps"
    assert volumes["mps-daemon-template"]["configMap"]["name"].endswith("-mps-template")
    [namespace] = [e for e in plugin["env"] if e["name"] == "POD_NAMESPACE"]
    assert namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # The flags parse, and the chart's root leaves every socket path within 107 bytes.
    args = [a for a in plugin["args"] if not a.startswith("--metrics-address")]
    config = parse_config(args, environ={"NODE_NAME": "n", "POD_NAMESPACE": NAMESPACE})
    assert config.mps_root is not None and config.namespace == NAMESPACE
    assert config.mps_shm_bytes == 256 * 1024**2
    check_socket_paths(MpsPaths.of(config.mps_root, CLAIM_UID, UUID).pipe)


def test_without_mps_pods_there_is_no_template_and_no_pod_rbac(helm: str) -> None:
    docs = render(helm, "kubeletPlugin.mps.enabled=false")
    assert find(docs, "ConfigMap", "-mps-template") == []
    assert find(docs, "Role", "-mps-pods") == [] and find(docs, "RoleBinding", "-mps-pods") == []
    [plugin] = plugin_pod(docs)["containers"]
    assert not [a for a in plugin["args"] if a.startswith("--mps-daemon-pod-template")]


@pytest.mark.parametrize("size", ["256MB", "1.5Gi", "-1Mi", ""])
def test_a_malformed_shm_size_is_refused_by_the_values_schema(helm: str, size: str) -> None:
    result = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART_DIR),
        "--set-string",
        f"kubeletPlugin.mps.shmSize={size}",
    )
    assert result.returncode != 0
    assert "shmSize" in result.stderr


def test_a_long_mps_root_is_refused_by_the_values_schema(helm: str) -> None:
    result = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART_DIR),
        "--set",
        "kubeletPlugin.mps.hostRoot=/var/lib/kubelet/plugins/gpu.sharegpu.dev/mps/" + "x" * 30,
    )
    assert result.returncode != 0
    assert "hostRoot" in result.stderr


def test_the_image_has_tini_for_the_plugin_and_the_daemons() -> None:
    dockerfile = (REPO_ROOT / "deploy" / "Dockerfile").read_text()
    # The last stage's packages: the image that runs (an earlier stage builds the wheels).
    *_, install = (line for line in dockerfile.splitlines() if "apt-get install" in line)
    assert "tini" in install.split()


def test_a_driver_container_root_is_copied_from_once_nvml_is_there(
    helm: str, tmp_path: Path
) -> None:
    """With a driver container's root the script first waits for NVML (mounted later by the
    driver container); when it is there, it copies at once, the MPS binaries included."""
    docs = render(helm, "kubeletPlugin.driverRoot=/run/nvidia/driver")
    [init] = plugin_pod(docs)["initContainers"]
    host, dest = tmp_path / "driver", tmp_path / "nvidia-root"
    (host / "usr" / "lib64").mkdir(parents=True)
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "lib64" / "libnvidia-ml.so.1").write_text("nvml")
    (host / "usr" / "bin" / "nvidia-cuda-mps-control").write_text("mps")
    script = init["args"][0].replace("/host-driver-root", str(host))
    script = script.replace("/nvidia-root", str(dest))
    assert "nvml_present" in script  # the wait is there for a driver container's root
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (dest / "usr" / "bin" / "nvidia-cuda-mps-control").read_text() == "mps"
    assert (dest / "usr" / "lib64" / "libnvidia-ml.so.1").read_text() == "nvml"


def test_daemon_pods_get_a_priority_class_that_never_preempts(
    default: list[dict[str, Any]], helm: str
) -> None:
    """A daemon pod never preempts a tenant: the chart's own class has preemptionPolicy Never;
    naming another class uses it and creates none."""
    [pc] = find(default, "PriorityClass")
    assert pc["metadata"]["name"] == template_of(default)["spec"]["priorityClassName"]
    assert pc["preemptionPolicy"] == "Never"
    assert pc["value"] == 1000000 and pc["globalDefault"] is False
    other = render(helm, "kubeletPlugin.mps.priorityClassName=tenant-low")
    assert find(other, "PriorityClass") == []
    assert template_of(other)["spec"]["priorityClassName"] == "tenant-low"


def test_the_plugin_gets_the_share_bound(helm: str, default: list[dict[str, Any]]) -> None:
    args = plugin_pod(default)["containers"][0]["args"]
    assert "--max-shares-per-gpu=20" in args
    assert (
        parse_config(
            [a for a in args if a.startswith("--max-")] + ["--node-name", "n"]
        ).max_shares_per_gpu
        == 20
    )
    other = plugin_pod(render(helm, "kubeletPlugin.maxSharesPerGpu=0"))["containers"][0]["args"]
    assert "--max-shares-per-gpu=0" in other
