"""Dynamic MIG test helpers: an in-memory MIG partitioner that enforces the hardware placement
rule and can fail or "crash" at chosen points, a node with MIG-enabled GPUs, and the invariant
check of the crash tests.

A crash is :class:`Crash` (a BaseException, so no ``except Exception`` of the plugin stops it):
once raised, every later call of the partitioner raises it again, as a dead process makes no
further call; :meth:`FakePartitioner.revive` is the restart. The partitioner's instances are
the GPU's and outlive the plugin's :class:`~kubeletplugin.prepare.state.DeviceState`, as MIG
instances outlive a kill -9 of the daemon.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from api import names
from kubeletplugin.devices.migcaps import MIG_MINORS_FILE
from kubeletplugin.devices.migpartition import MigError
from kubeletplugin.devices.migtables import (
    A100_40GB,
    A100_40GB_PRODUCT,
    H100_80GB,
    placement_problem,
)
from kubeletplugin.devices.table import NodeDevices, node_devices
from kubeletplugin.model import GpuInfo, MigInfo, MigPlacement, MigProfile
from kubeletplugin.prepare.checkpoint import STATE_COMPLETED
from kubeletplugin.prepare.state import DeviceState
from tests.kubeletplugin.prepare.helpers import gpus

MIB = 1024**2

#: Where the fake can fail or crash: before anything, after the GPU instance exists (no compute
#: instance yet), after the whole create; during a destroy before the GPU instance goes (its
#: compute instance is gone), after it went, and after the destroy returned.
CREATE_BEFORE = "create-before"
CREATE_AFTER_GI = "create-after-gi"
CREATE_AFTER = "create-after"
DESTROY_BEFORE_GI = "destroy-before-gi"
DESTROY_AFTER_GI = "destroy-after-gi"
DESTROY_AFTER = "destroy-after"
CREATE_POINTS = (CREATE_BEFORE, CREATE_AFTER_GI, CREATE_AFTER)
DESTROY_POINTS = (DESTROY_BEFORE_GI, DESTROY_AFTER_GI, DESTROY_AFTER)
POINTS = CREATE_POINTS + DESTROY_POINTS


class Crash(BaseException):
    """The plugin process died here."""


@dataclass
class Instance:
    """One GPU instance of the fake (with its compute instance unless ``ci`` is -1)."""

    parent: str
    gi: int
    profile: MigProfile
    placement: MigPlacement
    ci: int = -1
    uuid: str = ""


def mig_gpu(parent: GpuInfo, inst: Instance) -> GpuInfo:
    """The MIG device of ``inst`` as a partitioner describes it."""
    memory = inst.profile.memory_mb * MIB
    return replace(
        parent,
        uuid=inst.uuid,
        memory_total=memory,
        memory_reserved=0,
        memory_usable=memory,
        mig_mode=None,
        mig_devices=(),
        mig_profiles=(),
        mig=MigInfo(
            parent_uuid=parent.uuid,
            gpu_instance=inst.gi,
            compute_instance=inst.ci,
            profile=inst.profile.name,
            multiprocessors=inst.profile.multiprocessors,
            gpu_slices=inst.profile.slice_count,
            compute_slices=inst.profile.slice_count,
            placement=inst.placement,
            profile_id=inst.profile.profile_id,
        ),
        notes=(),
    )


class FakePartitioner:
    """An in-memory :class:`~kubeletplugin.devices.migpartition.MigPartitioner` (see the module
    docstring). ``arm(point, kind, skip)`` makes the ``skip + 1``-th visit of ``point`` fail
    (``kind`` "fail": MigError, after undoing a half-made create, as the real ones do) or crash."""

    def __init__(self) -> None:
        self.instances_by_gpu: dict[str, dict[int, Instance]] = {}
        self.creates = 0
        self.destroys = 0
        self.crashed = False
        self._armed: dict[str, tuple[str, int]] = {}
        self._serial = 0
        self._lock = threading.Lock()
        #: Called at the start of every protocol call (tests check what the caller holds).
        self.hook: Callable[[], None] | None = None

    # --- test controls ---

    def arm(self, point: str, kind: str = "crash", skip: int = 0) -> None:
        assert point in POINTS and kind in ("crash", "fail")
        self._armed[point] = (kind, skip)

    def disarm(self) -> None:
        self._armed.clear()

    def revive(self) -> None:
        """The restart: calls work again and nothing is armed."""
        self.crashed = False
        self._armed.clear()

    def add_foreign(self, parent: GpuInfo, profile_name: str, start: int) -> Instance:
        """An instance someone else created (with its compute instance)."""
        profile = next(p for p in parent.mig_profiles if p.name == profile_name)
        placement = next(p for p in profile.placements if p.start == start)
        with self._lock:
            inst = self._make_gi(parent, profile, placement)
            self._make_ci(inst)
        return inst

    def all(self) -> list[Instance]:
        return [i for gis in self.instances_by_gpu.values() for i in gis.values()]

    # --- the protocol ---

    def instances(self, parent: GpuInfo) -> tuple[GpuInfo, ...]:
        self._alive()
        with self._lock:
            gis = self.instances_by_gpu.get(parent.uuid, {})
            return tuple(mig_gpu(parent, gis[gi]) for gi in sorted(gis))

    def create(self, parent: GpuInfo, profile: MigProfile, placement: MigPlacement) -> GpuInfo:
        self._alive()
        with self._lock:
            self._visit(CREATE_BEFORE)
            existing = [
                (i.profile.profile_id, i.placement)
                for i in self.instances_by_gpu.get(parent.uuid, {}).values()
            ]
            problem = placement_problem(
                parent.mig_profiles, existing, profile.profile_id, placement
            )
            if problem is not None:
                raise MigError(f"GPU {parent.uuid}: cannot create {profile.name}: {problem}")
            inst = self._make_gi(parent, profile, placement)
            try:
                self._visit(CREATE_AFTER_GI)
            except MigError:
                del self.instances_by_gpu[parent.uuid][inst.gi]
                raise
            self._make_ci(inst)
            self.creates += 1
            try:
                self._visit(CREATE_AFTER)
            except MigError:
                del self.instances_by_gpu[parent.uuid][inst.gi]
                raise
            return mig_gpu(parent, inst)

    def destroy(self, parent: GpuInfo, gpu_instance: int) -> bool:
        self._alive()
        with self._lock:
            gis = self.instances_by_gpu.get(parent.uuid, {})
            inst = gis.get(gpu_instance)
            if inst is None:
                return False
            inst.ci, inst.uuid = -1, ""
            self._visit(DESTROY_BEFORE_GI)
            del gis[gpu_instance]
            self.destroys += 1
            self._visit(DESTROY_AFTER_GI)
        self._visit(DESTROY_AFTER)
        return True

    # --- internals ---

    def _alive(self) -> None:
        if self.crashed:
            raise Crash("the plugin is dead")
        if self.hook is not None:
            self.hook()

    def _visit(self, point: str) -> None:
        armed = self._armed.get(point)
        if armed is None:
            return
        kind, skip = armed
        if skip > 0:
            self._armed[point] = (kind, skip - 1)
            return
        del self._armed[point]
        if kind == "crash":
            self.crashed = True
            raise Crash(point)
        raise MigError(f"injected failure at {point}")

    def _make_gi(self, parent: GpuInfo, profile: MigProfile, placement: MigPlacement) -> Instance:
        gis = self.instances_by_gpu.setdefault(parent.uuid, {})
        gi = next(n for n in range(1, 64) if n not in gis)
        inst = Instance(parent.uuid, gi, profile, placement)
        gis[gi] = inst
        return inst

    def _make_ci(self, inst: Instance) -> None:
        self._serial += 1
        inst.ci = 0
        inst.uuid = f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'{inst.parent}/{self._serial}')}"


# --- the node ---------------------------------------------------------------------------------


def mig_node_gpus() -> list[GpuInfo]:
    """GPU 0: an H100 in MIG mode, GPU 1: an A100-40GB in MIG mode, GPU 2: a plain GPU."""
    h100, a100, plain = gpus(3)
    return [
        replace(h100, mig_mode="Enabled", mig_profiles=H100_80GB),
        replace(
            a100,
            product_name=A100_40GB_PRODUCT,
            memory_total=42949672960,
            memory_reserved=0,
            memory_usable=42949672960,
            mig_mode="Enabled",
            mig_profiles=A100_40GB,
        ),
        plain,
    ]


def mig_node_devices() -> NodeDevices:
    return node_devices(
        mig_node_gpus(), names.SHARING_MODE_PARTITIONS, mig_strategy=names.MIG_STRATEGY_DYNAMIC
    )


#: The ``nvidia-caps`` major of the simulated host's ``/proc/devices``.
CAPS_MAJOR = 241


def cap_minors(gpu_minor: int, gi: int, ci: int | None) -> int:
    """The capability minor the fixture's mig-minors file gives."""
    return 1000 + gpu_minor * 1000 + gi * 10 + (0 if ci is None else 1 + ci)


