"""Entry point of ``sharegpu-kubeletplugin``: flags -> discovery -> the running daemon.

The daemon is a :class:`Plugin`: the discovered GPUs, an API client, the
:class:`~kubeletplugin.publish.publisher.SlicePublisher` and any further :class:`Component` (the
kubelet
gRPC server, the health monitor, ...). Components are added in :func:`build_plugin` with
:meth:`Plugin.add_component`; they start in the order added, after the publisher, and stop in
reverse order when SIGTERM or SIGINT arrives. Stopping never deletes slices and never
unprepares claims: kubelet owns that clean-up.

Exit codes: 0 after a clean stop (or ``--print-slices``), 1 when discovery or the API connection
fails or a directory or socket cannot be created, 2 for bad flags. Expected failures print one
line, never a traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence

from api import names
from api.gpuconfig import STRATEGY_MPS
from kubeletplugin.claimservice import ClaimService, nvidia_cdi_detector
from kubeletplugin.config import ConfigError, PluginConfig, build_parser, config_from_args
from kubeletplugin.devices.backend import DeviceBackend, DiscoveryError
from kubeletplugin.devices.migpartition import MigPartitioner
from kubeletplugin.devices.table import NodeDevices, node_devices
from kubeletplugin.health.flags import HealthOptions
from kubeletplugin.health.monitor import HealthChecker, HealthMonitor
from kubeletplugin.health.restore import published_unhealthy
from kubeletplugin.health.taintmerge import TaintMerger
from kubeletplugin.hosts.host import Host
from kubeletplugin.hosts.nvidia import NvidiaHost
from kubeletplugin.hosts.simulated import SimulatedHost
from kubeletplugin.kubelet.healthservice import HealthBroadcaster, HealthSource
from kubeletplugin.kubelet.sockets import SocketPathError
from kubeletplugin.model import GpuInfo, TaintSink
from kubeletplugin.prepare.checkpoint import STATE_COMPLETED
from kubeletplugin.preview import NodePreview, SliceSettings, node_preview
from kubeletplugin.publish.publisher import SlicePublisher
from kubeletplugin.sharing.daemonpods import TemplateError
from kubeletplugin.sharing.enforcer import SharingEnforcer, build_enforcer
from kubeletplugin.usage.claims import KubeClaimApi
from kubeletplugin.usage.model import PreparedShare
from kubeletplugin.usage.mpsdaemons import DaemonPods, KubePodLister
from kubeletplugin.usage.sampler import UsageSampler
from sharegpu.kube.clock import SYSTEM_CLOCK
from sharegpu.kube.connection import KubeClient
from sharegpu.kube.httpserve import BoundedHTTPServer
from sharegpu.kube.lifecycle import Component, Lifecycle
from sharegpu.kube.logs import configure_logging
from sharegpu.kube.rest import KubeConfigError, KubeRest, load_connection
from sharegpu.kube.telemetry import Telemetry, serve_metrics

PROG = "sharegpu-kubeletplugin"
SERVICE_NAME = "sharegpu-kubeletplugin"

log = logging.getLogger(__name__)


def make_host(config: PluginConfig) -> Host:
    """The hardware the daemon drives: simulated with ``--device-backend mock``, else the node's
    NVIDIA GPUs. The one place real and simulated hardware part; raises :class:`DiscoveryError`
    for an unusable simulated GPU count."""
    if config.simulated is not None:
        return SimulatedHost(
            config.node_name,
            config.simulated,
            config.plugin_data_dir,
            mig_enabled=config.mig_strategy == names.MIG_STRATEGY_DYNAMIC,
            mps_daemon_pod_template=config.mps_daemon_pod_template,
            namespace=config.namespace,
        )
    return NvidiaHost(
        driver_root=config.driver_root,
        node_name=config.node_name,
        nvidia_cdi=nvidia_cdi_detector(config),
        mps_daemon_pod_template=config.mps_daemon_pod_template,
        namespace=config.namespace,
    )


def make_partitioner(host: Host, devices: NodeDevices) -> MigPartitioner | None:
    """What creates and destroys MIG instances: None unless the table has dynamic MIG
    devices."""
    if not any(d.dynamic_mig for d in devices):
        return None
    return host.mig_partitioner()


def enforcer_for(config: PluginConfig, host: Host, rest: KubeRest | None = None) -> SharingEnforcer:
    """The enforcer the daemon passes to ``DeviceState`` (``--plugin-data-dir``,
    ``--limits-library``, ``--mps-root``, ``--mps-shm-size``) over the host's tools; raises
    TemplateError for an unusable MPS daemon pod template."""
    return build_enforcer(
        host.share_tools(rest),
        config.plugin_data_dir,
        driver_name=config.driver_name,
        limits_library=None if config.limits_library is None else str(config.limits_library),
        mps_root=config.mps_root,
        mps_shm_bytes=config.mps_shm_bytes,
    )


def build_health(
    options: HealthOptions,
    checker: HealthChecker,
    driver_name: str,
    node_name: str,
    devices: NodeDevices,
    taints: TaintSink | None,
) -> tuple[HealthMonitor, HealthBroadcaster]:
    """The monitor (not started) and the broadcaster to pass as ``PluginServer``'s source."""
    broadcaster = HealthBroadcaster()
    monitor = HealthMonitor(
        checker,
        driver_name,
        node_name,
        devices,
        options.settings,
        taints=taints,
        stream=broadcaster,
    )
    return monitor, broadcaster


