"""Plugin flags (defaults, environment fallbacks, checks) and the daemon's component lifecycle."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from kubeletplugin.config import ConfigError, PluginConfig, parse_config
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.hosts.nvidia import NvidiaHost
from kubeletplugin.main import Plugin, make_host
from sharegpu.kube import httpserve
from sharegpu.kube.telemetry import Telemetry
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.helpers import eventually
from tests.kube.helpers import Recorder, all_closed, get_with_retries, short_limits, stall
from tests.kubeletplugin.publish.helpers import DEADLINE, create_node, is_consistent, pool


def test_defaults() -> None:
    config = parse_config(["--node-name", "n1"], environ={})
    assert config == PluginConfig(
        driver_name="gpu.sharegpu.dev",
        node_name="n1",
        kubeconfig=None,
        plugin_registry_dir=Path("/var/lib/kubelet/plugins_registry"),
        plugin_data_dir=Path("/var/lib/kubelet/plugins/gpu.sharegpu.dev"),
        cdi_dir=Path("/var/run/cdi"),
        sharing_mode="consumable",
        metrics_address=None,
        log_format="text",
        log_level="info",
        print_slices=False,
    )
    assert config.simulated is None


def test_environment_fallbacks_and_flag_precedence() -> None:
    env = {"NODE_NAME": "env-node", "DRIVER_NAME": "gpu.example.com"}
    config = parse_config([], environ=env)
    assert (config.node_name, config.driver_name) == ("env-node", "gpu.example.com")
    assert config.plugin_data_dir == Path("/var/lib/kubelet/plugins/gpu.example.com")
    config = parse_config(["--node-name", "flag-node", "--driver-name", "d.example"], environ=env)
    assert (config.node_name, config.driver_name) == ("flag-node", "d.example")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--node-name is required"),
        (["--node-name", "n1", "--driver-name", "Bad_Driver"], "--driver-name 'Bad_Driver'"),
        (["--node-name", "n1", "--metrics-address", "nowhere"], "--metrics-address: invalid"),
        (["--node-name", "n1", "--device-backend", "mock", "--mock-gpus", "0"], "--mock-gpus"),
        (["--node-name", "n1", "--mock-config", "x.yaml"], "--mock-config needs"),
        (["--node-name", "n1", "--mps-shm-size", "8Mi"], "--mps-shm-size '8Mi': must be 16Mi to"),
        (["--node-name", "n1", "--mps-shm-size", "65Gi"], "--mps-shm-size '65Gi': must be 16Mi"),
        (["--node-name", "n1", "--mps-shm-size", "lots"], "--mps-shm-size 'lots': "),
    ],
)
def test_bad_flags(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, environ={})


def make_plugin(server: KubeAPIServer, *flags: str) -> Plugin:
    config = parse_config(["--node-name", "n1", "--device-backend", "mock", *flags], environ={})
    backend = MockBackend("n1", count=2)
    return Plugin(config, backend, backend.discover(), server.client(), Telemetry("test"))


def test_components_start_in_order_and_stop_in_reverse(apiserver: KubeAPIServer) -> None:
    create_node(apiserver)
    events: list[str] = []
    plugin = make_plugin(apiserver)
    plugin.add_component(Recorder("grpc", events))
    plugin.add_component(Recorder("health", events))
    plugin.start()
    try:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        with pytest.raises(RuntimeError, match="before the daemon starts"):
            plugin.add_component(Recorder("late", events))
    finally:
        plugin.stop()
    assert events == ["start grpc", "start health", "stop health", "stop grpc"]
    plugin.stop()  # idempotent
    assert events == ["start grpc", "start health", "stop health", "stop grpc"]


def test_failed_start_stops_what_started(apiserver: KubeAPIServer) -> None:
    create_node(apiserver)
    events: list[str] = []
    plugin = make_plugin(apiserver)
    plugin.add_component(Recorder("grpc", events))
    plugin.add_component(Recorder("broken", events, fail_start=True))
    with pytest.raises(RuntimeError, match="broken cannot start"):
        plugin.start()
    assert events == ["start grpc", "stop grpc"]
    plugin.stop()


def test_run_returns_zero_on_request_stop(apiserver: KubeAPIServer) -> None:
    create_node(apiserver)
    plugin = make_plugin(apiserver)
    plugin.request_stop()
    assert plugin.run() == 0


def test_metrics_endpoint_is_bounded(
    apiserver: KubeAPIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--metrics-address (also /healthz): each connection that stalls after one byte of its
    request is cut at the deadline, and /metrics is still answered."""
    monkeypatch.setattr(httpserve, "DEFAULT_LIMITS", short_limits(max_connections=4))
    create_node(apiserver)
    plugin = make_plugin(apiserver, "--metrics-address", "127.0.0.1:0")
    plugin.start()
    stallers = []
    try:
        assert plugin.metrics_endpoint is not None and plugin.metrics_endpoint.port
        port = plugin.metrics_endpoint.port
        stallers = [stall(port) for _ in range(20)]
        all_closed(stallers)
        assert get_with_retries(port, "/metrics") == 200
    finally:
        for sock in stallers:
            sock.close()
        plugin.stop()


