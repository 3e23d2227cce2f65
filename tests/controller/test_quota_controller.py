"""The quota controller against the embedded API server: recomputation after a restart,
release on deletion, release of charges whose claim never appeared, allocation charges,
templates' claims, and the metrics source."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.quotaadmit import QuotaAdmitter
from controller.quotacharge import ChargeBasis
from controller.quotacontroller import QuotaController
from controller.webhook import AdmissionHandler
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest, resource_path
from tests.controller.quota_helpers import (
    DRIVER,
    GI,
    NAMESPACE,
    claim,
    claims_path,
    create_quota,
    quota,
    read_quota,
    review,
)
from tests.helpers import eventually

BASIS = ChargeBasis(largest_memory=80 * GI, largest_node_gpus=8)


@pytest.fixture
def controller_factory(kube: KubeRest) -> Iterator[Callable[..., QuotaController]]:
    started: list[QuotaController] = []

    def make(**kw: Any) -> QuotaController:
        c = QuotaController(kube, DRIVER, basis=lambda: BASIS, tick_s=0.02, **kw)
        c.start()
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()


def used(kube: KubeRest) -> dict[str, Any]:
    status = read_quota(kube, "q").get("status") or {}
    result: dict[str, Any] = status.get("used") or {}
    return result


def test_restart_recomputes_usage_from_live_claims(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    # Claims created while no controller (and no webhook) ran, and a stale status.
    create_quota(kube, quota("q", {"cores": 100}))
    for name, cores in (("a", 20), ("b", 30)):
        kube.request("POST", claims_path(), body=claim(name, cores, "1Gi"))
    controller_factory()
    eventually(lambda: used(kube).get("cores") == 50, "cores used 50")
    status = read_quota(kube, "q")["status"]
    assert sorted(entry["name"] for entry in status["claims"].values()) == ["a", "b"]
    assert all(key == entry["uid"] for key, entry in status["claims"].items())
    assert status["used"] == {"cores": 50, "memory": "2Gi", "devices": 2}
    assert status["coresSummary"] == "50/100"


def test_deleting_a_claim_releases_its_charge(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    create_quota(kube, quota("q", {"cores": 100}))
    h = AdmissionHandler(DRIVER, quota=QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS))
    # Admission sees the object with the UID the API server stores it under.
    stored = kube.request("POST", claims_path(), body=claim("a", 60))
    assert h.review(review(stored), from_api_server=True)["response"]["allowed"]
    uid = stored["metadata"]["uid"]
    controller_factory()
    eventually(lambda: "admittedAt" not in read_quota(kube, "q")["status"]["claims"][uid], "seen")
    kube.request("DELETE", f"{claims_path()}/a")
    eventually(lambda: used(kube).get("cores") == 0, "release")
    # The freed cores admit a new claim.
    assert h.review(review(claim("b", 100)), from_api_server=True)["response"]["allowed"]


def test_a_charge_whose_claim_never_appears_is_released_after_the_grace(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    create_quota(kube, quota("q", {"cores": 100}))
    h = AdmissionHandler(DRIVER, quota=QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS))
    assert h.review(review(claim("ghost", 70)), from_api_server=True)["response"][
        "allowed"
    ]  # never stored
    assert used(kube)["cores"] == 70
    clock = FakeClock(wall=time.time())
    controller_factory(clock=clock, grace_s=60.0)
    # A claim that appears makes the controller recompute the namespace within the grace
    # period: the ghost's charge is kept next to the new one.
    kube.request("POST", claims_path(), body=claim("real", 10, "1Gi"))
    eventually(lambda: used(kube).get("cores") == 80, "the new claim charged, the ghost kept")
    clock.advance(120.0)
    eventually(lambda: used(kube).get("cores") == 10, "release after the grace period")


def test_an_allocated_claim_is_charged_its_consumed_capacity(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    create_quota(kube, quota("q", {"cores": 100}))
    stored = kube.request("POST", claims_path(), body=claim("a", 30, "10Gi"))
    controller_factory()
    eventually(lambda: used(kube).get("cores") == 30, "demand charged")
    stored["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": "node-a",
                        "device": "gpu-0",
                        "shareID": "7c4b0f0e-0000-4000-8000-000000000001",
                        "consumedCapacity": {"cores": "32", "memory": "10Gi"},
                    }
                ]
            }
        }
    }
    kube.request("PUT", f"{claims_path()}/a/status", body=stored)
    eventually(lambda: used(kube).get("cores") == 32, "consumed capacity charged")
    charge = read_quota(kube, "q")["status"]["claims"][stored["metadata"]["uid"]]
    assert charge["allocated"] is True and charge["name"] == "a"


def test_claims_from_templates_are_charged(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    # The resourceclaim controller creates a pod's claim from its template with generateName;
    # the webhook sees the generated name, like any other claim.
    create_quota(kube, quota("q", {"devices": 1}))
    h = AdmissionHandler(DRIVER, quota=QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS))
    generated = claim("pod-1-gpu-x7k2p", 10)
    generated["metadata"]["generateName"] = "pod-1-gpu-"
    generated["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    assert h.review(review(generated), from_api_server=True)["response"]["allowed"]
    second = claim("pod-2-gpu-a1b2c", 10)
    assert not h.review(review(second), from_api_server=True)["response"]["allowed"]


def test_gauges_report_used_and_hard(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    create_quota(kube, quota("q", {"cores": 100, "memory": "80Gi"}))
    kube.request("POST", claims_path(), body=claim("a", 25, "1Gi"))
    c = controller_factory()
    eventually(lambda: used(kube).get("cores") == 25, "charged")
    eventually(lambda: any(g.used == 25 for g in c.gauges()), "informer copy")
    by_resource = {g.resource: g for g in c.gauges()}
    assert (by_resource["cores"].used, by_resource["cores"].hard) == (25, 100)
    assert (by_resource["memory"].used, by_resource["memory"].hard) == (GI, 80 * GI)
    assert by_resource["devices"].hard is None
    assert {g.namespace for g in c.gauges()} == {NAMESPACE}


def test_a_quota_scoped_to_a_class_of_the_driver_with_any_name_charges_its_claims(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    """An admin's DeviceClass ``premium`` selects this driver's devices but does not carry the
    driver's name: a GpuQuota scoped to it used to charge nothing. The class is the driver's by
    its selectors, for admission and for the controller."""
    kube.request(
        "POST",
        resource_path("resource.k8s.io", "v1", "deviceclasses"),
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "premium"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
    )
    create_quota(kube, quota("q", {"devices": 1}, classes=["premium"]))
    stored = kube.request("POST", claims_path(), body=claim("a", 30, device_class="premium"))
    controller = controller_factory()
    eventually(lambda: used(kube).get("devices") == 1, "the controller charges the claim")
    assert controller.driver_classes() == frozenset({"premium"})
    admitter = QuotaAdmitter(
        kube, DRIVER, basis=lambda: BASIS, known_classes=controller.driver_classes
    )
    h = AdmissionHandler(DRIVER, quota=admitter)
    second = h.review(review(claim("b", 30, device_class="premium")), from_api_server=True)
    assert not second["response"]["allowed"]
    assert "GpuQuota team-a/q" in second["response"]["status"]["message"]
    assert list(read_quota(kube, "q")["status"]["claims"]) == [stored["metadata"]["uid"]]


def test_the_webhook_judges_a_burst_limit_against_the_watched_class(
    kube: KubeRest, controller_factory: Callable[..., QuotaController]
) -> None:
    """The controller's DeviceClass watch keeps each class's config, so the webhook refuses a
    memory burst its class does not allow, naming the field and the class."""

    def device_class(name: str, memory: str) -> dict[str, Any]:
        parameters = {
            "apiVersion": "resource.sharegpu.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"burstPolicy": {"memory": memory}},
        }
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
                "config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}],
            },
        }

    for name, memory in ((f"{DRIVER}-burst", "Allowed"), (f"{DRIVER}-strict", "Denied")):
        kube.request(
            "POST",
            resource_path("resource.k8s.io", "v1", "deviceclasses"),
            body=device_class(name, memory),
        )
    controller = controller_factory()
    eventually(lambda: controller.class_configs(f"{DRIVER}-strict") is not None, "watched")
    h = AdmissionHandler(DRIVER, class_configs=controller.class_configs)

    def bursting(device_class: str) -> dict[str, Any]:
        obj = claim("b", 30, "10Gi", device_class=device_class)
        parameters = {
            "apiVersion": "resource.sharegpu.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "burstLimit": {"memory": "20Gi"}},
        }
        obj["spec"]["devices"]["config"] = [
            {"opaque": {"driver": DRIVER, "parameters": parameters}}
        ]
        return obj

    assert h.review(review(bursting(f"{DRIVER}-burst")))["response"]["allowed"]
    refused = h.review(review(bursting(f"{DRIVER}-strict")))["response"]
    assert not refused["allowed"]
    assert (
        "spec.devices.config[0].opaque.parameters: sharing.burstLimit.memory: memory burst is "
        f'not allowed by DeviceClass "{DRIVER}-strict" (its config[0] sets '
        "sharing.burstPolicy.memory: Denied)"
    ) in refused["status"]["message"]
