"""Admission of burstable shares: a claim's ``burstLimit`` against its request and its
DeviceClass's ``burstPolicy``; each refusal names the field path and the class."""

from __future__ import annotations

from typing import Any

import pytest

from api.gpuconfig import DriverConfigs, decode_driver_configs
from api.names import DEFAULT_DRIVER_NAME as DRIVER
from sharegpu.admission import checks

Obj = dict[str, Any]
WHERE = "spec.devices.config[0].opaque.parameters"


def parameters(sharing: Obj) -> Obj:
    return {"apiVersion": "resource.sharegpu.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing}


def device_class(name: str, sharing: Obj | None = None) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}
    if sharing is not None:
        spec["config"] = [{"opaque": {"driver": DRIVER, "parameters": parameters(sharing)}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def claim(limit: Obj, *, cores: str = "30", memory: str = "10Gi", cls: str = "burst") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": cls,
                            "capacity": {"requests": {"cores": cores, "memory": memory}},
                        },
                    }
                ],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": parameters({"strategy": "MPS", "burstLimit": limit}),
                        },
                    }
                ],
            }
        },
    }


def classes(*objects: Obj) -> dict[str, DriverConfigs]:
    return {
        o["metadata"]["name"]: decode_driver_configs(o["spec"].get("config", []), DRIVER)
        for o in objects
    }


KNOWN = classes(
    device_class("burst", {"burstPolicy": {"memory": "Allowed"}}),
    device_class("plain"),
    device_class("pinned", {"burstPolicy": {"compute": "Denied"}}),
)


def found(obj: Obj) -> list[str]:
    return [str(f) for f in checks.check_object(obj, DRIVER, list(KNOWN), KNOWN.get)]


def test_a_limit_the_class_allows_is_admitted() -> None:
    assert found(claim({"cores": 100, "memory": "40Gi"})) == []


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            claim({"cores": 20}),
            "sharing.burstLimit.cores: 20 is below the share's 30 cores request (a limit is at "
            "least the request)",
        ),
        (
            claim({"memory": "8Gi"}),
            "sharing.burstLimit.memory: 8Gi is below the share's 10Gi memory request (a limit is "
            "at least the request)",
        ),
        (
            claim({"memory": "20Gi"}, cls="plain"),
            'sharing.burstLimit.memory: memory burst is not allowed by DeviceClass "plain" (it '
            "sets no sharing.burstPolicy.memory, which defaults to Denied; an admin allows it "
            "with sharing.burstPolicy.memory: Allowed in the class's config)",
        ),
        (
            claim({"cores": 50}, cls="pinned"),
            'sharing.burstLimit.cores: compute burst is not allowed by DeviceClass "pinned" (its '
            "config[0] sets sharing.burstPolicy.compute: Denied)",
        ),
    ],
    ids=["below-cores", "below-memory", "memory-not-opted-in", "compute-denied"],
)
def test_refusals_name_the_field_and_the_class(obj: Obj, message: str) -> None:
    assert found(obj) == [f"{WHERE}: {message}"]


def test_a_limit_above_the_gpu_is_refused_by_the_schema() -> None:
    [message] = found(claim({"cores": 101}))
    assert message == f"{WHERE}: sharing.burstLimit.cores: must be between 1 and 100 (got 101)"


def test_compute_burst_is_allowed_by_a_class_without_a_policy() -> None:
    assert found(claim({"cores": 90}, cls="plain")) == []


def test_a_class_the_webhook_does_not_know_is_left_to_the_node_with_a_warning() -> None:
    findings = checks.check_object(claim({"memory": "20Gi"}, cls="burst"), DRIVER, ["burst"])
    assert [(f.severity, str(f)) for f in findings] == [
        (
            checks.WARNING,
            f"{WHERE}: sharing.burstLimit: DeviceClass 'burst' is not known here, so whether it "
            "allows the burst of request 'gpu' is checked when the claim is prepared",
        )
    ]
    # The request bounds hold without the class.
    assert checks.errors(checks.check_object(claim({"cores": 10}), DRIVER, ["burst"]))


def test_a_claim_cannot_allow_itself_to_burst() -> None:
    obj = claim({"memory": "20Gi"}, cls="plain")
    obj["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["burstPolicy"] = {
        "memory": "Allowed"
    }
    assert f"{WHERE}: sharing.burstPolicy: only a DeviceClass config may set it" in "\n".join(
        found(obj)
    )


def test_an_override_above_the_request_fits_under_the_limit() -> None:
    obj = claim({"cores": 60})
    sharing = obj["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]
    sharing["mps"] = {"activeThreadPercentage": 50}
    assert found(obj) == []
    sharing["mps"] = {"activeThreadPercentage": 70}
    assert found(obj) == [
        f"{WHERE}: sharing.mps.activeThreadPercentage 70 is above the 60 cores request 'gpu' "
        "reserves (its burstLimit); the kubelet plugin would refuse to prepare the claim"
    ]


def test_a_device_class_whose_limit_its_policy_denies_is_refused() -> None:
    obj = device_class("odd", {"strategy": "MPS", "burstLimit": {"memory": "20Gi"}})
    assert [str(f) for f in checks.check_object(obj, DRIVER)] == [
        "spec.config[0].opaque.parameters: sharing.burstLimit.memory: memory burst is not "
        'allowed by DeviceClass "odd" (it sets no sharing.burstPolicy.memory, which defaults to '
        "Denied; an admin allows it with sharing.burstPolicy.memory: Allowed in the class's "
        "config)"
    ]
    allowed = device_class(
        "ok",
        {"strategy": "MPS", "burstLimit": {"memory": "20Gi"}, "burstPolicy": {"memory": "Allowed"}},
    )
    assert checks.check_object(allowed, DRIVER) == []


def test_a_memory_limit_above_the_largest_gpu_is_refused_where_it_is_known() -> None:
    asked: list[str] = []

    def largest() -> int:
        asked.append("largest")
        return 80 * 1024**3

    obj = claim({"memory": "100Gi"})
    assert [str(f) for f in checks.check_object(obj, DRIVER, list(KNOWN), KNOWN.get, largest)] == [
        f"{WHERE}: sharing.burstLimit.memory: 100Gi is above the largest GPU's 80Gi of usable "
        "memory (a limit is at most the GPU)"
    ]
    assert (
        checks.check_object(claim({"memory": "64Gi"}), DRIVER, list(KNOWN), KNOWN.get, largest)
        == []
    )
    # Asked only for a claim with a burstLimit.
    asked.clear()
    plain = claim({"cores": 30})
    del plain["spec"]["devices"]["config"]
    assert checks.check_object(plain, DRIVER, list(KNOWN), KNOWN.get, largest) == []
    assert asked == []