def write_host(root: Path, gpu_minors: Iterable[int] = (0, 1, 2)) -> tuple[Path, Path]:
    """(dev root, proc root): the GPU and control nodes (no capability node: the host has none
    for an instance created after the plugin started), a ``/proc/devices`` with the
    ``nvidia-caps`` major and a mig-minors file listing GPU instances 0..63 with compute
    instances 0..7 of each GPU."""
    dev, proc = root / "dev", root / "proc"
    dev.mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).touch()
    lines = ["config 1", "monitor 2"]
    for minor in gpu_minors:
        (dev / f"nvidia{minor}").touch()
        for gi in range(64):
            lines.append(f"gpu{minor}/gi{gi}/access {cap_minors(minor, gi, None)}")
            for ci in range(8):
                lines.append(f"gpu{minor}/gi{gi}/ci{ci}/access {cap_minors(minor, gi, ci)}")
    (proc / MIG_MINORS_FILE).parent.mkdir(parents=True)
    (proc / MIG_MINORS_FILE).write_text("\n".join(lines) + "\n")
    (proc / "devices").write_text(f"Character devices:\n195 nvidia\n{CAPS_MAJOR} nvidia-caps\n")
    return dev, proc


# --- the invariants ---------------------------------------------------------------------------


def owned_instances(state: DeviceState, devices: NodeDevices) -> dict[tuple[str, int], str]:
    """(parent UUID, GPU instance) -> claim UID, of every completed dynamic MIG device."""
    out: dict[tuple[str, int], str] = {}
    for uid, rec in state.prepared_claims().items():
        if rec.state != STATE_COMPLETED:
            continue
        for d in rec.devices:
            if devices[d.device].dynamic_mig:
                assert d.mig_gpu_instance is not None, f"{uid}: {d.device} has no instance id"
                key = (d.gpu_uuid, d.mig_gpu_instance)
                assert key not in out, f"instance {key} recorded twice"
                out[key] = uid
    return out