def prepared_shares(claims: ClaimService) -> Callable[[], list[PreparedShare]]:
    """The prepared devices of the completed claims, as the usage stage reads them (a device
    is an MPS share when its record says enforcement decided MPS)."""

    def shares() -> list[PreparedShare]:
        out = []
        for rec in claims.state.prepared_claims().values():
            if rec.state != STATE_COMPLETED:
                continue
            for d in rec.devices:
                out.append(
                    PreparedShare(
                        claim_uid=rec.uid,
                        namespace=rec.namespace,
                        name=rec.name,
                        pool=d.pool,
                        device=d.device,
                        share_id=d.share_id,
                        gpu_uuid=d.gpu_uuid,
                        cores=d.cores,
                        memory=d.memory,
                        admin_access=d.admin_access,
                        mps=d.enforcement is not None and d.enforcement.strategy == STRATEGY_MPS,
                    )
                )
        return out

    return shares


def build_usage(
    plugin: Plugin,
    host: Host,
    claims: ClaimService,
    taints: TaintSink | None,
) -> UsageSampler:
    """The usage sampler (not started) over the prepared claims; their MPS shares are judged
    for escapes, the MPS servers found through the daemon pods of the plugin's namespace
    (``--namespace``) where the host runs its daemons as pods."""
    config = plugin.config
    rest = KubeRest(plugin.api_client)
    if problem := host.usage_problem():
        log.warning("usage: %s", problem)
    daemon_pods = None
    if config.namespace is not None and host.runs_daemon_pods():
        interval = config.usage.interval_s
        daemon_pods = DaemonPods(
            KubePodLister(rest),
            config.namespace,
            config.node_name,
            SYSTEM_CLOCK,
            refresh_s=max(interval * 6, 60.0),
            min_interval_s=interval,
        )
    return UsageSampler(
        config.usage,
        host.usage_source(plugin.gpus),
        prepared_shares(claims),
        KubeClaimApi(rest),
        config.driver_name,
        plugin.gpus,
        telemetry=plugin.telemetry,
        taints=taints,
        daemon_pods=daemon_pods,
    )


def describe_gpus(gpus: Sequence[GpuInfo]) -> None:
    """Log what discovery found, including its fallbacks."""
    for gpu in gpus:
        log.info(
            "GPU %d: %s %s, %d MiB usable of %d MiB, PCI %s, NUMA %s",
            gpu.index,
            gpu.product_name,
            gpu.uuid,
            gpu.memory_usable // 2**20,
            gpu.memory_total // 2**20,
            gpu.pci_bus_id,
            "unknown" if gpu.numa_node is None else gpu.numa_node,
        )
        for note in gpu.notes:
            log.warning("GPU %d: %s", gpu.index, note)


