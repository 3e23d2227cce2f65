"""MIG devices: their names, the attributes that describe them, and their profile names.

A GPU in MIG mode is split by its administrator (or the GPU Operator's mig-manager) into MIG
devices, each a compute instance of a GPU instance. The plugin publishes each existing MIG device
as one exclusive device and never the GPU itself (:mod:`kubeletplugin.devices.table` decides).

Invariants:
- a MIG device's name is ``gpu-<parent index>-mig-<gpu instance>-<compute instance>``: unique on
  the node because the (GPU instance, compute instance) pair is unique on its parent, and never
  equal to a whole-GPU or partition name (those have no ``-mig-``);
- :func:`profile_name` is a pure function of NVML's numbers, so the same MIG layout gives the
  same profile names on every node.
"""

from __future__ import annotations

import re
from typing import Final

from kubeletplugin.model import GpuInfo

#: ``GpuInfo.mig_mode`` values (NVML's current MIG mode).
MIG_ENABLED: Final = "Enabled"
MIG_DISABLED: Final = "Disabled"

#: The largest number of slices a GPU is cut into (memory fractions are eighths).
MEMORY_FRACTIONS: Final = 8
GIB: Final = 1024**3
MIB: Final = 1024**2

_PROFILE_RE: Final = re.compile(r"^(?:([1-8])c\.)?([1-8])g\.([1-9][0-9]{0,3})gb(\+[a-z]+)?$")


def instance_key(device: GpuInfo) -> tuple[int, int]:
    """``(GPU instance, compute instance)`` of a MIG device: its identity on its parent and the
    order MIG devices are listed in. ValueError for a device that is no MIG device."""
    if device.mig is None:
        raise ValueError(f"{device.uuid} is not a MIG device")
    return device.mig.gpu_instance, device.mig.compute_instance


def mig_device_name(parent_index: int, gpu_instance: int, compute_instance: int) -> str:
    """``gpu-<parent index>-mig-<gpu instance>-<compute instance>``."""
    return f"gpu-{parent_index}-mig-{gpu_instance}-{compute_instance}"


def profile_memory_gb(parent_memory_total: int, memory_mb: int) -> int:
    """The ``<n>gb`` figure of a profile name, computed as NVIDIA's tools name profiles: the MIG
    memory as a fraction of the parent's, rounded up to an eighth, times the parent's memory in
    whole GB (rounded up), rounded half up (never half to even: an H200's 4/8 of 141 GB is
    ``71gb``, as NVML names it, not 70).

    Exact integer arithmetic throughout, so no float error can move a half across.
    H100 80GB (85520809984 bytes): 9856 MiB -> 10, 40192 MiB -> 40, 80896 MiB -> 80;
    H200 (150754820096 bytes): 16384 MiB -> 18, 71424 MiB -> 71.
    Raises ValueError for non-positive sizes.
    """
    if parent_memory_total <= 0 or memory_mb <= 0:
        raise ValueError(
            f"MIG memory {memory_mb} MiB of a GPU with {parent_memory_total} bytes is not a size"
        )
    eighths = -(-memory_mb * MIB * MEMORY_FRACTIONS // parent_memory_total)
    parent_gb = -(-parent_memory_total // GIB)
    # floor(eighths * parent_gb / 8 + 1/2): round half up.
    half = MEMORY_FRACTIONS // 2
    return max(1, (eighths * parent_gb + half) // MEMORY_FRACTIONS)


def profile_name(
    gpu_slices: int, compute_slices: int, parent_memory_total: int, memory_mb: int
) -> str:
    """The MIG profile name: ``<g>g.<n>gb``, or ``<c>c.<g>g.<n>gb`` for a compute instance
    smaller than its GPU instance (the names ``nvidia-smi mig -lgip``/``-lcip`` print).

    Raises ValueError for slice counts outside 1..8 or a compute instance larger than its GPU
    instance."""
    if not 1 <= gpu_slices <= MEMORY_FRACTIONS or not 1 <= compute_slices <= gpu_slices:
        raise ValueError(
            f"MIG slice counts {compute_slices} (compute) of {gpu_slices} (GPU instance) are "
            f"outside 1..{MEMORY_FRACTIONS}"
        )
    memory = profile_memory_gb(parent_memory_total, memory_mb)
    base = f"{gpu_slices}g.{memory}gb"
    return base if compute_slices == gpu_slices else f"{compute_slices}c.{base}"


def parse_profile(profile: str) -> tuple[int, int, int]:
    """``(gpu slices, compute slices, memory GB)`` of a profile name such as ``1g.10gb``,
    ``1c.3g.40gb`` or ``1g.10gb+me``; ValueError naming the profile otherwise."""
    match = _PROFILE_RE.match(profile)
    if match is None:
        raise ValueError(
            f"MIG profile {profile!r} is not of the form <g>g.<n>gb or <c>c.<g>g.<n>gb"
        )
    gpu_slices = int(match.group(2))
    compute_slices = int(match.group(1) or gpu_slices)
    if compute_slices > gpu_slices:
        raise ValueError(f"MIG profile {profile!r}: more compute slices than GPU slices")
    return gpu_slices, compute_slices, int(match.group(3))
