"""Claim preparation metrics, scraped as Prometheus text."""

from __future__ import annotations

import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeletplugin.config import parse_config
from kubeletplugin.devices.table import node_devices
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.main import build_plugin
from kubeletplugin.prepare.cdi import CdiSpecWriter
from kubeletplugin.prepare.checkpoint import Checkpoint
from kubeletplugin.prepare.state import DeviceState
from sharegpu.kube.telemetry import Telemetry
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    GI,
    NODE,
    FakeClaims,
    Node,
    claim,
    gpus,
    ref,
    result,
)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry("sharegpu-kubeletplugin-test", env={})
    try:
        yield t
    finally:
        t.shutdown()


def _samples(telemetry: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(telemetry.scrape().decode()):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.name.endswith("_bucket"):
                continue
            out[(s.name, labels)] = s.value
    return out


def test_prepare_metrics_by_result_and_reason(tmp_path: Path, telemetry: Telemetry) -> None:
    node = Node(tmp_path)
    claims = FakeClaims()
    ok = claim("ok", [result("gpu", "gpu-0")])
    clash = claim("clash", [result("gpu", "gpu-0", share={"cores": 10, "memory": GI})])
    pending = claim("pending", None)
    claims.add(ok, clash, pending)
    state = DeviceState(
        driver_name=DRIVER,
        node_name=NODE,
        devices=node_devices(gpus(), "consumable"),
        claims=claims,
        cdi=CdiSpecWriter(node.cdi_dir, DRIVER),
        checkpoint=Checkpoint(node.data_dir, boot_id_file=node.boot_id_file),
        telemetry=telemetry,
    )
    state.start()
    missing = ClaimRef(namespace="default", name="gone", uid="66666666-6666-6666-6666-666666666666")
    outs = state.prepare([ref(ok), ref(clash), ref(pending), missing])
    assert outs[ok["metadata"]["uid"]].error == ""
    state.prepare([ref(ok)])  # answered from the record: counted as ok
    state.unprepare([ref(clash)])
    samples = _samples(telemetry)
    assert samples[("sharegpu_prepare_duration_seconds_count", (("result", "ok"),))] == 2
    assert samples[("sharegpu_prepare_duration_seconds_count", (("result", "error"),))] == 3
    for reason in ("conflict", "unallocated", "not_found"):
        assert samples[("sharegpu_prepare_errors_total", (("reason", reason),))] == 1
    assert samples[("sharegpu_unprepare_duration_seconds_count", (("result", "ok"),))] == 1
    assert samples[("sharegpu_prepared_claims", ())] == 1
    state.unprepare([ref(ok)])
    assert _samples(telemetry)[("sharegpu_prepared_claims", ())] == 0
    state.close()


def test_the_daemon_serves_prepare_metrics(tmp_path: Path, apiserver: KubeAPIServer) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    root = Path(tempfile.mkdtemp(prefix="sgm-", dir="/tmp"))
    (tmp_path / "boot_id").write_text("5a1e3c2b-0d4f-4e6a-8b7c-9d0e1f2a3b4c\n")
    config = parse_config(
        [
            f"--node-name={NODE}",
            f"--kubeconfig={kubeconfig}",
            "--device-backend=mock",
            f"--plugin-registry-dir={root / 'reg'}",
            f"--plugin-data-dir={root / 'data'}",
            f"--cdi-dir={tmp_path / 'cdi'}",
            f"--mock-boot-id-file={tmp_path / 'boot_id'}",
            f"--nvidia-cdi-dirs={tmp_path / 'none'}",
            "--metrics-address=127.0.0.1:0",
            "--disable-health",
        ],
        environ={},
    )
    c = claim("served", [result("gpu", "gpu-0", share={"cores": 10, "memory": GI})])
    apiserver.store.put("resourceclaims", c)
    plugin = build_plugin(config)
    try:
        plugin.start()
        with KubeletSim(root / "reg") as sim, sim.register(DRIVER) as kplugin:
            assert kplugin.prepare([ref(c)])[c["metadata"]["uid"]].error == ""
        assert plugin.metrics_endpoint is not None and plugin.metrics_endpoint.port
        url = f"http://127.0.0.1:{plugin.metrics_endpoint.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["sharegpu_prepared_claims"].samples[0].value == 1
        counts = [
            s
            for s in families["sharegpu_prepare_duration_seconds"].samples
            if s.name.endswith("_count")
        ]
        assert [(s.labels["result"], s.value) for s in counts] == [("ok", 1)]
    finally:
        plugin.stop()
        shutil.rmtree(root, ignore_errors=True)
