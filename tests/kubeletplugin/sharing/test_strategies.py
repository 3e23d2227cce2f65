"""Sharing strategies plug in through the registry alone: a strategy defined only here is
planned, enforced, recorded in the checkpoint, restored and released without a change to the
enforcer or the checkpoint; and the strategies of one claim are undone together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import pytest

from api.gpuconfig import (
    GPU_CONFIG_KIND,
    ConfigEntry,
    DriverConfigs,
    GpuConfig,
    Sharing,
    decode_driver_configs,
)
from api.names import GROUP_VERSION
from kubeletplugin.containeredits import ContainerEdits
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.checkpoint import (
    STATE_COMPLETED,
    Checkpoint,
    CheckpointError,
    ClaimRecord,
    device_from_json,
    device_to_json,
)
from kubeletplugin.sharing.enforcement import ShareError
from kubeletplugin.sharing.enforcer import SharingEnforcer
from kubeletplugin.sharing.strategies.base import (
    HeldClaims,
    Release,
    SettingsError,
    StrategySetup,
    enforced_caps,
)
from kubeletplugin.sharing.strategies.limits import LimitsNode
from kubeletplugin.sharing.strategies.registry import DEFAULT_REGISTRY, StrategyRegistry
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.sharing.helpers import GI, LIBRARY, Tools, decided, gpu_config, record

THROTTLE: Final = "Throttle"
#: The throttle levels a Throttle device may record (its one setting).
LEVELS: Final = ("Gentle", "Firm")
CLAIM_A: Final = "0a0a0a0a-0000-4000-8000-00000000000a"
CLAIM_B: Final = "0b0b0b0b-0000-4000-8000-00000000000b"


class ThrottleStrategy:
    """A strategy known only to this test: claims of one level share a GPU; each claim's GPUs
    get a marker file on the node; containers get ``THROTTLE_CAP``."""

    name: Final = THROTTLE
    shares_gpu_with: Final = frozenset({THROTTLE})
    mixes_in_claim: Final = True
    on_mig: Final = False

    def plan(
        self, share: DeviceRecord, config: GpuConfig, setup: StrategySetup, label: str
    ) -> Enforcement:
        cores, memory = enforced_caps(share, label)
        return Enforcement(THROTTLE, cores, memory, interval="Gentle")

    def check_claim(self, held: Sequence[DeviceRecord]) -> None:
        return None

    def conflict(self, ours: Enforcement, theirs: Enforcement) -> str | None:
        return None if ours.interval == theirs.interval else f"level {ours.interval}"

    def setting_from_json(self, value: Any, where: str) -> str | None:
        if value not in LEVELS:
            raise SettingsError(f"{where} is {value!r}; known: {', '.join(LEVELS)}")
        return str(value)

    def on_node(self, setup: StrategySetup) -> ThrottleNode:
        return ThrottleNode(setup.data_dir / "throttle")


class ThrottleNode:
    """One marker file ``<root>/<claim>.<gpu>`` per claim and GPU."""

    state_key: str | None = "throttle"

    def __init__(self, root: Path) -> None:
        self.root = root

    def marker(self, claim_uid: str, uuid: str) -> Path:
        return self.root / f"{claim_uid}.{uuid}"

    def acquire(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for d in held:
            self.marker(claim_uid, d.gpu.uuid).write_text(str(d.enforced.interval))

    def undo(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        for d in held:
            self.marker(claim_uid, d.gpu.uuid).unlink(missing_ok=True)

    def release(
        self, claim_uid: str, released: Sequence[DeviceRecord], held: HeldClaims
    ) -> Release:
        gpus = frozenset(d.gpu.uuid for d in released)

        def settle(held_now: HeldClaims) -> list[str]:
            self.undo(claim_uid, released)
            return []

        return Release(gpus, settle)

    def export_state(self) -> dict[str, Any]:
        return {"markers": sorted(p.name for p in self.root.glob("*"))}

    def restore(
        self, state: Mapping[str, Any] | None, held: HeldClaims, node_gpus: frozenset[str]
    ) -> None:
        needed = {
            self.marker(c, d.gpu.uuid).name
            for c, devices in held.items()
            for d in devices
            if d.enforced.strategy == THROTTLE
        }
        for name in (state or {}).get("markers", []):
            if name not in needed:
                (self.root / name).unlink(missing_ok=True)
        self.acquire_all(held)

    def acquire_all(self, held: HeldClaims) -> None:
        for claim_uid, devices in held.items():
            self.acquire(claim_uid, [d for d in devices if d.enforced.strategy == THROTTLE])

    def edits(
        self,
        claim_uid: str,
        device: DeviceRecord,
        caps: tuple[int, int],
        visible: Sequence[GpuInfo],
    ) -> ContainerEdits:
        return ContainerEdits(env=(f"THROTTLE_CAP={caps[0]}",))


REGISTRY: Final = DEFAULT_REGISTRY.with_strategy(ThrottleStrategy())


def throttled() -> DriverConfigs:
    """A config naming the test's strategy: what a strategy's GpuConfig section lets a user
    write (built without validation, since the GpuConfig schema lists only the real
    strategies)."""
    sharing = Sharing.model_construct(strategy=THROTTLE)
    config = GpuConfig.model_construct(
        api_version=GROUP_VERSION, kind=GPU_CONFIG_KIND, sharing=sharing
    )
    return DriverConfigs(entries=(ConfigEntry(0, "FromClaim", (), config),))


def boot_id_file(directory: Path) -> Path:
    path = directory / "boot_id"
    path.write_text("3f1e7c9a-0000-4000-8000-000000000001\n")
    return path


def enforcer(tools: Tools, data_dir: Path, strategies: StrategyRegistry) -> SharingEnforcer:
    return SharingEnforcer(
        tools.fake,
        data_dir,
        driver_name=h.DRIVER,
        launcher=tools.pods,
        mps_root=tools.mps_root,
        strategies=strategies,
    )


def test_a_strategy_defined_in_a_test_plugs_in_through_the_registry(tmp_path: Path) -> None:
    tools = Tools.new()
    gpu = h.gpus()[0]
    first = enforcer(tools, tmp_path, REGISTRY)
    node = first.node_of(ThrottleNode)
    devices = [record(gpu, "gpu-0", ("gpu",), 30, 2 * GI, share_id="s-1")]

    # Prepare: planned, acquired on the node, container edits from the strategy.
    applied = first.apply(CLAIM_A, devices, throttled())
    assert applied.decisions == (Enforcement(THROTTLE, 30, 2 * GI, interval="Gentle"),)
    assert applied.device_edits == (ContainerEdits(env=("THROTTLE_CAP=30",)),)
    assert node.marker(CLAIM_A, gpu.uuid).read_text() == "Gentle"
    assert tools.fake.argvs() == []
    # Its coexistence rules apply: another claim's MPS share cannot join the GPU.
    other = [record(gpu, "gpu-0", ("gpu",), 10, GI, share_id="s-2")]
    with pytest.raises(
        ShareError, match=r"strategy MPS cannot share GPU .* with strategy Throttle"
    ):
        first.apply(CLAIM_B, other, DriverConfigs())

    # Checkpoint round trip: its setting is checked by the strategy, through the registry.
    recorded = ClaimRecord(
        CLAIM_A, "default", "a", STATE_COMPLETED, tuple(decided(devices, applied))
    )
    checkpoint = Checkpoint(tmp_path / "ckpt", boot_id_file(tmp_path), strategies=REGISTRY)
    checkpoint.write({CLAIM_A: recorded}, first.export_state())
    loaded = Checkpoint(tmp_path / "ckpt", boot_id_file(tmp_path), strategies=REGISTRY).load()
    assert loaded.bad_claims == {}
    assert loaded.claims[CLAIM_A] == recorded
    assert loaded.sharing is not None
    assert loaded.sharing["throttle"] == {"markers": [f"{CLAIM_A}.{gpu.uuid}"]}
    # The registry decides what a checkpoint may name: without the strategy, the entry is bad.
    entry = device_to_json(recorded.devices[0])
    with pytest.raises(CheckpointError, match=r"d.enforcement.strategy is 'Throttle'; known: "):
        device_from_json(entry, "d")
    entry["enforcement"]["interval"] = "Harsh"
    with pytest.raises(CheckpointError, match=r"d.enforcement.interval is 'Harsh'; known: Gentle"):
        device_from_json(entry, "d", REGISTRY)

    # Restore after a restart: a leftover marker goes, the held claim's marker is kept.
    leftover = node.marker(CLAIM_B, gpu.uuid)
    leftover.write_text("Gentle")
    state = {**loaded.sharing, "throttle": {"markers": sorted([leftover.name, f"{CLAIM_A}.x"])}}
    second = enforcer(tools, tmp_path, REGISTRY)
    prepared = {CLAIM_A: [replace(d, gpu_info=gpu) for d in loaded.claims[CLAIM_A].devices]}
    # What apply answered: the decisions and the container edits (the spec is rebuilt from them).
    assert second.restore(state, prepared, node_gpus=[gpu.uuid]) == {CLAIM_A: applied}
    assert not leftover.exists() and node.marker(CLAIM_A, gpu.uuid).exists()
    assert second.held()[CLAIM_A][0].enforced.strategy == THROTTLE

    # Release: the strategy undoes its part.
    second.release(CLAIM_A)
    assert not node.marker(CLAIM_A, gpu.uuid).exists()
    assert second.held() == {}
    assert tools.fake.argvs() == []


def test_a_registry_without_a_strategy_refuses_configs_naming_it(tmp_path: Path) -> None:
    tools = Tools.new()
    only_exclusive = StrategyRegistry(DEFAULT_REGISTRY["Exclusive"])
    share = record(h.gpus()[0], "gpu-0", ("gpu",), 30, GI, share_id="s-1")
    with pytest.raises(ShareError, match="this node's plugin has no strategy MPS"):
        enforcer(tools, tmp_path, only_exclusive).apply(CLAIM_A, [share], DriverConfigs())
    with pytest.raises(ValueError, match="registered twice"):
        StrategyRegistry(DEFAULT_REGISTRY["MPS"], DEFAULT_REGISTRY["MPS"])


def test_a_failed_strategy_undoes_the_claims_strategies_before_it(tmp_path: Path) -> None:
    """A claim with a Limits share and an MPS share: when its MPS daemon cannot start, its
    Limits lock directory (made first) goes too, so a retry starts clean."""
    tools = Tools.new()
    gpu0, gpu1 = h.gpus()[:2]
    tools.sim.compute_modes[gpu1.uuid] = "EXCLUSIVE_PROCESS"
    first = tools.enforcer(tmp_path, limits_library=LIBRARY)
    configs = decode_driver_configs([gpu_config({"strategy": "Limits"}, ["a"])], h.DRIVER)
    devices = [
        record(gpu0, "gpu-0", ("a",), 30, GI, share_id="s-1"),
        record(gpu1, "gpu-1", ("b",), 30, GI, share_id="s-2"),
    ]
    with pytest.raises(ShareError, match=r"cannot enforce the share: GPU .* EXCLUSIVE_PROCESS"):
        first.apply(CLAIM_A, devices, configs)
    assert not first.node_of(LimitsNode).lock_dir(CLAIM_A).exists()
    assert first.held() == {}