def test_metrics_endpoint(apiserver: KubeAPIServer) -> None:
    create_node(apiserver)
    plugin = make_plugin(apiserver, "--metrics-address", "127.0.0.1:0")
    counter = plugin.telemetry.meter.create_counter("sharegpu_test_events")
    counter.add(3)
    plugin.start()
    try:
        assert plugin.metrics_endpoint is not None and plugin.metrics_endpoint.port
        url = f"http://127.0.0.1:{plugin.metrics_endpoint.port}/metrics"
        with urllib.request.urlopen(url, timeout=DEADLINE) as response:
            body = response.read().decode()
        assert "sharegpu_test_events_total 3.0" in body
    finally:
        plugin.stop()
    assert plugin.metrics_endpoint.port is None


def test_healthz_follows_the_liveness_check() -> None:
    """/healthz is the plugin's liveness probe: 503 while its own check fails, 200 after."""
    from sharegpu.kube.telemetry import serve_metrics

    state = {"ok": True}
    telemetry = Telemetry("test-liveness")
    server = serve_metrics(telemetry, "127.0.0.1:0", healthy=lambda: state["ok"])
    port = server.server_address[1]
    try:
        assert get_with_retries(port, "/healthz") == 200
        state["ok"] = False
        assert get_with_retries(port, "/healthz") == 503
        state["ok"] = True
        assert get_with_retries(port, "/healthz") == 200
    finally:
        server.shutdown()
        server.server_close()
        telemetry.shutdown()


def test_the_plugin_health_check_asks_its_grpc_endpoint(apiserver: KubeAPIServer) -> None:
    create_node(apiserver)
    plugin = make_plugin(apiserver)
    assert plugin.responsive()  # nothing built yet: nothing to probe

    class Server:
        def responsive(self) -> bool:
            return False

    class Claims:
        server = Server()

    plugin.claims = Claims()  # type: ignore[assignment]
    assert not plugin.responsive()


def test_mps_shm_size_flag() -> None:
    assert parse_config(["--node-name", "n1"], environ={}).mps_shm_bytes == 256 * 1024**2
    config = parse_config(["--node-name", "n1", "--mps-shm-size", "1Gi"], environ={})
    assert config.mps_shm_bytes == 1024**3


def test_default_share_cores_flag() -> None:
    base = ["--node-name", "node-a", "--device-backend", "mock"]
    assert parse_config(base).default_share_cores == 100
    assert parse_config([*base, "--default-share-cores", "10"]).default_share_cores == 10
    for bad in ("0", "101"):
        with pytest.raises(ConfigError, match=f"--default-share-cores {bad}: must be 1 to 100"):
            parse_config([*base, "--default-share-cores", bad])


def test_max_shares_per_gpu_flag() -> None:
    base = ["--node-name", "node-a", "--device-backend", "mock"]
    assert parse_config(base).max_shares_per_gpu == 0
    assert parse_config([*base, "--max-shares-per-gpu", "20"]).max_shares_per_gpu == 20
    for bad in ("-1", "61"):
        with pytest.raises(ConfigError, match=f"--max-shares-per-gpu {bad}: must be 0"):
            parse_config([*base, "--max-shares-per-gpu", bad])


def test_the_gpu_node_check_reads_the_hosts_proc_root(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir()
    proc.mkdir()
    (proc / "devices").write_text("Character devices:\n195 nvidia\n")
    host = make_host(parse_config(["--node-name", "n1"], environ={}))
    assert isinstance(host, NvidiaHost)
    assert (host.dev_root, host.proc_root) == (Path("/dev"), Path("/proc"))
    # The host's /dev and /proc in production (no flag moves them); here fixture directories.
    fixture = NvidiaHost(dev_root=dev, proc_root=proc, nvidia_cdi=host.nvidia_cdi)
    with caplog.at_level("WARNING", logger="kubeletplugin.devices.uvm"):
        fixture.check_node()
    assert f"{proc / 'devices'} lists no character device 'nvidia-uvm'" in caplog.text
    assert "nvidia-modprobe -u -c=0" in caplog.text


def test_the_nvidia_cdi_kind_reaches_the_detectors() -> None:
    config = parse_config(
        ["--node-name", "n1", "--nvidia-cdi-kind", "k8s.example.com/gpu"], environ={}
    )
    assert config.nvidia_cdi_kind == "k8s.example.com/gpu"
    host = make_host(config)
    assert isinstance(host, NvidiaHost)
    assert host.nvidia_cdi is not None and host.nvidia_cdi.kind == "k8s.example.com/gpu"


@pytest.mark.parametrize("kind", ["gpu", "nvidia.com/", "/gpu", "nvidia.com/g.pu", "1x.com/gpu"])
def test_a_bad_nvidia_cdi_kind_is_refused(kind: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(["--node-name", "n1", "--nvidia-cdi-kind", kind], environ={})
    assert str(info.value) == (
        f"--nvidia-cdi-kind {kind!r}: must be a CDI kind vendor/class, e.g. nvidia.com/gpu"
    )
