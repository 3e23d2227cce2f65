"""``sharegpu demo --keep-running``, driven by the real kubectl as a new user would: the
examples applied with ``kubectl apply -f``, pods Running with their shares in ``kubectl logs``,
claims from templates, FailedScheduling with the allocator's reason, workloads refused, quota
admission and status, schema validation of GPU edits, unprepare and deallocation on delete,
and the report on SIGTERM. Every wait is on a condition, with generous timeouts."""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import urllib3
import yaml

from tests.helpers import PATIENCE_S, built_kubectl, eventually
from tests.paths import REPO_ROOT
from tests.sharegpuctl.kubectlrun import Kubectl

#: How long the demo may take to allocate and prepare every example claim on a busy machine.
START_TIMEOUT_S = 240.0
#: How long the demo cluster may take to react to one change on a busy machine.
WAIT_S = 120.0
#: A pod whose claim asks for more GPUs than the node has.
TOO_BIG = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: nine-gpus
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: gpu.sharegpu.dev
            allocationMode: ExactCount
            count: 9
---
apiVersion: v1
kind: Pod
metadata:
  name: too-big
spec:
  containers:
    - name: c
      image: busybox
      resources:
        claims:
          - name: gpus
  resourceClaims:
    - name: gpus
      resourceClaimTemplateName: nine-gpus
