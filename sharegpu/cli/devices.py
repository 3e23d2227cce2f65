"""``sharegpu devices``: this node's GPUs and the ResourceSlices the plugin would publish."""

from __future__ import annotations

import argparse
from typing import Any

from api.quantity import format_bytes_human, format_quantity
from kubeletplugin.model import GpuInfo
from sharegpu.cli.common import (
    EXIT_OK,
    LocalNode,
    Obj,
    add_node_flags,
    add_output_flag,
    compact_names,
    local_node,
    slice_summary,
)
from sharegpu.cli.output import Table, emit, resolve_format

HELP = "show this node's GPUs and the ResourceSlices that would be published"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("devices", help=HELP, description=HELP + ".")
    add_node_flags(p, default_backend="nvml")
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
        "memory": {
            "total": format_quantity(gpu.memory_total),
            "reserved": format_quantity(gpu.memory_reserved),
            "usable": format_quantity(gpu.memory_usable),
            "infoVersion": gpu.memory_info_version,
        },
        "migMode": gpu.mig_mode,
        "notes": list(gpu.notes),
    }


def report(node: LocalNode) -> tuple[Obj, list[Table]]:
    """The data and the tables of the command."""
    summary = slice_summary(node.slices)
    data: Obj = {
        "node": node.node_name,
        "driver": node.driver,
        "backend": node.backend,
        "sharingMode": node.sharing_mode,
        "gpus": [gpu_json(g) for g in node.gpus],
        "resourceSlices": {
            "count": len(summary),
            "devices": sum(s["devices"] for s in summary),
            "counterSets": sum(s["counterSets"] for s in summary),
            "slices": summary,
        },
    }
    gpus = Table(
        ["INDEX", "PRODUCT", "UUID", "MEMORY (USABLE/TOTAL)", "CC", "PCIE ROOT", "NUMA", "MIG"],
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
    return data, tables


def run(args: argparse.Namespace) -> int:
    data, tables = report(local_node(args))
    emit(data, tables, resolve_format(args.output))
    return EXIT_OK
