"""The charge rule: policy rounding, whole GPUs, count, All, firstAvailable, allocations."""

from __future__ import annotations

from typing import Any

import pytest

from controller.quotacharge import Amounts, ChargeBasis, basis_of, claim_charge, demand

DRIVER = "gpu.sharegpu.dev"
GI = 1024**3
MI = 1024**2
BASIS = ChargeBasis(largest_memory=80 * GI, largest_node_gpus=4)


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def exactly(name: str = "r", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, **fields}}


def asks(cores: str | None = None, memory: str | None = None) -> dict[str, Any]:
    requests = {k: v for k, v in (("cores", cores), ("memory", memory)) if v is not None}
    return {"capacity": {"requests": requests}}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, Amounts(100, 80 * GI, 1)),
        (asks("30", "10Gi"), Amounts(30, 10 * GI, 1)),
        (asks("0.5", "1"), Amounts(1, 256 * MI, 1)),  # rounded up to the policy grid
        (asks("30"), Amounts(30, 80 * GI, 1)),  # unasked memory: the policy default
        (asks(memory="300Mi"), Amounts(100, 512 * MI, 1)),
        ({**asks("10", "1Gi"), "count": 3}, Amounts(30, 3 * GI, 3)),
        ({"allocationMode": "All"}, Amounts(400, 320 * GI, 4)),
        ({"capacity": {"requests": {f"{DRIVER}/cores": "20"}}}, Amounts(20, 80 * GI, 1)),
    ],
)
def test_demand_of_one_request(fields: dict[str, Any], expected: Amounts) -> None:
    assert demand(spec(exactly(**fields)), DRIVER, (), BASIS) == expected


def test_first_available_charges_the_largest_subrequest() -> None:
    subs = [
        {"name": "small", "deviceClassName": DRIVER, "count": 2, **asks("10", "1Gi")},
        {"name": "big", "deviceClassName": DRIVER, **asks("60", "1Gi")},
    ]
    got = demand(spec({"name": "r", "firstAvailable": subs}), DRIVER, (), BASIS)
    assert got == Amounts(60, 2 * GI, 2)


def test_other_classes_and_scope() -> None:
    s = spec(exactly(**asks("10")), {"name": "n", "exactly": {"deviceClassName": "nic.io"}})
    assert demand(s, DRIVER, (), BASIS).cores == 10
    assert demand(s, DRIVER, (), BASIS, scope=["other"]).zero
    assert demand(s, "nic", ["nic.io"], BASIS).devices == 1


def test_without_known_gpus_unasked_memory_is_not_charged() -> None:
    assert demand(spec(exactly()), DRIVER, (), ChargeBasis()) == Amounts(100, 0, 1)


def test_unreadable_amounts_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"capacity\.requests"):
        demand(spec(exactly(**asks("ten"))), DRIVER, (), BASIS)
    with pytest.raises(ValueError, match="count: must be a positive integer"):
        demand(spec(exactly(count=0)), DRIVER, (), BASIS)


def test_allocated_claims_are_charged_what_they_consume() -> None:
    claim = {
        "spec": spec(exactly(**asks("30", "10Gi"))),
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": DRIVER,
                            "device": "gpu-0",
                            "consumedCapacity": {"cores": "32", "memory": "10Gi"},
                        },
                        {"request": "r", "driver": DRIVER, "device": "gpu-1"},
                        {"request": "r", "driver": "other", "device": "x"},
                    ]
                }
            }
        },
    }
    assert claim_charge(claim, DRIVER, (), BASIS) == (Amounts(132, 90 * GI, 2), True)


def test_basis_from_published_gpus() -> None:
    gpus = [("a", 80 * GI, 5), ("a", 80 * GI, 3), ("b", 141 * GI, 1)]
    assert basis_of(gpus) == ChargeBasis(141 * GI, 2, 5)
    assert basis_of([]) == ChargeBasis(0, 1, 1)


@pytest.mark.parametrize("largest_memory", [80 * GI, 0])
def test_a_tiny_share_is_charged_the_largest_smallest_share(largest_memory: int) -> None:
    """A GPU that holds at most 20 shares charges a 1-core share 5 cores: admission charges
    that much before allocation, so the namespace's cores cannot be passed by tiny shares."""
    basis = ChargeBasis(largest_memory, 1, 5)
    claim = {
        "metadata": {"namespace": "ns", "name": "tiny"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "capacity": {"requests": {"cores": "1", "memory": "1Gi"}},
                        },
                    }
                ]
            }
        },
    }
    charged, allocated = claim_charge(claim, DRIVER, (), basis)
    assert not allocated and charged.cores == 5


def test_a_missing_consumed_amount_is_charged_whole_as_the_node_grants_it() -> None:
    """kube-scheduler records every capacity; should an amount be missing, the node plugin
    grants the whole amount (kubeletplugin.prepare.shares), so the quota charges it too."""
    result = {"request": "r", "driver": DRIVER, "device": "gpu-0", "shareID": "s"}
    claim = {
        "spec": spec(exactly(**asks("30", "10Gi"))),
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {**result, "consumedCapacity": {"memory": "10Gi"}},
                        {**result, "consumedCapacity": {f"{DRIVER}/cores": "30"}},
                    ]
                }
            }
        },
    }
    whole = BASIS.whole_gpu()
    assert claim_charge(claim, DRIVER, (), BASIS) == (
        Amounts(whole.cores + 30, 10 * GI + whole.memory, 2),
        True,
    )


# --- limits of burstable shares -------------------------------------------------------------


def burst_config(limit: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.sharegpu.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "burstLimit": limit},
            },
        }
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


def test_a_burstable_request_is_charged_its_request_and_its_limit() -> None:
    s = spec(exactly(**asks("30", "10Gi"), count=2), exactly("plain", **asks("20", "4Gi")))
    s["devices"]["config"] = [burst_config({"cores": 80, "memory": "16Gi"}, ["r"])]
    got = demand(s, DRIVER, (), BASIS)
    assert (got.cores, got.memory, got.devices) == (80, 24 * GI, 3)
    # Limits: the burstable request's limit per device, the other request's request.
    assert (got.limits_cores, got.limits_memory) == (180, 36 * GI)
    # A limit below the request (refused at admission) is never charged less than the request.
    s["devices"]["config"] = [burst_config({"cores": 10}, ["r"])]
    assert not demand(s, DRIVER, (), BASIS).bursts


def test_an_allocated_burstable_share_is_charged_the_allocation_s_limit() -> None:
    claim = {
        "spec": spec(exactly(**asks("30", "10Gi"))),
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": DRIVER,
                            "pool": "n1",
                            "device": "gpu-0",
                            "shareID": "s-1",
                            "consumedCapacity": {"cores": "30", "memory": "10Gi"},
                        }
                    ],
                    "config": [{**burst_config({"cores": 100}), "source": "FromClaim"}],
                }
            }
        },
    }
    charge, is_allocated = claim_charge(claim, DRIVER, (), BASIS)
    assert is_allocated
    assert charge == Amounts.of(30, 10 * GI, 1, (100, 10 * GI))
