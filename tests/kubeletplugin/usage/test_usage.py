"""The usage stage with a fake NVML module, a fake /proc tree and a fake claim API."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kubeletplugin.config import ConfigError, parse_config
from kubeletplugin.health.taintmerge import TaintMerger
from kubeletplugin.usage.attribution import REASON_AMBIGUOUS, REASON_NO_SHARE, attribute
from kubeletplugin.usage.claims import UsageWriter
from kubeletplugin.usage.flags import UsageOptions
from kubeletplugin.usage.mocksource import FileUsageSource
from kubeletplugin.usage.model import GpuSample, ProcessSample
from kubeletplugin.usage.procfs import (
    DEFAULT_LAYOUT,
    MAX_CGROUP_BYTES,
    REASON_GONE,
    CgroupLayout,
    cgroup_root_elements,
    kubelet_layout,
    pod_of_process,
    pod_uid_of_cgroup,
    pod_uid_of_path,
)
from kubeletplugin.usage.sampler import UsageSampler
from kubeletplugin.usage.source import NvmlUsageSource, UsageSourceError
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.telemetry import Telemetry
from tests.kubeletplugin.devices.helpers import NVMLError as NvmlError
from tests.kubeletplugin.devices.helpers import NVMLError_NotFound as NotFound
from tests.kubeletplugin.devices.helpers import NVMLError_NotSupported as NotSupported
from tests.kubeletplugin.usage.helpers import (
    CLAIM_A,
    CLAIM_B,
    GI,
    GPU0,
    GPUS,
    POD_A,
    POD_B,
    SHARE_A,
    SHARE_B,
    FakeClaims,
    Sink,
    share,
    write_proc,
)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    # cgroup v2 with the systemd driver, and v1 with cgroupfs.
    write_proc(
        root,
        100,
        b"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        + POD_A.replace("-", "_").encode()
        + b".slice/cri-containerd-abc.scope\n",
    )
    write_proc(root, 200, f"4:memory:/kubepods/besteffort/pod{POD_B}/c0ffee\n".encode())
    write_proc(root, 300, b"0::/system.slice/sshd.service\n")
    return root


# --- /proc --------------------------------------------------------------------------------


def test_pod_of_process_both_cgroup_drivers(proc: Path) -> None:
    assert pod_of_process(proc, 100).pod_uid == POD_A
    assert pod_of_process(proc, 200).pod_uid == POD_B
    assert pod_of_process(proc, 300).pod_uid is None


def test_hostile_proc_contents_are_bounded(proc: Path) -> None:
    # Odd bytes around a valid element still find the pod; nothing raises.
    write_proc(proc, 400, b"\xff\xfe\x00garbage\n0::/kubepods/pod" + POD_A.encode() + b"/x\n")
    assert pod_of_process(proc, 400).pod_uid == POD_A
    # A huge file is read only up to the bound: a pod element past it is never seen.
    write_proc(proc, 401, b"x" * (MAX_CGROUP_BYTES + 10) + b"\n0::/kubepods/pod" + POD_A.encode())
    assert pod_of_process(proc, 401).pod_uid is None
    # A FIFO in the way cannot block (opened non-blocking), a symlink is not followed.
    (proc / "402").mkdir()
    os.mkfifo(proc / "402" / "cgroup")
    assert pod_of_process(proc, 402).pod_uid is None
    (proc / "403").mkdir()
    (proc / "403" / "cgroup").symlink_to(proc / "100" / "cgroup")
    assert pod_of_process(proc, 403).reason.startswith("cgroup unreadable")
    # Unreadable, exited, nonsense pids.
    write_proc(proc, 404, b"0::/kubepods/pod" + POD_A.encode())
    (proc / "404" / "cgroup").chmod(0)
    if os.geteuid() != 0:
        assert pod_of_process(proc, 404).reason.startswith("cgroup unreadable")
    assert pod_of_process(proc, 999).reason == REASON_GONE
    assert pod_of_process(proc, -1).pod_uid is None


# --- attribution and overcommit ------------------------------------------------------------


def test_processes_map_to_their_shares(proc: Path) -> None:
    sample = GpuSample(
        GPU0,
        (ProcessSample(100, 4 * GI), ProcessSample(200, 25 * GI), ProcessSample(300, GI)),
        {100: 20, 200: 70},
    )
    pods = {CLAIM_A: frozenset({POD_A}), CLAIM_B: frozenset({POD_B})}
    result = attribute([sample], [SHARE_A, SHARE_B], lambda p: pod_of_process(proc, p), pods, 10)
    a, b = result.usage[SHARE_A.key], result.usage[SHARE_B.key]
    assert (a.used_memory, a.sm_utilization, a.processes, a.overcommitted) == (4 * GI, 20, 1, ())
    # 25 GiB of 20 reserved and 70% SMs of 50 + 10: both exceeded.
    assert (b.used_memory, b.processes, b.overcommitted) == (25 * GI, 1, ("memory", "compute"))
    assert [(u.pid, u.reason) for u in result.unattributed] == [(300, "not in a pod's cgroup")]


def test_unsupported_utilisation_is_absent_not_zero(proc: Path) -> None:
    sample = GpuSample(GPU0, (ProcessSample(100, GI),), None)
    result = attribute(
        [sample], [SHARE_A], lambda p: pod_of_process(proc, p), {CLAIM_A: frozenset({POD_A})}, 10
    )
    assert result.usage[SHARE_A.key].sm_utilization is None
    assert result.usage[SHARE_A.key].overcommitted == ()


def test_process_that_exited_and_ambiguous_pods(proc: Path) -> None:
    second = share(CLAIM_B, "b", GPU0, 10, GI, "s-b")
    sample = GpuSample(GPU0, (ProcessSample(999, GI), ProcessSample(100, GI)), {})
    both = {CLAIM_A: frozenset({POD_A}), CLAIM_B: frozenset({POD_A})}
    result = attribute([sample], [SHARE_A, second], lambda p: pod_of_process(proc, p), both, 10)
    assert [(u.pid, u.reason) for u in result.unattributed] == [
        (999, REASON_GONE),
        (100, REASON_AMBIGUOUS),
    ]
    assert result.usage[SHARE_A.key].processes == 0


# --- the NVML source ----------------------------------------------------------------------


class FakeNvml:
    """The few pynvml calls the source makes."""

    NVMLError = NvmlError
    NVMLError_NotSupported = NotSupported
    NVMLError_NotFound = NotFound

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.util: Any = []
        self.since: list[int] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid == "GPU-gone":
            raise NotFound(6)
        return uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return self.processes

    def nvmlDeviceGetProcessUtilization(self, handle: str, since: int) -> list[Any]:
        self.since.append(since)
        if isinstance(self.util, type):
            raise self.util()
        return list(self.util)


def test_nvml_source_utilisation_and_last_seen() -> None:
    fake = FakeNvml()
    fake.processes = [
        SimpleNamespace(pid=7, usedGpuMemory=GI),
        SimpleNamespace(pid=8, usedGpuMemory=None),
    ]
    fake.util = [SimpleNamespace(pid=7, smUtil=140, timeStamp=500)]
    source = NvmlUsageSource(fake)  # type: ignore[arg-type]
    source.open()
    s = source.sample(GPU0)
    assert [(p.pid, p.used_memory) for p in s.processes] == [(7, GI), (8, None)]
    assert s.sm_utilization == {7: 100}
    fake.util = NotFound
    assert source.sample(GPU0).sm_utilization == {7: 0, 8: 0}
    assert fake.since == [0, 500]
    fake.util = NotSupported
    assert source.sample(GPU0).sm_utilization is None
    fake.util = []
    assert source.sample(GPU0).sm_utilization is None  # not asked again
    with pytest.raises(UsageSourceError, match="GPU-gone"):
        source.sample("GPU-gone")
    source.close()


# --- the mock source, the claim writer, metrics, taints --------------------------------------


def sampler_for(
    tmp_path: Path, claims: FakeClaims, clock: FakeClock, sink: Sink, **opts: Any
) -> tuple[UsageSampler, Path, Telemetry]:
    usage_file = tmp_path / "usage.yaml"
    telemetry = Telemetry("test-usage", env={})
    merger = TaintMerger(sink)
    health = merger.source("health")
    health.set_taints({"gpu-1": [{"key": "d/unhealthy", "effect": "NoSchedule"}]})
    options = UsageOptions(proc_root=tmp_path / "proc", **opts)
    sampler = UsageSampler(
        options,
        FileUsageSource(usage_file, GPUS),
        lambda: [SHARE_A, SHARE_B],
        claims,
        "gpu.sharegpu.dev",
        GPUS,
        telemetry=telemetry,
        taints=merger.source("usage"),
        clock=clock,
    )
    return sampler, usage_file, telemetry


def test_sampler_writes_claims_metrics_and_taint(tmp_path: Path) -> None:
    claims, clock, sink = FakeClaims(), FakeClock(), Sink()
    claims.add("a", CLAIM_A, [POD_A])
    claims.add("b", CLAIM_B, [POD_B])
    sampler, usage_file, telemetry = sampler_for(tmp_path, claims, clock, sink, taint=True)
    usage_file.write_text(
        "0:\n- {claim: ml/a, memory: 12Gi, sm: 20}\n- {claim: ml/b, memory: 1Gi}\n"
    )
    sampler.sample_once()
    entries = {
        e["device"] + e.get("shareID", ""): e for e in claims.claims["a"]["status"]["devices"]
    }
    assert entries["y"]["driver"] == "other.example.com"  # another driver's entry is kept
    data = entries["gpu-0s-a"]["data"]
    assert data["kind"] == "ShareUsage" and data["usedMemory"] == "12Gi"
    assert data["overcommitted"] == ["memory"] and data["smUtilization"] == 20
    assert len(claims.puts) == 2
    # The health taint and the overcommit taint reach the publisher together.
    assert sink.taints["gpu-1"][0]["key"] == "d/unhealthy"
    assert sink.taints["gpu-0"][0]["key"] == "gpu.sharegpu.dev/overcommitted"
    assert sink.taints["gpu-0"][0]["value"] == "memory"
    text = telemetry.scrape().decode()
    assert 'sharegpu_share_used_memory_bytes{claim_name="a"' in text
    assert "sharegpu_share_overcommitted{" in text and 'resource="memory"' in text
    # Small changes within the write interval are not written; later they are, beyond the
    # threshold only.
    usage_file.write_text(
        "0:\n- {claim: ml/a, memory: 12.01Gi, sm: 22}\n- {claim: ml/b, memory: 1Gi}\n"
    )
    clock.advance(60)
    sampler.sample_once()
    assert len(claims.puts) == 2
    # Back within its reservation: written at once, taint gone.
    usage_file.write_text("0:\n- {claim: ml/a, memory: 1Gi, sm: 20}\n")
    clock.advance(1)
    sampler.sample_once()
    assert claims.claims["a"]["status"]["devices"][1]["data"].get("overcommitted") is None
    assert "gpu-0" not in sink.taints
    telemetry.shutdown()


def test_sampler_survives_bad_file_and_conflicts(tmp_path: Path) -> None:
    claims, clock, sink = FakeClaims(), FakeClock(), Sink()
    claims.add("a", CLAIM_A, [POD_A])
    sampler, usage_file, telemetry = sampler_for(tmp_path, claims, clock, sink)
    usage_file.write_text("0: [{claim: ml/a, memory: lots}]\n")
    result = sampler.sample_once()
    assert result.usage == {} and sampler.snapshot().errors == {GPU0: 1}
    usage_file.write_text("0: [{claim: ml/a, memory: 1Gi}]\n")
    claims.conflict = True
    sampler.sample_once()
    assert sampler.snapshot().writes == (0, 2)
    assert sink.taints is not None and "gpu-0" not in sink.taints  # taint off by default
    telemetry.shutdown()


def test_writer_never_writes_when_disabled(tmp_path: Path) -> None:
    claims, clock, sink = FakeClaims(), FakeClock(), Sink()
    claims.add("a", CLAIM_A, [POD_A])
    sampler, usage_file, telemetry = sampler_for(
        tmp_path, claims, clock, sink, write_interval_s=0.0
    )
    usage_file.write_text("0: [{claim: ml/a, memory: 1Gi}]\n")
    sampler.sample_once()
    assert claims.puts == [] and sampler.snapshot().usage[0].used_memory == GI
    assert isinstance(UsageWriter, type)
    telemetry.shutdown()


def test_unknown_pod_refreshes_shared_claim(proc: Path, tmp_path: Path) -> None:
    claims, clock, sink = FakeClaims(), FakeClock(), Sink()
    claims.add("a", CLAIM_A, [])
    claims.add("b", CLAIM_B, [POD_B])
    sampler, usage_file, telemetry = sampler_for(tmp_path, claims, clock, sink)
    usage_file.write_text("0: [{pid: 100, memory: 2Gi}]\n")
    first = sampler.sample_once()
    assert [u.reason for u in first.unattributed] == [REASON_NO_SHARE]
    claims.add("a", CLAIM_A, [POD_A])  # the shared claim gained the pod
    clock.advance(3600)
    second = sampler.sample_once()
    assert second.unattributed == () and second.usage[SHARE_A.key].used_memory == 2 * GI
    telemetry.shutdown()


# --- the kubelet's cgroup layout: forged pod elements ----------------------------------------

VICTIM = "0f0f0f0f-0000-4000-8000-0000000000ff"


def _sd(uid: str) -> str:
    return uid.replace("-", "_")


#: The kubelet's --cgroup-root /kubelet, read from the host's cgroup namespace.
KUBELET_ROOT = CgroupLayout(("kubelet",))
#: A kind node: the kubelet (cgroup root /kubelet) in a container's cgroup, its init in it.
KIND = CgroupLayout(("kubelet",), {"0": (0, ("system.slice", "docker-1.scope"))})
#: A reader in its own cgroup namespace, a container of a burstable pod: PID 1 is 4 levels up.
IN_NAMESPACE = CgroupLayout((), {"0": (4, ())})


@pytest.mark.parametrize(
    ("path", "layout", "expected"),
    [
        # the layouts kubelet makes: cgroupfs and systemd, each QoS class, a --cgroup-root
        (f"/kubepods/pod{POD_A}/c0ffee", DEFAULT_LAYOUT, POD_A),
        (f"/kubepods/burstable/pod{POD_A}/c0ffee", DEFAULT_LAYOUT, POD_A),
        (f"/kubelet/kubepods/besteffort/pod{POD_A}/c0ffee", KUBELET_ROOT, POD_A),
        (
            f"/kubepods.slice/kubepods-pod{_sd(POD_A)}.slice/cri-containerd-1.scope",
            DEFAULT_LAYOUT,
            POD_A,
        ),
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{_sd(POD_A)}.slice"
            "/cri-containerd-1.scope",
            DEFAULT_LAYOUT,
            POD_A,
        ),
        (
            "/system.slice/docker-1.scope/kubelet.slice/kubelet-kubepods.slice/"
            f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{_sd(POD_A)}.slice"
            "/cri-containerd-1.scope",
            KIND,
            POD_A,
        ),
        # read through another cgroup namespace: the hidden ancestors are ".."
        (f"/../../../besteffort/pod{POD_A}/c0ffee", IN_NAMESPACE, POD_A),
        (f"/../../../pod{POD_A}/c0ffee", IN_NAMESPACE, POD_A),
        (f"/../../pod{POD_A}/c0ffee", IN_NAMESPACE, POD_A),
        (f"/../../../../kubepods/pod{POD_A}/c0ffee", IN_NAMESPACE, POD_A),
        (
            f"/../../kubepods-burstable-pod{_sd(POD_A)}.slice/cri-containerd-1.scope",
            IN_NAMESPACE,
            POD_A,
        ),
        # a container names a child cgroup after another pod: still its own pod
        (f"/kubepods/burstable/pod{POD_A}/c0ffee/pod{VICTIM}", DEFAULT_LAYOUT, POD_A),
        (
            f"/kubepods/burstable/pod{POD_A}/c0ffee/kubepods/burstable/pod{VICTIM}/x",
            DEFAULT_LAYOUT,
            POD_A,
        ),
        (
            f"/kubepods.slice/kubepods-pod{_sd(POD_A)}.slice/cri-containerd-1.scope/"
            f"kubepods.slice/kubepods-pod{_sd(VICTIM)}.slice",
            DEFAULT_LAYOUT,
            POD_A,
        ),
        # a pod element out of the kubelet's layout names no pod, nor does anything below it
        (f"/system.slice/pod{VICTIM}", DEFAULT_LAYOUT, None),
        (f"/kubepods/burstable/x/pod{VICTIM}", DEFAULT_LAYOUT, None),
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-pod{_sd(VICTIM)}.slice",
            DEFAULT_LAYOUT,
            None,
        ),
        (f"/kubepods/weird-pod{POD_A}/kubepods/pod{VICTIM}", DEFAULT_LAYOUT, None),
        ("/kubepods/burstable", DEFAULT_LAYOUT, None),
        # beside the reader's own pod, or inside it: not the kubelet's layout
        (f"/../pod{VICTIM}/x", IN_NAMESPACE, None),
        (f"/../../../../../kubepods/pod{VICTIM}/x", IN_NAMESPACE, None),
    ],
)
def test_the_first_pod_element_under_kubepods_is_the_pod(
    path: str, layout: CgroupLayout, expected: str | None
) -> None:
    assert pod_uid_of_path(path, layout) == expected


@pytest.mark.parametrize(
    ("path", "layout"),
    [
        # a service outside every pod with a delegated subtree it names kubepods
        (f"/system.slice/evil.service/kubepods/burstable/pod{VICTIM}/x", DEFAULT_LAYOUT),
        (f"/system.slice/evil.service/kubepods/pod{VICTIM}/x", DEFAULT_LAYOUT),
        (
            f"/system.slice/evil.service/kubepods.slice/kubepods-pod{_sd(VICTIM)}.slice/x",
            DEFAULT_LAYOUT,
        ),
        (f"/../../../../system.slice/evil.service/kubepods/pod{VICTIM}/x", IN_NAMESPACE),
        (f"/../../../../user.slice/kubepods/burstable/pod{VICTIM}/x", IN_NAMESPACE),
        # the kubelet's kubepods is under /kubelet: a top-level kubepods is someone else's
        (f"/kubepods/pod{VICTIM}/x", KUBELET_ROOT),
        (f"/system.slice/kubelet/kubepods/pod{VICTIM}/x", KUBELET_ROOT),
        (f"/kubepods/pod{VICTIM}/x", KIND),
    ],
)
def test_a_kubepods_outside_the_kubelets_cgroup_root_names_no_pod(
    path: str, layout: CgroupLayout
) -> None:
    assert pod_uid_of_path(path, layout) is None


def test_the_layout_is_read_from_pid_1(proc: Path) -> None:
    write_proc(proc, 1, b"0::/../../../../init.scope\n")
    layout = kubelet_layout(proc, cgroup_root_elements("/"))
    assert layout == CgroupLayout((), {"0": (4, ())})
    hostile = f"0::/../../../../system.slice/evil.service/kubepods/pod{VICTIM}/x\n"
    write_proc(proc, 600, hostile.encode())
    assert pod_of_process(proc, 600, layout).pod_uid is None
    write_proc(proc, 601, f"0::/../../../besteffort/pod{POD_A}/c\n".encode())
    assert pod_of_process(proc, 601, layout).pod_uid == POD_A
    assert kubelet_layout(proc / "missing", ()) == CgroupLayout()


@pytest.mark.parametrize("bad", ["kubelet", "/a/../b", "/./a"])
def test_a_cgroup_root_must_be_an_absolute_clean_path(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad)):
        cgroup_root_elements(bad)


def test_v1_hierarchies_that_name_different_pods_name_none() -> None:
    same = f"4:memory:/kubepods/pod{POD_A}/c\n3:cpu:/kubepods/pod{POD_A}/c\n0::/\n"
    assert pod_uid_of_cgroup(same) == POD_A
    split = f"4:memory:/kubepods/pod{POD_A}/c\n3:cpu:/kubepods/pod{VICTIM}/c\n"
    assert pod_uid_of_cgroup(split) is None


def test_a_forged_child_cgroup_does_not_charge_the_victim(proc: Path) -> None:
    forged = (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{_sd(POD_A)}.slice/cri-containerd-abc.scope/kubepods-pod{_sd(VICTIM)}.slice\n"
    )
    write_proc(proc, 500, forged.encode())
    assert pod_of_process(proc, 500).pod_uid == POD_A


def test_the_kubelet_cgroup_root_flag() -> None:
    base = ["--node-name", "n1", "--device-backend", "mock"]
    assert parse_config(base).usage.kubelet_cgroup_root == ()
    flag = "--usage-kubelet-cgroup-root"
    assert parse_config([*base, flag, "/kubelet"]).usage.kubelet_cgroup_root == ("kubelet",)
    with pytest.raises(ConfigError, match=f"{flag} 'kubelet' must be an absolute cgroup path"):
        parse_config([*base, flag, "kubelet"])
