"""Containers given several devices: the merged CDI environment names every GPU they got.

The runtime applies the edits of every CDI device a container gets, in order; for one variable
name the last device wins. kubelet gives a container every device of each request it names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.containeredits import cuda_order, given_together, visible_gpus
from tests.kubeletplugin.prepare.helpers import (
    GI,
    FakeClaims,
    Node,
    assert_valid_cdi,
    claim,
    gpus,
    ref,
    result,
)
from tests.kubeletplugin.sharing.helpers import LIBRARY, Tools, claim_env, gpu_config


def merged_env(envs: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The environment a container sees after the runtime applied ``envs`` in order."""
    out: dict[str, str] = {}
    for env in envs:
        out.update(env)
    return out


def prepare(node: Node, obj: dict[str, Any], enforcer: Any = None) -> list[dict[str, str]]:
    claims = FakeClaims()
    claims.add(obj)
    state = node.state(claims, enforcer=enforcer)
    r = ref(obj)
    out = state.prepare([r])[r.uid]
    assert out.error == ""
    return claim_env(node, r.uid)


def test_every_device_of_a_two_device_request_lists_both_gpus_in_index_order(
    tmp_path: Path,
) -> None:
    # The scheduler may list the higher GPU first; the variables follow GPU (NVML index) order.
    obj = claim("pair", [result("gpu", "gpu-5"), result("gpu", "gpu-2")])
    envs = prepare(Node(tmp_path), obj)
    g = gpus()
    usable = g[0].memory_usable
    expected = {
        "NVIDIA_VISIBLE_DEVICES": f"{g[2].uuid},{g[5].uuid}",
        "SHAREGPU_DEVICES": "gpu-2,gpu-5",
        "SHAREGPU_GPU_UUIDS": f"{g[2].uuid},{g[5].uuid}",
        "SHAREGPU_CORES_LIST": "100,100",
        "SHAREGPU_MEMORY_LIST": f"{usable},{usable}",
        "SHAREGPU_REQUEST": "gpu",
    }
    assert len(envs) == 2
    for env in envs:
        assert {k: env[k] for k in expected} == expected
    # Whatever order the runtime applies the devices in, the container sees both GPUs.
    for order in (envs, list(reversed(envs))):
        merged = merged_env(order)
        assert {k: merged[k] for k in expected} == expected
    # The device variables still describe their own device (what recovery reads back).
    assert [(e["SHAREGPU_DEVICE"], e["SHAREGPU_GPU_UUID"]) for e in envs] == [
        ("gpu-5", g[5].uuid),
        ("gpu-2", g[2].uuid),
    ]


def test_two_shares_on_one_gpu_list_the_gpu_once(tmp_path: Path) -> None:
    obj = claim(
        "two-shares",
        [
            result("gpu", "gpu-1", share={"cores": 20, "memory": 4 * GI}),
            result("gpu", "gpu-1", share={"cores": 30, "memory": 8 * GI}),
        ],
    )
    tools = Tools.new()
    node = Node(tmp_path)
    envs = prepare(node, obj, enforcer=tools.enforcer(node.data_dir))
    uuid = gpus()[1].uuid
    for env in envs:
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert env["SHAREGPU_DEVICES"] == "gpu-1,gpu-1"
        assert env["SHAREGPU_GPU_UUIDS"] == f"{uuid},{uuid}"
        assert sorted(env["SHAREGPU_CORES_LIST"].split(",")) == ["20", "30"]
        # One MPS daemon, one pipe directory: the request's shares add up, on device 0.
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}=12288M"


def test_a_container_naming_one_request_sees_only_that_requests_gpus(tmp_path: Path) -> None:
    obj = claim(
        "split",
        [result("train", "gpu-6"), result("train", "gpu-1"), result("infer/small", "gpu-3")],
    )
    train_a, train_b, infer = prepare(Node(tmp_path), obj)
    g = gpus()
    for env in (train_a, train_b, merged_env([train_a, train_b])):
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"{g[1].uuid},{g[6].uuid}"
        assert env["SHAREGPU_DEVICES"] == "gpu-1,gpu-6"
    assert infer["NVIDIA_VISIBLE_DEVICES"] == g[3].uuid
    assert infer["SHAREGPU_DEVICES"] == "gpu-3"


def test_limits_ordinals_count_among_the_gpus_the_container_sees(tmp_path: Path) -> None:
    node = Node(tmp_path)
    obj = claim(
        "limits",
        [
            result("a", "gpu-4", share={"cores": 40, "memory": 16 * GI}),
            result("b", "gpu-2", share={"cores": 20, "memory": 4 * GI}),
            result("a", "gpu-0", share={"cores": 10, "memory": 8 * GI}),
        ],
        configs=[gpu_config({"strategy": "Limits"})],
    )
    a4, b2, a0 = prepare(node, obj, enforcer=Tools.new().enforcer(node.data_dir, LIBRARY))
    g = gpus()
    # Request a sees gpu-0 and gpu-4 as CUDA devices 0 and 1 (NVIDIA_VISIBLE_DEVICES order).
    merged_a = merged_env([a4, a0])
    assert merged_a["NVIDIA_VISIBLE_DEVICES"] == f"{g[0].uuid},{g[4].uuid}"
    assert merged_a["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert merged_a["CUDA_DEVICE_SM_LIMIT_0"] == "10"
    assert merged_a["CUDA_DEVICE_MEMORY_LIMIT_1"] == "16384m"
    assert merged_a["CUDA_DEVICE_SM_LIMIT_1"] == "40"
    # Request b alone sees gpu-2 as CUDA device 0, although the claim's gpu-0 sorts before it.
    assert b2["NVIDIA_VISIBLE_DEVICES"] == g[2].uuid
    assert b2["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert not any(k.endswith("_1") for k in b2)


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ([["gpu"]], [(0,)]),
        ([["gpu"], ["gpu"]], [(0, 1), (0, 1)]),
        ([["a"], ["b/x"], ["a"]], [(0, 2), (1,), (0, 2)]),
        # A device serving a and b (adminAccess) comes with what every container given it gets.
        ([["a", "b"], ["a"], ["b"], ["a", "b/y"]], [(0, 3), (0, 1, 3), (0, 2, 3), (0, 3)]),
    ],
)
def test_given_together(requests: Sequence[Sequence[str]], expected: list[tuple[int, ...]]) -> None:
    assert given_together(requests) == expected


def test_visible_gpus_follow_pci_bus_order_and_drop_repeats() -> None:
    g = gpus()
    assert cuda_order([g[7], g[0], g[7], g[3]]) == (g[0], g[3], g[7])
    assert visible_gpus([["r"], ["r"], ["s"]], [g[7], g[2], g[7]]) == [
        (g[2], g[7]),
        (g[2], g[7]),
        (g[7],),
    ]


def test_spec_of_a_multi_device_claim_is_valid_cdi(tmp_path: Path) -> None:
    node = Node(tmp_path)
    obj = claim("valid", [result("gpu", "gpu-0"), result("gpu", "gpu-1")])
    prepare(node, obj)
    (path,) = node.spec_files()
    assert len(assert_valid_cdi(path)["devices"]) == 2
