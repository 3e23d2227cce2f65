"""The webhook's GpuQuota admission against the embedded API server: charges, denials, the
optimistic-concurrency charge under 50 concurrent admissions, dry runs and broken quotas."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from api.crd import quota_crd_manifest
from api.names import GPU_QUOTA_CRD_NAME
from controller.metrics import ControllerMetrics
from controller.quotaadmit import CRD_ABSENT_WARNING, EMPTY_LIST_TTL_S, QuotaAdmitter
from controller.quotacharge import ChargeBasis
from controller.quotacontroller import QuotaController
from controller.webhook import AdmissionHandler
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeApiError, KubeRest
from sharegpu.kube.telemetry import Telemetry
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller.quota_helpers import (
    DRIVER,
    GI,
    claim,
    create_quota,
    quota,
    read_quota,
    review,
)

BASIS = ChargeBasis(largest_memory=80 * GI, largest_node_gpus=8)


def handler(kube: KubeRest) -> AdmissionHandler:
    admitter = QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS)
    return AdmissionHandler(DRIVER, quota=admitter)


def answer(h: AdmissionHandler, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    response: dict[str, Any] = h.review(review(obj, **kw), from_api_server=True)["response"]
    return response


def test_claims_are_charged_until_the_quota_is_full(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"cores": 100, "memory": "40Gi", "devices": 4}))
    h = handler(kube)
    assert answer(h, claim("a", 30, "10Gi"))["allowed"]
    assert answer(h, claim("b", 50, "20Gi"))["allowed"]
    denied = answer(h, claim("c", 30, "5Gi"))
    assert not denied["allowed"]
    assert denied["status"]["code"] == 403
    message = denied["status"]["message"]
    assert "GpuQuota team-a/q" in message
    assert "cores: used 80, asked 30, hard 100, 20 left" in message
    status = read_quota(kube, "q")["status"]
    assert status["used"] == {"cores": 80, "memory": "30Gi", "devices": 2}
    assert sorted(status["claims"]) == ["a", "b"]
    assert status["coresSummary"] == "80/100"
    assert status["memorySummary"] == "30Gi/40Gi"


def test_a_request_without_capacity_is_a_whole_gpu(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"memory": "100Gi"}))
    h = handler(kube)
    assert answer(h, claim("whole"))["allowed"]
    denied = answer(h, claim("second"))
    assert "memory: used 80Gi, asked 80Gi, hard 100Gi, 20Gi left" in denied["status"]["message"]


def test_memory_is_charged_after_the_policy_rounding(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"memory": "1Gi"}))
    h = handler(kube)
    for name in ("a", "b", "c", "d"):  # 1 byte is reserved as 256Mi
        assert answer(h, claim(name, 1, "1"))["allowed"], name
    assert not answer(h, claim("e", 1, "1"))["allowed"]
    assert read_quota(kube, "q")["status"]["used"]["memory"] == "1Gi"


def test_fifty_concurrent_admissions_never_over_admit(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"cores": 100}))
    h = handler(kube)
    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda i: answer(h, claim(f"c{i}", 10), uid=f"u{i}"), range(50)))
    admitted = [a for a in answers if a["allowed"]]
    assert len(admitted) == 10
    status = read_quota(kube, "q")["status"]
    assert status["used"]["cores"] == 100
    assert len(status["claims"]) == 10
    assert all("exceeded GpuQuota" in a["status"]["message"] for a in answers if not a["allowed"])


def test_dry_run_judges_without_charging(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"cores": 50}))
    h = handler(kube)
    assert answer(h, claim("a", 40), dry_run=True)["allowed"]
    assert not answer(h, claim("b", 60), dry_run=True)["allowed"]
    assert "status" not in read_quota(kube, "q") or not read_quota(kube, "q")["status"].get(
        "claims"
    )


def test_scoped_quota_counts_only_its_classes(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"devices": 1}, classes=[f"{DRIVER}-premium"]))
    h = handler(kube)
    assert answer(h, claim("plain-1", 10))["allowed"]
    assert answer(h, claim("plain-2", 10))["allowed"]
    assert answer(h, claim("p1", 10, device_class=f"{DRIVER}-premium"))["allowed"]
    assert not answer(h, claim("p2", 10, device_class=f"{DRIVER}-premium"))["allowed"]


def test_other_drivers_claims_are_not_charged(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"devices": 0}))
    h = handler(kube)
    assert answer(h, claim("other", device_class="nic.example.com"))["allowed"]
    assert not answer(h, claim("mine", 10))["allowed"]


def test_a_denial_by_a_second_quota_releases_the_first_charge(kube: KubeRest) -> None:
    create_quota(kube, quota("a-cores", {"cores": 100}))
    create_quota(kube, quota("b-devices", {"devices": 0}))
    h = handler(kube)
    denied = answer(h, claim("x", 10))
    assert "GpuQuota team-a/b-devices" in denied["status"]["message"]
    assert not read_quota(kube, "a-cores")["status"]["claims"]


def test_a_broken_quota_denies_with_a_clear_message(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    broken = quota("bad", {"cores": -5, "memory": "lots", "devices": "two"})
    # The API server refuses it through the CRD schema ...
    with pytest.raises(KubeApiError) as err:
        create_quota(kube, broken)
    assert err.value.status == 422
    # ... but a quota stored past it (a CRD without that schema) is named by the webhook.
    apiserver.store.put("gpuquotas", broken)
    h = handler(kube)
    denied = answer(h, claim("x", 10))
    message = denied["status"]["message"]
    assert "GpuQuota team-a/bad cannot be applied" in message
    assert "spec.hard.cores: must be an integer between 0 and 100000000 (got -5)" in message
    assert "spec.hard.memory" in message and "spec.hard.devices" in message


def test_without_quotas_claims_are_allowed(kube: KubeRest) -> None:
    assert answer(handler(kube), claim("free", 100, "80Gi"))["allowed"]


class _Unreachable(KubeRest):
    """An API client whose every request fails, counting the attempts."""

    def __init__(self) -> None:
        self.requests = 0

    def list_all(self, path: str, **_: Any) -> Any:
        self.requests += 1
        raise KubeApiError(503, "Service Unavailable", "the API server is unreachable")


def test_a_namespace_the_quota_cache_knows_has_none_is_admitted_when_the_api_fails() -> None:
    """Claim creation in namespaces without quotas never depends on the API server: with the
    watch cache saying "none here", a live list that fails admits; when the cache cannot tell
    (not yet synced), a list that fails denies naming the namespace."""
    kube = _Unreachable()
    known_none = QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS, has_quotas=lambda ns: False)
    assert AdmissionHandler(DRIVER, quota=known_none).review(
        review(claim("a", 30, "10Gi")), from_api_server=True
    )["response"]["allowed"]
    assert kube.requests == 1
    unknown = QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS, has_quotas=lambda ns: None)
    denied = answer(AdmissionHandler(DRIVER, quota=unknown), claim("b", 30, "10Gi"))
    assert kube.requests == 2 and not denied["allowed"]
    assert "cannot read the GpuQuotas of namespace team-a" in denied["status"]["message"]


def test_a_quota_the_watch_cache_has_not_seen_yet_still_denies(kube: KubeRest) -> None:
    """The watch cache lags a quota created moments ago: its "none" is checked with a live
    list, so the quota charges and denies from the first claim (before, the first claims were
    admitted uncharged and a later one over the quota got in beside them)."""
    create_quota(kube, quota("q", {"cores": 100}))
    admitter = QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS, has_quotas=lambda ns: False)
    handler = AdmissionHandler(DRIVER, quota=admitter)
    assert answer(handler, claim("a", 60, "10Gi"))["allowed"]
    denied = answer(handler, claim("b", 60, "10Gi"))
    assert not denied["allowed"] and "team-a/q" in denied["status"]["message"]


def test_an_empty_live_list_answers_for_its_namespace_until_the_ttl(kube: KubeRest) -> None:
    """A live list that found no quota stands in for the cache's "none" for
    EMPTY_LIST_TTL_S; after that the namespace is listed again and a new quota counts."""
    clock = FakeClock()
    admitter = QuotaAdmitter(
        kube, DRIVER, basis=lambda: BASIS, has_quotas=lambda ns: False, clock=clock
    )
    handler = AdmissionHandler(DRIVER, quota=admitter)
    assert answer(handler, claim("a", 60, "10Gi"))["allowed"]
    create_quota(kube, quota("q", {"cores": 10}))
    clock.advance(EMPTY_LIST_TTL_S / 2)
    assert answer(handler, claim("b", 60, "10Gi"))["allowed"]  # remembered: not listed
    clock.advance(EMPTY_LIST_TTL_S)
    assert not answer(handler, claim("c", 60, "10Gi"))["allowed"]


def test_the_quota_controller_says_which_namespaces_have_quotas(kube: KubeRest) -> None:
    create_quota(kube, quota("q", {"cores": 100}))
    controller = QuotaController(kube, DRIVER, basis=lambda: BASIS)
    assert controller.namespace_has_quotas("team-a") is None  # before the first list
    controller.start()
    try:
        assert controller.quotas.synced.wait(10)
        assert controller.namespace_has_quotas("team-a") is True
        assert controller.namespace_has_quotas("team-b") is False
    finally:
        controller.stop()


def test_without_the_quota_crd_claims_are_admitted_with_a_warning_until_it_appears(
    apiserver: KubeAPIServer, kube: KubeRest, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.store.delete("customresourcedefinitions", GPU_QUOTA_CRD_NAME)
    telemetry = Telemetry("test-quota-crd")
    metrics = ControllerMetrics(telemetry)
    admitter = QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS)
    metrics.set_quota_crd_source(admitter.crd_served)
    h = AdmissionHandler(DRIVER, metrics, quota=admitter)
    try:
        with caplog.at_level(logging.INFO, logger="controller.quotaadmit"):
            for name in ("a", "b", "c"):
                response = answer(h, claim(name, 100, "80Gi"))
                assert response["allowed"] and response["warnings"] == [CRD_ABSENT_WARNING]
            assert admitter.crd_served() is False
            text = telemetry.scrape().decode()
            assert "sharegpu_quota_crd_installed 0.0" in text
            assert (
                'sharegpu_webhook_reviews_total{kind="ResourceClaim",result="warned"} 3.0' in text
            )
            # The CRD appears (applied later): quotas are enforced again, no restart.
            apiserver.store.create("customresourcedefinitions", quota_crd_manifest())
            create_quota(kube, quota("q", {"cores": 50}))
            assert "warnings" not in answer(h, claim("d", 40, "1Gi"))
            denied = answer(h, claim("e", 40, "1Gi"))
            assert not denied["allowed"] and "GpuQuota team-a/q" in denied["status"]["message"]
            assert admitter.crd_served() is True
            assert "sharegpu_quota_crd_installed 1.0" in telemetry.scrape().decode()
    finally:
        telemetry.shutdown()
    absent = [r for r in caplog.records if CRD_ABSENT_WARNING in r.getMessage()]
    assert len(absent) == 1 and absent[0].levelno == logging.WARNING
    assert sum("quotas are enforced" in r.getMessage() for r in caplog.records) == 1


def test_other_read_errors_still_deny(apiserver: KubeAPIServer, kube: KubeRest) -> None:
    apiserver.inject_fault(verb="list", resource="gpuquotas", code=500, times=None)
    denied = answer(handler(kube), claim("a", 10, "1Gi"))
    assert not denied["allowed"]
    assert "cannot read the GpuQuotas of namespace team-a" in denied["status"]["message"]
    assert "warnings" not in denied


def with_uid(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    """``obj`` with the ``metadata.uid`` the API server gives it before validating admission."""
    return {**obj, "metadata": {**obj["metadata"], "uid": uid}}


def test_a_create_named_like_a_live_claim_does_not_replace_its_charge(kube: KubeRest) -> None:
    """The API server refuses a duplicate name only after admission: its charge is its own
    (keyed by its UID), so the live claim stays charged and a third claim does not fit."""
    create_quota(kube, quota("q", {"devices": 2}))
    h = handler(kube)
    assert answer(h, with_uid(claim("a", 10), "uid-a"))["allowed"]
    assert answer(h, with_uid(claim("a", 10), "uid-dup"))["allowed"]  # refused later: exists
    denied = answer(h, with_uid(claim("b", 10), "uid-b"))
    assert not denied["allowed"]
    assert "devices: used 2, asked 1, hard 2, 0 left" in denied["status"]["message"]
    charges = read_quota(kube, "q")["status"]["claims"]
    assert sorted(charges) == ["uid-a", "uid-dup"]
    assert {entry["name"] for entry in charges.values()} == {"a"}


def test_the_undo_of_a_denied_duplicate_keeps_the_live_claims_charge(kube: KubeRest) -> None:
    create_quota(kube, quota("a-devices", {"devices": 2}))
    create_quota(kube, quota("b-memory", {"memory": "10Gi"}))
    h = handler(kube)
    assert answer(h, with_uid(claim("a", 10, "5Gi"), "uid-a"))["allowed"]
    denied = answer(h, with_uid(claim("a", 10, "20Gi"), "uid-dup"))
    assert not denied["allowed"] and "GpuQuota team-a/b-memory" in denied["status"]["message"]
    for name in ("a-devices", "b-memory"):
        charges = read_quota(kube, name)["status"]["claims"]
        assert list(charges) == ["uid-a"], name
        assert charges["uid-a"]["devices"] == 1


def test_a_quota_on_limits_bounds_the_sum_of_burst_limits(kube: KubeRest) -> None:
    """``limitsCores`` bounds what the namespace's shares may burst to, as ResourceQuota's
    ``limits.*``: two 30-core shares fit in 100 cores, but not with 80-core limits in 150."""
    create_quota(kube, quota("q", {"cores": 100, "limitsCores": 150}))
    h = handler(kube)

    def bursting(name: str) -> dict[str, Any]:
        obj = claim(name, 30, "10Gi")
        obj["spec"]["devices"]["config"] = [
            {
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "resource.sharegpu.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS", "burstLimit": {"cores": 80}},
                    },
                }
            }
        ]
        return obj

    assert answer(h, bursting("a"))["allowed"]
    denied = answer(h, bursting("b"))
    assert not denied["allowed"]
    assert "limitsCores: used 80, asked 80, hard 150, 70 left" in denied["status"]["message"]
    assert answer(h, claim("c", 30, "10Gi"))["allowed"]  # its limit is its request
    status = read_quota(kube, "q")["status"]
    assert status["used"] == {
        "cores": 60,
        "memory": "20Gi",
        "devices": 2,
        "limitsCores": 110,
        "limitsMemory": "20Gi",
    }
    assert status["claims"]["a"]["limitsCores"] == 80
    assert "limitsCores" not in status["claims"]["c"]
    assert status["limitsSummary"] == "110/150 cores, 20Gi/-"