def slice_settings(config: PluginConfig) -> SliceSettings:
    """The settings of ``config`` that shape the published slices."""
    return SliceSettings(
        driver_name=config.driver_name,
        node_name=config.node_name,
        sharing_mode=config.sharing_mode,
        default_share_cores=config.default_share_cores,
        mig_strategy=config.mig_strategy,
        max_shares_per_gpu=config.max_shares_per_gpu,
    )


def slices_yaml(preview: NodePreview) -> str:
    """The ResourceSlices that would be published, as a YAML stream (no owner: no Node known)."""
    import yaml  # only for --print-slices

    return yaml.safe_dump_all(list(preview.slices), sort_keys=False)


class MetricsEndpoint:
    """``--metrics-address``: serves the plugin's :class:`Telemetry` on ``/metrics`` (and
    ``/healthz``) with the bounded server of :func:`serve_metrics`: a capped number of
    connections, each cut when its request is not read within the deadline."""

    def __init__(
        self, telemetry: Telemetry, address: str, healthy: Callable[[], bool] | None = None
    ) -> None:
        self._telemetry = telemetry
        self._address = address
        self._healthy = healthy
        self._server: BoundedHTTPServer | None = None

    def start(self) -> None:
        self._server = serve_metrics(self._telemetry, self._address, healthy=self._healthy)
        log.info("serving metrics on %s/metrics", self._address)

    @property
    def port(self) -> int | None:
        """The bound port while serving (useful with port 0), else None."""
        return None if self._server is None else int(self._server.server_address[1])

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class UnblockedPlacements:
    """Started after the claim service: publishes the dynamic MIG placements that no MIG
    instance created by someone else blocks (:meth:`DeviceState.hidden_devices`)."""

    def __init__(self, publisher: SlicePublisher, claims: ClaimService) -> None:
        self._publisher = publisher
        self._claims = claims

    def start(self) -> None:
        self._publisher.set_hidden_devices(self._claims.state.hidden_devices())

    def stop(self) -> None:
        """Nothing runs."""


class Plugin:
    """The running daemon.

    For other components: ``config``, ``gpus`` (NVML order), ``devices`` (the node's device
    table, shared by the publisher, prepare and health), ``backend``, ``api_client`` (share
    it), ``telemetry`` (create instruments on ``telemetry.meter``) and ``publisher`` (call
    ``publisher.set_taints(...)`` / ``publisher.update_devices(...)`` to republish).
    """

    def __init__(
        self,
        config: PluginConfig,
        backend: DeviceBackend,
        gpus: Sequence[GpuInfo],
        api_client: KubeClient,
        telemetry: Telemetry,
    ) -> None:
        self.config = config
        self.backend = backend
        self.gpus: tuple[GpuInfo, ...] = tuple(gpus)
        self.api_client = api_client
        self.telemetry = telemetry
        #: The node's device table, computed once: the publisher, prepare and health share it.
        self.devices = node_devices(
            gpus,
            config.sharing_mode,
            config.default_share_cores,
            config.mig_strategy,
            config.max_shares_per_gpu,
        )
        self.publisher = SlicePublisher(
            KubeRest(api_client), config.driver_name, config.node_name, self.devices
        )
        #: Set by :func:`build_plugin` unless ``--disable-health``: the GPU health monitor and
        #: the kubelet health-stream source to give ``PluginServer(health_source=...)``.
        self.health: HealthMonitor | None = None
        self.health_source: HealthSource | None = None
        #: Set by :func:`build_plugin`: prepare (the state module) and the kubelet gRPC server.
        self.claims: ClaimService | None = None
        #: Set by :func:`build_plugin` unless ``--disable-usage``: the usage sampler.
        self.usage: UsageSampler | None = None
        #: Components start in the order added and stop in reverse; the API client and the
        #: telemetry are closed last.
        self.lifecycle = Lifecycle()
        self.lifecycle.running("API client", api_client.close)
        self.lifecycle.running("telemetry", telemetry.shutdown)
        self.metrics_endpoint: MetricsEndpoint | None = None
        if config.metrics_address:
            # /healthz is the liveness probe: the kubelet gRPC endpoint must answer itself.
            self.metrics_endpoint = MetricsEndpoint(
                telemetry, config.metrics_address, healthy=self.responsive
            )
            self.lifecycle.add(self.metrics_endpoint)
        self.lifecycle.add(self.publisher)

    def responsive(self) -> bool:
        """Whether the kubelet gRPC endpoint answers (True before it is built)."""
        return self.claims is None or self.claims.server.responsive()

    def add_component(self, component: Component) -> None:
        """Run ``component`` with the daemon (call before :meth:`start`)."""
        self.lifecycle.add(component)

    def start(self) -> None:
        """Start every component in order; on a failure, stop those already running."""
        self.lifecycle.start()

    def stop(self) -> None:
        """Stop everything in reverse order (idempotent, never raises)."""
        self.lifecycle.stop()

    def request_stop(self) -> None:
        """Ask :meth:`run` to return (safe from signal handlers and other threads)."""
        self.lifecycle.request_stop()

    def run(self) -> int:
        """Start, wait for SIGTERM/SIGINT (or :meth:`request_stop`), stop; returns 0."""
        self.lifecycle.run(
            on_started=lambda: log.info(
                "running: driver %s, node %s, %d GPUs, sharing mode %s",
                self.config.driver_name,
                self.config.node_name,
                len(self.gpus),
                self.config.sharing_mode,
            )
        )
        log.info("stopped")
        return 0


