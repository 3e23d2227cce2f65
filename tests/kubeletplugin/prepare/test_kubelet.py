"""Prepare and unprepare through the kubelet simulator (real unix sockets, v1 and v1beta1),
with DeviceState reading claims from the in-process API server."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from kubeletplugin.devices.table import node_devices
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.kubelet.server import PluginServer
from kubeletplugin.prepare.cdi import CdiSpecWriter, spec_file_prefix
from kubeletplugin.prepare.checkpoint import Checkpoint
from kubeletplugin.prepare.claims import KubeClaimGetter
from kubeletplugin.prepare.state import DeviceState
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    GI,
    NODE,
    Node,
    assert_valid_cdi,
    claim,
    gpus,
    ref,
    result,
)


class Plugin:
    """DeviceState + PluginServer on short socket paths, for one test."""

    def __init__(self, root: Path, client: kubernetes.client.ApiClient) -> None:
        self.node = Node(root)
        self.registry = root / "reg"
        self.sockets = root / "plug"
        self.state = DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=node_devices(gpus(), "consumable"),
            claims=KubeClaimGetter(client),
            cdi=CdiSpecWriter(self.node.cdi_dir, DRIVER),
            checkpoint=Checkpoint(self.node.data_dir, boot_id_file=self.node.boot_id_file),
        )
        self.state.start()
        self.server = PluginServer(DRIVER, self.registry, self.sockets, self.state)
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=1.0)


@pytest.fixture
def plugin(kube_client: kubernetes.client.ApiClient) -> Iterator[Plugin]:
    root = Path(tempfile.mkdtemp(prefix="sgst-", dir="/tmp"))
    p = Plugin(root, kube_client)
    try:
        yield p
    finally:
        p.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_prepare_unprepare_over_both_versions(
    plugin: Plugin, apiserver: KubeAPIServer, version: str
) -> None:
    whole = claim("whole", [result("gpu", "gpu-0")])
    share = claim(
        "share",
        [
            result("a", "gpu-1", share={"cores": 30, "memory": 10 * GI}),
            result("b/small", "gpu-1", share={"cores": 20, "memory": 4 * GI}),
        ],
    )
    other = claim("nic", [result("nic", "eth0", driver="net.example.com")])
    unallocated = claim("pending", None)
    for obj in (whole, share, other, unallocated):
        apiserver.store.put("resourceclaims", obj)
    with KubeletSim(plugin.registry) as sim, sim.register(DRIVER) as kplugin:
        assert kplugin.version == "v1.DRAPlugin"
        refs = [ref(o) for o in (whole, share, other, unallocated)]
        results = kplugin.prepare(refs, version=version)
        assert set(results) == {r.uid for r in refs}
        assert results[whole["metadata"]["uid"]].error == ""
        (dev,) = results[whole["metadata"]["uid"]].devices
        assert (dev.request_names, dev.pool_name, dev.device_name) == (("gpu",), NODE, "gpu-0")
        shared = results[share["metadata"]["uid"]]
        assert shared.error == ""
        sids = [r["shareID"] for r in share["status"]["allocation"]["devices"]["results"]]
        assert [d.request_names for d in shared.devices] == [("a",), ("b",)]
        expected = sids if version == "v1.DRAPlugin" else [None, None]
        assert [d.share_id for d in shared.devices] == expected
        assert "no allocation result for driver" in results[other["metadata"]["uid"]].error
        assert "is not allocated" in results[unallocated["metadata"]["uid"]].error
        for path in plugin.node.spec_files():
            assert_valid_cdi(path)
        assert len(plugin.node.spec_files()) == 2
        # Repeated call: same answer.
        again = kplugin.prepare(refs[:2], version=version)
        assert again[whole["metadata"]["uid"]] == results[whole["metadata"]["uid"]]
        errors = kplugin.unprepare(refs, version=version)
        assert errors == {r.uid: "" for r in refs}
        assert plugin.node.spec_files() == []


def test_uid_mismatch_over_the_socket(plugin: Plugin, apiserver: KubeAPIServer) -> None:
    old = claim("recreated", [result("gpu", "gpu-0")])
    new = claim("recreated", [result("gpu", "gpu-0")])
    apiserver.store.delete_now("resourceclaims", "recreated", "default")
    apiserver.store.put("resourceclaims", new)
    with KubeletSim(plugin.registry) as sim, sim.register(DRIVER) as kplugin:
        res = kplugin.prepare([ref(old)])
        assert "was replaced" in res[old["metadata"]["uid"]].error


def test_32_concurrent_prepares_over_the_socket(plugin: Plugin, apiserver: KubeAPIServer) -> None:
    n = 32
    objs = [
        claim(f"c{i}", [result("gpu", f"gpu-{i % 8}", share={"cores": 3, "memory": GI})])
        for i in range(n)
    ]
    for obj in objs:
        apiserver.store.put("resourceclaims", obj)
    barrier = threading.Barrier(n)
    results: dict[str, Any] = {}
    failures: list[BaseException] = []
    with KubeletSim(plugin.registry) as sim, sim.register(DRIVER) as kplugin:

        def call(obj: dict[str, Any]) -> None:
            try:
                barrier.wait(timeout=60)
                results.update(kplugin.prepare([ref(obj)]))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=call, args=(o,)) for o in objs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not failures
        assert len(results) == n and all(r.error == "" for r in results.values())
        assert len({d.share_id for r in results.values() for d in r.devices}) == n
        assert len(plugin.node.spec_files()) == n
        errors = kplugin.unprepare([ref(o) for o in objs])
        assert set(errors.values()) == {""}
    assert plugin.node.spec_files() == []


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_a_claim_uid_with_a_path_in_it_touches_nothing_outside_the_cdi_dir(
    plugin: Plugin, version: str
) -> None:
    """Unprepare (and prepare) of ``x/../../victim`` used to delete ``<cdi-dir>/../victim.json``."""
    victim = plugin.node.cdi_dir.parent / "victim.json"
    victim.write_text("keep me")
    # With this directory, <cdi-dir>/<prefix>x/../../victim.json resolves to the victim.
    (plugin.node.cdi_dir / f"{spec_file_prefix(DRIVER)}x").mkdir(parents=True)
    hostile = ClaimRef("default", "x/../../victim", "c")
    with KubeletSim(plugin.registry) as sim, sim.register(DRIVER) as kplugin:
        errors = kplugin.unprepare([hostile], version=version)
        prepared = kplugin.prepare([hostile], version=version)
    assert errors[hostile.uid].startswith("kubelet sent an invalid claim reference: uid")
    assert prepared[hostile.uid].error.startswith("kubelet sent an invalid claim reference")
    assert victim.read_text() == "keep me"
    assert plugin.node.spec_files() == []
