"""Escapes from MPS: MPS clients, MPS servers of the driver's daemon pods and plain processes on
a GPU with MPS shares, from the attribution rule to the claims, metrics, log and taint."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.health.taintmerge import TaintMerger
from kubeletplugin.usage.attribution import REASON_NO_SHARE, attribute
from kubeletplugin.usage.flags import UsageOptions
from kubeletplugin.usage.mocksource import FileUsageSource, parse_usage_file
from kubeletplugin.usage.model import GpuSample, ProcessSample
from kubeletplugin.usage.mpsdaemons import DAEMON_POD_SELECTOR, MAX_DAEMON_PODS, DaemonPods
from kubeletplugin.usage.procfs import (
    INITIAL_PID_NAMESPACE,
    PodLookup,
    pid_namespace_problem,
    pod_of_process,
)
from kubeletplugin.usage.sampler import UsageSampler
from kubeletplugin.usage.source import UsageSourceError
from kubeletplugin.usage.taints import EscapeTaints
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeApiError
from sharegpu.kube.telemetry import Telemetry
from tests.kubeletplugin.usage.helpers import (
    CLAIM_A,
    CLAIM_B,
    GI,
    GPU0,
    GPU1,
    GPUS,
    POD_A,
    POD_B,
    SHARE_A,
    SHARE_B,
    FakeClaims,
    Sink,
    write_proc,
)

#: An MPS control daemon pod of this node, and a pod with no share (privileged, say).
POD_DAEMON = "0d0d0d0d-0000-4000-8000-00000000000d"
POD_OTHER = "0e0e0e0e-0000-4000-8000-00000000000e"
MPS_A, MPS_B = replace(SHARE_A, mps=True), replace(SHARE_B, mps=True)
PODS = {CLAIM_A: frozenset({POD_A}), CLAIM_B: frozenset({POD_B})}


def cgroup(pod: str) -> bytes:
    return f"0::/kubepods.slice/kubepods-pod{pod.replace('-', '_')}.slice/cri-x.scope\n".encode()


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """Host processes: 10 an MPS client of pod A, 11 the MPS server (daemon pod), 12 a plain
    process of pod A, 13 a plain process of a pod without a share, 14 a host process."""
    root = tmp_path / "proc"
    for pid, pod in ((10, POD_A), (11, POD_DAEMON), (12, POD_A), (13, POD_OTHER)):
        write_proc(root, pid, cgroup(pod))
    write_proc(root, 14, b"0::/system.slice/host.service\n")
    return root


def mps_sample(*pids: int, listed: bool = True) -> GpuSample:
    memory = {10: 3 * GI, 11: 69 * 2**20, 12: 2 * GI, 13: GI, 14: GI}
    processes = tuple(ProcessSample(p, memory[p], mps_client=p == 10) for p in pids)
    # NVML: MPS clients' SM time is reported under their server, plain processes have their own.
    sm = {11: 30, 12: 60, 13: 5, 14: 5}
    return GpuSample(GPU0, processes, {p: sm[p] for p in pids if p in sm}, mps_listed=listed)


def lookup(proc: Path) -> Any:
    return lambda pid: pod_of_process(proc, pid)


# --- the rule ---------------------------------------------------------------------------------


def test_every_process_outside_mps_escapes_and_servers_are_nobodys(proc: Path) -> None:
    sample = mps_sample(10, 11, 12, 13, 14)
    result = attribute([sample], [MPS_A, MPS_B], lookup(proc), PODS, 10, frozenset({POD_DAEMON}))
    # The server is neither a share's process nor unattributed.
    assert all(u.pid != 11 for u in result.unattributed)
    assert [(e.pid, e.pod_uid, e.share) for e in result.escapes] == [
        (12, POD_A, MPS_A),
        (13, POD_OTHER, None),
        (14, None, None),
    ]
    assert result.judged == (GPU0,)
    a, b = result.usage[MPS_A.key], result.usage[MPS_B.key]
    # The client and the escaped process of pod A both count for share A.
    assert (a.processes, a.used_memory) == (2, 5 * GI)
    # A share counts its own escapes only: B's tenant never sees A's process, nor the process
    # of a pod without a share, nor the host's (those are the node's: log, metric, taint).
    assert (a.outside_mps, a.escaped_pods) == (1, (POD_A,))
    assert (b.outside_mps, b.escaped_pods) == (0, ())
    # NVML gives no SM time per MPS client: absent, never the server's or zero.
    assert a.sm_utilization is None and b.sm_utilization is None
    assert [(u.pid, u.reason) for u in result.unattributed] == [
        (13, REASON_NO_SHARE),
        (14, "not in a pod's cgroup"),
    ]


def test_clients_and_servers_only_is_no_escape(proc: Path) -> None:
    sample = mps_sample(10, 11)
    result = attribute([sample], [MPS_A], lookup(proc), PODS, 10, frozenset({POD_DAEMON}))
    assert result.escapes == () and result.unattributed == ()
    assert result.usage[MPS_A.key].outside_mps == 0
    assert result.usage[MPS_A.key].escaped_pods == ()


def test_a_process_named_like_a_server_is_judged_by_its_pod(proc: Path) -> None:
    """Only the pod decides: a tenant's "nvidia-cuda-mps-server" in its own pod escapes, and
    so does a server whose pod is not one of the driver's daemon pods."""
    write_proc(proc, 15, cgroup(POD_B))
    (proc / "15" / "comm").write_text("nvidia-cuda-mps-server\n")
    sample = GpuSample(GPU0, (ProcessSample(15, GI),), {}, mps_listed=True)
    result = attribute([sample], [MPS_A, MPS_B], lookup(proc), PODS, 10, frozenset({POD_DAEMON}))
    assert [(e.pid, e.share) for e in result.escapes] == [(15, MPS_B)]
    result = attribute([mps_sample(11)], [MPS_A], lookup(proc), PODS, 10, frozenset())
    assert [e.pid for e in result.escapes] == [11]


