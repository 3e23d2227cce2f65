"""The share enforcer (:class:`~kubeletplugin.sharing.enforcement.ShareEnforcer`): GpuConfig
strategies turned into node state and per-device container edits, each strategy through its
entry in a :class:`~kubeletplugin.sharing.strategies.registry.StrategyRegistry`.

Invariants, per claim: each device's GpuConfig is resolved by
:meth:`api.gpuconfig.DriverConfigs.resolve`, its ``burstLimit`` is judged against the
DeviceClass's ``burstPolicy`` (:mod:`api.burst`) and it is planned by its strategy (whose
overrides never exceed the share's caps: its request, or the burst limit); under the locks of
its GPUs the claim's strategies must coexist with each other and with the other claims'
(:attr:`SharingStrategy.shares_gpu_with`,
:attr:`~SharingStrategy.mixes_in_claim`, :meth:`~SharingStrategy.conflict`) and granted cores
and memory never exceed the GPU's; adminAccess allocations are neither counted nor enforced.
Every GPU fact comes from the record's attached GPU (:attr:`DeviceRecord.gpu`). Strategies act
on the node in registry order; when one fails, those before it are undone in reverse order.
``restore`` hands every strategy the prepared claims, ``release`` every strategy the released
claim, so each can undo what no surviving claim needs and retry what an earlier release left
undone. This module names no strategy."""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, TypeVar

from api import burst, sharepolicy
from api.gpuconfig import DriverConfigs, GpuConfig, GpuConfigError, default_strategy
from api.names import CORES_PER_GPU
from api.quantity import format_bytes_human
from kubeletplugin.containeredits import ContainerEdits, visible_gpus
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.runner import Runner
from kubeletplugin.sharing.daemons import DaemonLauncher
from kubeletplugin.sharing.enforcement import Applied, Decisions, ShareError
from kubeletplugin.sharing.shm import DEFAULT_SHM_BYTES, PlainDirectory, ShmMounter
from kubeletplugin.sharing.strategies.base import (
    Release,
    StrategyNode,
    StrategySetup,
    group_caps,
    of_strategy,
)
from kubeletplugin.sharing.strategies.registry import DEFAULT_REGISTRY, StrategyRegistry

STATE_VERSION: Final = 2

_Node = TypeVar("_Node")


def takes_whole_gpu(share: DeviceRecord) -> bool:
    """:func:`api.sharepolicy.takes_whole_gpu` of ``share``: such a share defaults to
    Exclusive, like a whole-GPU allocation."""
    return sharepolicy.takes_whole_gpu(
        partition=share.partition is not None,
        cores=share.cores,
        memory=share.memory,
        memory_usable=share.gpu.memory_usable,
    )


def _label(share: DeviceRecord) -> str:
    quoted = ", ".join(f'"{r}"' for r in share.requests)
    return f"device {share.device} (request {quoted})"


