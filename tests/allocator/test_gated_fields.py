"""The alpha fields of Kubernetes 1.37 (off by default) are accepted and ignored: the allocator
answers as kube-scheduler does with their gates off, and writes none of them."""

from __future__ import annotations

from sharegpu.allocator import allocate

from .helpers import claim, device_class, exactly, exclusive_device, resource_slice


def test_alpha_fields_do_not_change_the_allocation() -> None:
    plain = resource_slice("s", [exclusive_device(0), exclusive_device(1)])
    gated = resource_slice("s", [exclusive_device(0), exclusive_device(1)])
    gated["spec"]["skipNodeOperations"] = ["*"]
    gated["spec"]["partitionTypeAttribute"] = "gpu.sharegpu.dev/profile"
    for device in gated["spec"]["devices"]:
        device["consumesCounters"] = []
    c = claim("c", [exactly("a"), exactly("b")])
    with_derived = claim("c", [exactly("a"), exactly("b")])
    for request in with_derived["spec"]["devices"]["requests"]:
        request["exactly"]["derivedAttributes"] = [
            {"name": "derived/x", "expression": "device.attributes['gpu.sharegpu.dev'].index"}
        ]
    expected = allocate(c, [plain], [device_class()], node="n1").allocation
    got = allocate(with_derived, [gated], [device_class()], node="n1").allocation
    assert expected is not None and got == expected
    assert all("skipNodeOperations" not in r for r in got["devices"]["results"])
