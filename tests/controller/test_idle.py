"""Idle shares: the threshold, the period on the tracker's clock, unknown is not idle, the GPU
object's condition and allocation flag, the metric, and the configuration's bounds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.gpu import GpuObject
from api.names import CONDITION_SHARES_IDLE
from api.shareusage import MeasuredUsage
from controller.config import build_parser, parse_config
from controller.idle import (
    IdlePolicy,
    IdleShares,
    shares_idle_condition,
)
from controller.metrics import ControllerMetrics
from controller.reconcile import Alloc
from controller.tracker import Tracker
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest
from sharegpu.kube.telemetry import Telemetry
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller import helpers as h
from tests.helpers import eventually

GI = 1024**3
GPU = "node-a-gpu-0"
#: 10% of 40 cores is 4; 10% of 10Gi is 1Gi.
POLICY = IdlePolicy(threshold_percent=10, period_s=600)
DEADLINE_S = 30.0


def _alloc(sm: int | None, memory: int, *, claim: str = "a", measured: bool = True) -> Alloc:
    usage = MeasuredUsage(memory, sm, 1, None, ()) if measured else None
    return Alloc(
        gpu=GPU,
        claim_namespace="ml",
        claim_name=claim,
        claim_uid=f"uid-{claim}",
        request="gpu",
        device="gpu-0",
        share_id=f"s-{claim}",
        cores=40,
        memory=10 * GI,
        pods=(("p", "uid-p", ("main",)),),
        usage=usage,
    )


def _idle(shares: IdleShares, allocs: list[Alloc]) -> dict[str, Any]:
    shares.observe(GPU, allocs)
    verdict = shares.verdict(GPU, allocs, record=True)
    return {"idle": sorted(k[0] for k in verdict.idle), "condition": _condition(allocs, verdict)}


def _condition(allocs: list[Alloc], verdict: Any) -> str | None:
    c = shares_idle_condition(allocs, verdict)
    return None if c is None else c["status"]


def test_exactly_at_the_threshold_is_not_below() -> None:
    assert POLICY.below(_alloc(4, GI)) is False  # 4% of the GPU is exactly 10% of 40 cores
    assert POLICY.below(_alloc(3, GI)) is False  # memory exactly at 10% of 10Gi
    assert POLICY.below(_alloc(3, GI - 1)) is True
    assert POLICY.below(_alloc(4, GI - 1)) is False


def test_idle_only_once_the_period_has_elapsed() -> None:
    clock = FakeClock()
    shares = IdleShares(POLICY, clock)
    quiet = [_alloc(0, 0)]
    assert _idle(shares, quiet) == {"idle": [], "condition": "False"}
    assert clock.advance(599)
    assert shares.due() == []
    assert _idle(shares, quiet) == {"idle": [], "condition": "False"}
    assert clock.advance(1)
    assert shares.due() == [GPU]  # reached the period with no input changing
    assert _idle(shares, quiet) == {"idle": ["uid-a"], "condition": "True"}
    assert shares.due() == []  # reported: not due again


def test_a_second_share_reaching_the_period_makes_the_gpu_due_again() -> None:
    clock = FakeClock()
    shares = IdleShares(POLICY, clock)
    first = _alloc(0, 0, claim="a")
    _idle(shares, [first, _alloc(30, 0, claim="b")])
    clock.advance(300)
    both = [first, _alloc(0, 0, claim="b")]
    _idle(shares, both)  # b is below from now on
    clock.advance(300)
    assert shares.due() == [GPU]
    assert _idle(shares, both)["idle"] == ["uid-a"]
    clock.advance(299)
    assert shares.due() == []
    clock.advance(1)
    assert shares.due() == [GPU]
    assert shares.due() == [GPU]  # due until its verdict is recorded
    assert _idle(shares, both)["idle"] == ["uid-a", "uid-b"]
    assert shares.due() == []


def test_a_share_that_becomes_busy_again_clears_and_starts_over() -> None:
    clock = FakeClock()
    shares = IdleShares(POLICY, clock)
    _idle(shares, [_alloc(1, GI // 2)])
    clock.advance(600)
    assert _idle(shares, [_alloc(2, GI // 4)])["idle"] == ["uid-a"]  # still below: still idle
    assert _idle(shares, [_alloc(30, GI // 4)]) == {"idle": [], "condition": "False"}
    assert _idle(shares, [_alloc(0, 0)])["idle"] == []  # below again: the period starts over
    clock.advance(599)
    assert _idle(shares, [_alloc(0, 0)])["idle"] == []
    clock.advance(1)
    assert _idle(shares, [_alloc(0, 0)])["idle"] == ["uid-a"]


@pytest.mark.parametrize(
    "alloc",
    [
        _alloc(0, 0, measured=False),  # no measurement
        _alloc(None, 0),  # the GPU does not report per-process utilisation
        replace(_alloc(0, 0), cores=0, memory=0),  # reserved nothing (adminAccess)
    ],
    ids=["unmeasured", "no-utilisation", "reserves-nothing"],
)
def test_unknown_usage_is_never_idle(alloc: Alloc) -> None:
    clock = FakeClock()
    shares = IdleShares(POLICY, clock)
    assert POLICY.below(alloc) is None
    _idle(shares, [alloc])
    clock.advance(10 * 600)
    assert shares.due() == []
    assert _idle(shares, [alloc]) == {"idle": [], "condition": None}


def test_a_missing_sample_restarts_the_period() -> None:
    clock = FakeClock()
    shares = IdleShares(POLICY, clock)
    _idle(shares, [_alloc(0, 0)])
    clock.advance(300)
    _idle(shares, [_alloc(0, 0, measured=False)])  # the measurement vanished: unknown
    clock.advance(300)
    assert _idle(shares, [_alloc(0, 0)])["idle"] == []
    clock.advance(600)
    assert _idle(shares, [_alloc(0, 0)])["idle"] == ["uid-a"]


def test_configuration_bounds_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--idle-threshold-percent must be 1 to 100"):
        IdlePolicy(threshold_percent=101)
    with pytest.raises(ValueError, match="--idle-period-seconds must be 1 to 2592000"):
        IdlePolicy(period_s=0)
    off = "--disable-webhook"
    assert parse_config([off, "--idle-threshold-percent=0"]).idle_policy is None
    flags = [off, "--idle-threshold-percent=7", "--idle-period-seconds=90"]
    assert parse_config(flags).idle_policy == IdlePolicy(7, 90)
    assert parse_config([off]).idle_policy == IdlePolicy()


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--idle-threshold-percent=-1", "--idle-threshold-percent must be from 0 to 100, not -1"),
        ("--idle-period-seconds=1h", "--idle-period-seconds must be an integer from 1 to"),
    ],
)
def test_bad_flags_are_usage_errors(
    flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([flag])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def _measure(kube: KubeRest, sm: int, memory: str) -> None:
    current = kube.get(h.claims_path(name="share"))
    data = {"kind": "ShareUsage", "usedMemory": memory, "processes": 1, "smUtilization": sm}
    current["status"]["devices"] = [
        {"driver": h.DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": "s-1", "data": data}
    ]
    kube.request("PUT", h.claims_path(name="share") + "/status", body=current)


def _stored_gpu(kube: KubeRest) -> GpuObject:
    obj = kube.get(f"{h.GPUS}/{GPU}")
    return GpuObject.model_validate({"name": GPU, "spec": obj["spec"], "status": obj["status"]})


def _scrape(metrics: Telemetry) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(metrics.scrape().decode())
        for s in family.samples
        if s.name == "sharegpu_share_idle_seconds"
    ]


def test_the_tracker_reports_an_idle_share_on_the_gpu_object_and_in_the_metric(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    cluster = h.Cluster(kube)
    cluster.add_slice(h.node_slice("node-a", 1))
    pods = [(p, cluster.add_pod(h.pod(p, "share", {"main": None}))) for p in ("p1", "p2")]
    result = h.result("node-a", "gpu-0", cores=40, memory="10Gi", share_id="s-1")
    cluster.add_claim("share", [result], pods=pods)
    _measure(kube, sm=1, memory="100Mi")
    clock = FakeClock()
    telemetry = Telemetry("test-idle")
    metrics = ControllerMetrics(telemetry)
    tracker = Tracker(kube, h.DRIVER, clock=clock, watch_timeout_s=60, idle=POLICY)
    metrics.set_idle_source(tracker.idle_gauges)
    for informer in tracker.informers:
        informer.start()
    try:
        assert tracker.wait_synced(DEADLINE_S)

        def measured() -> bool:
            tracker.flush()
            (gpu,) = tracker.gpus("node-a")
            return any(a.usage is not None for a in gpu.status.allocations)

        eventually(measured, timeout_s=DEADLINE_S)
        gpu = _stored_gpu(kube)
        conditions = {c.type: c for c in gpu.status.conditions or []}
        assert conditions[CONDITION_SHARES_IDLE].status == "False"
        assert [a.idle for a in gpu.status.allocations] == [None]
        assert _scrape(telemetry) == []

        clock.advance(600)
        tracker.flush()  # nothing changed but the time: the GPU is due
        gpu = _stored_gpu(kube)
        conditions = {c.type: c for c in gpu.status.conditions or []}
        idle = conditions[CONDITION_SHARES_IDLE]
        assert (idle.status, idle.reason) == ("True", "UsageBelowThreshold")
        assert "default/share (s-1)" in idle.message and "10%" in idle.message
        assert [a.idle for a in gpu.status.allocations] == [True]
        labels = [(s, v) for s, v in _scrape(telemetry)]
        assert sorted(s["pod"] for s, _ in labels) == ["p1", "p2"]
        assert all(
            (s["namespace"], s["claim"], s["gpu"]) == ("default", "share", GPU) and v == 600
            for s, v in labels
        )

        _measure(kube, sm=30, memory="100Mi")  # busy again

        def cleared() -> bool:
            clock.advance(1)  # past the write interval (on the same clock)
            tracker.flush()
            found = {c.type: c.status for c in _stored_gpu(kube).status.conditions or []}
            return found.get(CONDITION_SHARES_IDLE) == "False"

        eventually(cleared, timeout_s=DEADLINE_S)
        assert [a.idle for a in _stored_gpu(kube).status.allocations] == [None]
        assert _scrape(telemetry) == []
    finally:
        tracker.stop()
