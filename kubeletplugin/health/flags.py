"""The health flags of ``sharegpu-kubeletplugin`` and the objects they configure.

One place for the flags (:func:`add_health_flags`), their checks (:func:`health_options`) and
the wiring (:func:`build_health`): the plugin's config and main module only call these.
"""

from __future__ import annotations

import argparse
import math
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kubeletplugin.health.events import DEFAULT_IGNORED_XIDS, parse_xid_list
from kubeletplugin.health.mockfile import MockHealthChecker
from kubeletplugin.health.monitor import (
    DEFAULT_PROBE_INTERVAL_S,
    HealthChecker,
    HealthMonitor,
    HealthSettings,
    TaintSink,
)
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.health.state import DEFAULT_RECOVERY_PROBES
from kubeletplugin.health.taints import DEFAULT_TAINT_EFFECT, TAINT_EFFECTS
from kubeletplugin.kubelet.healthservice import HealthBroadcaster
from kubeletplugin.model import GpuInfo


class HealthFlagError(ValueError):
    """A bad health flag; the message names the flag and the problem."""


@dataclass(frozen=True)
class HealthOptions:
    """The health flags, checked. ``enabled`` False: no monitor, no health service."""

    enabled: bool
    settings: HealthSettings
    mock_health_file: Path | None


#: What the flags give when none is set.
DEFAULT_HEALTH_OPTIONS: Final = HealthOptions(True, HealthSettings(), None)


def add_health_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--health-*``, ``--mock-health-file`` and ``--disable-health`` flags."""
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
    group.add_argument(
        "--mock-health-file",
        type=Path,
        metavar="PATH",
        help="YAML/JSON file of injected GPU health, watched for changes (mock backend)",
    )


def health_options(args: argparse.Namespace, device_backend: str) -> HealthOptions:
    """Check the health flags; raise :class:`HealthFlagError` naming the bad one."""
    if args.mock_health_file is not None and device_backend != "mock":
        raise HealthFlagError("--mock-health-file needs --device-backend mock")
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
    return HealthOptions(not args.disable_health, settings, args.mock_health_file)


def install_reload_signal(checker: HealthChecker) -> bool:
    """Make SIGUSR1 re-read the mock health file; True when installed.

    Only the main thread can install signal handlers; elsewhere (tests) nothing happens.
    """
    if not isinstance(checker, MockHealthChecker):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: checker.reload())
    return True


def build_checker(options: HealthOptions, device_backend: str) -> HealthChecker:
    """NVML events and probes for real GPUs; the health file for the mock backend."""
    if device_backend == "mock":
        return MockHealthChecker(options.mock_health_file)
    return NvmlHealthChecker()


def build_health(
    options: HealthOptions,
    device_backend: str,
    driver_name: str,
    node_name: str,
    sharing_mode: str,
    gpus: Sequence[GpuInfo],
    taints: TaintSink | None,
) -> tuple[HealthMonitor, HealthBroadcaster]:
    """The monitor (not started) and the broadcaster to pass as ``PluginServer``'s source."""
    broadcaster = HealthBroadcaster()
    monitor = HealthMonitor(
        build_checker(options, device_backend),
        driver_name,
        node_name,
        sharing_mode,
        gpus,
        options.settings,
        taints=taints,
        stream=broadcaster,
    )
    return monitor, broadcaster
