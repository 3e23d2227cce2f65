"""Dynamic MIG end to end through the real plugin process, the embedded API server and the kubelet
simulator: kill -9 at every step of a prepare and of an unprepare (so also between creating a
GPU instance and its compute instance, and between destroying them) and before calls, in a long
prepare/unprepare loop; restart, retry like kubelet, and check the node's MIG instances after
every call. Kill points are events, chosen from a seed: a failure names the seed that replays it.

The mock backend's MIG instances live in ``<data dir>/mock-mig.json``, which outlives the process
like a real GPU's instances. An instance "created by someone else" exists before the plugin
starts; it must survive everything, and the placements it blocks must never be published.
The "scheduler" here deliberately hands overlapping placements to different claims (a stale
decision), so the plugin's last line of defence is exercised too.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api import names
from kubeletplugin.devices.migtables import H100_80GB
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.mockmig import MockMigPartitioner
from kubeletplugin.model import GpuInfo, MigPlacement
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim
from tests.helpers import eventually
from tests.kubeletplugin.prepare.helpers import DRIVER, NODE, assert_valid_cdi, claim, ref, result
from tests.kubeletplugin.prepare.process_helpers import (
    BEFORE_CALL,
    CrashingKubelet,
    KillPlanner,
    PluginProcess,
    check_node,
    crash_seed,
    replay_hint,
)

pytestmark = pytest.mark.process

SEED = 20261125
OPERATIONS = 80
MIG_GPUS = 2
MIG_ARGS = ("--sharing-mode=partitions", "--mig=dynamic")
#: The share of calls killed before they are sent (the others are killed at a step of the call
#: while some step of their kind was never killed at).
KILLED_BEFORE_CALL = 0.05
#: The instance someone else created before the plugin started: GPU 1, 1g.10gb at slice 6.
FOREIGN = (1, "1g.10gb", 6)


def _profile(name: str) -> Any:
    return next(p for p in H100_80GB if p.name == name)


def _gpus() -> list[GpuInfo]:
    return MockBackend(NODE, count=MIG_GPUS, mig_enabled=True).discover()


def _instances(plugin: PluginProcess) -> dict[str, tuple[GpuInfo, ...]]:
    """Every MIG instance of the mock GPUs, by parent UUID (read as another process would)."""
    partitioner = MockMigPartitioner(plugin.data_dir / "mock-mig.json", NODE)
    return {gpu.uuid: partitioner.instances(gpu) for gpu in _gpus()}


def _placement_of(device: str) -> tuple[int, str, int]:
    """(GPU index, profile name, start) of a placement device name."""
    gpu = _gpus()[int(device.split("-")[1])]
    for profile in gpu.mig_profiles:
        for placement in profile.placements:
            name = names.mig_placement_device_name(gpu.index, profile.name, placement.start)
            if name == device:
                return gpu.index, profile.name, placement.start
    raise AssertionError(f"{device} is no placement device")


@pytest.fixture
def env() -> Iterator[tuple[KubeAPIServer, PluginProcess]]:
    root = Path(tempfile.mkdtemp(prefix="sgmig-", dir="/tmp"))
    (root / "boot_id").write_text("3c9e1c7e-7d7b-4c42-9a4c-0d9b1f0e0c11\n")
    with KubeAPIServer() as apiserver:
        kubeconfig = root / "kubeconfig"
        apiserver.write_kubeconfig(kubeconfig)
        plugin = PluginProcess(root, kubeconfig, extra_args=MIG_ARGS, gpus=MIG_GPUS)
        try:
            yield apiserver, plugin
        finally:
            plugin.close()
            shutil.rmtree(root, ignore_errors=True)


def _claims(rng: random.Random) -> list[dict[str, Any]]:
    """Claims on placement devices of both GPUs, some overlapping each other, and two on
    placements the foreign instance blocks."""
    devices = [
        names.mig_placement_device_name(i, profile.name, placement.start)
        for i in range(MIG_GPUS)
        for profile in H100_80GB
        for placement in profile.placements
    ]
    chosen = rng.sample(devices, 14)
    chosen += ["gpu-1-mig-1g-10gb-6", "gpu-1-mig-7g-80gb-0"]
    return [claim(f"mig-{n}", [result("mig", device)]) for n, device in enumerate(chosen)]


def _check_mig(
    plugin: PluginProcess,
    prepared: dict[str, str],
    foreign: GpuInfo,
) -> None:
    """The node as it must be between kubelet calls: exactly one instance (with its compute
    instance) per prepared claim, at the claim's placement, named in its spec; the foreign
    instance untouched; nothing else."""
    check_node(plugin, set(prepared))
    instances = _instances(plugin)
    gpus = _gpus()
    found: dict[tuple[int, str, int], GpuInfo] = {}
    for gpu in gpus:
        for inst in instances[gpu.uuid]:
            assert inst.mig is not None and inst.mig.placement is not None
            key = (gpu.index, inst.mig.profile, inst.mig.placement.start)
            assert key not in found
            found[key] = inst
    assert found.pop(FOREIGN) == foreign, "the foreign instance was touched"
    expected = {_placement_of(device): uid for uid, device in prepared.items()}
    assert set(found) == set(expected), f"instances {sorted(found)} != claims {sorted(expected)}"
    for key, inst in found.items():
        assert inst.mig is not None and inst.mig.compute_instance >= 0, f"{key} has no CI"
        uid = expected[key]
        spec = assert_valid_cdi(plugin.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json")
        (device,) = spec["devices"]
        env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == inst.uuid


def _published_devices(apiserver: KubeAPIServer) -> set[str]:
    return {
        d["name"]
        for s in apiserver.store.list("resourceslices")
        for d in s["spec"].get("devices", [])
    }


def test_kill_9_during_mig_create_and_destroy(env: tuple[KubeAPIServer, PluginProcess]) -> None:
    apiserver, plugin = env
    seed = crash_seed(SEED)
    rng = random.Random(seed)
    gpu1 = _gpus()[FOREIGN[0]]
    plugin.data_dir.mkdir(parents=True)
    foreign = MockMigPartitioner(plugin.data_dir / "mock-mig.json", NODE).create(
        gpu1, _profile(FOREIGN[1]), MigPlacement(FOREIGN[2], 1)
    )
    apiserver.store.put("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    objs = _claims(rng)
    for obj in objs:
        apiserver.store.put("resourceclaims", obj)
    refs = {o["metadata"]["uid"]: ref(o) for o in objs}
    # Chosen by name: the UIDs are random, their order is not the seed's.
    name_of = {uid: r.name for uid, r in refs.items()}
    device_of = {
        o["metadata"]["uid"]: o["status"]["allocation"]["devices"]["results"][0]["device"]
        for o in objs
    }
    prepared: dict[str, str] = {}
    refusals: list[str] = []
    plugin.start()
    sim = KubeletSim(plugin.registry)
    kubelet = CrashingKubelet(plugin, sim, plugin.register(sim))
    planner = KillPlanner(kubelet, rng, before_call=KILLED_BEFORE_CALL)
    where = "the start"

    def placements_published() -> set[str] | None:
        found = _published_devices(apiserver)
        return found if "gpu-0-mig-1g-10gb-0" in found else None

    try:
        with replay_hint(seed, lambda: where):
            published = eventually(
                placements_published,
                lambda: f"placements published: {plugin.logs[-1].read_text()[-3000:]}",
                timeout_s=60,
            )
            # The placements the foreign instance blocks are not published; the others are.
            assert "gpu-1-mig-1g-10gb-6" not in published
            assert "gpu-1-mig-7g-80gb-0" not in published
            assert "gpu-1-mig-1g-10gb-5" in published
            for step in range(OPERATIONS):
                candidates = [u for u in refs if u not in prepared]
                if prepared and (not candidates or rng.random() < 0.45):
                    op, uid = "unprepare", rng.choice(sorted(prepared, key=name_of.get))
                else:
                    op, uid = "prepare", rng.choice(sorted(candidates, key=name_of.get))
                kill_at = planner.choose(f"{op} mig")
                where = f"operation {step}: {op} of {refs[uid].name}, kill at {kill_at}"
                value = kubelet.answered(op, refs[uid], kill_at, "mig")
                if op == "prepare":
                    if value == "":
                        prepared[uid] = device_of[uid]
                    else:
                        refusals.append(value)
                        assert "overlap" in value or "cannot create" in value, value
                else:
                    assert value == "", value
                    prepared.pop(uid, None)
                _check_mig(plugin, prepared, foreign)
            where = "the final unprepare"
            errors = kubelet.kplugin.unprepare([refs[u] for u in sorted(prepared)])
            assert set(errors.values()) <= {""}
            prepared.clear()
            _check_mig(plugin, prepared, foreign)
            where = "the coverage check"
            # Both kinds of call ran, changed the MIG state and were killed at each step.
            assert set(kubelet.offers) == {"prepare mig", "unprepare mig"}
            for label, steps in kubelet.offers.items():
                assert ("replace:data/mock-mig.json", 1) in steps, (label, steps)
                assert ("replace:data/mock-mig.json", 2) in steps, (label, steps)
            uncovered = sorted(map(str, kubelet.uncovered()))
            assert not uncovered, f"kill points never killed at: {uncovered}"
            assert any(p.target == BEFORE_CALL for p in kubelet.killed_at)
            assert kubelet.kills == kubelet.lost_calls == len(kubelet.killed_at)
            logs = "".join(log.read_text() for log in plugin.logs)
            # Some kills landed while an instance was being created: the restart destroyed it.
            assert "of rolled-back claim" in logs, "no kill landed during a MIG create"
            assert any("overlap" in r for r in refusals)
    finally:
        kubelet.kplugin.close()
        sim.close()