def check_invariants(
    state: DeviceState,
    devices: NodeDevices,
    fake: FakePartitioner,
    foreign: Mapping[tuple[str, int], Instance],
    spec_envs: Mapping[str, list[dict[str, str]]] | None = None,
) -> None:
    """After a start or a call that returned: every instance is a prepared claim's or foreign,
    every prepared claim's instance exists where its device is (with a compute instance and the
    recorded UUID), foreign instances are untouched and every placement they overlap is hidden;
    no started record remains; ``spec_envs`` (claim UID -> its devices' environments), when
    given, name the recorded MIG UUIDs. ``foreign`` holds copies of the instances as created.
    """
    claims = state.prepared_claims()
    started = [uid for uid, rec in claims.items() if rec.state != STATE_COMPLETED]
    assert not started, f"started records remain: {started}"
    owned = owned_instances(state, devices)
    present = {(i.parent, i.gi): i for i in fake.all()}
    for key, before in foreign.items():
        assert key in present, f"foreign instance {key} was destroyed"
        now = present[key]
        assert (now.uuid, now.placement, now.ci) == (before.uuid, before.placement, before.ci)
        assert key not in owned, f"foreign instance {key} is taken by claim {owned.get(key)}"
    leaked = set(present) - set(owned) - set(foreign)
    assert not leaked, f"instances no claim owns: {[vars(present[k]) for k in sorted(leaked)]}"
    for uid, rec in claims.items():
        for d in rec.devices:
            nd = devices[d.device]
            if not nd.dynamic_mig:
                continue
            assert d.mig_gpu_instance is not None
            inst = present.get((d.gpu_uuid, d.mig_gpu_instance))
            assert inst is not None, f"{uid}: the instance of {d.device} is gone"
            assert inst.placement == nd.placement and inst.profile == nd.mig_profile
            assert inst.ci == d.mig_compute_instance and inst.ci >= 0
            assert inst.uuid == d.mig_uuid
            if spec_envs is not None:
                envs = spec_envs[uid]
                assert any(
                    e["SHAREGPU_DEVICE"] == d.device and e["NVIDIA_VISIBLE_DEVICES"] == inst.uuid
                    for e in envs
                ), f"{uid}: the spec does not name {inst.uuid}"
    # Hidden: what the hardware rule refuses next to the foreign instances of the GPU.
    hidden = {
        nd.name
        for nd in devices
        if nd.mig_profile is not None
        and nd.placement is not None
        and placement_problem(
            nd.gpu.mig_profiles,
            [
                (f.profile.profile_id, f.placement)
                for f in foreign.values()
                if f.parent == nd.gpu.uuid
            ],
            nd.mig_profile.profile_id,
            nd.placement,
        )
        is not None
    }
    assert state.hidden_devices() == hidden


def spec_envs_of(cdi_files: Iterable[Path]) -> dict[str, list[dict[str, str]]]:
    """Claim UID -> the environment of each device of its spec file."""
    out: dict[str, list[dict[str, str]]] = {}
    for path in cdi_files:
        doc: dict[str, Any] = json.loads(path.read_text())
        envs = [
            dict(e.split("=", 1) for e in d["containerEdits"].get("env", []))
            for d in doc["devices"]
        ]
        out[envs[0]["SHAREGPU_CLAIM_UID"]] = envs
    return out
