"""The request policy of a shareable GPU (consumable capacity, KEP-5075): the one place for it.

The node plugin publishes it on every consumable device (``kubeletplugin/devices/slices.py``);
the admission checks and the GpuQuota charge derive what a request reserves from it (rounded by
the allocator's ``consumed_amount``, kube-scheduler's rule); the node
plugin, the tracker and the GpuQuota charge read what an allocated share reserves with
:func:`share_reservation` (an amount its ``consumedCapacity`` lacks is the whole). Invariants:
cores are whole percents from the node's smallest share (1 unless it bounds the shares of a
GPU) to 100, with the node's default for a request that names none; memory
is granted in :data:`~api.names.MEMORY_STEP_BYTES` steps from one step up to the largest step
multiple not above the usable memory, and a request without memory takes that largest amount.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from api import names
from api.quantity import format_quantity


def memory_policy_max(usable: int) -> int:
    """Largest multiple of 256Mi that is not above ``usable`` (default and max of a request)."""
    return usable - usable % names.MEMORY_STEP_BYTES


def takes_whole_gpu(*, partition: bool, cores: int, memory: int, memory_usable: int) -> bool:
    """Whether a consumable-capacity share consumes every core and the largest grantable memory
    of a GPU with ``memory_usable`` bytes: what a request without capacity gets (kube-scheduler
    gives it a shareID all the same). Such a share is configured like a whole-GPU allocation. A
    partition device never takes the whole GPU."""
    return (
        not partition
        and cores == names.CORES_PER_GPU
        and memory >= memory_policy_max(memory_usable)
    )


def configured_as_share(
    *, share_id: bool, partition: bool, cores: int, memory: int, memory_usable: int
) -> bool:
    """Whether an allocated device takes a share's default configuration (MPS, see
    :func:`api.gpuconfig.default_strategy`) rather than a whole GPU's: a consumable share
    (``share_id``) or a partition that does not take the whole GPU. The one rule the node
    plugin and the controller both apply."""
    return (share_id or partition) and not takes_whole_gpu(
        partition=partition, cores=cores, memory=memory, memory_usable=memory_usable
    )


#: ``(cores, memory)`` a result's ``consumedCapacity`` records, None for an amount it lacks.
Recorded = tuple[int | None, int | None]


def recorded_amounts(
    consumed: Mapping[str, Any], driver_name: str, parse: Callable[[str, Any], int]
) -> Recorded:
    """The cores and memory ``consumed`` (one result's ``consumedCapacity``) records under the
    plain or driver-qualified name, each read by ``parse(name, value)``."""
    out = []
    for name in (names.CAP_CORES, names.CAP_MEMORY):
        value = names.driver_value(consumed, driver_name, name)
        out.append(None if value is None else parse(name, value))
    return out[0], out[1]


def reserved_amounts(recorded: Recorded | None, whole: tuple[int, int]) -> tuple[int, int]:
    """What a consumable share reserves: each amount its ``consumedCapacity`` records, the
    device's ``whole`` amount for one it lacks (kube-scheduler records every capacity; should
    one be missing, the node grants the whole amount, so the tracker and quota count it so)."""
    if recorded is None:
        return whole
    cores, memory = recorded
    return (whole[0] if cores is None else cores, whole[1] if memory is None else memory)


def share_reservation(
    consumed: Mapping[str, Any] | None,
    driver_name: str,
    whole: tuple[int, int],
    parse: Callable[[str, Any], int],
) -> tuple[int, int]:
    """:func:`reserved_amounts` of ``consumed`` (None: the result recorded no
    ``consumedCapacity``), amounts read by ``parse`` as in :func:`recorded_amounts`."""
    if consumed is None:
        return whole
    return reserved_amounts(recorded_amounts(consumed, driver_name, parse), whole)


def consumable_capacity(
    memory_usable: int, default_cores: int = names.CORES_PER_GPU, min_cores: int = 1
) -> dict[str, Any]:
    """The ``capacity`` of a shareable GPU with ``memory_usable`` bytes: ``cores`` and
    ``memory`` with their request policies (``default_cores`` for a request naming no cores,
    ``min_cores`` the smallest cores a request is charged: it bounds the shares of the GPU)."""
    if not 1 <= min_cores <= default_cores <= names.CORES_PER_GPU:
        raise ValueError(
            f"cores policy needs 1 <= min ({min_cores}) <= default ({default_cores}) <= "
            f"{names.CORES_PER_GPU}"
        )
    memory_max = memory_policy_max(memory_usable)
    step = format_quantity(names.MEMORY_STEP_BYTES)
    cores = format_quantity(names.CORES_PER_GPU)
    return {
        names.CAP_CORES: {
            "value": cores,
            "requestPolicy": {
                "default": format_quantity(default_cores),
                "validRange": {"min": format_quantity(min_cores), "max": cores, "step": "1"},
            },
        },
        names.CAP_MEMORY: {
            "value": format_quantity(memory_usable),
            "requestPolicy": {
                "default": format_quantity(memory_max),
                "validRange": {"min": step, "max": format_quantity(memory_max), "step": step},
            },
        },
    }


def capacity_of_unknown_gpu() -> dict[str, Any]:
    """The :func:`consumable_capacity` assumed where no GPU's memory is known: memory requests
    are rounded up to the step grid (at least one step) with no upper bound, unasked memory is
    0. What a request reserves under it is the allocator's ``consumed_amount``, the one rounding
    rule (kube-scheduler's)."""
    capacity = consumable_capacity(0)
    step = format_quantity(names.MEMORY_STEP_BYTES)
    capacity[names.CAP_MEMORY]["requestPolicy"] = {
        "default": "0",
        "validRange": {"min": step, "step": step},
    }
    return capacity
