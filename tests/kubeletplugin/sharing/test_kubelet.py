"""Shares on one GPU prepared by a simulated kubelet over the plugin's real gRPC sockets: every
share gets its own, correct MPS limits, and the daemon goes away with the last share."""

from __future__ import annotations

from typing import Any

import pytest

from kubeletplugin.kubelet.preparer import ClaimRef
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.kubelet.helpers import Dirs, running_server, socket_dirs
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.sharing.helpers import GI, Tools, claim_env

# (cores, memory GiB) per share: distinct, summing to exactly the GPU's 100 cores.
TWO_SHARES = [(30, 10), (70, 40)]
EIGHT_SHARES = [(3, 1), (5, 2), (7, 3), (9, 4), (11, 5), (13, 6), (17, 7), (35, 8)]


@pytest.mark.parametrize(
    ("shares", "version"),
    [
        (TWO_SHARES, "v1.DRAPlugin"),
        (EIGHT_SHARES, "v1.DRAPlugin"),
        (EIGHT_SHARES, "v1beta1.DRAPlugin"),
    ],
    ids=["2-shares-v1", "8-shares-v1", "8-shares-v1beta1"],
)
def test_shares_on_one_gpu_get_distinct_correct_limits(
    shares: list[tuple[int, int]], version: str
) -> None:
    with socket_dirs() as dirs:
        run_shares(dirs, shares, version)


def run_shares(dirs: Dirs, shares: list[tuple[int, int]], version: str) -> None:
    (dirs.root / "node").mkdir()
    node, claims, tools = h.Node(dirs.root / "node"), h.FakeClaims(), Tools.new()
    state = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    objs: list[dict[str, Any]] = []
    for i, (cores, memory) in enumerate(shares):
        obj = h.claim(
            f"share-{i}",
            [h.result("gpu", "gpu-0", share={"cores": cores, "memory": memory * GI})],
        )
        objs.append(obj)
    claims.add(*objs)
    refs = [h.ref(o) for o in objs]
    uuid = h.gpus()[0].uuid
    with running_server(dirs, preparer=state), KubeletSim(dirs.registry) as sim:  # type: ignore[arg-type]
        plugin = sim.register(h.DRIVER)
        results = plugin.prepare(refs, version=version)
        for obj, (cores, memory) in zip(objs, shares, strict=True):
            uid = obj["metadata"]["uid"]
            assert results[uid].error == ""
            [device] = results[uid].devices
            expected_share_id = obj["status"]["allocation"]["devices"]["results"][0]["shareID"]
            assert device.share_id == (expected_share_id if version.startswith("v1.") else None)
            [env] = claim_env(node, uid)
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(cores)
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}={memory * 1024}M"
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/sharegpu/mps/{uuid}/pipe"
        limits = {
            claim_env(node, o["metadata"]["uid"])[0]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
            for o in objs
        }
        assert len(limits) == len(shares)
        # One daemon per claim, each started with its claim's limits as its defaults.
        assert tools.sim.daemons_started == len(shares) == len(tools.sim.daemons)
        assert sorted(
            (int(d["active_thread_percentage"]), d["pinned_mem_limit"])
            for d in tools.sim.default_limits.values()
        ) == sorted((cores, f"{memory * 1024}M") for cores, memory in shares)
        # Repeating the prepare (kubelet retries) starts nothing new.
        assert plugin.prepare(refs[:1], version=version)[refs[0].uid].error == ""
        assert tools.sim.daemons_started == len(shares)
        errors = plugin.unprepare(refs[:-1], version=version)
        assert set(errors.values()) == {""}
        assert len(tools.sim.daemons) == 1
        assert plugin.unprepare(refs[-1:], version=version) == {refs[-1].uid: ""}
        assert tools.sim.daemons == {}
        assert tools.sim.mode(uuid) == "DEFAULT"
        assert node.spec_files() == []


def test_a_ninth_share_beyond_the_gpu_is_refused_per_claim() -> None:
    with socket_dirs() as dirs:
        (dirs.root / "node").mkdir()
        node, claims, tools = h.Node(dirs.root / "node"), h.FakeClaims(), Tools.new()
        state = node.state(claims, enforcer=tools.enforcer(node.data_dir))
        objs = [
            h.claim(f"s{i}", [h.result("gpu", "gpu-0", share={"cores": c, "memory": m * GI})])
            for i, (c, m) in enumerate([*EIGHT_SHARES, (1, 1)])
        ]
        claims.add(*objs)
        refs: list[ClaimRef] = [h.ref(o) for o in objs]
        with running_server(dirs, preparer=state), KubeletSim(dirs.registry) as sim:  # type: ignore[arg-type]
            plugin = sim.register(h.DRIVER)
            results = plugin.prepare(refs)
            errors = {uid: r.error for uid, r in results.items() if r.error}
            assert list(errors) == [refs[-1].uid]
            assert "other claims already hold 100 of 100 cores" in errors[refs[-1].uid]
