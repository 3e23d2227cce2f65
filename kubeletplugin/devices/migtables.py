"""MIG profiles of known GPUs and the rule that says where a new GPU instance fits.

The reference tables are what NVML reports on an NVIDIA H100 80GB HBM3, an H200, an
A100-SXM4-40GB and an A100-SXM4-80GB (NVIDIA Multi-Instance GPU User Guide, "Supported MIG
Profiles", whose profile names, engines and instance counts these follow, and the ``nvidia-smi
mig -lgip`` / ``-lgipp`` listings for the memory sizes and placements). The H200's names and
memory sizes were read through NVML on an H200 (driver 580); its SM counts are the H100's (the
same GH100 chip with 132 SMs). They back the mock backend (``sharegpu devices --mock``, the
demo, the kill -9 tests) and the fake NVML of the tests; the NVML backend reads the real GPU's
profiles and placements from NVML and never uses these tables.

:func:`placement_problem` is the one statement of the hardware rule that the mock partitioner
and the fake NVML enforce when a GPU instance is created: the published shared counters
(:mod:`kubeletplugin.devices.slices`) model exactly this rule, so kube-scheduler can only pick
combinations that the GPU can place.

Invariants of every table: profiles are ordered by (slice count, memory, profile id); every
placement lies inside the GPU's memory slices (:func:`memory_slices`); the largest profile's
slice count is the GPU's number of compute slices (:func:`compute_slices`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Final

from kubeletplugin.devices.mig import MIB
from kubeletplugin.model import MigPlacement, MigProfile

# NVML_GPU_INSTANCE_PROFILE_* (profile index) and NVML_COMPUTE_INSTANCE_PROFILE_* values.
GI_1_SLICE: Final = 0x0
GI_2_SLICE: Final = 0x1
GI_3_SLICE: Final = 0x2
GI_4_SLICE: Final = 0x3
GI_7_SLICE: Final = 0x4
GI_1_SLICE_REV1: Final = 0x7
GI_1_SLICE_REV2: Final = 0x9
CI_FOR_SLICES: Final = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4}

H100_80GB_PRODUCT: Final = "NVIDIA H100 80GB HBM3"
H200_PRODUCT: Final = "NVIDIA H200"
A100_40GB_PRODUCT: Final = "NVIDIA A100-SXM4-40GB"
A100_80GB_PRODUCT: Final = "NVIDIA A100-SXM4-80GB"


def _placements(starts: Iterable[int], size: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(start, size) for start in starts)


def _profile(
    index: int,
    profile_id: int,
    name: str,
    slices: int,
    instances: int,
    memory_mb: int,
    sms: int,
    engines: tuple[int, int, int, int, int],
    placements: tuple[MigPlacement, ...],
) -> MigProfile:
    copy_engines, decoders, encoders, jpeg, ofa = engines
    return MigProfile(
        profile_id=profile_id,
        profile_index=index,
        name=name,
        slice_count=slices,
        instance_count=instances,
        memory_mb=memory_mb,
        multiprocessors=sms,
        copy_engines=copy_engines,
        decoders=decoders,
        encoders=encoders,
        jpeg_engines=jpeg,
        ofa_engines=ofa,
        placements=placements,
        compute_profile=CI_FOR_SLICES[slices],
    )


#: H100 80GB HBM3. Engines: (copy, decoder, encoder, JPEG, OFA).
H100_80GB: Final = (
    _profile(GI_1_SLICE, 19, "1g.10gb", 1, 7, 9984, 16, (1, 1, 0, 1, 0), _placements(range(7), 1)),
    _profile(
        GI_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 9984, 16, (1, 1, 0, 1, 1), _placements(range(7), 1)
    ),
    _profile(
        GI_1_SLICE_REV2,
        15,
        "1g.20gb",
        1,
        4,
        20096,
        26,
        (1, 1, 0, 1, 0),
        _placements((0, 2, 4, 6), 2),
    ),
    _profile(
        GI_2_SLICE, 14, "2g.20gb", 2, 3, 20096, 32, (2, 2, 0, 2, 0), _placements((0, 2, 4), 2)
    ),
    _profile(GI_3_SLICE, 9, "3g.40gb", 3, 2, 40448, 60, (3, 3, 0, 3, 0), _placements((0, 4), 4)),
    _profile(GI_4_SLICE, 5, "4g.40gb", 4, 1, 40448, 64, (4, 4, 0, 4, 0), _placements((0,), 4)),
    _profile(GI_7_SLICE, 0, "7g.80gb", 7, 1, 81152, 132, (8, 7, 0, 7, 1), _placements((0,), 8)),
)

#: A100-SXM4-40GB. Engines: (copy, decoder, encoder, JPEG, OFA).
A100_40GB: Final = (
    _profile(GI_1_SLICE, 19, "1g.5gb", 1, 7, 4864, 14, (1, 0, 0, 0, 0), _placements(range(7), 1)),
    _profile(
        GI_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 4864, 14, (1, 1, 0, 1, 1), _placements(range(7), 1)
    ),
    _profile(
        GI_1_SLICE_REV2,
        15,
        "1g.10gb",
        1,
        4,
        9856,
        14,
        (1, 1, 0, 0, 0),
        _placements((0, 2, 4, 6), 2),
    ),
    _profile(GI_2_SLICE, 14, "2g.10gb", 2, 3, 9856, 28, (2, 1, 0, 0, 0), _placements((0, 2, 4), 2)),
    _profile(GI_3_SLICE, 9, "3g.20gb", 3, 2, 19968, 42, (3, 2, 0, 0, 0), _placements((0, 4), 4)),
    _profile(GI_4_SLICE, 5, "4g.20gb", 4, 1, 19968, 56, (4, 2, 0, 0, 0), _placements((0,), 4)),
    _profile(GI_7_SLICE, 0, "7g.40gb", 7, 1, 40192, 98, (7, 5, 0, 1, 1), _placements((0,), 8)),
)


def _same_chip(
    base: Sequence[MigProfile], names_and_memory: Sequence[tuple[str, int]]
) -> tuple[MigProfile, ...]:
    """``base``'s profiles (ids, slices, SMs, engines, placements) with the names and memory
    sizes (MiB) of the same chip with more memory, in ``base``'s order."""
    if len(names_and_memory) != len(base):
        raise ValueError(f"{len(names_and_memory)} names for {len(base)} profiles")
    return tuple(
        dataclasses.replace(profile, name=name, memory_mb=memory_mb)
        for profile, (name, memory_mb) in zip(base, names_and_memory, strict=True)
    )