def build_plugin(config: PluginConfig) -> Plugin:
    """Discover GPUs, connect to the API server and assemble the daemon.

    Raises :class:`DiscoveryError` or :class:`KubeConfigError`. This is where the daemon's
    further components are added (``plugin.add_component(...)``).
    """
    host = make_host(config)
    gpus = host.backend.discover()
    describe_gpus(gpus)
    host.check_node()
    api_client = load_connection(config.kubeconfig)
    plugin = Plugin(config, host.backend, gpus, api_client, Telemetry(SERVICE_NAME))
    # Health and usage taints reach the publisher merged (each sets its complete map).
    merger = TaintMerger(plugin.publisher)
    health_taints = merger.source("health")
    usage = config.usage
    usage_taints = merger.source("usage") if usage.taint or usage.escape_taint else None
    if config.health.enabled:
        plugin.health, plugin.health_source = build_health(
            config.health,
            host.health_checker(),
            config.driver_name,
            config.node_name,
            plugin.devices,
            taints=health_taints,
        )
        plugin.health.restore(
            published_unhealthy(
                KubeRest(api_client), config.driver_name, config.node_name, SYSTEM_CLOCK.time()
            )
        )
        plugin.add_component(plugin.health)
    partitioner = make_partitioner(host, plugin.devices)
    enforcer = enforcer_for(config, host, KubeRest(api_client))
    plugin.claims = ClaimService(
        config,
        host,
        plugin.devices,
        api_client,
        enforcer,
        plugin.health_source,
        plugin.telemetry,
        partitioner=partitioner,
    )
    plugin.add_component(plugin.claims)
    if partitioner is not None:
        # Dynamic MIG placements stay out of the slices until prepare has matched the GPUs'
        # MIG instances to its claims; then only those that other instances block stay hidden.
        plugin.publisher.set_hidden_devices(d.name for d in plugin.devices if d.dynamic_mig)
        plugin.add_component(UnblockedPlacements(plugin.publisher, plugin.claims))
        if plugin.health is not None:
            plugin.health.set_instance_resolver(plugin.claims.state.mig_device_for)
    if config.usage.enabled:
        plugin.usage = build_usage(plugin, host, plugin.claims, usage_taints)
        plugin.add_component(plugin.usage)
    return plugin


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the node daemon; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    configure_logging(config.log_format, config.log_level)
    try:
        if config.print_slices:
            preview = node_preview(make_host(config), slice_settings(config))
            sys.stdout.write(slices_yaml(preview))
            return 0
        plugin = build_plugin(config)
    except (DiscoveryError, KubeConfigError, SocketPathError, TemplateError) as exc:
        # SocketPathError here: a socket path too long for a unix socket; TemplateError: an
        # unusable MPS daemon pod template.
        return _fail(str(exc), 1)
    try:
        return plugin.run()
    except (OSError, SocketPathError) as exc:
        # A directory or socket the daemon cannot create (permissions, a file in the way).
        return _fail(f"cannot start: {exc}", 1)
