"""The kubelet plugin's settings: every command-line flag, parsed and checked in one place.

Precedence for each setting: the flag, else its environment variable (``DRIVER_NAME``,
``NODE_NAME``; ``KUBECONFIG`` is read by :mod:`sharegpu.kube.rest`), else the default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from api import names
from api.quantity import quantity_int
from api.version import VERSION
from kubeletplugin.devices.sharelimit import (
    MAX_SHARES_PER_GPU,
    MPS_CLIENTS_PRE_VOLTA,
    MPS_CLIENTS_VOLTA,
)
from kubeletplugin.health.flags import (
    DEFAULT_HEALTH_OPTIONS,
    HealthFlagError,
    HealthOptions,
    add_health_flags,
    health_options,
)
from kubeletplugin.hosts.options import (
    HostFlagError,
    SimulatedOptions,
    add_host_flags,
    simulated_options,
)
from kubeletplugin.prepare.cdi import is_cdi_kind
from kubeletplugin.sharing.shm import DEFAULT_SHM_BYTES
from kubeletplugin.usage.flags import (
    DEFAULT_USAGE_OPTIONS,
    UsageFlagError,
    UsageOptions,
    add_usage_flags,
    usage_options,
)
from sharegpu.kube import slicerules
from sharegpu.kube.logs import LOG_FORMATS, LOG_LEVELS
from sharegpu.kube.telemetry import parse_address

DEFAULT_PLUGIN_REGISTRY_DIR: Final = Path("/var/lib/kubelet/plugins_registry")
#: ``--plugin-data-dir`` defaults to this directory plus the driver name.
DEFAULT_PLUGINS_DIR: Final = Path("/var/lib/kubelet/plugins")
DEFAULT_CDI_DIR: Final = Path("/var/run/cdi")
#: Where runtimes read CDI specs; scanned for the NVIDIA Container Toolkit's spec.
DEFAULT_NVIDIA_CDI_DIRS: Final = (Path("/etc/cdi"), Path("/var/run/cdi"))

ENV_DRIVER_NAME: Final = "DRIVER_NAME"
ENV_NODE_NAME: Final = "NODE_NAME"
#: The plugin pod's namespace (downward API), where it creates the MPS daemon pods.
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"


class ConfigError(ValueError):
    """Bad flags; the message is one line naming the flag and the problem."""


@dataclass(frozen=True)
class PluginConfig:
    """All settings of ``sharegpu-kubeletplugin`` (immutable, validated)."""

    driver_name: str
    node_name: str
    kubeconfig: str | None
    plugin_registry_dir: Path
    plugin_data_dir: Path
    cdi_dir: Path
    sharing_mode: str
    metrics_address: str | None
    log_format: str
    log_level: str
    #: Print the slices that would be published and exit (no API server needed).
    print_slices: bool
    #: Root of the NVIDIA driver files: nvidia-smi and nvidia-cuda-mps-control are run from
    #: ``<root>/usr/bin`` or ``<root>/bin``.
    driver_root: Path = Path("/")
    #: Host path of an interception library (HAMi-core's environment contract) for the
    #: GpuConfig strategy ``Limits``; None: claims asking for Limits get a per-claim error.
    limits_library: Path | None = None
    #: ``--device-backend mock``: the simulated host's ``--mock-*`` settings; None: NVIDIA GPUs.
    simulated: SimulatedOptions | None = None
    #: ``--disable-health`` and ``--health-*``.
    health: HealthOptions = DEFAULT_HEALTH_OPTIONS
    #: CDI kind of the NVIDIA Container Toolkit's spec, and the directories searched for it.
    nvidia_cdi_kind: str = names.NVIDIA_CTK_CDI_KIND
    nvidia_cdi_dirs: tuple[Path, ...] = DEFAULT_NVIDIA_CDI_DIRS
    #: Consumable mode: cores charged to a request that names none (``--default-share-cores``).
    default_share_cores: int = names.CORES_PER_GPU
    #: The most shares one GPU holds (``--max-shares-per-gpu``; 0: what MPS serves alone).
    max_shares_per_gpu: int = 0
    #: Host directory of the per-daemon MPS directories (``--mps-root``); None: ``<data dir>/mps``.
    mps_root: Path | None = None
    #: Bytes of each MPS daemon's shm tmpfs (``--mps-shm-size``).
    mps_shm_bytes: int = DEFAULT_SHM_BYTES
    #: Pod manifest the MPS daemon pods are made from (``--mps-daemon-pod-template``); None: the
    #: NVML backend refuses MPS shares.
    mps_daemon_pod_template: Path | None = None
    #: Namespace of the MPS daemon pods (``--namespace``, else ``$POD_NAMESPACE``).
    namespace: str | None = None
    #: ``--disable-usage`` and ``--usage-*``.
    usage: UsageOptions = DEFAULT_USAGE_OPTIONS
    #: ``--mig``: ``static`` publishes existing MIG devices; ``dynamic`` (``partitions`` mode
    #: only) publishes MIG profile placements and creates the instances at prepare.
    mig_strategy: str = names.MIG_STRATEGY_STATIC


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the node daemon."""
    p = argparse.ArgumentParser(
        prog="sharegpu-kubeletplugin",
        description="sharegpu node daemon: discovers GPUs, publishes ResourceSlices, "
        "and prepares claims for kubelet.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    p.add_argument(
        "--driver-name",
        help=f"DRA driver name (env {ENV_DRIVER_NAME}; default {names.DEFAULT_DRIVER_NAME})",
    )
    p.add_argument("--node-name", help=f"this node's name (env {ENV_NODE_NAME}; required)")
    p.add_argument(
        "--kubeconfig", help="kubeconfig file (else $KUBECONFIG, else the in-cluster config)"
    )
    p.add_argument(
        "--plugin-registry-dir",
        type=Path,
        default=DEFAULT_PLUGIN_REGISTRY_DIR,
        help=f"kubelet's plugin registration directory (default {DEFAULT_PLUGIN_REGISTRY_DIR})",
    )
    p.add_argument(
        "--plugin-data-dir",
        type=Path,
        help=f"directory for the DRA socket and the checkpoint (default {DEFAULT_PLUGINS_DIR}/"
        "<driver name>)",
    )
    p.add_argument(
        "--cdi-dir",
        type=Path,
        default=DEFAULT_CDI_DIR,
        help=f"where CDI specs are written (default {DEFAULT_CDI_DIR})",
    )
    p.add_argument(
        "--nvidia-cdi-kind",
        default=names.NVIDIA_CTK_CDI_KIND,
        help="CDI kind of the NVIDIA Container Toolkit's spec; where it has a device named by a "
        "GPU's UUID (or else its NVML index), that ID is returned too "
        f"(default {names.NVIDIA_CTK_CDI_KIND})",
    )
    p.add_argument(
        "--nvidia-cdi-dirs",
        default=",".join(str(d) for d in DEFAULT_NVIDIA_CDI_DIRS),
        help="comma-separated directories searched for that spec (default "
        f"{','.join(str(d) for d in DEFAULT_NVIDIA_CDI_DIRS)})",
    )
    p.add_argument(
        "--sharing-mode",
        choices=names.SHARING_MODES,
        default=names.SHARING_MODE_CONSUMABLE,
        help="how GPUs are published: consumable capacity shares (KEP-5075), fixed partitions "
        "(KEP-4815), or whole GPUs only (default consumable)",
    )
    p.add_argument(
        "--mig",
        dest="mig_strategy",
        choices=names.MIG_STRATEGIES,
        default=names.MIG_STRATEGY_STATIC,
        help="MIG-enabled GPUs: publish the MIG devices that exist (static), or every placement "
        "of every MIG profile, creating the MIG instance when a claim is prepared (dynamic; "
        "needs --sharing-mode partitions) (default static)",
    )
    p.add_argument(
        "--default-share-cores",
        type=int,
        default=names.CORES_PER_GPU,
        help="consumable mode: the cores (percent of a GPU, 1-100) kube-scheduler charges a "
        "request that names no cores, e.g. one asking only for memory; published as the cores "
        f"request policy's default (default {names.CORES_PER_GPU}: such a request takes every "
        "core of its GPU)",
    )
    p.add_argument(
        "--max-shares-per-gpu",
        type=int,
        default=0,
        help="the most shares (claims) one GPU holds at once, each with its own MPS daemon; "
        "published as the smallest cores request (ceil(100/N)) and by leaving out partitions "
        f"of more parts. Never above what MPS serves on the GPU ({MPS_CLIENTS_PRE_VOLTA} before "
        f"Volta, {MPS_CLIENTS_VOLTA} on Volta and later, {MAX_SHARES_PER_GPU} from CUDA 13.1), "
        f"which 0 (the default) means; 1 to {MAX_SHARES_PER_GPU}",
    )
    p.add_argument("--metrics-address", help="serve /metrics on HOST:PORT (default: off)")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.add_argument(
        "--driver-root",
        type=Path,
        default=Path("/"),
        help="root of the NVIDIA driver files, e.g. /run/nvidia/driver; nvidia-smi and "
        "nvidia-cuda-mps-control are run from <root>/usr/bin or <root>/bin (default /)",
    )
    p.add_argument(
        "--limits-library",
        type=Path,
        help="host path of an interception library following HAMi-core's environment contract; "
        "enables the GpuConfig strategy Limits (default: none, Limits is refused)",
    )
    p.add_argument(
        "--print-slices",
        action="store_true",
        help="discover GPUs, print the ResourceSlices that would be published as YAML, and exit",
    )
    p.add_argument(
        "--mps-root",
        type=Path,
        help="host directory holding one <daemon id>/{pipe,shm,log} directory per MPS daemon "
        "(one per claim and GPU), mounted at the same path in the plugin; keep it short, a unix "
        "socket path holds at most 107 bytes (default: <plugin data dir>/mps)",
    )
    p.add_argument(
        "--mps-shm-size",
        default="256Mi",
        help="size bound of each MPS daemon's shared-memory tmpfs, mounted at /dev/shm in the "
        f"daemon and its claim's clients (a quantity, {MIN_SHM_SIZE} to {MAX_SHM_SIZE}; "
        "default: 256Mi)",
    )
    p.add_argument(
        "--mps-daemon-pod-template",
        type=Path,
        help="YAML Pod manifest each GPU's MPS control daemon pod is made from (NVML backend; "
        "default: none, MPS shares are refused)",
    )
    p.add_argument(
        "--namespace",
        help=f"namespace of the MPS daemon pods (env {ENV_POD_NAMESPACE}; needed with "
        "--mps-daemon-pod-template)",
    )
    add_health_flags(p)
    add_usage_flags(p)
    add_host_flags(p)
    return p


