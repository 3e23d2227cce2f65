"""Reducers from API JSON to the tracker's compact records: what survives, what is dropped."""

from __future__ import annotations

import pytest

from api.names import CAP_CORES, CAP_MEMORY
from controller.records import (
    AllocatedClaim,
    PodInfo,
    PublishedDevice,
    ResultRecord,
    SliceRecord,
    claim_record,
    pod_record,
    slice_record,
)
from tests.controller import helpers as h

GI = 1024**3


@pytest.mark.parametrize(
    "record", [AllocatedClaim, ResultRecord, SliceRecord, PublishedDevice, PodInfo]
)
def test_records_are_slotted_and_immutable(record: type) -> None:
    """No per-instance __dict__ (memory), no mutation (shared by informer store and index)."""
    assert "__slots__" in vars(record) and "__dict__" not in vars(record)
    assert record.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_claim_keeps_the_drivers_results_and_reserving_pods_only() -> None:
    c = h.claim(
        "a",
        [
            h.result("n1", "gpu-0", cores=30, memory="10Gi", share_id="s-1"),
            h.result("n1", "gpu-1", driver="other.example.com"),
            h.result("n1", "gpu-2", request="gpu/sub"),
        ],
        namespace="team",
        uid="uid-a",
        pods=[("p1", "u1")],
    )
    c["status"]["reservedFor"].append({"resource": "things", "apiGroup": "x.io", "name": "no"})
    c["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": "x"}}]
    rec = claim_record(c, h.DRIVER)
    assert rec == AllocatedClaim(
        namespace="team",
        name="a",
        uid="uid-a",
        results=(
            ResultRecord("gpu", "n1", "gpu-0", "s-1", False, (30, 10 * GI)),
            ResultRecord("gpu/sub", "n1", "gpu-2", None, False, None),
        ),
        reserved=(("p1", "u1"),),
    )


def test_claims_with_nothing_of_the_driver_are_dropped() -> None:
    assert claim_record(h.claim("pending"), h.DRIVER) is None
    other = h.claim("x", [h.result("n1", "gpu-0", driver="other.example.com")])
    assert claim_record(other, h.DRIVER) is None


def test_bad_consumed_amounts_read_zero_and_admin_access_is_kept() -> None:
    r = h.result("n1", "gpu-0", cores=1, memory="1Gi")
    r["consumedCapacity"] = {CAP_CORES: "lots", CAP_MEMORY: True}
    r["adminAccess"] = True
    rec = claim_record(h.claim("a", [r]), h.DRIVER)
    assert rec is not None
    assert rec.results[0].consumed == (0, 0) and rec.results[0].admin_access


def test_pods_without_claims_are_dropped_and_others_reduced() -> None:
    assert pod_record({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}) is None
    p = h.pod("p", "a", {"main": None, "aux": "gpu"}, uid="u")
    rec = pod_record(p)
    assert rec is not None and rec.key == "default/p"
    assert rec.claim_names == (("gpu", "a"),)
    assert rec.containers_for("a", "gpu") == ("aux", "main")
    assert rec.containers_for("a", "other") == ("main",)
    assert rec.containers_for("b", "gpu") == ()


def test_slice_keeps_what_accounting_reads() -> None:
    s = h.node_slice(
        "n1", devices=[h.whole_device("n1", 0, unhealthy="Xid79"), *h.half_devices("n1", 1)]
    )
    rec = slice_record(s, h.DRIVER)
    assert (rec.pool, rec.node, rec.generation, rec.count) == ("n1", "n1", 1, 1)
    whole, half0, _ = rec.devices
    assert whole.gpu_uuid == h.gpu_uuid("n1", 0) and not whole.has_parent and whole.shared
    assert whole.unhealthy_reason == "Xid79"
    assert (whole.cores, whole.memory, whole.index) == (100, h.GPU_MEMORY, 0)
    assert half0.gpu_uuid == h.gpu_uuid("n1", 1) and half0.has_parent and half0.partition
    assert half0.memory == h.GPU_MEMORY // 2 and half0.unhealthy_reason is None


def test_slices_that_count_for_no_pool() -> None:
    forged = h.node_slice("n1", 1)
    forged["spec"]["pool"]["name"] = "n2"
    assert slice_record(forged, h.DRIVER).pool is None
    assert slice_record(h.node_slice("n1", 1, driver="other.example.com"), h.DRIVER).pool is None
    odd = h.node_slice("n1", 1)
    odd["spec"]["pool"].update(generation="7", resourceSliceCount=0)
    odd["spec"]["devices"].append("not a device")
    rec = slice_record(odd, h.DRIVER)
    assert (rec.generation, rec.count, len(rec.devices)) == (0, 1, 1)
