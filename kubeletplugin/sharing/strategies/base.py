"""What a sharing strategy provides (:class:`SharingStrategy` and its :class:`StrategyNode`), and
the rules every strategy shares.

A strategy is registered once (:mod:`kubeletplugin.sharing.strategies.registry`) as a stateless
:class:`SharingStrategy`: its name (the GpuConfig ``sharing.strategy`` value), which strategies
it may share a GPU with, its pure planning and its checkpoint settings. Each enforcer asks it
once for a :class:`StrategyNode` (:meth:`SharingStrategy.on_node`), which owns the strategy's
node state (daemons, intervals, directories) and drives the node for it.

Invariants the enforcer relies on:

- planning is pure: :meth:`SharingStrategy.plan`, :meth:`~SharingStrategy.check_claim` and
  :meth:`~SharingStrategy.conflict` read their arguments only;
- the caps a device is enforced at come from :func:`enforced_caps` (one home for the rule
  "requested cores and memory, or the burst limit, or an override at most those");
- a node's methods for one GPU are called under that GPU's lock (the enforcer holds it);
- :meth:`StrategyNode.acquire` either succeeds or undoes its own part and raises
  :class:`~kubeletplugin.sharing.enforcement.ShareError`; :meth:`StrategyNode.undo` undoes a
  successful ``acquire`` (another strategy of the claim failed after it) and never raises;
- :meth:`StrategyNode.restore` acts only on GPUs of the node and logs what it cannot do.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from api import burst
from api.gpuconfig import GpuConfig
from api.names import CORES_PER_GPU
from api.quantity import format_bytes_human
from kubeletplugin.containeredits import ContainerEdits
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.model import GpuInfo
from kubeletplugin.runner import Runner
from kubeletplugin.sharing.daemons import DaemonLauncher
from kubeletplugin.sharing.enforcement import ShareError
from kubeletplugin.sharing.shm import DEFAULT_SHM_BYTES, ShmMounter

log = logging.getLogger(__name__)

#: The enforced devices of every held claim, by claim UID (each device with its enforcement).
HeldClaims = Mapping[str, Sequence[DeviceRecord]]


class SettingsError(ValueError):
    """A strategy's checkpoint setting that does not decode; the message names the field."""


@dataclass(frozen=True)
class StrategySetup:
    """What a node's strategies work with: the runner of the driver's tools, the plugin's data
    directory, the MPS daemon launcher and shared-memory mounter, and the plugin's flags that
    tune a strategy (``--mps-root``, ``--mps-shm-size``, ``--limits-library``)."""

    runner: Runner
    data_dir: Path
    launcher: DaemonLauncher
    shm: ShmMounter
    shm_bytes: int = DEFAULT_SHM_BYTES
    mps_root: Path | None = None
    limits_library: str | None = None


@dataclass(frozen=True)
class Release:
    """One strategy's part in releasing a claim: the GPUs whose locks it needs, and ``settle``,
    run under those locks with the claims held then; it returns the problems (each a sentence)
    that it could not fix (they are retried by the next release)."""

    gpus: frozenset[str]
    settle: Callable[[HeldClaims], list[str]]


NO_RELEASE = Release(frozenset(), lambda held: [])


