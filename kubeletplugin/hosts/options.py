"""The ``--device-backend`` flag and the simulated host's ``--mock-*`` flags, checked in one place.

``--device-backend mock`` gives :class:`SimulatedOptions`; ``nvml`` gives None (the NVIDIA host,
whose settings are the plugin's own flags). A ``--mock-*`` flag without the mock backend is an
error naming the flag. ``--mock-mig-step-seconds`` and ``--mock-boot-id-file`` exist for tests
and benchmarks (slow MIG steps, simulated reboots) and are left out of ``--help``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from api.names import DEVICE_BACKENDS, MOCK_BACKEND, NVML_BACKEND
from kubeletplugin.devices.mock import MAX_MOCK_GPUS, MockBackend
from kubeletplugin.fsutil import DEFAULT_BOOT_ID_FILE

DEFAULT_MOCK_GPUS: Final = 8
#: Bounds of ``--mock-mig-step-seconds``.
MAX_MIG_STEP_SECONDS: Final = 60.0


class HostFlagError(ValueError):
    """A bad host flag; the message names the flag and the problem."""


@dataclass(frozen=True)
class SimulatedOptions:
    """The simulated host's settings (``--mock-*``)."""

    #: Number of simulated GPUs (unless ``config_file`` lists them).
    gpus: int = DEFAULT_MOCK_GPUS
    #: YAML list of simulated GPUs with any discovery field.
    config_file: Path | None = None
    #: Injected GPU health, watched for changes.
    health_file: Path | None = None
    #: GPU processes to report.
    usage_file: Path | None = None
    #: Seconds between the two steps of creating or destroying a MIG instance.
    mig_step_seconds: float = 0.0
    #: The simulated kernel's boot ID (a change simulates a reboot).
    boot_id_file: Path = DEFAULT_BOOT_ID_FILE


def add_host_flags(
    parser: argparse.ArgumentParser,
    default_backend: str = NVML_BACKEND,
    group: argparse._ArgumentGroup | None = None,
    *,
    discovery_only: bool = False,
) -> None:
    """Add ``--device-backend`` (default ``default_backend``) and the ``--mock-*`` flags of the
    simulated host, to ``group`` when given. The one definition of these flags: the plugin and
    ``sharegpu devices``/``explain`` take them. ``discovery_only`` (a preview, which only
    discovers GPUs) leaves the health and usage files out of ``--help``; they are still taken and
    checked."""
    running = argparse.SUPPRESS if discovery_only else None
    g = group or parser.add_argument_group("simulated host (--device-backend mock)")
    g.add_argument(
        "--device-backend",
        choices=DEVICE_BACKENDS,
        default=default_backend,
        help="the GPUs driven: the node's NVIDIA GPUs through NVML and the driver's tools, or "
        f"simulated GPUs, tools, health and usage (default {default_backend})",
    )
    g.add_argument(
        "--mock-gpus",
        type=int,
        default=DEFAULT_MOCK_GPUS,
        metavar="N",
        help=f"number of mock GPUs (mock backend; default {DEFAULT_MOCK_GPUS})",
    )
    g.add_argument(
        "--mock-config",
        type=Path,
        metavar="FILE",
        help="YAML list of mock GPUs with any discovery field (mock backend)",
    )
    g.add_argument(
        "--mock-health-file",
        type=Path,
        metavar="PATH",
        help=running or "YAML/JSON file of injected GPU health, watched for changes (mock backend)",
    )
    g.add_argument(
        "--mock-usage-file",
        type=Path,
        metavar="PATH",
        help=running or "YAML/JSON file of GPU processes to report (mock backend)",
    )
    g.add_argument("--mock-mig-step-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    g.add_argument("--mock-boot-id-file", type=Path, help=argparse.SUPPRESS)


def simulated_options(args: argparse.Namespace) -> SimulatedOptions | None:
    """The simulated host's options with ``--device-backend mock``, else None; raise
    :class:`HostFlagError` naming a bad flag."""
    if args.mock_config is None and not 1 <= args.mock_gpus <= MAX_MOCK_GPUS:
        raise HostFlagError(
            f"--mock-gpus must be between 1 and {MAX_MOCK_GPUS}, got {args.mock_gpus}"
        )
    if not 0.0 <= args.mock_mig_step_seconds <= MAX_MIG_STEP_SECONDS:
        raise HostFlagError(
            f"--mock-mig-step-seconds {args.mock_mig_step_seconds}: must be 0 to "
            f"{MAX_MIG_STEP_SECONDS:g}"
        )
    if args.mock_boot_id_file is not None and not args.mock_boot_id_file.is_absolute():
        raise HostFlagError(
            f"--mock-boot-id-file {str(args.mock_boot_id_file)!r}: must be an absolute path"
        )
    if args.device_backend != MOCK_BACKEND:
        for flag, given in (
            ("--mock-config", args.mock_config is not None),
            ("--mock-health-file", args.mock_health_file is not None),
            ("--mock-usage-file", args.mock_usage_file is not None),
            ("--mock-mig-step-seconds", bool(args.mock_mig_step_seconds)),
            ("--mock-boot-id-file", args.mock_boot_id_file is not None),
        ):
            if given:
                raise HostFlagError(f"{flag} needs --device-backend {MOCK_BACKEND}")
        return None
    return SimulatedOptions(
        gpus=args.mock_gpus,
        config_file=args.mock_config,
        health_file=args.mock_health_file,
        usage_file=args.mock_usage_file,
        mig_step_seconds=args.mock_mig_step_seconds,
        boot_id_file=args.mock_boot_id_file or DEFAULT_BOOT_ID_FILE,
    )


def simulated_backend(
    node_name: str, options: SimulatedOptions, mig_enabled: bool = False
) -> MockBackend:
    """The mock GPUs of ``options`` (the simulated host's discovery); with ``mig_enabled`` the
    default GPUs are in MIG mode (a ``--mock-config`` file says per GPU). Raises
    :class:`~kubeletplugin.devices.backend.DiscoveryError` for an unusable GPU count."""
    return MockBackend(
        node_name, count=options.gpus, config_file=options.config_file, mig_enabled=mig_enabled
    )
