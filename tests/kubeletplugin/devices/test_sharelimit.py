"""The share limit of a GPU: MPS's client bound per architecture and CUDA version, the node's
bound, and the smallest share that keeps the scheduler within it."""

from __future__ import annotations

import dataclasses

import pytest

from api import names
from kubeletplugin.devices import sharelimit
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices
from kubeletplugin.devices.table import node_devices
from kubeletplugin.model import GpuInfo


def gpu(capability: str, cuda: str) -> GpuInfo:
    base = MockBackend("n1", 1).discover()[0]
    return dataclasses.replace(base, cuda_compute_capability=capability, cuda_driver_version=cuda)


@pytest.mark.parametrize(
    ("capability", "cuda", "limit"),
    [
        ("6.0", "12.8", 16),
        ("6.1", "13.1", 16),
        ("7.0", "12.8", 48),
        ("9.0", "13.0", 48),
        ("9.0", "13.1", 60),
        ("10.0", "13.2", 60),
        ("9.0", "not a version", 48),
        ("garbage", "13.1", 16),
    ],
)
def test_mps_client_limit_follows_architecture_and_cuda(
    capability: str, cuda: str, limit: int
) -> None:
    assert sharelimit.mps_client_limit(gpu(capability, cuda)) == limit


@pytest.mark.parametrize(("node", "limit"), [(0, 48), (1, 1), (20, 20), (48, 48), (60, 48)])
def test_node_bound_never_raises_the_mps_bound(node: int, limit: int) -> None:
    assert sharelimit.share_limit(gpu("9.0", "12.8"), node) == limit


@pytest.mark.parametrize(("limit", "cores"), [(1, 100), (3, 34), (16, 7), (20, 5), (48, 3)])
def test_min_share_cores_fits_at_most_limit_shares(limit: int, cores: int) -> None:
    assert sharelimit.min_share_cores(limit) == cores
    assert names.CORES_PER_GPU // cores <= limit


def test_published_cores_policy_carries_the_smallest_share_and_raises_the_default() -> None:
    table = node_devices(
        [gpu("9.0", "12.8")], names.SHARING_MODE_CONSUMABLE, default_share_cores=2, max_shares=10
    )
    (device,) = desired_slices(table)[0]["devices"]
    policy = device["capacity"][names.CAP_CORES]["requestPolicy"]
    assert policy == {"default": "10", "validRange": {"min": "10", "max": "100", "step": "1"}}


def test_pre_volta_gpu_publishes_its_smaller_bound() -> None:
    table = node_devices([gpu("6.0", "12.8")], names.SHARING_MODE_CONSUMABLE)
    (device,) = desired_slices(table)[0]["devices"]
    assert device["capacity"][names.CAP_CORES]["requestPolicy"]["validRange"]["min"] == "7"


@pytest.mark.parametrize("bad", [-1, 61])
def test_node_devices_refuses_a_bound_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match="max shares per GPU must be 0 to 60"):
        node_devices([gpu("9.0", "12.8")], names.SHARING_MODE_CONSUMABLE, max_shares=bad)