#: Bounds of ``--mps-shm-size`` (a daemon and its clients need some; a tmpfs is memory).
MIN_SHM_SIZE: Final = "16Mi"
MAX_SHM_SIZE: Final = "64Gi"


def _shm_bytes(text: str) -> int:
    """``--mps-shm-size`` in bytes; ConfigError naming the flag, the value and the bounds."""
    low, high = quantity_int(MIN_SHM_SIZE), quantity_int(MAX_SHM_SIZE)
    try:
        value = quantity_int(text)
    except ValueError as exc:
        raise ConfigError(f"--mps-shm-size {text!r}: {exc}") from None
    if not low <= value <= high:
        raise ConfigError(f"--mps-shm-size {text!r}: must be {MIN_SHM_SIZE} to {MAX_SHM_SIZE}")
    return value


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> PluginConfig:
    """Apply environment fallbacks and defaults; raise :class:`ConfigError` on bad values."""
    env = environ if environ is not None else os.environ
    driver = args.driver_name or env.get(ENV_DRIVER_NAME) or names.DEFAULT_DRIVER_NAME
    if not slicerules.is_dns_subdomain(driver, slicerules.MAX_DRIVER_NAME_LENGTH):
        raise ConfigError(
            f"--driver-name {driver!r}: must be a DNS subdomain of at most "
            f"{slicerules.MAX_DRIVER_NAME_LENGTH} characters"
        )
    node = args.node_name or env.get(ENV_NODE_NAME)
    if not node:
        raise ConfigError(f"--node-name is required (or set ${ENV_NODE_NAME})")
    if not slicerules.is_dns_subdomain(node):
        raise ConfigError(f"--node-name {node!r}: must be a DNS subdomain")
    if args.metrics_address:
        try:
            parse_address(args.metrics_address)
        except ValueError as exc:
            raise ConfigError(f"--metrics-address: {exc}") from None
    try:
        simulated = simulated_options(args)
    except HostFlagError as exc:
        raise ConfigError(str(exc)) from None
    if not is_cdi_kind(args.nvidia_cdi_kind):
        raise ConfigError(
            f"--nvidia-cdi-kind {args.nvidia_cdi_kind!r}: must be a CDI kind vendor/class, "
            "e.g. nvidia.com/gpu"
        )
    nvidia_cdi_dirs = tuple(Path(d) for d in args.nvidia_cdi_dirs.split(",") if d)
    for flag, path in (
        ("--driver-root", args.driver_root),
        ("--limits-library", args.limits_library),
        *(("--nvidia-cdi-dirs", d) for d in nvidia_cdi_dirs),
    ):
        if path is not None and not path.is_absolute():
            raise ConfigError(f"{flag} {str(path)!r}: must be an absolute path")
    for flag, path in (
        ("--mps-root", args.mps_root),
        ("--mps-daemon-pod-template", args.mps_daemon_pod_template),
    ):
        if path is not None and not path.is_absolute():
            raise ConfigError(f"{flag} {str(path)!r}: must be an absolute path")
    namespace = args.namespace or env.get(ENV_POD_NAMESPACE) or None
    if args.mps_daemon_pod_template is not None and not namespace:
        raise ConfigError(f"--mps-daemon-pod-template needs --namespace (or ${ENV_POD_NAMESPACE})")
    if namespace is not None and not slicerules.is_dns_label(namespace):
        raise ConfigError(f"--namespace {namespace!r}: must be a DNS label")
    mps_shm_bytes = _shm_bytes(args.mps_shm_size)
    if not 1 <= args.default_share_cores <= names.CORES_PER_GPU:
        raise ConfigError(
            f"--default-share-cores {args.default_share_cores}: must be 1 to {names.CORES_PER_GPU}"
        )
    if not 0 <= args.max_shares_per_gpu <= MAX_SHARES_PER_GPU:
        raise ConfigError(
            f"--max-shares-per-gpu {args.max_shares_per_gpu}: must be 0 (what MPS serves) to "
            f"{MAX_SHARES_PER_GPU}"
        )
    if (
        args.mig_strategy == names.MIG_STRATEGY_DYNAMIC
        and args.sharing_mode != names.SHARING_MODE_PARTITIONS
    ):
        raise ConfigError(
            f"--mig {names.MIG_STRATEGY_DYNAMIC} needs --sharing-mode "
            f"{names.SHARING_MODE_PARTITIONS} (got {args.sharing_mode}): dynamic MIG devices "
            "consume shared counters, which only that mode publishes"
        )
    try:
        health = health_options(args)
    except HealthFlagError as exc:
        raise ConfigError(str(exc)) from None
    try:
        usage = usage_options(args)
    except UsageFlagError as exc:
        raise ConfigError(str(exc)) from None
    return PluginConfig(
        driver_name=driver,
        node_name=node,
        kubeconfig=args.kubeconfig,
        plugin_registry_dir=args.plugin_registry_dir,
        plugin_data_dir=args.plugin_data_dir or DEFAULT_PLUGINS_DIR / driver,
        cdi_dir=args.cdi_dir,
        sharing_mode=args.sharing_mode,
        metrics_address=args.metrics_address,
        log_format=args.log_format,
        log_level=args.log_level,
        print_slices=args.print_slices,
        driver_root=args.driver_root,
        limits_library=args.limits_library,
        health=health,
        nvidia_cdi_kind=args.nvidia_cdi_kind,
        nvidia_cdi_dirs=nvidia_cdi_dirs,
        default_share_cores=args.default_share_cores,
        max_shares_per_gpu=args.max_shares_per_gpu,
        mps_root=args.mps_root,
        mps_shm_bytes=mps_shm_bytes,
        mps_daemon_pod_template=args.mps_daemon_pod_template,
        namespace=namespace,
        usage=usage,
        mig_strategy=args.mig_strategy,
        simulated=simulated,
    )


def parse_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> PluginConfig:
    """Parse flags (argparse exits with status 2 on unknown flags or bad choices)."""
    return config_from_args(build_parser().parse_args(argv), environ)
