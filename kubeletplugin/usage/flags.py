"""The usage flags of ``sharegpu-kubeletplugin``: one place for the flags
(:func:`add_usage_flags`) and their checks (:func:`usage_options`), which give plain data
(:class:`UsageOptions`). The sampler is built in :mod:`kubeletplugin.main`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from api.quantity import QuantityError, quantity_int
from kubeletplugin.usage.claims import DEFAULT_MEMORY_THRESHOLD
from kubeletplugin.usage.procfs import cgroup_root_elements

DEFAULT_INTERVAL_S: Final = 10.0
DEFAULT_WRITE_INTERVAL_S: Final = 30.0
DEFAULT_COMPUTE_MARGIN: Final = 10
DEFAULT_PROC_ROOT: Final = Path("/proc")


class UsageFlagError(ValueError):
    """A bad usage flag; the message names the flag and the problem."""


@dataclass(frozen=True)
class UsageOptions:
    """The usage flags, checked. ``enabled`` False: no sampler at all."""

    enabled: bool = True
    interval_s: float = DEFAULT_INTERVAL_S
    #: Seconds between writes of one claim's usage; 0: never written to claims.
    write_interval_s: float = DEFAULT_WRITE_INTERVAL_S
    memory_threshold: int = DEFAULT_MEMORY_THRESHOLD
    compute_margin: int = DEFAULT_COMPUTE_MARGIN
    taint: bool = False
    escape_taint: bool = False
    proc_root: Path = DEFAULT_PROC_ROOT
    #: The kubelet's ``--cgroup-root`` elements (``--usage-kubelet-cgroup-root``): only a
    #: ``kubepods`` right under it holds pods.
    kubelet_cgroup_root: tuple[str, ...] = ()


DEFAULT_USAGE_OPTIONS: Final = UsageOptions()


def add_usage_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--usage-*`` and ``--disable-usage`` flags."""
    g = parser.add_argument_group("measured usage")
    g.add_argument(
        "--disable-usage", action="store_true", help="do not sample the GPUs' compute processes"
    )
    g.add_argument(
        "--usage-interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between samples of each GPU (default {DEFAULT_INTERVAL_S:g})",
    )
    g.add_argument(
        "--usage-write-interval",
        type=float,
        default=DEFAULT_WRITE_INTERVAL_S,
        metavar="SECONDS",
        help="least seconds between writes of a claim's usage into its status.devices (an "
        f"overcommit change is written at once; 0: never written; default "
        f"{DEFAULT_WRITE_INTERVAL_S:g})",
    )
    g.add_argument(
        "--usage-memory-threshold",
        default=f"{DEFAULT_MEMORY_THRESHOLD // 2**20}Mi",
        metavar="QUANTITY",
        help="smallest change of a share's used memory worth writing (also at least 5%% of the "
        "share; default %(default)s)",
    )
    g.add_argument(
        "--usage-compute-margin",
        type=int,
        default=DEFAULT_COMPUTE_MARGIN,
        metavar="POINTS",
        help="SM utilisation points a share may use above its reserved cores before it counts "
        f"as overcommitted (default {DEFAULT_COMPUTE_MARGIN})",
    )
    g.add_argument(
        "--usage-taint",
        action="store_true",
        help="taint a GPU NoSchedule (<driver>/overcommitted) while one of its shares uses more "
        "than it reserved, so no new share lands on it (default: off)",
    )
    g.add_argument(
        "--usage-escape-taint",
        action="store_true",
        help="taint a GPU NoSchedule (<driver>/mps-escape) while a compute process runs on it "
        "outside MPS next to MPS shares, so no new share lands on it (default: off)",
    )
    g.add_argument(
        "--usage-proc-root",
        type=Path,
        default=DEFAULT_PROC_ROOT,
        help="the host's /proc, where a process's cgroup names its pod (default /proc: the "
        "chart runs the plugin in the host PID namespace, where NVML lists every process)",
    )

    g.add_argument(
        "--usage-kubelet-cgroup-root",
        default="/",
        metavar="PATH",
        help="the kubelet's --cgroup-root (cgroupRoot), as the node's init sees cgroups: a "
        "process names a pod only when its cgroup is under <root>/kubepods, so a process "
        "outside every pod that names a subtree of its own kubepods is charged to no pod "
        "(default /; kind nodes: /kubelet)",
    )


def usage_options(args: argparse.Namespace) -> UsageOptions:
    """Check the usage flags; raise :class:`UsageFlagError` naming the bad one."""
    for flag, value, low in (
        ("--usage-interval", args.usage_interval, 0.0),
        ("--usage-write-interval", args.usage_write_interval, -1.0),
    ):
        if not math.isfinite(value) or value <= low:
            bound = "> 0" if low == 0 else ">= 0"
            raise UsageFlagError(f"{flag} must be a finite number of seconds {bound}, got {value}")
    try:
        threshold = quantity_int(args.usage_memory_threshold)
    except QuantityError as exc:
        raise UsageFlagError(f"--usage-memory-threshold: {exc}") from None
    if threshold < 0:
        raise UsageFlagError("--usage-memory-threshold must not be negative")
    if not 0 <= args.usage_compute_margin <= 100:
        raise UsageFlagError(
            f"--usage-compute-margin must be 0 to 100, got {args.usage_compute_margin}"
        )
    if not args.usage_proc_root.is_absolute():
        raise UsageFlagError(f"--usage-proc-root {str(args.usage_proc_root)!r}: must be absolute")
    try:
        cgroup_root = cgroup_root_elements(args.usage_kubelet_cgroup_root)
    except ValueError as exc:
        raise UsageFlagError(f"--usage-kubelet-cgroup-root {exc}") from None
    return UsageOptions(
        enabled=not args.disable_usage,
        interval_s=args.usage_interval,
        write_interval_s=args.usage_write_interval,
        memory_threshold=threshold,
        compute_margin=args.usage_compute_margin,
        taint=args.usage_taint,
        escape_taint=args.usage_escape_taint,
        proc_root=args.usage_proc_root,
        kubelet_cgroup_root=cgroup_root,
    )