def test_nothing_is_judged_without_what_the_rule_needs(proc: Path) -> None:
    daemons = frozenset({POD_DAEMON})
    cases = [
        # Daemon pods unknown (never listed): servers cannot be told apart.
        (mps_sample(10, 11, 12), [MPS_A], None),
        # The driver did not list the MPS clients.
        (mps_sample(10, 11, 12, listed=False), [MPS_A], daemons),
        # No MPS share on the GPU (time-slicing, say).
        (mps_sample(12, 13), [SHARE_A], daemons),
    ]
    for sample, shares, known in cases:
        result = attribute([sample], shares, lookup(proc), PODS, 10, known)
        assert result.escapes == () and result.judged == ()
        assert all(u.outside_mps is None for u in result.usage.values())
    # Known daemon pods still keep the server out of the unattributed processes.
    result = attribute([mps_sample(11, 12, listed=False)], [MPS_A], lookup(proc), PODS, 10, daemons)
    assert result.unattributed == ()


def test_a_non_mps_share_on_an_mps_gpu_keeps_its_utilisation(proc: Path) -> None:
    sample = mps_sample(10, 11, 13)
    shares = [MPS_A, replace(SHARE_B, gpu_uuid=GPU0)]
    pods = {CLAIM_A: frozenset({POD_A}), CLAIM_B: frozenset({POD_OTHER})}
    result = attribute([sample], shares, lookup(proc), pods, 10, frozenset({POD_DAEMON}))
    b = result.usage[SHARE_B.key]
    assert (b.sm_utilization, b.outside_mps, b.escaped_pods) == (5, None, ())
    # Its plain process is outside MPS all the same, but it is not A's: A's status stays clean.
    assert [e.share for e in result.escapes] == [SHARE_B]
    assert result.usage[MPS_A.key].outside_mps == 0


# --- the mock source --------------------------------------------------------------------------


def test_mock_file_expresses_clients_servers_and_plain_processes() -> None:
    text = (
        f"0:\n"
        f"- {{claim: ml/a, pod: {POD_A}, mpsClient: true, memory: 3Gi}}\n"
        f"- {{pod: {POD_DAEMON}, memory: 64Mi, sm: 30}}\n"
        f"- {{pod: {POD_OTHER}, memory: 2Gi, sm: 60}}\n"
    )
    sample = parse_usage_file(text, GPUS)[GPU0]
    assert sample.mps_listed
    client, server, plain = sample.processes
    assert (client.claim, client.pod_uid, client.mps_client) == ("ml/a", POD_A, True)
    assert (server.pod_uid, server.mps_client, plain.pod_uid) == (POD_DAEMON, False, POD_OTHER)
    assert sample.sm_utilization == {client.pid: 0, server.pid: 30, plain.pid: 60}
    result = attribute(
        [sample], [MPS_A], lambda p: PodLookup(None, "x"), PODS, 10, frozenset({POD_DAEMON})
    )
    assert [(e.pod_uid, e.share) for e in result.escapes] == [(POD_OTHER, None)]
    assert result.usage[MPS_A.key].processes == 1


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("{pod: POD-A}", "entry 0[0].pod: expected a pod UID"),
        ("{pod: 12}", "entry 0[0].pod: expected a pod UID"),
        ("{claim: ml/a, mpsClient: 1}", "entry 0[0].mpsClient: expected true or false"),
        ("{claim: ml/a, mpsClient: true, sm: 5}", "entry 0[0].sm: NVML reports an MPS client"),
        ("{memory: 1Gi, mpsClient: true}", "needs a claim, a pid or a pod"),
    ],
)
def test_mock_file_refuses_what_nvml_cannot_say(entry: str, problem: str) -> None:
    with pytest.raises(UsageSourceError, match=re.escape(problem)):
        parse_usage_file(f"0: [{entry}]\n", GPUS)


