"""Burstable shares: the one home of the rules on a GpuConfig's ``sharing.burstLimit``.

A share's request (its ``consumedCapacity`` cores and memory) is what kube-scheduler reserves
and GpuQuota counts; a ``burstLimit`` lets the strategy's caps (MPS, Limits) sit above it, up to
the whole GPU. The admission webhook, ``sharegpu validate``/``explain`` and the kubelet plugin
all judge a limit with :func:`limit_problems` and derive the caps with :func:`share_caps`.

Invariants:

- a limit is at least the request and at most the GPU (cores: 100; memory: the GPU's usable
  memory, where known); an amount the limit leaves out is the request's;
- only a DeviceClass config decides what may burst (:func:`class_policy`): compute burst is
  allowed unless the class denies it, memory burst is denied unless the class allows it (one
  tenant's allocation can fail because another took the spare memory: docs/sharing.md); a
  ``burstPolicy`` in a claim's own config is refused (:func:`claim_policy_problems`), so a claim
  never grants itself a burst;
- every problem is one ``<field path>: <problem>`` line naming the DeviceClass when the class
  decides it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from api.gpuconfig import (
    BURST_ALLOWED,
    BURST_DENIED,
    SOURCE_FROM_CLASS,
    ConfigEntry,
    DriverConfigs,
    GpuConfigError,
    Sharing,
)
from api.names import CORES_PER_GPU
from api.quantity import format_quantity

FIELD_LIMIT: Final = "sharing.burstLimit"
FIELD_POLICY: Final = "sharing.burstPolicy"


@dataclass(frozen=True)
class ClassPolicy:
    """What a DeviceClass lets its requests burst; ``position`` is the class config entry that
    set it (None: no entry did, the defaults apply)."""

    compute: bool = True
    memory: bool = False
    position: int | None = None


def class_policy(entries: Iterable[ConfigEntry], request: str) -> ClassPolicy:
    """The policy of the last of a DeviceClass's config ``entries`` that applies to ``request``
    and sets ``sharing.burstPolicy``; none does: compute allowed, memory denied. ``entries``
    are all the class's (the caller picks them: :func:`allocation_class_entries` for an
    allocation, the DeviceClass object's ``spec.config`` at admission)."""
    found = ClassPolicy()
    for entry in entries:
        sharing = entry.config.sharing
        if sharing is None or sharing.burst_policy is None or not entry.applies_to(request):
            continue
        policy = sharing.burst_policy
        found = ClassPolicy(
            compute=policy.compute == BURST_ALLOWED,
            memory=policy.memory == BURST_ALLOWED,
            position=entry.position,
        )
    return found


def allocation_class_entries(configs: DriverConfigs) -> tuple[ConfigEntry, ...]:
    """The entries of an allocation's ``config[]`` that came from the DeviceClass (``source:
    FromClass``): the only ones whose ``burstPolicy`` counts."""
    return tuple(e for e in configs.entries if e.source == SOURCE_FROM_CLASS)


def allocation_policy(configs: DriverConfigs, request: str) -> ClassPolicy:
    """:func:`class_policy` of an allocation's DeviceClass entries for ``request``. Raises
    :class:`~api.gpuconfig.GpuConfigError` when one of the claim's own entries that applies to
    ``request`` sets ``burstPolicy`` (:func:`claim_policy_problems`): the node refuses what
    admission refuses."""
    own = [e for e in configs.entries if e.source != SOURCE_FROM_CLASS and e.applies_to(request)]
    problems = claim_policy_problems(own)
    if problems:
        raise GpuConfigError([f"config[{position}]: {p}" for position, p in problems])
    return class_policy(allocation_class_entries(configs), request)


def claim_policy_problems(entries: Iterable[ConfigEntry]) -> list[tuple[int, str]]:
    """``(position, problem)`` for each of a claim's own entries that sets ``burstPolicy``."""
    return [
        (
            e.position,
            f"{FIELD_POLICY}: only a DeviceClass config may set it (a claim cannot allow "
            "itself to burst; ask for a DeviceClass that allows it)",
        )
        for e in entries
        if e.config.sharing is not None and e.config.sharing.burst_policy is not None
    ]


def _class_named(class_name: str | None) -> str:
    return f'DeviceClass "{class_name}"' if class_name else "the request's DeviceClass"


