"""The search settles a state it met before without searching again (``settled.py``): claims
that are infeasible in ways the look-ahead does not see end as "not allocated" within the step
limit, and the devices picked are still those of kube-scheduler's search order."""

from __future__ import annotations

from typing import Any

from sharegpu.allocator import allocate, allocate_pod
from tests.allocator.helpers import (
    DRIVER,
    claim,
    device_class,
    exactly,
    exclusive_device,
    exclusive_slices,
    resource_slice,
)

Obj = dict[str, Any]
CLASSES = [device_class()]
ROOT = "resource.kubernetes.io/pcieRoot"
INDEX = f"device.attributes['{DRIVER}'].index"


def _two_roots(gpus: int) -> list[Obj]:
    half = gpus // 2
    devices = [exclusive_device(i, pcie_root=f"root-{i // half}") for i in range(gpus)]
    return [resource_slice("s", devices)]


def _devices(outcome: Any) -> list[tuple[str, str]]:
    assert outcome.allocation is not None, outcome.to_dict()
    return [(r["request"], r["device"]) for r in outcome.allocation["devices"]["results"]]


def test_requests_on_two_roots_with_one_match_attribute_end_unallocated() -> None:
    """4 + 4 of 64 GPUs, each request on its own root, matchAttribute over both: the second
    request fails the same way after every choice of the first (C(32, 4) of them), so once."""
    c = claim(
        "c",
        [
            exactly("a", count=4, selectors=[f"{INDEX} < 32"]),
            exactly("b", count=4, selectors=[f"{INDEX} >= 32"]),
        ],
        constraints=[{"matchAttribute": ROOT}],
    )
    out = allocate(c, _two_roots(64), CLASSES, node="n1")
    assert not out.ok
    assert out.error is None


def test_claims_needing_one_gpu_more_than_the_node_has_end_unallocated() -> None:
    """4 + 4 + 5 of 12 interchangeable GPUs, one pod: each request alone fits and the
    look-ahead sees no shortage until the third claim, so the search without settling takes
    tens of thousands of placements; choices that differ only in which interchangeable GPUs
    they take are one state."""
    claims = [claim(f"c{i}", [exactly(count=n)]) for i, n in enumerate([4, 4, 5])]
    outcomes = allocate_pod(claims, exclusive_slices(12), CLASSES, node="n1")
    assert [o.ok for o in outcomes] == [False, False, False]
    assert [o.error for o in outcomes] == [None, None, None]


def test_the_first_solution_in_search_order_is_kept() -> None:
    """Every pair of root-0 GPUs for request a leaves b (two of gpu-5..7, same root) without a
    device: a gets gpu-4 and gpu-5, the first pair in order that works, and b gpu-6, gpu-7."""
    c = claim(
        "c",
        [exactly("a", count=2), exactly("b", count=2, selectors=[f"{INDEX} >= 5"])],
        constraints=[{"matchAttribute": ROOT}],
    )
    out = allocate(c, _two_roots(8), CLASSES, node="n1")
    assert _devices(out) == [("a", "gpu-4"), ("a", "gpu-5"), ("b", "gpu-6"), ("b", "gpu-7")]