# --- the daemon pods --------------------------------------------------------------------------


class FakePods:
    def __init__(self, *uids: str) -> None:
        self.uids = list(uids)
        self.calls: list[tuple[str, str, str]] = []
        self.fail = False

    def list(self, namespace: str, label_selector: str, field_selector: str) -> list[Any]:
        self.calls.append((namespace, label_selector, field_selector))
        if self.fail:
            raise KubeApiError(403, "Forbidden", "no")
        return [{"metadata": {"uid": u}} for u in self.uids] + [{"metadata": {}}, "junk"]


def test_daemon_pods_are_listed_by_label_and_node_and_refreshed_sparingly() -> None:
    pods, clock = FakePods(POD_DAEMON), FakeClock()
    daemons = DaemonPods(pods, "gpu-operators", "node-a", clock, refresh_s=60, min_interval_s=10)
    assert daemons.uids() == frozenset({POD_DAEMON})
    assert pods.calls == [("gpu-operators", DAEMON_POD_SELECTOR, "spec.nodeName=node-a")]
    pods.uids.append(POD_OTHER)
    clock.advance(5)
    assert daemons.uids(fresh=True) == frozenset({POD_DAEMON})  # within min_interval_s
    clock.advance(5)
    assert daemons.uids() == frozenset({POD_DAEMON})  # not stale yet
    assert daemons.uids(fresh=True) == frozenset({POD_DAEMON, POD_OTHER})
    # A failed list keeps what was known; the first failure leaves it unknown.
    pods.fail = True
    clock.advance(60)
    assert daemons.uids() == frozenset({POD_DAEMON, POD_OTHER})
    never = DaemonPods(pods, "ns", "node-a", clock, refresh_s=60, min_interval_s=10)
    assert never.uids() is None
    # Bounded: no more than MAX_DAEMON_PODS entries are read.
    many = FakePods(*(f"{i:032x}" for i in range(MAX_DAEMON_PODS + 5)))
    bounded = DaemonPods(many, "ns", "node-a", clock, refresh_s=60, min_interval_s=10)
    assert len(bounded.uids() or ()) == MAX_DAEMON_PODS


# --- the sampler ------------------------------------------------------------------------------


def mps_sampler(
    tmp_path: Path, claims: FakeClaims, pods: FakePods, clock: FakeClock, sink: Sink, **opts: Any
) -> tuple[UsageSampler, Path, Telemetry]:
    usage_file = tmp_path / "usage.yaml"
    telemetry = Telemetry("test-escapes", env={})
    options = UsageOptions(proc_root=tmp_path / "proc", **opts)
    sampler = UsageSampler(
        options,
        FileUsageSource(usage_file, GPUS),
        lambda: [MPS_A, MPS_B],
        claims,
        "gpu.sharegpu.dev",
        GPUS,
        telemetry=telemetry,
        taints=TaintMerger(sink).source("usage"),
        daemon_pods=DaemonPods(pods, "ns", "node-a", clock, refresh_s=600, min_interval_s=1),
        clock=clock,
    )
    return sampler, usage_file, telemetry


def usage_file_text(*extra: str) -> str:
    lines = [
        f"- {{claim: ml/a, pod: {POD_A}, mpsClient: true, memory: 3Gi}}",
        f"- {{pod: {POD_DAEMON}, memory: 64Mi, sm: 30}}",
        *extra,
    ]
    return "0:\n" + "\n".join(lines) + "\n"


def data(claims: FakeClaims, name: str) -> dict[str, Any]:
    [entry] = [
        e for e in claims.claims[name]["status"]["devices"] if e["driver"] == "gpu.sharegpu.dev"
    ]
    return dict(entry["data"])


