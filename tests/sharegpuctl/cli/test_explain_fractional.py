"""``sharegpu explain`` judges fractional request-policy ranges (Kubernetes 1.37 beta) exactly:
a request above a ``1500m`` maximum is a policy violation, whatever whole numbers both round to."""

from __future__ import annotations

from typing import Any

import pytest

from sharegpu.allocator.model import DeviceId, Rejection
from sharegpuctl.cli.explain import describe, policy_maximum, reason_kind

DRIVER = "bw.example.com"


def slices(policy: dict[str, Any]) -> list[dict[str, Any]]:
    """One device with a ``bandwidth`` capacity of 2 under ``policy``."""
    device = {
        "name": "nic-0",
        "allowMultipleAllocations": True,
        "capacity": {"bandwidth": {"value": "2", "requestPolicy": policy}},
    }
    spec = {"driver": DRIVER, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}
    return [{"kind": "ResourceSlice", "spec": {**spec, "nodeName": "n", "devices": [device]}}]


def short(requested: str) -> Rejection:
    """The allocator's capacity-short rejection of ``requested`` bandwidth on nic-0."""
    return Rejection(
        "capacity-short",
        DeviceId(DRIVER, "p", "nic-0"),
        "short",
        {"capacity": "bandwidth", "requested": requested, "available": "2", "shortBy": "1"},
    )


RANGE = {"validRange": {"min": "100m", "max": "1500m", "step": "100m"}}
VALUES = {"validValues": ["500m", "1500m"]}


@pytest.mark.parametrize("policy", [RANGE, VALUES], ids=["validRange", "validValues"])
@pytest.mark.parametrize("requested", ["1700m", "1501m", "1.6"])
def test_a_request_above_a_fractional_maximum_is_a_policy_violation(
    policy: dict[str, Any], requested: str
) -> None:
    rejection = short(requested)
    assert reason_kind(rejection, slices(policy)) == "capacity-policy"
    above = policy_maximum(rejection, slices(policy))
    assert above is not None and above[0] == "1500m"
    text = describe(rejection, slices(policy))
    assert "one share of the device may have at most 1500m" in text, text
    assert text.endswith("request at most 1500m")


@pytest.mark.parametrize("policy", [RANGE, VALUES], ids=["validRange", "validValues"])
@pytest.mark.parametrize("requested", ["1500m", "1.5", "1200m"])
def test_a_request_within_a_fractional_maximum_is_a_shortage(
    policy: dict[str, Any], requested: str
) -> None:
    rejection = short(requested)
    assert policy_maximum(rejection, slices(policy)) is None
    assert reason_kind(rejection, slices(policy)) == "capacity-short"
