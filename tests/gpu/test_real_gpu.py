"""The node plugin against a real NVIDIA GPU (root only; skipped elsewhere with the reason).

- discovery through NVML equals what ``nvidia-smi --query-gpu`` prints, and a GPU has an
  NVLink domain exactly when ``nvidia-smi nvlink --status`` shows it an active link (a single
  GPU: none), read without changing any setting;
- two MPS shares (10Gi/25% and 20Gi/50%) of one GPU, prepared over the real DRA socket from
  claims in the embedded API server, each with its own MPS daemon run by
  :class:`~tests.gpu.hostlauncher.HostMpsLauncher`; CUDA clients run in containers emulated from
  each claim's CDI spec (:mod:`tests.gpu.container`, :mod:`tests.gpu.enter`) as
  :data:`CLIENT_UID`: an allocation below the share works, one above it fails; the compute mode
  is never changed; unprepare leaves no daemon;
- the order that broke one daemon per GPU: share A prepared, A's client holds memory, share B
  prepared, B's client (same UID) gets B's SMs and memory, not A's;
- compute shares: the same busy-loop kernel over a fixed grid sized from the whole GPU
  (``cudaprobe.py compute``) takes about twice as long in a 25% MPS share as in a 50% one
  (:data:`~tests.gpu.checks.RATIO_RANGE`);
- a claim's control daemon killed with SIGKILL does not stop another claim on the GPU from
  getting its own daemon, whose client works;
- a TimeSlicing claim (interval Long) sets the GPU's interval and unprepare puts back Default
  and the compute mode;
- a client that stores through a null pointer (XID 31) makes the NVML health monitor taint its
  GPU with the ordinary (not reset-required) unhealthy taint once application XIDs are not
  ignored; with the default ignore list it stays untainted;
- dynamic MIG, on a GPU whose MIG mode is already enabled (never enabled or reset here): the
  smallest profile created at its first free placement has the profile's memory, CUDA limited
  to its UUID sees exactly its SMs, and destroy removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import kubernetes.client
import pytest

from api import names
from kubeletplugin.devices.mig import MIG_DISABLED, MIG_ENABLED
from kubeletplugin.devices.migtables import placement_problem
from kubeletplugin.devices.nvlink import domain_problem
from kubeletplugin.devices.nvml import NvmlBackend, normalize_pci_bus_id
from kubeletplugin.devices.nvmlmig import NvmlMigPartitioner
from kubeletplugin.devices.table import node_devices
from kubeletplugin.health.events import is_reset_reason
from kubeletplugin.health.monitor import HealthMonitor
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.health.settings import HealthSettings
from kubeletplugin.health.taints import DEFAULT_TAINT_EFFECT
from kubeletplugin.hosts.nvidia import nvidia_share_tools
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.kubelet.server import PluginServer
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.cdi import CdiSpecWriter
from kubeletplugin.prepare.checkpoint import Checkpoint
from kubeletplugin.prepare.claims import KubeClaimGetter
from kubeletplugin.prepare.state import DeviceState
from kubeletplugin.runner import HostRunner
from kubeletplugin.sharing.computemode import DEFAULT_COMPUTE_MODE, query_compute_mode
from kubeletplugin.sharing.daemons import DaemonPhase, DaemonSpec
from kubeletplugin.sharing.enforcer import build_enforcer
from kubeletplugin.sharing.mps import control_env
from kubeletplugin.sharing.mpspaths import MpsPaths
from kubeletplugin.sharing.strategies.mps import MpsNode
from kubeletplugin.usage.attribution import attribute
from kubeletplugin.usage.model import GpuSample, PreparedShare
from kubeletplugin.usage.procfs import PodLookup
from kubeletplugin.usage.source import NvmlUsageSource
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim, RegisteredPlugin, SimClaimResult
from tests.gpu import cudaprobe, pipeprobe
from tests.gpu.checks import (
    CALIBRATION_ITERATIONS,
    RATIO_RANGE,
    RATIO_SHARES,
    TaintRecorder,
    ratio_in_range,
    scaled_iterations,
    timeslice_from_policy_list,
    wait_until,
)
from tests.gpu.container import (
    ContainerPlan,
    enter_command,
    load_specs,
    missing_targets,
    plan_for,
)
from tests.gpu.gpuenv import skip_reason
from tests.gpu.hostlauncher import HostMpsLauncher
from tests.gpu.settingsguard import SettingsGuard
from tests.kubeletplugin.prepare.helpers import DRIVER, GI, NODE, claim, ref, result
from tests.kubeletplugin.sharing.helpers import gpu_config

SKIP = skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

MIB: Final = 1024**2
#: The UID the emulated containers run as (a non-root tenant).
CLIENT_UID: Final = 1000
#: (share GiB, cores %, GiB that must fit, GiB that must not).
SHARES: Final = ((10, 25, 9.0, 12.0), (20, 50, 15.0, 21.0))
#: Kinds whose IDs the emulation leaves out: the host provides the driver libraries.
SKIP_KINDS: Final = ("nvidia.com/gpu",)
SMI_QUERY: Final = (
    "index,uuid,name,pci.bus_id,memory.total,driver_version,compute_cap,mig.mode.current"
)


def smi_rows() -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def test_discovery_matches_nvidia_smi() -> None:
    gpus = NvmlBackend().discover()
    mig = {"Enabled": MIG_ENABLED, "Disabled": MIG_DISABLED}
    expected = [
        (int(r[0]), r[1], r[2], normalize_pci_bus_id(r[3]), int(r[4]), r[5], r[6], mig.get(r[7]))
        for r in smi_rows()
    ]
    got = [
        (
            g.index,
            g.uuid,
            g.product_name,
            g.pci_bus_id,
            g.memory_total // MIB,
            g.driver_version,
            g.cuda_compute_capability,
            g.mig_mode,
        )
        for g in gpus
    ]
    assert got == expected
    assert all(g.memory_usable == g.memory_total - g.memory_reserved for g in gpus)


def smi_active_nvlinks() -> dict[int, int]:
    """GPU index -> its active NVLinks, as ``nvidia-smi nvlink --status`` prints them (a link
    line with a speed in GB/s; inactive ones say ``<inactive>``)."""
    out = subprocess.run(
        ["nvidia-smi", "nvlink", "--status"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout
    active: dict[int, int] = {}
    current: int | None = None
    for line in out.splitlines():
        header = re.match(r"^GPU (\d+):", line)
        if header:
            current = int(header.group(1))
            active[current] = 0
        elif current is not None and re.search(r"Link \d+: .*GB/s", line):
            active[current] += 1
    return active


def test_nvlink_domains_follow_the_active_links() -> None:
    gpus = NvmlBackend().discover()
    links = smi_active_nvlinks()
    for gpu in gpus:
        if gpu.nvlink_domain is not None:
            assert domain_problem(gpu.nvlink_domain) is None, gpu.nvlink_domain
    got = {g.index: g.nvlink_domain is not None for g in gpus}
    if len(gpus) == 1:
        assert got == {gpus[0].index: False}  # one GPU has no NVLink peer on its node
    else:
        assert got == {g.index: links.get(g.index, 0) > 0 for g in gpus}


class GpuNode:
    """DeviceState with the NVML devices, real commands and host MPS daemons, served on a DRA
    socket under ``root``."""

    def __init__(self, root: Path, client: kubernetes.client.ApiClient) -> None:
        self.root = root
        self.gpus = NvmlBackend().discover()
        self.mps_root = root / "mps"
        control = shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"
        self.launcher = HostMpsLauncher(self.mps_root, control)
        self.enforcer = build_enforcer(
            nvidia_share_tools(Path("/"), self.launcher),
            root / "data",
            driver_name=DRIVER,
            mps_root=self.mps_root,
        )
        self.state = DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=node_devices(self.gpus, "consumable"),
            claims=KubeClaimGetter(client),
            cdi=CdiSpecWriter(root / "cdi", DRIVER, dev_root=Path("/dev")),
            checkpoint=Checkpoint(root / "data"),
            enforcer=self.enforcer,
        )
        self.state.start()
        self.registry = root / "reg"
        self.server = PluginServer(DRIVER, self.registry, root / "plug", self.state)
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=1.0)


@pytest.fixture
def gpu_node(kube_client: kubernetes.client.ApiClient) -> Iterator[GpuNode]:
    root = Path(tempfile.mkdtemp(prefix="sgpu-", dir="/tmp"))
    root.chmod(0o755)  # the clients (CLIENT_UID) read the probe from here
    node = GpuNode(root, kube_client)
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def shareable_gpu(gpus: list[GpuInfo]) -> GpuInfo:
    for gpu in gpus:
        if gpu.mig_mode != MIG_ENABLED and gpu.memory_usable >= (SHARES[1][3] + 2) * GI:
            return gpu
    pytest.skip(f"no GPU without MIG and with {SHARES[1][3] + 2:.0f} GiB usable")


def run_client(plan: ContainerPlan, args: list[str], probe: Path) -> tuple[int, dict[str, Any]]:
    """Run the CUDA probe with ``args`` in the emulated container; (exit status, report)."""
    argv = [os.path.realpath(sys.executable), "-I", "-S", str(probe), *args]
    with mount_targets(plan):
        done = subprocess.run(
            enter_command(plan, argv, CLIENT_UID),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    return done.returncode, probe_report(done)


@contextlib.contextmanager
def mount_targets(plan: ContainerPlan) -> Iterator[None]:
    """The host paths the emulated container's mounts need, there while the body runs."""
    created = missing_targets(plan)
    for path, is_dir in created:
        if is_dir:
            path.mkdir()
        else:
            path.touch()
    try:
        yield
    finally:
        for path, is_dir in reversed(created):
            if is_dir:
                path.rmdir()
            else:
                path.unlink()