def _denied(what: str, policy: ClassPolicy, class_name: str | None, allowed_field: str) -> str:
    if policy.position is not None:
        how = f"its config[{policy.position}] sets {FIELD_POLICY}.{allowed_field}: {BURST_DENIED}"
    else:
        default = BURST_ALLOWED if allowed_field == "compute" else BURST_DENIED
        how = (
            f"it sets no {FIELD_POLICY}.{allowed_field}, which defaults to {default}; "
            f"an admin allows it with {FIELD_POLICY}.{allowed_field}: {BURST_ALLOWED} in the "
            "class's config"
        )
    return f"{what} burst is not allowed by {_class_named(class_name)} ({how})"


def limit_problems(
    sharing: Sharing | None,
    policy: ClassPolicy,
    *,
    cores: int | None,
    memory: int | None,
    gpu_memory: int | None = None,
    gpu: str = "the GPU's",
    class_name: str | None = None,
) -> list[str]:
    """Why ``sharing.burstLimit`` is refused for a share that requests ``cores`` and ``memory``
    bytes (None: not known, e.g. at admission before the scheduler applied the policy's
    default) on a GPU with ``gpu_memory`` usable bytes (None: not known; ``gpu`` names it in
    the message, e.g. "the largest GPU's" at admission). Empty: accepted.
    A limit that may raise an amount the class does not let burst is refused; with the request
    unknown, any limit on that amount counts as raising it."""
    limit = sharing.burst_limit if sharing is not None else None
    if limit is None:
        return []
    problems: list[str] = []
    if limit.cores is not None:
        where = f"{FIELD_LIMIT}.cores"
        if cores is not None and limit.cores < cores:
            problems.append(
                f"{where}: {limit.cores} is below the share's {cores} cores request (a limit "
                "is at least the request)"
            )
        elif (cores is None or limit.cores > cores) and not policy.compute:
            problems.append(f"{where}: {_denied('compute', policy, class_name, 'compute')}")
    memory_limit = limit.memory_bytes()
    if memory_limit is not None:
        where = f"{FIELD_LIMIT}.memory"
        if memory is not None and memory_limit < memory:
            problems.append(
                f"{where}: {format_quantity(memory_limit)} is below the share's "
                f"{format_quantity(memory)} memory request (a limit is at least the request)"
            )
        elif gpu_memory is not None and memory_limit > gpu_memory:
            problems.append(
                f"{where}: {format_quantity(memory_limit)} is above {gpu} "
                f"{format_quantity(gpu_memory)} of usable memory (a limit is at most the GPU)"
            )
        elif (memory is None or memory_limit > memory) and not policy.memory:
            problems.append(f"{where}: {_denied('memory', policy, class_name, 'memory')}")
    return problems


def share_caps(sharing: Sharing | None, cores: int, memory: int) -> tuple[int, int]:
    """``(cores, memory bytes)`` a share requesting ``cores`` and ``memory`` may use: its
    ``burstLimit`` where set (accepted by :func:`limit_problems`), else the request; cores
    never above the GPU's."""
    limit = sharing.burst_limit if sharing is not None else None
    if limit is None:
        return cores, memory
    return limit_caps((limit.cores, limit.memory_bytes()), cores, memory)


#: ``(cores, memory bytes)`` of a ``burstLimit``, None for an amount it leaves out.
LimitAmounts = tuple[int | None, int | None]


def configured_limit(configs: DriverConfigs | None, request: str) -> LimitAmounts | None:
    """The ``burstLimit`` of the config that applies to a share of ``request`` (the node's
    resolution, :meth:`~api.gpuconfig.DriverConfigs.resolve`); None without one, or when the
    entries are invalid (the node refuses the claim)."""
    if configs is None or configs.problems:
        return None
    sharing = configs.resolve(request, shared=True).sharing
    limit = sharing.burst_limit if sharing is not None else None
    if limit is None:
        return None
    return limit.cores, limit.memory_bytes()


def limit_caps(limit: LimitAmounts, cores: int, memory: int) -> tuple[int, int]:
    """:func:`share_caps` from a :func:`configured_limit`: each amount at least the request,
    cores at most the GPU's."""
    limit_cores, limit_memory = limit
    return (
        min(CORES_PER_GPU, cores if limit_cores is None else max(cores, limit_cores)),
        memory if limit_memory is None else max(memory, limit_memory),
    )


def overcommit_ratio(limits: tuple[int, int], capacity: tuple[int, int]) -> str:
    """How far the limits of a GPU's shares exceed its capacity: the larger of the cores and
    memory ratios, with two decimals (``"1.25"``; above 1 the GPU is overcommitted; a capacity
    of 0 counts as ratio 0)."""
    ratios = [0.0 if c <= 0 else v / c for v, c in zip(limits, capacity, strict=True)]
    return f"{max(ratios):.2f}"