def test_an_escape_is_flagged_in_the_round_that_sees_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    claims, pods, clock, sink = FakeClaims(), FakePods(POD_DAEMON), FakeClock(), Sink()
    claims.add("a", CLAIM_A, [POD_A])
    claims.add("b", CLAIM_B, [POD_B])
    sampler, usage_file, telemetry = mps_sampler(
        tmp_path, claims, pods, clock, sink, escape_taint=True
    )
    usage_file.write_text(usage_file_text())
    sampler.sample_once()
    assert data(claims, "a")["processesOutsideMPS"] == 0 and "escapedPods" not in data(claims, "a")
    assert "smUtilization" not in data(claims, "a")
    assert sink.taints == {}
    assert 'sharegpu_mps_escaped_processes{gpu="' + GPU0 + '"} 0' in telemetry.scrape().decode()
    # Pod A starts a plain CUDA process, within the write interval: written at once.
    usage_file.write_text(usage_file_text(f"- {{pod: {POD_A}, claim: ml/a, memory: 2Gi, sm: 90}}"))
    clock.advance(1)
    with caplog.at_level(logging.WARNING, logger="kubeletplugin.usage.sampler"):
        sampler.sample_once()
        sampler.sample_once()  # the same escape is logged once
    assert (data(claims, "a")["processesOutsideMPS"], data(claims, "a")["escapedPods"]) == (
        1,
        [POD_A],
    )
    # Tenant B's claim does not hear of A's process; the GPU's metric and taint do.
    assert data(claims, "b")["processesOutsideMPS"] == 0 and "escapedPods" not in data(claims, "b")
    [record] = [r for r in caplog.records if "outside MPS" in r.getMessage()]
    assert POD_A in record.getMessage() and "claim ml/a" in record.getMessage()
    [taint] = sink.taints["gpu-0"]
    assert (taint["key"], taint["effect"]) == ("gpu.sharegpu.dev/mps-escape", "NoSchedule")
    text = telemetry.scrape().decode()
    assert 'sharegpu_mps_escaped_processes{gpu="' + GPU0 + '"} 1' in text
    # It exits: written at once again, the taint goes.
    usage_file.write_text(usage_file_text())
    clock.advance(1)
    sampler.sample_once()
    assert data(claims, "a")["processesOutsideMPS"] == 0 and "escapedPods" not in data(claims, "a")
    assert sink.taints == {}
    telemetry.shutdown()


def test_a_daemon_started_since_the_last_list_is_no_escape(tmp_path: Path) -> None:
    new_daemon = "0f0f0f0f-0000-4000-8000-00000000000f"
    claims, pods, clock, sink = FakeClaims(), FakePods(POD_DAEMON), FakeClock(), Sink()
    claims.add("a", CLAIM_A, [POD_A])
    claims.add("b", CLAIM_B, [POD_B])
    sampler, usage_file, telemetry = mps_sampler(tmp_path, claims, pods, clock, sink)
    usage_file.write_text(usage_file_text())
    sampler.sample_once()
    # A second daemon pod (another claim's) starts its server: its pod is listed afresh.
    pods.uids.append(new_daemon)
    usage_file.write_text(usage_file_text(f"- {{pod: {new_daemon}, memory: 64Mi}}"))
    clock.advance(5)
    result = sampler.sample_once()
    assert result.escapes == ()
    assert data(claims, "a")["processesOutsideMPS"] == 0
    assert len(pods.calls) == 2
    # Escape taint off by default.
    usage_file.write_text(usage_file_text(f"- {{pod: {POD_OTHER}, memory: 1Gi}}"))
    clock.advance(5)
    assert len(sampler.sample_once().escapes) == 1
    assert sink.taints is None
    telemetry.shutdown()


def test_escape_taint_keeps_its_time_while_it_lasts() -> None:
    taints = EscapeTaints("d", GPUS)
    sample = GpuSample(GPU1, (ProcessSample(12, GI),), None, mps_listed=True)
    result = attribute(
        [sample], [replace(MPS_A, gpu_uuid=GPU1)], lambda p: PodLookup(POD_A), PODS, 10, frozenset()
    )
    first = taints.taints(result.escapes, 1_000.0)
    assert first == {
        "gpu-1": [
            {"key": "d/mps-escape", "effect": "NoSchedule", "timeAdded": "1970-01-01T00:16:40Z"}
        ]
    }
    assert taints.taints(result.escapes, 2_000.0) == first
    assert taints.taints((), 3_000.0) == {}
    assert (
        taints.taints(result.escapes, 4_000.0)["gpu-1"][0]["timeAdded"]
        != first["gpu-1"][0]["timeAdded"]
    )


# --- the PID namespace ------------------------------------------------------------------------


def test_a_plugin_outside_the_host_pid_namespace_is_told_why_usage_reads_zero(
    tmp_path: Path,
) -> None:
    ns = tmp_path / "self" / "ns"
    ns.mkdir(parents=True)
    (ns / "pid").symlink_to(INITIAL_PID_NAMESPACE)
    assert pid_namespace_problem(tmp_path) is None
    (ns / "pid").unlink()
    (ns / "pid").symlink_to("pid:[4026532999]")
    problem = pid_namespace_problem(tmp_path)
    assert problem is not None and "pid:[4026532999]" in problem and "hostPID" in problem
    assert pid_namespace_problem(tmp_path / "missing") is None
