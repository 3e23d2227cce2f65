"""``sharegpu devices``: this node's GPUs and the ResourceSlices the plugin would publish."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, Final

from api import names
from api.jsontypes import Obj
from api.quantity import format_bytes_human, format_quantity
from kubeletplugin.model import GpuInfo, MigProfile
from sharegpuctl.cli.common import (
    EXIT_OK,
    LocalNode,
    add_node_flags,
    add_output_flag,
    compact_names,
    local_node,
    slice_summary,
)
from sharegpuctl.cli.output import Table, emit, resolve_format

HELP = "show this node's GPUs and the ResourceSlices that would be published"
MIB: Final = 1024 * 1024


def add_parser(sub: Any) -> None:
    p = sub.add_parser("devices", help=HELP, description=HELP + ".")
    add_node_flags(p, default_backend=names.NVML_BACKEND)
    add_output_flag(p)
    p.set_defaults(run=run)


def gpu_json(gpu: GpuInfo) -> Obj:
    """One GPU as ``sharegpu devices -o json`` reports it."""
    return {
        "index": gpu.index,
        "minor": gpu.minor,
        "uuid": gpu.uuid,
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": gpu.cuda_compute_capability,
        "driverVersion": gpu.driver_version,
        "cudaDriverVersion": gpu.cuda_driver_version,
        "pciBusID": gpu.pci_bus_id,
        "pcieRoot": gpu.pcie_root,
        "numaNode": gpu.numa_node,
        "nvlinkDomain": gpu.nvlink_domain,
        "memory": {
            "total": format_quantity(gpu.memory_total),
            "reserved": format_quantity(gpu.memory_reserved),
            "usable": format_quantity(gpu.memory_usable),
            "infoVersion": gpu.memory_info_version,
        },
        "migMode": gpu.mig_mode,
        "migProfiles": [mig_profile_json(p) for p in gpu.mig_profiles],
        "notes": list(gpu.notes),
    }


def mig_profile_json(profile: MigProfile) -> Obj:
    """One MIG profile a GPU can create, as ``sharegpu devices -o json`` reports it."""
    return {
        "name": profile.name,
        "id": profile.profile_id,
        "sliceCount": profile.slice_count,
        "instanceCount": profile.instance_count,
        "memory": format_quantity(profile.memory_mb * MIB),
        "multiprocessors": profile.multiprocessors,
        "placements": [{"start": p.start, "size": p.size} for p in profile.placements],
    }


def counter_sets(slices: Sequence[Obj]) -> list[Obj]:
    """Every shared counter set of the slices: ``{"name", "counters": {name: value}}``."""
    return [
        {
            "name": str(c.get("name")),
            "counters": {k: str(v.get("value")) for k, v in (c.get("counters") or {}).items()},
        }
        for s in slices
        for c in (s.get("spec") or {}).get("sharedCounters") or []
    ]


def mig_tables(node: LocalNode) -> list[Table]:
    """Dynamic MIG: per GPU in MIG mode, its profiles and the devices published for their
    placements; and the counter sets those devices consume."""
    if node.mig_strategy != names.MIG_STRATEGY_DYNAMIC:
        return []
    profiles = Table(
        ["GPU", "PROFILE", "ID", "SLICES", "MEMORY", "MAX", "PLACEMENTS (START:SIZE)", "DEVICES"],
        title="MIG profiles published as placement devices (--mig dynamic; MAX: instances)",
    )
    for g in node.gpus:
        for p in g.mig_profiles:
            starts = sorted(p.placements)
            profiles.add(
                g.index,
                p.name,
                p.profile_id,
                p.slice_count,
                format_bytes_human(p.memory_mb * MIB),
                p.instance_count,
                " ".join(f"{pl.start}:{pl.size}" for pl in starts),
                compact_names(
                    [names.mig_placement_device_name(g.index, p.name, pl.start) for pl in starts],
                    limit=2,
                ),
            )
    if not profiles.rows:
        return []
    sets = Table(["COUNTER SET", "COUNTERS"], title="Shared counters")
    for c in counter_sets(node.slices):
        sets.add(c["name"], ", ".join(f"{k}={v}" for k, v in c["counters"].items()))
    return [profiles, sets]


def report(node: LocalNode) -> tuple[Obj, list[Table]]:
    """The data and the tables of the command."""
    summary = slice_summary(node.slices)
    data: Obj = {
        "node": node.node_name,
        "driver": node.driver,
        "backend": node.backend,
        "sharingMode": node.sharing_mode,
        "migStrategy": node.mig_strategy,
        "gpus": [gpu_json(g) for g in node.gpus],
        "resourceSlices": {
            "count": len(summary),
            "devices": sum(s["devices"] for s in summary),
            "counterSets": sum(s["counterSets"] for s in summary),
            "slices": summary,
            "sharedCounters": counter_sets(node.slices),
        },
    }
    gpus = Table(
        [
            "INDEX",
            "PRODUCT",
            "UUID",
            "MEMORY (USABLE/TOTAL)",
            "CC",
            "PCIE ROOT",
            "NUMA",
            "NVLINK",
            "MIG",
        ],
        title=f"GPUs on node {node.node_name} ({node.backend} backend)",
    )
    for g in node.gpus:
        gpus.add(
            g.index,
            g.product_name,
            g.uuid,
            f"{format_bytes_human(g.memory_usable)}/{format_bytes_human(g.memory_total)}",
            g.cuda_compute_capability,
            g.pcie_root or "-",
            "-" if g.numa_node is None else g.numa_node,
            g.nvlink_domain or "-",
            g.mig_mode or "-",
        )
    tables = [gpus]
    notes = Table(["INDEX", "NOTE"], title="Discovery notes")
    for g in node.gpus:
        for note in g.notes:
            notes.add(g.index, note)
    if notes.rows:
        tables.append(notes)
    slices = Table(
        ["SLICE", "DEVICES", "COUNTER SETS", "NAMES"],
        title=f"ResourceSlices that would be published (driver {node.driver}, sharing mode "
        f"{node.sharing_mode}): {len(summary)} slice(s), {data['resourceSlices']['devices']} "
        f"device(s), {data['resourceSlices']['counterSets']} counter set(s)",
    )
    for s in summary:
        slices.add(
            s["name"],
            s["devices"],
            s["counterSets"],
            compact_names(s["deviceNames"] or s["counterSetNames"]) or "-",
        )
    tables.append(slices)
    tables += mig_tables(node)
    return data, tables


def run(args: argparse.Namespace) -> int:
    data, tables = report(local_node(args))
    emit(data, tables, resolve_format(args.output))
    return EXIT_OK