def stop_holder(process: subprocess.Popen[str]) -> None:
    """End a ``cudaprobe.py hold`` process: close its input, wait, kill it if it lingers."""
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def probe_report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The probe's JSON line, or its stderr when it printed none."""
    lines = done.stdout.strip().splitlines()
    report: dict[str, Any] = json.loads(lines[-1]) if lines else {"stderr": done.stderr.strip()}
    return report


def install_probe(root: Path, source: str = cudaprobe.__file__) -> Path:
    """A copy of the probe ``source`` (the CUDA probe by default) under ``root`` that
    :data:`CLIENT_UID` can read."""
    probe = root / Path(source).name
    shutil.copyfile(source, probe)
    probe.chmod(0o644)
    return probe


def mps_claim(name: str, gpu: GpuInfo, cores: int, gib: int) -> dict[str, Any]:
    return claim(
        name,
        [result("gpu", f"gpu-{gpu.index}", share={"cores": cores, "memory": gib * GI})],
        configs=[gpu_config({"strategy": "MPS"})],
    )


def store(apiserver: KubeAPIServer, claims: list[dict[str, Any]]) -> list[ClaimRef]:
    for obj in claims:
        apiserver.store.put("resourceclaims", obj)
    return [ref(c) for c in claims]


def prepare_ok(kplugin: RegisteredPlugin, refs: list[ClaimRef]) -> dict[str, SimClaimResult]:
    results = kplugin.prepare(refs)
    assert {uid: r.error for uid, r in results.items()} == {r.uid: "" for r in refs}
    return results