"""
DEMO = "import sys; from sharegpuctl.cli import main; sys.exit(main())"


@dataclass
class RunningDemo:
    process: subprocess.Popen[str]
    kubeconfig: str
    server: str
    stderr_lines: list[str]


def _lines(stream: IO[str], sink: queue.Queue[str | None]) -> None:
    for line in stream:
        sink.put(line)
    sink.put(None)


@pytest.fixture(scope="module")
def demo() -> Iterator[RunningDemo]:
    process = subprocess.Popen(
        [sys.executable, "-c", DEMO, "demo", "--keep-running", "-o", "json"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stderr, lines), daemon=True).start()
    seen: list[str] = []
    kubeconfig = None
    try:
        while kubeconfig is None:
            line = lines.get(timeout=START_TIMEOUT_S)
            assert line is not None, f"the demo ended before it printed a kubeconfig: {seen}"
            seen.append(line)
            match = re.search(r"export KUBECONFIG=(\S+)", line)
            kubeconfig = match.group(1) if match else None
        config = yaml.safe_load(Path(kubeconfig).read_text(encoding="utf-8"))
        server = config["clusters"][0]["cluster"]["server"]
        yield RunningDemo(process, kubeconfig, server, seen)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=PATIENCE_S * 4)


@pytest.fixture(scope="module")
def kubectl(demo: RunningDemo, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    home = tmp_path_factory.mktemp("kubectl-home")
    return Kubectl(built_kubectl(), demo.kubeconfig, home, cwd=REPO_ROOT)


def _pod_phase(kubectl: Kubectl, name: str) -> str:
    out = kubectl.run("get", "pod", name, "-o", "jsonpath={.status.phase}")
    return out.stdout if out.returncode == 0 else ""


def _events(kubectl: Kubectl, pod: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json(
        "get", "events", "--field-selector", f"involvedObject.name={pod}"
    )["items"]
    return items


def _counted_claims(kubectl: Kubectl) -> set[str]:
    gpus = kubectl.json("get", "gpus")["items"]
    return {a["claimName"] for g in gpus for a in (g["status"].get("allocations") or [])}


def test_the_server_is_loopback_tls_and_needs_the_token(demo: RunningDemo) -> None:
    assert demo.server.startswith("https://127.0.0.1:")
    assert stat.S_IMODE(os.stat(demo.kubeconfig).st_mode) == 0o600
    config = yaml.safe_load(Path(demo.kubeconfig).read_text(encoding="utf-8"))
    ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
    token = config["users"][0]["user"]["token"]
    with tempfile.NamedTemporaryFile(suffix=".crt") as ca_file:
        ca_file.write(ca)
        ca_file.flush()
        pool = urllib3.PoolManager(ca_certs=ca_file.name, cert_reqs="CERT_REQUIRED")
        assert pool.request("GET", f"{demo.server}/api", retries=False).status == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert pool.request("GET", f"{demo.server}/api", headers=auth).status == 200


def test_the_banner_says_what_reacts(demo: RunningDemo) -> None:
    text = "".join(demo.stderr_lines)
    assert "What reacts to kubectl" in text and "make local-cluster" in text
    assert all(len(line.rstrip("\n")) <= 120 for line in demo.stderr_lines)


def test_examples_run_as_pods_with_their_shares(kubectl: Kubectl) -> None:
    for example in ("two-pods-fractional-share", "whole-gpu", "mps-with-overrides"):
        kubectl.ok("apply", "-f", f"examples/{example}/")
    for pod in ("small-share", "large-share", "whole-gpu", "mps-share"):
        eventually(
            lambda pod=pod: _pod_phase(kubectl, pod) == "Running",
            f"pod {pod} Running",
            timeout_s=WAIT_S,
        )
    logs = kubectl.ok("logs", "small-share")
    assert "SHAREGPU_CORES=30" in logs.splitlines()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in logs.splitlines()
    assert "# claim small-share" in logs
    mps = kubectl.ok("logs", "mps-share").splitlines()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in mps  # the GpuConfig override
    # the template's claim: generated, owned by the pod, reserved for it
    pod = kubectl.json("get", "pod", "whole-gpu")
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = kubectl.json("get", "resourceclaim", status["resourceClaimName"])
    assert claim["metadata"]["name"].startswith("whole-gpu-gpu-")
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Pod",
        "whole-gpu",
        pod["metadata"]["uid"],
    )
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "whole-gpu", "uid": pod["metadata"]["uid"]}
    ]
    reasons = {e["reason"] for e in _events(kubectl, "whole-gpu")}
    assert {"Scheduled", "Started"} <= reasons
    eventually(
        lambda: claim["metadata"]["name"] in _counted_claims(kubectl),
        "the GPU objects count the generated claim",
        timeout_s=WAIT_S,
    )


def test_a_pod_that_cannot_fit_gets_failed_scheduling_with_the_reason(
    kubectl: Kubectl, tmp_path: Path
) -> None:
    manifest = tmp_path / "too-big.yaml"
    manifest.write_text(TOO_BIG)
    kubectl.ok("apply", "-f", str(manifest))

    def failed() -> list[dict[str, Any]]:
        return [e for e in _events(kubectl, "too-big") if e["reason"] == "FailedScheduling"]

    (event,) = eventually(failed, "a FailedScheduling event", timeout_s=WAIT_S)
    assert event["type"] == "Warning"
    assert "0/1 nodes are available" in event["message"]
    assert "needs 9 device(s)" in event["message"]  # the allocator's reason, as explain says it
    assert _pod_phase(kubectl, "too-big") == "Pending"


def test_workloads_are_refused_naming_make_local_cluster(kubectl: Kubectl) -> None:
    out = kubectl.run("apply", "-f", "examples/vllm-inference/")
    assert out.returncode != 0
    assert "make local-cluster" in out.stderr and "Deployment" in out.stderr
    assert "resourceclaimtemplate.resource.k8s.io/vllm-share created" in out.stdout
    assert kubectl.json("get", "deployments")["items"] == []
    assert kubectl.json("get", "services")["items"] == []


def test_quota_admission_and_status(kubectl: Kubectl) -> None:
    kubectl.ok("apply", "-f", "examples/gpu-quota/gpu-quota.yaml")
    out = kubectl.run("apply", "-f", "examples/gpu-quota/quota-claims.yaml")
    assert out.returncode != 0 and "exceeded GpuQuota gpu-quota-demo/team-gpus" in out.stderr

    def used() -> Any:
        quota = kubectl.json("get", "gpuquota", "-n", "gpu-quota-demo", "team-gpus")
        return (quota.get("status") or {}).get("used", {}).get("cores") == 60

    eventually(used, "the GpuQuota's status counts share-a", timeout_s=WAIT_S)


def test_editing_a_gpu_to_a_bogus_sharing_mode_is_refused(kubectl: Kubectl, tmp_path: Path) -> None:
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i 's/sharingMode: consumable/sharingMode: bogus/' \"$1\"\n")
    editor.chmod(0o755)
    out = kubectl.run("edit", "gpu", "demo-node-gpu-0", editor=str(editor))
    assert out.returncode != 0
    assert 'gpus.resource.sharegpu.dev "demo-node-gpu-0" is invalid' in out.stderr
    # kubectl edit keeps the details in its copy of the edit; a patch prints them
    out = kubectl.run(
        "patch", "gpu", "demo-node-gpu-0", "--type=merge", "-p", '{"spec":{"sharingMode":"bogus"}}'
    )
    assert out.returncode != 0
    assert (
        'spec.sharingMode: Unsupported value: "bogus": supported values: "consumable", '
        '"partitions", "exclusive"'
    ) in out.stderr
    assert kubectl.json("get", "gpu", "demo-node-gpu-0")["spec"]["sharingMode"] == "consumable"


def test_deleting_a_claim_unprepares_it_and_stops_counting_it(kubectl: Kubectl) -> None:
    eventually(
        lambda: "small-share" in _counted_claims(kubectl), "small-share counted", timeout_s=WAIT_S
    )
    kubectl.ok("delete", "resourceclaim", "small-share")
    eventually(
        lambda: "small-share" not in _counted_claims(kubectl),
        "small-share not counted",
        timeout_s=WAIT_S,
    )
    eventually(
        lambda: _pod_phase(kubectl, "small-share") == "Failed",
        "pod small-share Failed",
        timeout_s=WAIT_S,
    )


def test_deleting_a_pod_deletes_and_deallocates_its_claim(kubectl: Kubectl) -> None:
    status = kubectl.json("get", "pod", "whole-gpu")["status"]["resourceClaimStatuses"][0]
    generated = status["resourceClaimName"]
    kubectl.ok("delete", "pod", "whole-gpu")
    eventually(
        lambda: generated not in _counted_claims(kubectl),
        f"{generated} not counted",
        timeout_s=WAIT_S,
    )
    gone = kubectl.run("get", "resourceclaim", generated)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_sigterm_cleans_up_and_prints_the_report(demo: RunningDemo) -> None:
    demo.process.send_signal(signal.SIGTERM)
    stdout, _ = demo.process.communicate(timeout=PATIENCE_S * 4)
    report = json.loads(stdout)
    assert report["cleanup"]["tempDirRemoved"] and report["cleanup"]["cdiSpecsLeft"] == 0
    assert not Path(demo.kubeconfig).exists()
    pods = {p["pod"]: p for p in report["pods"]}
    assert {"default/small-share", "default/large-share", "default/whole-gpu"} <= set(pods)
    assert pods["default/small-share"]["claim"] == "small-share"
    assert pods["default/small-share"]["shareID"]
