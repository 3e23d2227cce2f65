"""What an allocation result grants on the node (:func:`kubeletplugin.prepare.shares.
device_record`), for the amounts the controller counts alike (tests/controller)."""

from __future__ import annotations

from api import names
from kubeletplugin.devices.table import node_devices
from kubeletplugin.prepare.claims import AllocationResult
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