#: H200 (141 GB HBM3e): the H100's layout, with the names and sizes NVML gives on an H200.
H200: Final = _same_chip(
    H100_80GB,
    (
        ("1g.18gb", 16384),
        ("1g.18gb+me", 16384),
        ("1g.35gb", 33280),
        ("2g.35gb", 33280),
        ("3g.71gb", 71424),
        ("4g.71gb", 71424),
        ("7g.141gb", 143360),
    ),
)

#: A100-SXM4-80GB: the A100 40GB's layout with twice the memory (the user guide's names).
A100_80GB: Final = _same_chip(
    A100_40GB,
    (
        ("1g.10gb", 9728),
        ("1g.10gb+me", 9728),
        ("1g.20gb", 19968),
        ("2g.20gb", 19968),
        ("3g.40gb", 40192),
        ("4g.40gb", 40192),
        ("7g.80gb", 80896),
    ),
)

#: Product name as NVML reports it -> its reference table.
REFERENCE_TABLES: Final[dict[str, tuple[MigProfile, ...]]] = {
    H100_80GB_PRODUCT: H100_80GB,
    H200_PRODUCT: H200,
    A100_40GB_PRODUCT: A100_40GB,
    A100_80GB_PRODUCT: A100_80GB,
}

#: Product name -> the GPU's total memory in bytes as NVML reports it (``nvidia-smi`` prints the
#: same figure in MiB), from which the ``<n>gb`` of a profile name is derived.
REFERENCE_MEMORY_TOTAL: Final[dict[str, int]] = {
    H100_80GB_PRODUCT: 81559 * MIB,
    H200_PRODUCT: 143771 * MIB,
    A100_40GB_PRODUCT: 40960 * MIB,
    A100_80GB_PRODUCT: 81920 * MIB,
}


def reference_profiles(product_name: str) -> tuple[MigProfile, ...] | None:
    """The reference table of ``product_name``; None for a GPU without one."""
    return REFERENCE_TABLES.get(product_name)


def memory_slices(profiles: Sequence[MigProfile]) -> int:
    """How many memory slices the GPU has: the end of its furthest placement (8 on A100/H100)."""
    return max((p.start + p.size for prof in profiles for p in prof.placements), default=0)


def compute_slices(profiles: Sequence[MigProfile]) -> int:
    """How many compute slices the GPU has: its largest profile's slice count (7 on A100/H100)."""
    return max((prof.slice_count for prof in profiles), default=0)


def profile_by_id(profiles: Sequence[MigProfile], profile_id: int) -> MigProfile | None:
    """The profile with NVML id ``profile_id``, or None."""
    return next((p for p in profiles if p.profile_id == profile_id), None)


def placement_problem(
    profiles: Sequence[MigProfile],
    existing: Sequence[tuple[int, MigPlacement]],
    profile_id: int,
    placement: MigPlacement,
) -> str | None:
    """Why a GPU instance of ``profile_id`` cannot be created at ``placement`` next to the
    ``existing`` instances (each ``(profile id, placement)``), or None when it fits.

    The rule: the placement is one of the profile's; it shares no memory slice with an existing
    instance; fewer than ``instance_count`` instances of the profile exist; and the compute
    slices of all instances stay within :func:`compute_slices`.
    """
    profile = profile_by_id(profiles, profile_id)
    if profile is None:
        known = ", ".join(f"{p.profile_id} ({p.name})" for p in profiles)
        return f"GPU instance profile {profile_id} is not one of this GPU's ({known})"
    if placement not in profile.placements:
        allowed = ", ".join(f"{p.start}:{p.size}" for p in profile.placements)
        return (
            f"placement {placement.start}:{placement.size} is not a placement of profile "
            f"{profile.name} (allowed start:size: {allowed})"
        )
    for other_id, other in existing:
        if other.overlaps(placement):
            other_profile = profile_by_id(profiles, other_id)
            other_name = other_profile.name if other_profile else f"profile {other_id}"
            return (
                f"placement {placement.start}:{placement.size} overlaps the {other_name} "
                f"instance at {other.start}:{other.size}"
            )
    same = sum(1 for other_id, _ in existing if other_id == profile_id)
    if same >= profile.instance_count:
        return f"profile {profile.name} allows {profile.instance_count} instances; {same} exist"
    used = sum(
        (p.slice_count if (p := profile_by_id(profiles, other_id)) else 0)
        for other_id, _ in existing
    )
    if used + profile.slice_count > compute_slices(profiles):
        return (
            f"{used} of {compute_slices(profiles)} compute slices are in use; profile "
            f"{profile.name} needs {profile.slice_count}"
        )
    return None
