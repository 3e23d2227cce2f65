"""What several ``sharegpu`` commands share: errors, flags, the driver's defaults, the local node.

Invariants:

- Expected problems (a missing file, bad YAML, no GPU, an unreachable API server) raise
  :class:`CliError`; ``sharegpu`` prints its one-line message and exits with its ``code``
  (1; 2 for usage errors). Nothing expected reaches the user as a traceback.
- Manifests are plain dicts in their JSON shape, read by the one bounded loader,
  :mod:`sharegpuctl.cli.loading`.
- Importing this module is cheap (``sharegpu --help`` imports it): the node plugin's preview
  (:mod:`kubeletplugin.preview`) is imported by the functions that use it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from api import names
from api.jsontypes import Obj
from sharegpuctl.cli.output import OUTPUT_FORMATS

if TYPE_CHECKING:
    from kubeletplugin.model import GpuInfo


EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_USAGE: Final = 2

#: Added to an NVML discovery failure: how to run the command on a machine without a GPU.
NO_GPU_HINT: Final = (
    "; without an NVIDIA GPU here, use --device-backend mock --mock-gpus N for N mock H100-like "
    "GPUs (or --device-backend mock --mock-config FILE)"
)
#: What the deprecated ``--mock N`` stands for.
MOCK_FLAGS: Final = f"--device-backend {names.MOCK_BACKEND} --mock-gpus N"
#: Node name used when neither ``--node-name`` nor ``$NODE_NAME`` nor a usable host name is set.
FALLBACK_NODE_NAME: Final = "local-node"


class CliError(Exception):
    """An expected failure: one line for the user, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_FINDINGS) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def add_output_flag(parser: argparse.ArgumentParser) -> None:
    """``-o/--output``: every command takes it (default: a table on a terminal, else text)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        help="output format (default: table on a terminal, plain text otherwise)",
    )


# --- the driver's defaults ------------------------------------------------------------------


#: The attribute only MIG devices have (the chart's gpu class leaves them out).
PROFILE = names.ATTR_PROFILE


def default_device_class(driver: str = names.DEFAULT_DRIVER_NAME) -> Obj:
    """The DeviceClass the Helm chart installs: every device of the driver but MIG devices (which
    have the attribute ``profile``), named like the driver."""
    return {
        "apiVersion": names.RESOURCE_GROUP_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {
            "selectors": [
                {"cel": {"expression": f"device.driver == {driver!r}"}},
                {
                    "cel": {
                        "expression": f"!({names.ATTR_PROFILE!r} in device.attributes[{driver!r}])"
                    }
                },
            ]
        },
    }


def mig_device_class(driver: str = names.DEFAULT_DRIVER_NAME) -> Obj:
    """The MIG DeviceClass the Helm chart installs (``mig.<driver>``): every device of the driver
    that has the attribute ``profile`` (static MIG devices and dynamic MIG placements); a request
    picks a profile with a selector such as ``device.attributes['<driver>'].profile ==
    '1g.10gb'``."""
    return {
        "apiVersion": names.RESOURCE_GROUP_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": f"mig.{driver}"},
        "spec": {
            "selectors": [
                {"cel": {"expression": f"device.driver == {driver!r}"}},
                {"cel": {"expression": f"{names.ATTR_PROFILE!r} in device.attributes[{driver!r}]"}},
            ]
        },
    }


@dataclass(frozen=True)
class ChartDeviceClass:
    """One DeviceClass of the Helm chart: its key under ``deviceClasses`` in the chart's values,
    the prefix of its default name (``<prefix><driver>``) and whether the chart's defaults
    install it. :data:`CHART_DEVICE_CLASSES` is the one list; a chart test renders it."""

    key: str
    prefix: str
    installed_by_default: bool

    def name(self, driver: str) -> str:
        return f"{self.prefix}{driver}"


#: The chart's DeviceClasses (``deviceClasses.*`` with ``name`` empty): the class of every device
#: of the driver (:func:`default_device_class`), the MIG class (:func:`mig_device_class`) and the
#: extended-resource class (off by default: it needs DRAExtendedResource).
CHART_DEVICE_CLASSES: Final = (
    ChartDeviceClass("gpu", "", installed_by_default=True),
    ChartDeviceClass("extendedResource", "extended.", installed_by_default=False),
    ChartDeviceClass("mig", "mig.", installed_by_default=True),
)


def chart_device_class_names(driver: str = names.DEFAULT_DRIVER_NAME) -> tuple[str, ...]:
    """The names the Helm chart gives its DeviceClasses (every one it can install)."""
    return tuple(c.name(driver) for c in CHART_DEVICE_CLASSES)


def chart_installed_class_names(driver: str = names.DEFAULT_DRIVER_NAME) -> tuple[str, ...]:
    """The DeviceClasses the Helm chart installs with its default values."""
    return tuple(c.name(driver) for c in CHART_DEVICE_CLASSES if c.installed_by_default)


def chart_installed_classes(driver: str = names.DEFAULT_DRIVER_NAME) -> list[Obj]:
    """The DeviceClass objects the Helm chart installs with its default values (the MIG class
    too: it selects nothing on a node without MIG devices)."""
    builders = {"gpu": default_device_class, "mig": mig_device_class}
    return [builders[c.key](driver) for c in CHART_DEVICE_CLASSES if c.installed_by_default]


def chart_installs(driver: str = names.DEFAULT_DRIVER_NAME) -> str:
    """``the sharegpu chart installs A and B``: every DeviceClass of its defaults, for messages."""
    installed = chart_installed_class_names(driver)
    *first, last = installed
    return f"the sharegpu chart installs {', '.join(first) + ' and ' if first else ''}{last}"


def default_node_name() -> str:
    """``$NODE_NAME``, else this host's name when it is a DNS subdomain, else a fixed name."""
    import socket

    from sharegpu.kube import slicerules

    for candidate in (os.environ.get("NODE_NAME", ""), socket.gethostname().lower()):
        if candidate and slicerules.is_dns_subdomain(candidate):
            return candidate
    return FALLBACK_NODE_NAME