class SharingEnforcer:
    """Enforces shares with the strategies of a registry (see module doc)."""

    def __init__(
        self,
        runner: Runner,
        data_dir: str | Path,
        *,
        driver_name: str,
        launcher: DaemonLauncher,
        limits_library: str | None = None,
        mps_root: str | Path | None = None,
        shm: ShmMounter | None = None,
        shm_bytes: int = DEFAULT_SHM_BYTES,
        strategies: StrategyRegistry = DEFAULT_REGISTRY,
    ) -> None:
        """The registry's strategies each get a :class:`StrategySetup` of the arguments (the
        node's tools and the plugin flags that tune a strategy) and make their node part."""
        self.driver_name = driver_name
        self.setup = StrategySetup(
            runner=runner,
            data_dir=Path(data_dir),
            launcher=launcher,
            shm=shm or PlainDirectory(),
            shm_bytes=shm_bytes,
            mps_root=None if mps_root is None else Path(mps_root),
            limits_library=limits_library,
        )
        self.strategies = strategies
        #: Each strategy's node part, in registry order.
        self.nodes: Mapping[str, StrategyNode] = {
            name: strategy.on_node(self.setup) for name, strategy in strategies.items()
        }
        #: The enforced devices of each claim (records with ``enforcement`` set; adminAccess
        #: devices are left out).
        self._held: dict[str, tuple[DeviceRecord, ...]] = {}
        self._lock = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)

    def node_of(self, kind: type[_Node]) -> _Node:
        """The node part of the strategy whose node part is a ``kind`` (for tests, the demo
        and the CLI)."""
        found = [n for n in self.nodes.values() if isinstance(n, kind)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} strategies have a {kind.__name__}")
        return found[0]

    # --- the seam ---

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceRecord], configs: DriverConfigs
    ) -> Applied:
        with self._lock:
            known = claim_uid in self._held
        if known:
            self.release(claim_uid)
        decisions = tuple(None if d.admin_access else self._plan(d, configs) for d in devices)
        held = _decided(devices, decisions)
        for name in self.strategies:
            if of_strategy(name, held):
                self.strategies[name].check_claim(held)
        uuids = sorted({d.gpu.uuid for d in held})
        with self._locked(uuids):
            self._check_against_others(claim_uid, held)
            self._drive_node(claim_uid, held)
            with self._lock:
                self._held[claim_uid] = held
        return Applied(decisions=decisions, device_edits=self._edits(claim_uid, devices, held))

    def release(self, claim_uid: str) -> None:
        with self._lock:
            released = self._held.pop(claim_uid, ())
            held = dict(self._held)
        # Every strategy retries what an earlier release left undone (a failed daemon stop, an
        # unrestored interval), so each is asked even when the claim did not use it.
        parts: list[Release] = [
            node.release(claim_uid, of_strategy(name, released), held)
            for name, node in self.nodes.items()
        ]
        uuids = sorted({d.gpu.uuid for d in released}.union(*(p.gpus for p in parts)))
        problems: list[str] = []
        with self._locked(uuids):
            for part in parts:
                problems += part.settle(self.held())
        if problems:
            raise ShareError("; ".join(problems))

    def export_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"version": STATE_VERSION}
        for node in self.nodes.values():
            if node.state_key is not None:
                state[node.state_key] = node.export_state()
        return state

    def restore(
        self,
        state: Mapping[str, Any] | None,
        prepared: Mapping[str, Sequence[DeviceRecord]],
        *,
        node_gpus: Collection[str],
    ) -> dict[str, Applied]:
        state = state if isinstance(state, Mapping) else {}
        known = frozenset(node_gpus)
        decisions = {
            claim_uid: tuple(
                None if d.admin_access else d.enforcement or _default_enforcement(d)
                for d in devices
            )
            for claim_uid, devices in prepared.items()
        }
        with self._lock:
            for claim_uid, devices in prepared.items():
                self._held[claim_uid] = _decided(devices, decisions[claim_uid])
            held = dict(self._held)
        for node in self.nodes.values():
            recorded = None if node.state_key is None else state.get(node.state_key)
            node.restore(recorded if isinstance(recorded, Mapping) else None, held, known)
        return {
            claim_uid: Applied(
                decisions=decisions[claim_uid],
                device_edits=self._edits(claim_uid, devices, held[claim_uid]),
            )
            for claim_uid, devices in prepared.items()
        }

    # --- views for tests, the demo and the CLI ---

    def held(self) -> dict[str, tuple[DeviceRecord, ...]]:
        """The enforced devices by claim UID (each with its ``enforcement``)."""
        with self._lock:
            return dict(self._held)

    def usage(self) -> dict[str, tuple[int, int]]:
        """``{gpu_uuid: (held cores, held memory bytes)}`` over all claims."""
        totals: dict[str, tuple[int, int]] = {}
        for held in self.held().values():
            for d in held:
                cores, memory = totals.get(d.gpu.uuid, (0, 0))
                totals[d.gpu.uuid] = (cores + d.cores, memory + d.memory)
        return totals

    # --- planning ---

    def _plan(self, share: DeviceRecord, configs: DriverConfigs) -> Enforcement:
        label = _label(share)
        shared = share.is_share and not takes_whole_gpu(share)
        try:
            resolved = [configs.resolve(request, shared=shared) for request in share.requests]
        except GpuConfigError as exc:
            raise ShareError(f"{label}: invalid GpuConfig: {exc}") from None
        if not resolved:
            raise ShareError(f"{label}: the allocation names no request")
        config = resolved[0]
        if any(other != config for other in resolved[1:]):
            raise ShareError(
                f"{label}: the requests sharing this device resolve to different GpuConfigs; "
                "give them one config"
            )
        name = config.strategy or default_strategy(shared)
        strategy = self.strategies.get(name)
        if strategy is None:
            raise ShareError(
                f"{label}: this node's plugin has no strategy {name} "
                f"(known: {self.strategies.known()})"
            )
        if share.gpu.mig is not None and not strategy.on_mig:
            allowed = ", ".join(s.name for s in self.strategies.values() if s.on_mig)
            raise ShareError(
                f"{label}: MIG device {share.gpu.uuid} ({share.gpu.mig.profile}) supports only "
                f"strategy {allowed}, not {name}: a MIG device is already an "
                "isolated slice of its GPU"
            )
        _check_burst_limit(config, configs, share, label)
        return strategy.plan(share, config, self.setup, label)

    def _check_against_others(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        gpus = {d.gpu.uuid: d.gpu for d in held}
        with self._lock:
            others = [
                (uid, d)
                for uid, devices in self._held.items()
                if uid != claim_uid
                for d in devices
                if d.gpu.uuid in gpus
            ]
        for mine in held:
            uuid, ours = mine.gpu.uuid, mine.enforced
            strategy = self.strategies[ours.strategy]
            for other in held:
                theirs = other.enforced
                if (
                    other is not mine
                    and other.gpu.uuid == uuid
                    and theirs.strategy != ours.strategy
                    and not (
                        strategy.mixes_in_claim and self.strategies[theirs.strategy].mixes_in_claim
                    )
                ):
                    raise ShareError(
                        f"device {mine.device}: strategy {ours.strategy} cannot share GPU "
                        f"{uuid} with strategy {theirs.strategy} of device "
                        f"{other.device} in the same claim"
                    )
            for uid, other in others:
                theirs = other.enforced
                if other.gpu.uuid != uuid:
                    continue
                if theirs.strategy not in strategy.shares_gpu_with:
                    raise ShareError(
                        f"device {mine.device}: strategy {ours.strategy} cannot share GPU "
                        f"{uuid} with strategy {theirs.strategy} already used there "
                        f"by claim {uid}"
                    )
                conflict = strategy.conflict(ours, theirs)
                if conflict is not None:
                    raise ShareError(
                        f"device {mine.device}: {conflict} already used on GPU {uuid} "
                        f"by claim {uid}"
                    )
        for uuid, gpu in gpus.items():
            held_cores = sum(d.cores for _, d in others if d.gpu.uuid == uuid)
            held_memory = sum(d.memory for _, d in others if d.gpu.uuid == uuid)
            new_cores = sum(d.cores for d in held if d.gpu.uuid == uuid)
            new_memory = sum(d.memory for d in held if d.gpu.uuid == uuid)
            if held_cores + new_cores > CORES_PER_GPU or held_memory + new_memory > (
                gpu.memory_usable
            ):
                raise ShareError(
                    f"GPU {uuid} (gpu-{gpu.index}) cannot hold this claim's {new_cores} cores "
                    f"and {format_bytes_human(new_memory)}: other claims already hold "
                    f"{held_cores} of {CORES_PER_GPU} cores and "
                    f"{format_bytes_human(held_memory)} of "
                    f"{format_bytes_human(gpu.memory_usable)}"
                )

    # --- node state ---

    def _drive_node(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        """Each strategy of the claim acquires its part, in registry order; when one fails
        (it undid its own part), those before it are undone in reverse order."""
        done: list[tuple[StrategyNode, list[DeviceRecord]]] = []
        try:
            for name, node in self.nodes.items():
                mine = of_strategy(name, held)
                if mine:
                    node.acquire(claim_uid, mine)
                    done.append((node, mine))
        except ShareError:
            for node, mine in reversed(done):
                node.undo(claim_uid, mine)
            raise

    @contextlib.contextmanager
    def _locked(self, uuids: Sequence[str]) -> Iterator[None]:
        with self._lock:
            locks = [self._gpu_locks[u] for u in sorted(set(uuids))]
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    # --- container edits ---

    def _edits(
        self, claim_uid: str, devices: Sequence[DeviceRecord], held: Sequence[DeviceRecord]
    ) -> tuple[ContainerEdits, ...]:
        """Per-device edits (``held``: the enforced ones among ``devices``, decided), each from
        its strategy. Devices of one request on one GPU are injected together and share one set
        of variables, so each carries the group's total caps (:func:`group_caps`); ``visible``
        is what the container sees with the device (``containeredits.visible_gpus``)."""
        caps = group_caps(held)
        decided = iter(held)
        visible = visible_gpus([d.requests for d in devices], [d.gpu for d in devices])
        edits: list[ContainerEdits] = []
        for i, device in enumerate(devices):
            if device.admin_access:
                edits.append(ContainerEdits())
                continue
            d = next(decided)
            strategy = d.enforced.strategy
            edits.append(
                self.nodes[strategy].edits(
                    claim_uid, d, caps[(d.requests, d.gpu.uuid, strategy)], visible[i]
                )
            )
        return tuple(edits)


def _decided(devices: Sequence[DeviceRecord], decisions: Decisions) -> tuple[DeviceRecord, ...]:
    """The devices with a decision, each carrying it (``decisions[i]`` is ``devices[i]``'s)."""
    return tuple(
        replace(d, enforcement=e) for d, e in zip(devices, decisions, strict=True) if e is not None
    )


def _default_enforcement(d: DeviceRecord) -> Enforcement:
    """What a device recorded without a decision gets at restore (a claim rebuilt from its CDI
    spec, or recorded by a plugin that kept none): the default strategy, limited to its share."""
    return Enforcement(
        strategy=default_strategy(d.is_share and not takes_whole_gpu(d)),
        limit_cores=d.cores,
        limit_memory=d.memory,
    )


def _check_burst_limit(
    config: GpuConfig, configs: DriverConfigs, share: DeviceRecord, label: str
) -> None:
    """ShareError when the share's ``burstLimit`` is one :func:`api.burst.limit_problems`
    refuses under its DeviceClass's policy (a claim's own ``burstPolicy`` included), so that the
    node refuses what admission refuses."""
    try:
        policy = burst.allocation_policy(configs, share.requests[0])
    except GpuConfigError as exc:
        raise ShareError(f"{label}: invalid GpuConfig: {exc}") from None
    problems = burst.limit_problems(
        config.sharing,
        policy,
        cores=share.cores,
        memory=share.memory,
        gpu_memory=share.gpu.memory_usable,
    )
    if problems:
        raise ShareError(f"{label}: " + "; ".join(problems))


@dataclass(frozen=True)
class ShareTools:
    """What enforcement drives on a host: the runner of the driver's tools, the launcher of the
    MPS daemons and the mounter of their shared memory."""

    runner: Runner
    launcher: DaemonLauncher
    shm: ShmMounter


def build_enforcer(
    tools: ShareTools,
    data_dir: str | Path,
    *,
    driver_name: str,
    limits_library: str | None = None,
    mps_root: str | Path | None = None,
    mps_shm_bytes: int = DEFAULT_SHM_BYTES,
) -> SharingEnforcer:
    """The enforcer for a plugin, driving the host through ``tools``."""
    return SharingEnforcer(
        tools.runner,
        data_dir,
        driver_name=driver_name,
        launcher=tools.launcher,
        limits_library=limits_library,
        mps_root=mps_root,
        shm=tools.shm,
        shm_bytes=mps_shm_bytes,
    )