def plans(
    node: GpuNode, results: dict[str, SimClaimResult], refs: list[ClaimRef]
) -> list[ContainerPlan]:
    """The emulated container of each claim of ``refs``, in that order."""
    specs = load_specs(node.root / "cdi")
    return [
        plan_for(specs, [i for d in results[r.uid].devices for i in d.cdi_device_ids], SKIP_KINDS)
        for r in refs
    ]


def daemon_of(node: GpuNode, claim_ref: ClaimRef, gpu: GpuInfo) -> DaemonSpec:
    return DaemonSpec(MpsPaths.of(node.mps_root, claim_ref.uid, gpu.uuid))


def whole_gpu_sms(gpu: GpuInfo, probe: Path) -> int:
    """The GPU's SM count as a plain CUDA client sees it (before any MPS daemon serves it)."""
    done = subprocess.run(
        [os.path.realpath(sys.executable), "-I", "-S", str(probe), "1"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = probe_report(done)
    assert done.returncode == cudaprobe.EXIT_OK, report
    return int(report["sms"])


def share_sms(whole: int, cores: int) -> tuple[int, int]:
    """The SM counts a client of a ``cores`` % share may see (MPS rounds to whole SMs, and to
    SM pairs on some GPUs)."""
    exact = whole * cores / 100
    return int(exact) - 2, int(exact) + 2


def test_mps_shares_limit_memory_and_leave_the_compute_mode(
    gpu_node: GpuNode, apiserver: KubeAPIServer
) -> None:
    gpu = shareable_gpu(gpu_node.gpus)
    mode_before = query_compute_mode(HostRunner("/"), gpu.uuid)
    probe = install_probe(gpu_node.root)
    claims = [mps_claim(f"mps-{size}gi", gpu, cores, size) for size, cores, _f, _t in SHARES]
    refs = store(apiserver, claims)
    expected: dict[tuple[int, float], int] = {}
    got: dict[tuple[int, float], int] = {}
    reports: dict[tuple[int, float], dict[str, Any]] = {}
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            results = prepare_ok(kplugin, refs)
            mode_during = query_compute_mode(HostRunner("/"), gpu.uuid)
            for (size, _cores, fits, too_big), plan in zip(
                SHARES, plans(gpu_node, results, refs), strict=True
            ):
                for gib, status in ((fits, cudaprobe.EXIT_OK), (too_big, cudaprobe.EXIT_ALLOC)):
                    expected[(size, gib)] = status
                    got[(size, gib)], reports[(size, gib)] = run_client(plan, [str(gib)], probe)
        finally:
            errors = kplugin.unprepare(refs)
    assert got == expected, reports
    assert errors == {r.uid: "" for r in refs}
    assert mode_during == mode_before == DEFAULT_COMPUTE_MODE
    for r in refs:
        assert gpu_node.launcher.phase(daemon_of(gpu_node, r, gpu)) is DaemonPhase.ABSENT


#: (GiB, cores %) of the first share, the GiB its client holds, and the second, larger share
#: with the GiB its client allocates (above the first share, within the second).
FIRST_SHARE: Final = (10, 25)
FIRST_HOLDS_GIB: Final = "4"
SECOND_SHARE: Final = (20, 50)
SECOND_ALLOCATES_GIB: Final = "15"


def test_a_later_larger_share_gets_its_own_limits_while_an_earlier_client_runs(
    gpu_node: GpuNode, apiserver: KubeAPIServer
) -> None:
    gpu = shareable_gpu(gpu_node.gpus)
    probe = install_probe(gpu_node.root)
    whole = whole_gpu_sms(gpu, probe)
    first = store(apiserver, [mps_claim("first", gpu, FIRST_SHARE[1], FIRST_SHARE[0])])
    second = store(apiserver, [mps_claim("second", gpu, SECOND_SHARE[1], SECOND_SHARE[0])])
    reports: dict[str, dict[str, Any]] = {}
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            (plan_a,) = plans(gpu_node, prepare_ok(kplugin, first), first)
            with holding_client(plan_a, ["hold", FIRST_HOLDS_GIB], probe) as held:
                reports["first"] = held
                (plan_b,) = plans(gpu_node, prepare_ok(kplugin, second), second)
                status, reports["second"] = run_client(plan_b, [SECOND_ALLOCATES_GIB], probe)
        finally:
            errors = kplugin.unprepare(first + second)
    assert errors == {r.uid: "" for r in first + second}
    assert status == cudaprobe.EXIT_OK, reports
    low, high = share_sms(whole, FIRST_SHARE[1])
    assert low <= int(reports["first"]["sms"]) <= high, (whole, reports)
    low, high = share_sms(whole, SECOND_SHARE[1])
    assert low <= int(reports["second"]["sms"]) <= high, (whole, reports)


@contextlib.contextmanager
def holder(
    argv: list[str], env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """A ``cudaprobe.py hold`` process that holds its allocation while the body runs; yields it
    with its report line (checked: CUDA started and the allocation worked)."""
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        report: dict[str, Any] = json.loads(line) if line.strip() else {"stdout": line}
        assert report.get("step") != "load" and report.get("code") in (None, 0), report
        yield process, report
    finally:
        stop_holder(process)


@contextlib.contextmanager
def holding_client(plan: ContainerPlan, args: list[str], probe: Path) -> Iterator[dict[str, Any]]:
    """A client in the emulated container that holds its allocation while the body runs;
    yields its report line."""
    argv = [os.path.realpath(sys.executable), "-I", "-S", str(probe), *args]
    with mount_targets(plan), holder(enter_command(plan, argv, CLIENT_UID)) as (_, report):
        yield report


#: GiB of each compute-ratio share (the probe allocates almost nothing).
RATIO_SHARE_GIB: Final = 4


def test_mps_compute_shares_run_in_the_ratio_of_their_cores(
    gpu_node: GpuNode, apiserver: KubeAPIServer
) -> None:
    gpu = shareable_gpu(gpu_node.gpus)
    probe = install_probe(gpu_node.root)
    blocks = str(whole_gpu_sms(gpu, probe) * cudaprobe.BLOCKS_PER_SM)
    claims = [mps_claim(f"cores-{c}", gpu, c, RATIO_SHARE_GIB) for c in RATIO_SHARES]
    refs = store(apiserver, claims)
    seconds: dict[int, float] = {}
    reports: dict[str, dict[str, Any]] = {}
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            small, large = plans(gpu_node, prepare_ok(kplugin, refs), refs)
            # Sized in the larger share, so that one runs about TARGET_SECONDS; one at a time.
            status, reports["calibration"] = run_client(
                large, ["compute", str(CALIBRATION_ITERATIONS), blocks], probe
            )
            assert status == cudaprobe.EXIT_OK, reports
            turns = scaled_iterations(CALIBRATION_ITERATIONS, reports["calibration"]["seconds"])
            for cores, plan in zip(RATIO_SHARES, (small, large), strict=True):
                status, reports[str(cores)] = run_client(
                    plan, ["compute", str(turns), blocks], probe
                )
                assert status == cudaprobe.EXIT_OK, reports
                seconds[cores] = float(reports[str(cores)]["seconds"])
        finally:
            errors = kplugin.unprepare(refs)
    assert errors == {r.uid: "" for r in refs}
    slow, fast = seconds[RATIO_SHARES[0]], seconds[RATIO_SHARES[1]]
    assert ratio_in_range(slow, fast), (
        f"{slow:.2f} s / {fast:.2f} s not in {RATIO_RANGE}: {reports}"
    )


#: (cores %, GiB) of the share whose daemon is killed, and of the one prepared after.
BEFORE_KILL: Final = (25, 4)
AFTER_KILL: Final = (10, 2)
CLIENT_GIB: Final = "1"
KILL_WAIT_S: Final = 10.0


def kill_daemon(node: GpuNode, daemon: DaemonSpec) -> list[int]:
    """SIGKILL the one control daemon of ``daemon`` and wait until it no longer runs; its pids."""
    killed = node.launcher.pids(daemon)
    assert len(killed) == 1, killed
    os.kill(killed[0], signal.SIGKILL)
    assert wait_until(lambda: node.launcher.phase(daemon) is not DaemonPhase.RUNNING, KILL_WAIT_S)
    return killed


def test_a_killed_daemon_does_not_stop_the_next_claim_getting_its_own(
    gpu_node: GpuNode, apiserver: KubeAPIServer
) -> None:
    gpu = shareable_gpu(gpu_node.gpus)
    mode_before = query_compute_mode(HostRunner("/"), gpu.uuid)
    probe = install_probe(gpu_node.root)
    first = store(apiserver, [mps_claim("kill", gpu, *BEFORE_KILL)])
    later = store(apiserver, [mps_claim("after-kill", gpu, *AFTER_KILL)])
    killed_daemon, later_daemon = (
        daemon_of(gpu_node, first[0], gpu),
        daemon_of(gpu_node, later[0], gpu),
    )
    reports: dict[str, dict[str, Any]] = {}
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            prepare_ok(kplugin, first)
            killed = kill_daemon(gpu_node, killed_daemon)
            (plan,) = plans(gpu_node, prepare_ok(kplugin, later), later)
            started = gpu_node.launcher.pids(later_daemon)
            phase = gpu_node.launcher.phase(later_daemon)
            status, reports["after"] = run_client(plan, [CLIENT_GIB], probe)
        finally:
            errors = kplugin.unprepare(first + later)
    assert phase is DaemonPhase.RUNNING
    assert len(started) == 1 and started != killed, (killed, started)
    assert status == cudaprobe.EXIT_OK, reports
    assert errors == {r.uid: "" for r in first + later}
    assert query_compute_mode(HostRunner("/"), gpu.uuid) == mode_before
    assert gpu_node.launcher.phase(later_daemon) is DaemonPhase.ABSENT


# --- what a tenant's client reaches of its daemon (open findings are strict xfails) ---------


class FindingStillHolds(AssertionError):
    """A secure property a test states does not hold on this GPU: an open finding reproduced.

    The tests of open findings are ``xfail(raises=FindingStillHolds, strict=True)``: only this
    exception counts as the expected failure (any other failure is a broken test, reported as
    such), and a pass fails the run as XPASS(strict), so the mark goes once the finding is fixed.
    """


def secure(holds: bool, message: str) -> None:
    """Raise :class:`FindingStillHolds` with ``message`` unless the secure property ``holds``."""
    if not holds:
        raise FindingStillHolds(message)


#: Seconds a client-side reader waits for what its daemon writes.
LOG_READ_S: Final = 10.0
#: Thread percentage a tenant tries to make its daemon's default (above its share's 25).
RAISED_THREADS: Final = 37


def control_in(plan: ContainerPlan, command: str, uid: int = 0) -> subprocess.CompletedProcess[str]:
    """``nvidia-cuda-mps-control`` with ``command`` as ``uid`` (root by default) in the emulated
    client container: what a tenant can send through its pipe directory. Its exit status says
    nothing (it exits 0 when the daemon refuses a command)."""
    control = shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"
    with mount_targets(plan):
        return subprocess.run(
            enter_command(plan, [control], uid),
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def host_control(paths: MpsPaths, command: str) -> str:
    """``command`` to the daemon through its own pipe directory on the host (the plugin's way);
    the last line of its answer."""
    control = shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"
    done = subprocess.run(
        [control],
        input=command + "\n",
        env={**os.environ, **control_env(paths)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if lines else ""


def daemon_defaults(paths: MpsPaths, uuid: str) -> tuple[str, str]:
    """The daemon's default (thread percentage, pinned memory limit of GPU ``uuid``), read back
    through its own pipe directory."""
    return (
        host_control(paths, "get_default_active_thread_percentage"),
        host_control(paths, f"get_default_device_pinned_mem_limit {uuid}"),
    )


def answers(paths: MpsPaths) -> bool:
    """Whether the daemon answers ``get_default_active_thread_percentage`` with a number."""
    try:
        float(host_control(paths, "get_default_active_thread_percentage"))
    except ValueError:
        return False
    return True


def restart_through_the_plugin(node: GpuNode, daemon: DaemonSpec) -> None:
    """Kill ``daemon`` and let the plugin's MPS manager start it again, as a prepare or a plugin
    restart does for a dead daemon (its sockets unlinked and created anew)."""
    mps = node.enforcer.node_of(MpsNode).manager
    owned = mps.running()[daemon.id]
    kill_daemon(node, daemon)
    mps.ensure_running(owned.claim_uid, owned.uuid, owned.limits)


@pytest.mark.xfail(
    raises=FindingStillHolds,
    strict=True,
    reason=(
        "N5 open: a daemon restart unlinks and recreates control_privileged, which detaches the "
        "/dev/null bind mount over it in running clients, so a root client reaches set_default_*"
    ),
)
def test_a_root_client_cannot_change_its_daemon_defaults_after_a_restart(
    gpu_node: GpuNode, apiserver: KubeAPIServer, record_property: Callable[[str, object], None]
) -> None:
    """A root client (emulated container of the claim's CDI spec, started before the restart)
    sends ``set_default_active_thread_percentage 37`` and a pinned memory limit of the whole GPU
    through its pipe directory, before and after the plugin restarts the claim's daemon. The
    daemon's defaults, read back through its own pipe directory on the host (the command exits
    0 even when refused), must stay those the plugin set. The same commands sent through the
    host's pipe directory must change them: the commands work where they reach the daemon."""
    gpu = shareable_gpu(gpu_node.gpus)
    refs = store(apiserver, [mps_claim("restarted", gpu, *BEFORE_KILL)])
    daemon = daemon_of(gpu_node, refs[0], gpu)
    attempts = (
        f"set_default_active_thread_percentage {RAISED_THREADS}",
        f"set_default_device_pinned_mem_limit {gpu.uuid} {gpu.memory_total // MIB}M",
    )
    seen: dict[str, tuple[str, str]] = {}
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            (plan,) = plans(gpu_node, prepare_ok(kplugin, refs), refs)
            seen["set by the plugin"] = daemon_defaults(daemon.paths, gpu.uuid)
            for command in attempts:
                control_in(plan, command)
            seen["client, before the restart"] = daemon_defaults(daemon.paths, gpu.uuid)
            restart_through_the_plugin(gpu_node, daemon)
            seen["set again at the restart"] = daemon_defaults(daemon.paths, gpu.uuid)
            for command in attempts:
                control_in(plan, command)
            seen["client, after the restart"] = daemon_defaults(daemon.paths, gpu.uuid)
            for command in attempts:
                host_control(daemon.paths, command)
            seen["host pipe directory"] = daemon_defaults(daemon.paths, gpu.uuid)
        finally:
            errors = kplugin.unprepare(refs)
    record_property("defaults", {k: list(v) for k, v in seen.items()})
    assert errors == {r.uid: "" for r in refs}
    plugin_set = seen["set by the plugin"]
    assert float(plugin_set[0]) == float(BEFORE_KILL[0]), seen
    assert seen["client, before the restart"] == plugin_set, f"the mask did not hold: {seen}"
    assert seen["set again at the restart"] == plugin_set, seen
    reached = seen["host pipe directory"]
    assert float(reached[0]) == float(RAISED_THREADS) and reached[1] != plugin_set[1], seen
    secure(
        seen["client, after the restart"] == plugin_set,
        f"a root client changed its daemon's defaults after a restart: {seen}",
    )


@pytest.mark.xfail(
    raises=FindingStillHolds,
    strict=True,
    reason=(
        "N17 open: the pipe directory's log FIFO (mode 0777) is in the client's read-only view "
        "and streams the control daemon's log to any client that opens it"
    ),
)
def test_a_client_cannot_read_the_daemon_log_through_its_pipe_directory(
    gpu_node: GpuNode, apiserver: KubeAPIServer, record_property: Callable[[str, object], None]
) -> None:
    """A non-root client (:data:`CLIENT_UID`) opens ``log`` in its pipe directory without
    blocking and reads for :data:`LOG_READ_S` seconds while a CUDA client of the share starts
    (the daemon starts a server and logs it). It must not be able to open it at all."""
    gpu = shareable_gpu(gpu_node.gpus)
    probe = install_probe(gpu_node.root)
    reader_script = install_probe(gpu_node.root, pipeprobe.__file__)
    refs = store(apiserver, [mps_claim("log", gpu, *BEFORE_KILL)])
    daemon = daemon_of(gpu_node, refs[0], gpu)
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            (plan,) = plans(gpu_node, prepare_ok(kplugin, refs), refs)
            on_host = sorted(os.listdir(daemon.paths.pipe))
            in_container = f"{plan.env['CUDA_MPS_PIPE_DIRECTORY']}/log"
            argv = [os.path.realpath(sys.executable), "-I", "-S", str(reader_script)]
            argv += ["read", in_container, str(LOG_READ_S)]
            with mount_targets(plan):
                reader = subprocess.Popen(
                    enter_command(plan, argv, CLIENT_UID),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                try:
                    status, client = run_client(plan, [CLIENT_GIB], probe)
                    host_control(daemon.paths, "get_server_list")
                    out, err = reader.communicate(timeout=LOG_READ_S + 60)
                finally:
                    if reader.poll() is None:
                        reader.kill()
                        reader.wait(timeout=30)
        finally:
            errors = kplugin.unprepare(refs)
    lines = out.strip().splitlines()
    report: dict[str, Any] = json.loads(lines[-1]) if lines else {"stderr": err.strip()}
    record_property("pipe_directory_on_host", on_host)
    record_property("log_reader", report)
    assert errors == {r.uid: "" for r in refs}
    assert status == cudaprobe.EXIT_OK, client
    assert reader.returncode == 0 and "opened" in report, report
    secure(
        not report["opened"],
        f"a client (uid {CLIENT_UID}) opened {in_container} and read {report['bytes']} bytes "
        f"of the daemon's log: {report['head']!r}",
    )


def snapshot(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    """Each file directly in ``directory``: (content, mode, modification time in ns)."""
    out = {}
    for entry in sorted(directory.iterdir()):
        info = entry.lstat()
        out[entry.name] = (entry.read_bytes(), info.st_mode, info.st_mtime_ns)
    return out


#: What each file outside the shm directory holds before the links to it are planted.
OUTSIDE_CONTENT: Final = b"sharegpu: a file no MPS daemon or server may write\n"


def test_the_daemon_and_server_do_not_follow_a_client_symlink_in_shm(
    gpu_node: GpuNode, apiserver: KubeAPIServer, record_property: Callable[[str, object], None]
) -> None:
    """The names the daemon and its server create in the share's ``/dev/shm`` (learned while a
    client runs) are replaced, by a root client, with symlinks to root-owned files outside it;
    then the daemon starts again without the plugin clearing the directory (as a daemon pod's
    container restart does) and a client starts a server. The files outside stay untouched.
    ``fs.protected_symlinks`` is recorded: with 1, the kernel itself refuses to let root follow
    another UID's link in a sticky world-writable directory, which is why root plants them."""
    gpu = shareable_gpu(gpu_node.gpus)
    probe = install_probe(gpu_node.root)
    planter = install_probe(gpu_node.root, pipeprobe.__file__)
    refs = store(apiserver, [mps_claim("shm-links", gpu, *BEFORE_KILL)])
    daemon = daemon_of(gpu_node, refs[0], gpu)
    outside = gpu_node.root / "outside"
    outside.mkdir(mode=0o755)
    planted: dict[str, Any] = {}
    names: list[str] = []
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            (plan,) = plans(gpu_node, prepare_ok(kplugin, refs), refs)
            with holding_client(plan, ["hold", CLIENT_GIB], probe):
                names = sorted(os.listdir(daemon.paths.shm))
            names = sorted({*names, *os.listdir(daemon.paths.shm)})
            if names:
                for name in names:
                    (outside / name).write_bytes(OUTSIDE_CONTENT)
                    (outside / name).chmod(0o644)
                before = snapshot(outside)
                spec = gpu_node.enforcer.node_of(MpsNode).manager.spec(
                    refs[0].uid,
                    gpu.uuid,
                    gpu_node.enforcer.node_of(MpsNode).manager.running()[daemon.id].limits,
                )
                kill_daemon(gpu_node, daemon)
                argv = [os.path.realpath(sys.executable), "-I", "-S", str(planter)]
                argv += ["plant", "/dev/shm", str(outside), *names]
                with mount_targets(plan):
                    done = subprocess.run(
                        enter_command(plan, argv, 0),
                        capture_output=True,
                        text=True,
                        timeout=60,
                        check=False,
                    )
                planted = probe_report(done)
                gpu_node.launcher.launch(spec)
                assert wait_until(lambda: answers(daemon.paths), KILL_WAIT_S)
                status, client = run_client(plan, [CLIENT_GIB], probe)
                after = snapshot(outside)
                links_left = [n for n in names if (daemon.paths.shm / n).is_symlink()]
        finally:
            errors = kplugin.unprepare(refs)
    assert errors == {r.uid: "" for r in refs}
    if not names:
        pytest.skip("the daemon and its server created nothing in /dev/shm: no name to plant")
    protected = Path("/proc/sys/fs/protected_symlinks").read_text().strip()
    record_property("shm_names", names)
    record_property("protected_symlinks", protected)
    record_property("links_left_after_the_client", links_left)
    record_property("client_after_planting", {"status": status, "report": client})
    assert planted.get("planted") == names, planted
    assert after == before, (
        f"a file outside /dev/shm changed through a planted link (fs.protected_symlinks="
        f"{protected}): before {before}, after {after}"
    )


def plain_gpu(gpus: list[GpuInfo]) -> GpuInfo:
    """The first GPU without MIG (time-slicing and the fault check use a whole GPU)."""
    for gpu in gpus:
        if gpu.mig_mode != MIG_ENABLED:
            return gpu
    pytest.skip("every GPU here is in MIG mode")


def read_timeslice(uuid: str) -> str | None:
    """The GPU's time-slice interval as ``nvidia-smi compute-policy --list`` shows it; None when
    it cannot be read (the command fails or prints no recognisable interval)."""
    done = subprocess.run(
        ["nvidia-smi", "compute-policy", "--list", "-i", uuid],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return timeslice_from_policy_list(done.stdout) if done.returncode == 0 else None


def test_time_slicing_interval_is_set_and_restored(
    gpu_node: GpuNode, apiserver: KubeAPIServer, settings_guard: SettingsGuard | None
) -> None:
    gpu = plain_gpu(gpu_node.gpus)
    runner = HostRunner("/")
    mode_before = query_compute_mode(runner, gpu.uuid)
    interval_before = read_timeslice(gpu.uuid)
    long = gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
    refs = store(apiserver, [claim("slices", [result("gpu", f"gpu-{gpu.index}")], configs=[long])])
    marker = gpu_node.root / "data" / "timeslice" / gpu.uuid
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            prepare_ok(kplugin, refs)  # the plugin's nvidia-smi --set-timeslice=3 exited 0
            marked = marker.read_text().splitlines() if marker.exists() else []
            during = read_timeslice(gpu.uuid)
            mode_during = query_compute_mode(runner, gpu.uuid)
        finally:
            errors = kplugin.unprepare(refs)
    assert errors == {r.uid: "" for r in refs}
    assert marked[:1] == ["Long"], marked
    assert mode_during == DEFAULT_COMPUTE_MODE
    assert not marker.exists()
    if settings_guard is not None:
        # The GPU's interval was left alone: the commands the plugin ran prove what they can.
        intervals = [a for a in settings_guard.recorded if a[:1] == ["compute-policy"]]
        assert intervals[-2:] == [
            ["compute-policy", "-i", gpu.uuid, "--set-timeslice=3"],
            ["compute-policy", "-i", gpu.uuid, "--set-timeslice=0"],
        ], settings_guard.recorded
        return
    after = read_timeslice(gpu.uuid)
    # nvidia-smi's listing is not a stable interface: compared only where it could be read.
    readable = [v is not None for v in (interval_before, during, after)]
    assert readable in ([True] * 3, [False] * 3), (interval_before, during, after)
    if all(readable):
        assert (during, after) == ("Long", "Default")
    assert query_compute_mode(runner, gpu.uuid) == mode_before


FAULT_WAIT_S: Final = 30.0
#: An application XID as its taint value starts: 13 (graphics engine exception), 31 (MMU fault).
APPLICATION_XID: Final = re.compile(r"XID-(13|31)(-|$)")


def test_a_faulting_client_taints_its_gpu() -> None:
    gpus = NvmlBackend().discover()
    gpu = plain_gpu(gpus)
    device = names.device_name(gpu.index)
    strict, default = TaintRecorder(), TaintRecorder()
    monitors = [
        HealthMonitor(
            NvmlHealthChecker(),
            DRIVER,
            NODE,
            node_devices(gpus, "consumable"),
            settings,
            taints=sink,
        )
        for settings, sink in ((HealthSettings(ignored_xids=frozenset()), strict), (None, default))
    ]
    with contextlib.ExitStack() as stack:
        for monitor in monitors:
            monitor.start()
            stack.callback(monitor.stop)
        assert strict.latest(device) == [], "the GPU is unhealthy before the fault"
        done = subprocess.run(
            [os.path.realpath(sys.executable), "-I", "-S", cudaprobe.__file__, "fault"],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        tainted = wait_until(lambda: bool(strict.latest(device)), FAULT_WAIT_S)
    assert done.returncode == cudaprobe.EXIT_FAULTED, probe_report(done)
    assert tainted, f"no taint on {device} within {FAULT_WAIT_S:.0f} s of the fault"
    (taint,) = strict.latest(device)
    assert taint["key"] == names.unhealthy_taint_key(DRIVER)
    assert taint["effect"] == DEFAULT_TAINT_EFFECT
    assert APPLICATION_XID.match(taint.get("value", "")), taint
    assert not is_reset_reason(taint["value"])
    assert default.latest(device) == [], "an application XID is ignored by default"


def test_dynamic_mig_instance_is_created_used_and_destroyed() -> None:
    """The smallest MIG profile at its first free placement, created through
    :class:`NvmlMigPartitioner` on a GPU whose MIG mode is already enabled (never enabled or
    reset here): its memory is the profile's, CUDA limited to its UUID sees exactly its SMs and
    can allocate within it, and after destroy nvidia-smi no longer lists it."""
    backend = NvmlBackend()
    gpu = next(
        (g for g in backend.discover() if g.mig_mode == MIG_ENABLED and g.mig_profiles), None
    )
    if gpu is None:
        pytest.skip(
            "no GPU with MIG mode enabled and NVML MIG profiles (MIG is never enabled here)"
        )
    part = NvmlMigPartitioner(backend)
    taken = [(d.mig.profile_id, d.mig.placement) for d in part.instances(gpu) if d.mig]
    if any(pid is None or where is None for pid, where in taken):
        pytest.skip(f"GPU {gpu.index}: NVML does not report the existing instances' placements")
    existing = [(pid, where) for pid, where in taken if pid is not None and where is not None]
    smallest = gpu.mig_profiles[0]
    free = [
        p
        for p in smallest.placements
        if placement_problem(gpu.mig_profiles, existing, smallest.profile_id, p) is None
    ]
    if not free:
        pytest.skip(f"GPU {gpu.index}: no free placement for profile {smallest.name}")
    device = part.create(gpu, smallest, free[0])
    assert device.mig is not None
    try:
        assert device.memory_total // MIB == smallest.memory_mb
        assert (device.mig.placement, device.mig.profile_id) == (free[0], smallest.profile_id)
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        assert device.uuid in listed
        with tempfile.TemporaryDirectory() as tmp:
            probe = install_probe(Path(tmp))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
            done = subprocess.run(
                [sys.executable, "-I", "-S", str(probe), "1"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
                env=env,
            )
            report = probe_report(done)
            assert done.returncode == 0, report
            assert report.get("sms") == smallest.multiprocessors, report
    finally:
        assert part.destroy(gpu, device.mig.gpu_instance) is True
    assert part.destroy(gpu, device.mig.gpu_instance) is False
    listed = subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert device.uuid not in listed


#: Seconds a just-started CUDA process has to appear in NVML's lists.
LISTED_WAIT_S: Final = 20.0
DAEMON_POD, TENANT_POD, PLAIN_POD = "daemon-pod", "tenant-pod", "plain-pod"


def child_pids(pid: int) -> list[int]:
    """The children of ``pid`` (``/proc/<pid>/task/<pid>/children``)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@contextlib.contextmanager
def plain_holder_in_own_pid_namespace(gpu: GpuInfo, probe: Path) -> Iterator[int]:
    """A CUDA process outside MPS (no pipe directory) in a PID namespace of its own, as a pod
    without hostPID runs, holding 2 GiB; yields its PID as the host sees it."""
    argv = ["unshare", "--pid", "--fork", "--mount-proc", os.path.realpath(sys.executable)]
    argv += ["-I", "-S", str(probe), "hold", "2"]
    env = {"PATH": os.environ.get("PATH", ""), "CUDA_VISIBLE_DEVICES": gpu.uuid}
    with holder(argv, env) as (process, _):
        (host_pid,) = child_pids(process.pid)
        yield host_pid


def nvml_pids_seen_from_a_new_pid_namespace(gpu: GpuInfo) -> list[int]:
    """The compute processes of ``gpu`` as NVML lists them to a process in a new PID namespace
    (a plugin pod without hostPID)."""
    code = (
        "import json,sys,pynvml as n;n.nvmlInit();"
        "h=n.nvmlDeviceGetHandleByUUID(sys.argv[1]);"
        "print(json.dumps([p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]))"
    )
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code, gpu.uuid],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pids: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return pids


def test_usage_sees_other_pid_namespaces_and_flags_a_process_outside_mps(
    gpu_node: GpuNode, apiserver: KubeAPIServer
) -> None:
    """A share's MPS client (emulated container) and a plain CUDA process in a PID namespace of
    its own run on one GPU. From the host PID namespace (the chart's hostPID) NVML lists both and
    the MPS client list marks the client; attribution with the node's daemon and pods (mapped
    here by the test, as cgroups map them on a node) flags only the plain process. From a new
    PID namespace NVML lists none of them: why the sampler needs the host's."""
    gpu = shareable_gpu(gpu_node.gpus)
    probe = install_probe(gpu_node.root)
    refs = store(apiserver, [mps_claim("watched", gpu, 25, 4)])
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            (plan,) = plans(gpu_node, prepare_ok(kplugin, refs), refs)
            with (
                holding_client(plan, ["hold", "1"], probe),
                plain_holder_in_own_pid_namespace(gpu, probe) as plain_pid,
            ):
                source = NvmlUsageSource()
                source.open()
                try:
                    samples: list[GpuSample] = []

                    def both_listed() -> bool:
                        samples[:] = [source.sample(gpu.uuid, mps=True)]
                        listed = {p.pid: p for p in samples[0].processes}
                        return plain_pid in listed and any(p.mps_client for p in listed.values())

                    assert wait_until(both_listed, LISTED_WAIT_S), samples
                finally:
                    source.close()
                from_new_namespace = nvml_pids_seen_from_a_new_pid_namespace(gpu)
        finally:
            errors = kplugin.unprepare(refs)
    assert errors == {r.uid: "" for r in refs}
    (sample,) = samples
    clients = {p.pid for p in sample.processes if p.mps_client}
    servers = {p.pid for p in sample.processes if process_name(p.pid) == "nvidia-cuda-mps-server"}
    assert sample.mps_listed and len(clients) == 1 and len(servers) == 1, sample

    def pod_of(pid: int) -> PodLookup:
        uid = DAEMON_POD if pid in servers else TENANT_POD if pid in clients else PLAIN_POD
        return PodLookup(uid)

    share = PreparedShare(
        refs[0].uid,
        "default",
        "watched",
        NODE,
        f"gpu-{gpu.index}",
        None,
        gpu.uuid,
        25,
        4 * GI,
        mps=True,
    )
    result = attribute(
        [sample],
        [share],
        pod_of,
        {refs[0].uid: frozenset({TENANT_POD})},
        compute_margin=0,
        daemon_pods=frozenset({DAEMON_POD}),
    )
    assert [(e.pid, e.pod_uid) for e in result.escapes] == [(plain_pid, PLAIN_POD)]
    [usage] = result.usage.values()
    assert (usage.processes, usage.outside_mps) == (1, 1)
    assert from_new_namespace == []
