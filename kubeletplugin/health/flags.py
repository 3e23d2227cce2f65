"""The health flags of ``sharegpu-kubeletplugin``: one place for the flags
(:func:`add_health_flags`) and their checks (:func:`health_options`), which give plain data
(:class:`HealthOptions`). The objects they configure are built in :mod:`kubeletplugin.main`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Final

from kubeletplugin.health.events import DEFAULT_IGNORED_XIDS, parse_xid_list
from kubeletplugin.health.settings import (
    DEFAULT_PROBE_INTERVAL_S,
    HealthSettings,
)
from kubeletplugin.health.state import DEFAULT_RECOVERY_PROBES
from kubeletplugin.health.taints import DEFAULT_TAINT_EFFECT, TAINT_EFFECTS


class HealthFlagError(ValueError):
    """A bad health flag; the message names the flag and the problem."""


@dataclass(frozen=True)
class HealthOptions:
    """The health flags, checked. ``enabled`` False: no monitor, no health service."""

    enabled: bool
    settings: HealthSettings


#: What the flags give when none is set.
DEFAULT_HEALTH_OPTIONS: Final = HealthOptions(True, HealthSettings())


def add_health_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--health-*`` and ``--disable-health`` flags."""
    group = parser.add_argument_group("device health")
    group.add_argument(
        "--disable-health",
        action="store_true",
        help="do not watch GPU health (no taints, no kubelet health stream)",
    )
    group.add_argument(
        "--health-probe-interval",
        type=float,
        default=DEFAULT_PROBE_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between NVML probes of each GPU (default {DEFAULT_PROBE_INTERVAL_S:g})",
    )
    group.add_argument(
        "--health-recovery-probes",
        type=int,
        default=DEFAULT_RECOVERY_PROBES,
        metavar="N",
        help="consecutive healthy probes after which an unhealthy GPU is healthy again "
        f"(doubled for a GPU that keeps failing; default {DEFAULT_RECOVERY_PROBES})",
    )
    group.add_argument(
        "--health-ignore-xids",
        default=",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS)),
        metavar="LIST",
        help="comma-separated XIDs that do not make a GPU unhealthy (application errors; "
        "default %(default)s; empty: none ignored)",
    )
    group.add_argument(
        "--health-taint-effect",
        choices=TAINT_EFFECTS,
        default=DEFAULT_TAINT_EFFECT,
        help="effect of the unhealthy device taint: NoSchedule keeps new claims away, "
        "NoExecute also evicts pods that use the device (default %(default)s)",
    )


def health_options(args: argparse.Namespace) -> HealthOptions:
    """Check the health flags; raise :class:`HealthFlagError` naming the bad one."""
    if not math.isfinite(args.health_probe_interval):
        raise HealthFlagError(
            f"--health-probe-interval must be a finite number of seconds, "
            f"got {args.health_probe_interval}"
        )
    if args.health_probe_interval <= 0:
        raise HealthFlagError(
            f"--health-probe-interval must be > 0 seconds, got {args.health_probe_interval}"
        )
    if args.health_recovery_probes < 1:
        raise HealthFlagError(
            f"--health-recovery-probes must be at least 1, got {args.health_recovery_probes}"
        )
    try:
        ignored = parse_xid_list(args.health_ignore_xids)
    except ValueError as exc:
        raise HealthFlagError(f"--health-ignore-xids: {exc}") from None
    settings = HealthSettings(
        probe_interval=args.health_probe_interval,
        recovery_probes=args.health_recovery_probes,
        ignored_xids=ignored,
        taint_effect=args.health_taint_effect,
    )
    return HealthOptions(not args.disable_health, settings)