# --- the local node's GPUs and slices -------------------------------------------------------


class DeprecatedMock(argparse.Action):
    """``--mock N``, the former spelling of ``--device-backend mock --mock-gpus N``: still
    works, with a warning on stderr."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        warn(parser.prog, f"--mock N is deprecated: use {MOCK_FLAGS}")
        namespace.mock_gpus = values
        namespace.deprecated_mock = True


def warn(prog: str, message: str) -> None:
    """One warning line on stderr (``sharegpu <command>: warning: ...``)."""
    print(f"{prog}: warning: {message}", file=sys.stderr)


def add_node_flags(
    parser: argparse.ArgumentParser,
    default_backend: str,
    group: argparse._ArgumentGroup | None = None,
) -> None:
    """Flags that describe this node's GPUs and how the plugin would publish them (added to
    ``group`` when given): the plugin's host flags (``--device-backend``, ``--mock-gpus``,
    ``--mock-config``, ...; one definition, :func:`kubeletplugin.preview.add_host_flags`), the
    deprecated ``--mock N``, and the plugin's publishing flags."""
    from kubeletplugin.preview import add_host_flags

    target = group or parser
    add_host_flags(parser, default_backend, group, discovery_only=True)
    target.add_argument(
        "--mock",
        type=int,
        metavar="N",
        action=DeprecatedMock,
        help=f"deprecated: use {MOCK_FLAGS}",
    )
    target.add_argument(
        "--sharing-mode",
        choices=names.SHARING_MODES,
        default=names.SHARING_MODE_CONSUMABLE,
        help="how the plugin publishes the GPUs (default consumable)",
    )
    target.add_argument(
        "--mig",
        choices=names.MIG_STRATEGIES,
        default=names.MIG_STRATEGY_STATIC,
        help="how GPUs in MIG mode are published: static (the MIG devices that exist) or dynamic "
        "(every placement of every MIG profile, created at prepare; needs --sharing-mode "
        "partitions). With dynamic, the default mock GPUs are in MIG mode (default static)",
    )
    target.add_argument(
        "--default-share-cores",
        type=int,
        default=names.CORES_PER_GPU,
        metavar="N",
        help="consumable mode: the cores (percent, 1-100) a request naming none is charged, as "
        f"the plugin's flag of that name publishes it (default {names.CORES_PER_GPU})",
    )
    target.add_argument(
        "--max-shares-per-gpu",
        type=int,
        default=0,
        metavar="N",
        help="the most shares one GPU holds, as the plugin's flag of that name publishes it "
        "(0: what MPS serves on the GPU, the plugin's default; the chart passes 20)",
    )
    target.add_argument("--node-name", help="node name (default $NODE_NAME, else the host name)")
    target.add_argument(
        "--driver-name",
        default=names.DEFAULT_DRIVER_NAME,
        help=f"DRA driver name (default {names.DEFAULT_DRIVER_NAME})",
    )
    # No --device-backend given: default_backend, unless a deprecated spelling implies mock.
    parser.set_defaults(default_backend=default_backend, device_backend=None, deprecated_mock=False)


@dataclass(frozen=True)
class LocalNode:
    """This node as the kubelet plugin would see and publish it."""

    node_name: str
    driver: str
    backend: str
    sharing_mode: str
    gpus: tuple[GpuInfo, ...]
    slices: tuple[Obj, ...]
    mig_strategy: str = names.MIG_STRATEGY_STATIC


