"""What an allocation result grants on the node (:func:`kubeletplugin.prepare.shares.
device_record`), for the amounts the controller counts alike (tests/controller)."""

from __future__ import annotations

import pytest

from api import names
from kubeletplugin.devices.table import node_devices
from kubeletplugin.prepare.claims import AllocationResult, ClaimError
from kubeletplugin.prepare.shares import device_record
from tests.kubeletplugin.prepare import helpers as h

GI = 1024**3


def test_a_missing_consumed_amount_grants_the_whole_amount() -> None:
    """kube-scheduler records every capacity; should ``cores`` be missing, the share gets every
    core, which is what the tracker and the GpuQuota charge count too."""
    devices = node_devices(h.gpus(1), "consumable")
    device = devices["gpu-0"]
    result = AllocationResult(
        "gpu", h.NODE, "gpu-0", share_id="s", consumed_capacity={"memory": "10Gi"}
    )
    share = device_record(
        [result], device, h.DRIVER, "claim default/a", cdi_name="a-gpu-0-s", cdi_device_ids=()
    )
    assert (share.cores, share.memory) == (names.CORES_PER_GPU, 10 * GI)
    assert (share.pool, share.share_id, share.gpu, share.enforcement) == (
        h.NODE,
        "s",
        device.gpu,
        None,
    )


@pytest.mark.parametrize(
    ("consumed", "name"),
    [
        ({"cores": "12500m", "memory": "10Gi"}, "cores"),
        ({"cores": "12.5", "memory": "10Gi"}, "cores"),
        ({"cores": "20", "memory": "10737418240500m"}, "memory"),
    ],
)
def test_a_fractional_consumed_amount_is_refused_not_rounded(
    consumed: dict[str, str], name: str
) -> None:
    """The published policies grant whole cores and bytes; a fraction in ``consumedCapacity``
    is refused at prepare, never rounded up to more than the share (nor down)."""
    device = node_devices(h.gpus(1), "consumable")["gpu-0"]
    result = AllocationResult("gpu", h.NODE, "gpu-0", share_id="s", consumed_capacity=consumed)
    with pytest.raises(ClaimError) as err:
        device_record(
            [result], device, h.DRIVER, "claim default/a", cdi_name="a-gpu-0-s", cdi_device_ids=()
        )
    message = str(err.value)
    assert f"consumedCapacity.{name}: {consumed[name]!r} is not a whole number" in message
    assert "\n" not in message


def test_whole_amounts_in_any_spelling_are_granted_exactly() -> None:
    device = node_devices(h.gpus(1), "consumable")["gpu-0"]
    consumed = {"cores": "25000m", "memory": "10737418240000m"}
    result = AllocationResult("gpu", h.NODE, "gpu-0", share_id="s", consumed_capacity=consumed)
    share = device_record(
        [result], device, h.DRIVER, "claim default/a", cdi_name="a-gpu-0-s", cdi_device_ids=()
    )
    assert (share.cores, share.memory) == (25, 10 * GI)