class StrategyNode(Protocol):
    """A strategy's state on one node and the node effects that change it."""

    @property
    def state_key(self) -> str | None:
        """The key of this strategy's node state in the enforcer's exported state (None: it
        keeps none in the checkpoint)."""
        ...

    def acquire(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        """Drive the node for the claim's devices of this strategy (``held``, each decided);
        raise ShareError after undoing this call's part."""
        ...

    def undo(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        """Undo a successful :meth:`acquire` of the same devices; never raises."""
        ...

    def release(
        self, claim_uid: str, released: Sequence[DeviceRecord], held: HeldClaims
    ) -> Release:
        """The release of ``claim_uid`` (its devices of this strategy: ``released``; ``held``:
        the claims held without it), also retrying what an earlier release left undone."""
        ...

    def export_state(self) -> dict[str, Any]:
        """This strategy's node state, JSON-serialisable (read back by :meth:`restore`)."""
        ...

    def restore(
        self, state: Mapping[str, Any] | None, held: HeldClaims, node_gpus: frozenset[str]
    ) -> None:
        """After a restart: resume ``held`` (every prepared claim's enforced devices, of every
        strategy) from ``state`` (what :meth:`export_state` wrote, unchecked, None when lost)
        and undo what no held claim needs; only GPUs in ``node_gpus`` are acted on."""
        ...

    def edits(
        self,
        claim_uid: str,
        device: DeviceRecord,
        caps: tuple[int, int],
        visible: Sequence[GpuInfo],
    ) -> ContainerEdits:
        """The container edits enforcing ``caps`` (cores, memory bytes: the total of the
        device's container group, :func:`group_caps`) on the device; ``visible``: the GPUs the
        container sees, in CUDA order."""
        ...


class SharingStrategy(Protocol):
    """One GpuConfig strategy: its rules, its pure planning and its checkpoint settings."""

    @property
    def name(self) -> str:
        """The GpuConfig ``sharing.strategy`` value."""
        ...

    @property
    def shares_gpu_with(self) -> frozenset[str]:
        """The strategies other claims may use on a GPU this strategy uses."""
        ...

    @property
    def mixes_in_claim(self) -> bool:
        """Whether one claim may use another strategy beside this one on a GPU."""
        ...

    @property
    def on_mig(self) -> bool:
        """Whether a MIG device may use this strategy."""
        ...

    def plan(
        self, share: DeviceRecord, config: GpuConfig, setup: StrategySetup, label: str
    ) -> Enforcement:
        """The enforcement of ``share`` under ``config`` (resolved, naming this strategy);
        ShareError, prefixed with ``label``, when it cannot be enforced."""
        ...

    def check_claim(self, held: Sequence[DeviceRecord]) -> None:
        """Claim-wide rules of this strategy over all the claim's enforced devices (``held``);
        ShareError when one is broken."""
        ...

    def conflict(self, ours: Enforcement, theirs: Enforcement) -> str | None:
        """Why ``ours`` cannot share its GPU with another claim's ``theirs`` (a strategy in
        :attr:`shares_gpu_with`), or None."""
        ...

    def setting_from_json(self, value: Any, where: str) -> str | None:
        """The device's recorded setting (:attr:`Enforcement.interval`, JSON ``interval``)
        read back from a checkpoint; SettingsError naming ``where`` when it does not fit."""
        ...

    def on_node(self, setup: StrategySetup) -> StrategyNode:
        """This strategy's state on a node (one per enforcer)."""
        ...


def enforced_caps(
    share: DeviceRecord,
    label: str,
    *,
    config: GpuConfig | None = None,
    cores: tuple[str, int | None] = ("", None),
    memory: tuple[str, int | None] = ("", None),
) -> tuple[int, int]:
    """(cores, memory bytes) a device's container is limited to: the share's caps (its requested
    cores and memory, or the ``burstLimit`` of ``config`` where set, :func:`api.burst.share_caps`;
    the enforcer has judged that limit against the DeviceClass's policy), or a GpuConfig override
    (``(field, value)``, e.g. ``("mps.activeThreadPercentage", 40)``) that is at most the caps;
    ShareError naming the field when it is above."""
    sharing = config.sharing if config is not None else None
    cap_cores, cap_memory = burst.share_caps(sharing, share.cores, share.memory)
    whose = "the share's burstLimit" if sharing and sharing.burst_limit else "the share's"
    cores_field, cores_override = cores
    memory_field, memory_override = memory
    if cores_override is not None and cores_override > cap_cores:
        raise ShareError(
            f"{label}: sharing.{cores_field} {cores_override} is above {whose} {cap_cores} cores"
        )
    if memory_override is not None and memory_override > cap_memory:
        raise ShareError(
            f"{label}: sharing.{memory_field} {format_bytes_human(memory_override)} is above "
            f"{whose} memory {format_bytes_human(cap_memory)}"
        )
    return (
        cap_cores if cores_override is None else cores_override,
        cap_memory if memory_override is None else memory_override,
    )


def group_caps(
    held: Sequence[DeviceRecord],
) -> dict[tuple[tuple[str, ...], str, str], tuple[int, int]]:
    """(cores, memory bytes) one container is limited to, per (requests, GPU, strategy): devices
    of one request on one GPU are injected together, so their limits add up (cores at most the
    GPU's)."""
    groups: dict[tuple[tuple[str, ...], str, str], list[Enforcement]] = defaultdict(list)
    for d in held:
        groups[(d.requests, d.gpu.uuid, d.enforced.strategy)].append(d.enforced)
    return {
        key: (
            min(CORES_PER_GPU, sum(e.limit_cores for e in group)),
            sum(e.limit_memory for e in group),
        )
        for key, group in groups.items()
    }


def no_setting(name: str, value: Any, where: str) -> None:
    """The setting check of a strategy that has none: ``value`` must be absent."""
    if value is not None:
        raise SettingsError(f"{where} is set for strategy {name}")


def of_strategy(name: str, devices: Sequence[DeviceRecord]) -> list[DeviceRecord]:
    """The decided ``devices`` that use strategy ``name``."""
    return [d for d in devices if d.enforced.strategy == name]


def on_node_gpus(found: Mapping[str, str], known: Collection[str], what: str) -> dict[str, str]:
    """The entries of ``found`` (by GPU UUID, from a checkpoint) for GPUs this node has; the
    others are logged and dropped, never acted on."""
    for uuid in sorted(set(found) - set(known)):
        log.warning("ignoring the recorded %s of %r: this node has no such GPU", what, uuid)
    return {uuid: value for uuid, value in found.items() if uuid in known}


class NoNodeEffects:
    """The node part of a strategy that changes nothing on the node and adds no edits."""

    state_key: str | None = None

    def acquire(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        return None

    def undo(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        return None

    def release(
        self, claim_uid: str, released: Sequence[DeviceRecord], held: HeldClaims
    ) -> Release:
        return NO_RELEASE

    def export_state(self) -> dict[str, Any]:
        return {}

    def restore(
        self, state: Mapping[str, Any] | None, held: HeldClaims, node_gpus: frozenset[str]
    ) -> None:
        return None

    def edits(
        self,
        claim_uid: str,
        device: DeviceRecord,
        caps: tuple[int, int],
        visible: Sequence[GpuInfo],
    ) -> ContainerEdits:
        return ContainerEdits()