def device_backend(args: argparse.Namespace) -> str:
    """The backend the node flags ask for: ``--device-backend``, else the command's default,
    which the deprecated ``--mock N`` and a ``--mock-config`` alone turn into ``mock`` (with a
    warning). Usage errors raise :class:`CliError` (code 2)."""
    prog = f"sharegpu {getattr(args, 'command', None) or ''}".rstrip()
    if args.device_backend is not None:
        if args.deprecated_mock and args.device_backend != names.MOCK_BACKEND:
            raise CliError(f"--mock needs --device-backend {names.MOCK_BACKEND}", EXIT_USAGE)
        return str(args.device_backend)
    if args.default_backend == names.MOCK_BACKEND or args.deprecated_mock:
        return names.MOCK_BACKEND
    if args.mock_config is not None:
        warn(
            prog,
            "--mock-config without --device-backend mock is deprecated: add --device-backend mock",
        )
        return names.MOCK_BACKEND
    return str(args.default_backend)


def local_node(args: argparse.Namespace) -> LocalNode:
    """Discover this node's GPUs and build the slices the plugin would publish, through the
    plugin's own preview (:func:`kubeletplugin.preview.node_preview`).

    Slices get names (``<generateName>local``) so that allocation order is defined. With
    ``--mig dynamic`` the default mock GPUs are in MIG mode (H100s with their reference MIG
    profiles); a ``--mock-config`` file says per GPU (``migMode``).
    """
    from kubeletplugin.preview import (
        MAX_SHARES_PER_GPU,
        DiscoveryError,
        HostFlagError,
        SliceSettings,
        node_preview,
        preview_host,
        simulated_options,
    )
    from sharegpu.kube import slicerules

    node = args.node_name or default_node_name()
    if not slicerules.is_dns_subdomain(node):
        raise CliError(f"--node-name {node!r}: must be a DNS subdomain", EXIT_USAGE)
    mig = getattr(args, "mig", names.MIG_STRATEGY_STATIC)
    dynamic = mig == names.MIG_STRATEGY_DYNAMIC
    if dynamic and args.sharing_mode != names.SHARING_MODE_PARTITIONS:
        raise CliError(
            f"--mig {mig} needs --sharing-mode {names.SHARING_MODE_PARTITIONS}, not "
            f"{args.sharing_mode}",
            EXIT_USAGE,
        )
    cores = getattr(args, "default_share_cores", names.CORES_PER_GPU)
    if not 1 <= cores <= names.CORES_PER_GPU:
        raise CliError(
            f"--default-share-cores {cores}: must be 1 to {names.CORES_PER_GPU}", EXIT_USAGE
        )
    max_shares = getattr(args, "max_shares_per_gpu", 0)
    if not 0 <= max_shares <= MAX_SHARES_PER_GPU:
        raise CliError(
            f"--max-shares-per-gpu {max_shares}: must be 0 to {MAX_SHARES_PER_GPU}", EXIT_USAGE
        )
    backend = device_backend(args)
    try:
        simulated = simulated_options(
            argparse.Namespace(**{**vars(args), "device_backend": backend})
        )
    except HostFlagError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    settings = SliceSettings(args.driver_name, node, args.sharing_mode, cores, mig, max_shares)
    try:
        preview = node_preview(preview_host(settings, simulated), settings)
    except DiscoveryError as exc:
        hint = NO_GPU_HINT if simulated is None else ""
        raise CliError(f"{exc}{hint}") from None
    slices = tuple(
        {**obj, "metadata": {"name": obj["metadata"]["generateName"] + "local"}}
        for obj in preview.slices
    )
    return LocalNode(
        node_name=node,
        driver=args.driver_name,
        backend=backend,
        sharing_mode=args.sharing_mode,
        gpus=preview.gpus,
        slices=slices,
        mig_strategy=mig,
    )


def slice_summary(slices: Sequence[Obj]) -> list[Obj]:
    """Per slice: name, pool, node, devices and counter sets (counts and names)."""
    out: list[Obj] = []
    for s in slices:
        spec = s.get("spec") or {}
        md = s.get("metadata") or {}
        devices = [str(d.get("name")) for d in spec.get("devices") or []]
        counters = [str(c.get("name")) for c in spec.get("sharedCounters") or []]
        pool = spec.get("pool") or {}
        out.append(
            {
                "name": str(md.get("name") or md.get("generateName") or ""),
                "driver": str(spec.get("driver", "")),
                "pool": str(pool.get("name", "")),
                "generation": pool.get("generation"),
                "node": str(spec.get("nodeName", "")),
                "devices": len(devices),
                "deviceNames": devices,
                "counterSets": len(counters),
                "counterSetNames": counters,
            }
        )
    return out


def compact_names(items: Sequence[str], limit: int = 6) -> str:
    """``a, b, c`` or ``a, b, ... z (N)`` for long lists."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[: limit - 1])}, ..., {items[-1]} ({len(items)})"
