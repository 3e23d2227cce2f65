"""Health end to end: the plugin as built from its flags (mock backend, health file), the
in-process API server, the gRPC server and the kubelet simulator's health stream.

Deadlines are generous (the machine is shared); the publisher's periodic resync is 300 s, so
everything seen within them was published by the health mechanism itself.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api import names
from api.gpu import HEALTHY, UNHEALTHY
from controller.reconcile import reconcile
from kubeletplugin.config import parse_config
from kubeletplugin.health.monitor import HealthMonitor
from kubeletplugin.main import Plugin, build_plugin
from sharegpu.kube import slicerules
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import HealthWatch, KubeletSim, RegisteredPlugin, SimDeviceHealth
from tests.helpers import eventually
from tests.kubeletplugin.kubelet.helpers import socket_dirs
from tests.kubeletplugin.publish.helpers import create_node, devices, is_consistent, pool

DRIVER = names.DEFAULT_DRIVER_NAME
NODE = "n1"
TAINT_KEY = names.unhealthy_taint_key(DRIVER)
XID79_VALUE = "reset-required-XID-79-GPU-has-fallen-off-the-bus"
XID79_MESSAGE = "reset required: XID 79: GPU has fallen off the bus"
DEADLINE = 10.0


class SliceHistory:
    """Every version of this node's slices the API server stored since creation."""

    def __init__(self, server: KubeAPIServer) -> None:
        self._server = server
        self._watcher = server.store.watch(
            "resourceslices", None, lambda o: o["spec"].get("nodeName") == NODE, None
        )
        self.objects: list[dict[str, Any]] = []

    def drain(self) -> list[dict[str, Any]]:
        while True:
            try:
                item = self._watcher.queue.get_nowait()
            except queue.Empty:
                return self.objects
            obj = getattr(item, "object", None)
            if isinstance(obj, dict):
                self.objects.append(obj)

    def close(self) -> None:
        self._server.store.unwatch(self._watcher)


def write_atomic(path: Path, text: str) -> None:
    """Replace the file in one step, so the poller never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class Running:
    plugin: Plugin
    kubelet_plugin: RegisteredPlugin
    health_file: Path
    history: SliceHistory
    server: KubeAPIServer

    @property
    def monitor(self) -> HealthMonitor:
        assert self.plugin.health is not None
        return self.plugin.health

    def uuid(self, index: int) -> str:
        return self.plugin.gpus[index].uuid


@contextmanager
def running_plugin(
    apiserver: KubeAPIServer, tmp_path: Path, *flags: str, gpus: int = 2, new_node: bool = True
) -> Iterator[Running]:
    """The daemon from its flags, its own kubelet sockets registered with the simulator."""
    if new_node:
        create_node(apiserver, NODE)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    health_file = tmp_path / "health.yaml"
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("0f2b7a52-5d7e-4c1e-9a51-2f4d8c9e6b10\n")
    previous_usr1 = signal.getsignal(signal.SIGUSR1)
    with socket_dirs() as dirs:
        config = parse_config(
            [
                "--node-name",
                NODE,
                "--kubeconfig",
                kubeconfig,
                "--device-backend",
                "mock",
                "--mock-gpus",
                str(gpus),
                "--plugin-registry-dir",
                str(dirs.registry),
                "--plugin-data-dir",
                str(dirs.data),
                "--cdi-dir",
                str(tmp_path / "cdi"),
                "--mock-boot-id-file",
                str(boot_id),
                "--mock-health-file",
                str(health_file),
                "--health-probe-interval",
                "0.2",
                *flags,
            ],
            environ={},
        )
        plugin = build_plugin(config)
        history = SliceHistory(apiserver)
        try:
            plugin.start()
            with KubeletSim(dirs.registry) as kubelet:
                registered = kubelet.register(DRIVER)
                assert {"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} <= set(
                    registered.info.supported_versions
                )
                assert registered.health_version == "v1.DRAResourceHealth"
                yield Running(plugin, registered, health_file, history, apiserver)
        finally:
            plugin.stop()
            history.close()
            signal.signal(signal.SIGUSR1, previous_usr1)


def tainted(slices: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Device name -> its unhealthy taints, for the devices that have one."""
    return {
        d["name"]: [t for t in d.get("taints", []) if t["key"] == TAINT_KEY]
        for d in devices(slices)
        if any(t["key"] == TAINT_KEY for t in d.get("taints", []))
    }


def of_gpu(index: int, names_: object) -> set[str]:
    prefix = f"gpu-{index}"
    return {n for n in names_ if n == prefix or n.startswith(prefix + "-")}  # type: ignore[attr-defined]


def next_list_where(
    watch: HealthWatch, predicate: Any, deadline: float = DEADLINE
) -> list[SimDeviceHealth]:
    """Read the stream until a complete list satisfies ``predicate``."""
    end = time.monotonic() + deadline
    while True:
        remaining = end - time.monotonic()
        assert remaining > 0, "no matching health list in time"
        try:
            lst = watch.next(timeout=remaining)
        except queue.Empty:
            raise AssertionError("no matching health list in time") from None
        if predicate(lst):
            return lst


def by_name(lst: list[SimDeviceHealth]) -> dict[str, SimDeviceHealth]:
    return {d.device_name: d for d in lst}


def test_xid_taints_every_partition_of_the_gpu_and_reaches_the_stream(
    apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    with running_plugin(
        apiserver, tmp_path, "--sharing-mode", "partitions", "--health-recovery-probes", "25"
    ) as run:
        # 25 healthy probes 0.2 s apart: the GPU stays unhealthy for at least 5 s, longer than
        # the publisher's debounce, so the taint is written before the recovery replaces it.
        eventually(lambda: is_consistent(pool(apiserver)), timeout_s=DEADLINE)
        assert tainted(pool(apiserver)) == {}
        watch = run.kubelet_plugin.watch_health()
        first = watch.next()
        assert len(first) == 2 * 15
        assert {d.pool_name for d in first} == {NODE}
        assert {d.health for d in first} == {"HEALTHY"}
        all_names = {d.device_name for d in first}
        assert all_names == {d["name"] for d in devices(pool(apiserver))}

        write_atomic(run.health_file, "1: {xids: [79]}\n")

        def gpu1_tainted_in_history() -> bool:
            for obj in run.history.drain():
                found = tainted([obj])
                if of_gpu(1, found):
                    return True
            return False

        eventually(
            gpu1_tainted_in_history, "the XID taint in a published slice", timeout_s=DEADLINE
        )
        seen = [o for o in run.history.objects if tainted([o])]
        taints = tainted(seen[:1])
        assert set(taints) == of_gpu(1, all_names)
        assert len(taints) == 15
        for device_taints in taints.values():
            (taint,) = device_taints
            assert taint["value"] == XID79_VALUE
            assert taint["effect"] == "NoSchedule"
            assert taint["timeAdded"].endswith("Z")
        for obj in seen:
            assert (
                len(obj["spec"]["devices"])
                <= slicerules.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
            )

        lst = next_list_where(watch, lambda lst: any(d.health == "UNHEALTHY" for d in lst))
        health = by_name(lst)
        assert set(health) == all_names
        assert {n for n, d in health.items() if d.health == "UNHEALTHY"} == of_gpu(1, all_names)
        assert {health[n].message for n in of_gpu(1, all_names)} == {XID79_MESSAGE}
        assert {health[n].health for n in of_gpu(0, all_names)} == {"HEALTHY"}

        # XID 79 needs a GPU reset: healthy probes that follow do not bring the GPU back.
        state = run.monitor.gpu_health()[run.uuid(1)]
        assert state.needs_reset and not state.healthy
        watch.close()


def test_ignored_xids_change_nothing_and_the_controller_sees_health(
    apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    with running_plugin(apiserver, tmp_path, "--health-recovery-probes", "1000") as run:
        eventually(lambda: is_consistent(pool(apiserver)), timeout_s=DEADLINE)
        write_atomic(run.health_file, "0: {xids: [13, 31, 43, 45, 68, 109]}\n1: {xids: [48]}\n")
        eventually(lambda: "gpu-1" in tainted(pool(apiserver)), timeout_s=DEADLINE)
        assert set(tainted(run.history.drain())) == {"gpu-1"}
        assert (
            tainted(pool(apiserver))["gpu-1"][0]["value"]
            == "reset-required-XID-48-double-bit-ECC-error"
        )

        gpu_objects = reconcile(pool(apiserver), [], [], DRIVER)
        gpu0 = gpu_objects[names.gpu_object_name(NODE, 0)]
        gpu1 = gpu_objects[names.gpu_object_name(NODE, 1)]
        assert gpu0.status.health == HEALTHY
        assert (gpu1.status.health, gpu1.status.health_reason) == (
            UNHEALTHY,
            "reset-required-XID-48-double-bit-ECC-error",
        )


def test_probe_failure_holds_the_taint_until_recovery(
    apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    with running_plugin(
        apiserver,
        tmp_path,
        "--health-taint-effect",
        "NoExecute",
        "--health-recovery-probes",
        "2",
    ) as run:
        eventually(lambda: is_consistent(pool(apiserver)), timeout_s=DEADLINE)
        watch = run.kubelet_plugin.watch_health()
        write_atomic(
            run.health_file, "0: {healthy: false, reason: 'NVML query failed: GPU is lost'}\n"
        )
        eventually(lambda: "gpu-0" in tainted(pool(apiserver)), timeout_s=DEADLINE)
        taint = tainted(pool(apiserver))["gpu-0"][0]
        assert (taint["value"], taint["effect"]) == ("NVML-query-failed-GPU-is-lost", "NoExecute")
        lst = next_list_where(watch, lambda lst: by_name(lst)["gpu-0"].health == "UNHEALTHY")
        assert by_name(lst)["gpu-0"].message == "NVML query failed: GPU is lost"

        # Probes keep failing while the file says so: many probe rounds later, still tainted.
        probes_before = run.monitor.gpu_health()[run.uuid(0)].checked
        eventually(
            lambda: run.monitor.gpu_health()[run.uuid(0)].checked >= probes_before + 1,
            "more probes",
            timeout_s=DEADLINE,
        )
        assert not run.monitor.gpu_health()[run.uuid(0)].healthy
        assert "gpu-0" in tainted(pool(apiserver))

        write_atomic(run.health_file, "{}\n")
        eventually(lambda: tainted(pool(apiserver)) == {}, timeout_s=DEADLINE)
        next_list_where(watch, lambda lst: by_name(lst)["gpu-0"].health == "HEALTHY")
        watch.close()


def test_flapping_gives_bounded_publishes(apiserver: KubeAPIServer, tmp_path: Path) -> None:
    with running_plugin(apiserver, tmp_path, "--health-recovery-probes", "1") as run:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        apiserver.reset_counters()
        for i in range(16):
            if i % 2 == 0:
                write_atomic(run.health_file, f"0: {{healthy: false, reason: 'flap {i}'}}\n")
            else:
                write_atomic(run.health_file, "{}\n")
            time.sleep(0.25)  # paces the flapping; nothing below depends on how long it took
        write_atomic(run.health_file, "{}\n")
        health = run.monitor
        transitions = health.changes
        assert transitions >= 1
        if transitions >= 3:
            # It failed again soon after recovering: the next recovery needs more probes.
            assert health.gpu_health()[run.uuid(0)].required > 1
        eventually(
            lambda: tainted(pool(apiserver)) == {} and is_consistent(pool(apiserver), 1),
            timeout_s=3 * DEADLINE,
        )
        # Each write publishes a new taint state, so there are at most as many as health
        # changes (plus a sync in flight when counting began); the debounce that merges
        # changes is tested against the publisher's clock in tests/kubeletplugin/publish.
        writes = apiserver.write_count("resourceslices")
        assert writes <= health.changes + 1, (writes, health.changes)


def test_stream_reconnect_gets_the_full_current_list(
    apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    with running_plugin(apiserver, tmp_path, "--health-recovery-probes", "1000") as run:
        watch = run.kubelet_plugin.watch_health()
        assert [d.device_name for d in watch.next()] == ["gpu-0", "gpu-1"]
        watch.close()
        write_atomic(run.health_file, "1: {xids: [79]}\n")
        eventually(lambda: not run.monitor.gpu_health()[run.uuid(1)].healthy, timeout_s=DEADLINE)
        again = run.kubelet_plugin.watch_health()
        lst = again.next()
        assert [(d.device_name, d.health) for d in lst] == [
            ("gpu-0", "HEALTHY"),
            ("gpu-1", "UNHEALTHY"),
        ]
        assert by_name(lst)["gpu-1"].message == XID79_MESSAGE
        again.close()


def test_sigusr1_reapplies_the_health_file(apiserver: KubeAPIServer, tmp_path: Path) -> None:
    with running_plugin(apiserver, tmp_path, "--health-recovery-probes", "2") as run:
        health = run.monitor
        # XID 92 does not need a reset, so the healthy probes that follow clear it.
        write_atomic(run.health_file, "0: {xids: [92]}\n")
        eventually(lambda: health.changes >= 2, "fault and recovery", timeout_s=DEADLINE)
        assert health.gpu_health()[run.uuid(0)].healthy
        os.kill(os.getpid(), signal.SIGUSR1)
        eventually(lambda: health.changes >= 3, "the XID re-applied", timeout_s=DEADLINE)


def test_a_tainted_gpu_in_a_full_slice_is_split_out(
    apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    with running_plugin(apiserver, tmp_path, "--health-recovery-probes", "1000", gpus=100) as run:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=3 * DEADLINE)
        write_atomic(run.health_file, "5: {healthy: false, reason: 'XID 79'}\n")
        eventually(
            lambda: "gpu-5" in tainted(pool(apiserver)) and is_consistent(pool(apiserver)),
            timeout_s=3 * DEADLINE,
        )
        slices = pool(apiserver)
        assert len(devices(slices)) == 100
        assert max(len(s["spec"]["devices"]) for s in slices) <= 64
        assert set(tainted(slices)) == {"gpu-5"}


def test_an_unhealthy_gpu_stays_tainted_across_a_plugin_restart(
    apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    with running_plugin(apiserver, tmp_path, "--health-recovery-probes", "1000") as run:
        # XID 92 (high single-bit ECC rate) does not need a reset, so probes may clear it.
        write_atomic(run.health_file, "1: {xids: [92]}\n")
        eventually(lambda: "gpu-1" in tainted(pool(apiserver)), timeout_s=DEADLINE)
        before = tainted(pool(apiserver))
    with running_plugin(
        apiserver, tmp_path, "--health-recovery-probes", "3", new_node=False
    ) as run:
        # The XID is not repeated: the GPU is unhealthy only because the taint was read back.
        assert not run.monitor.gpu_health()[run.uuid(1)].healthy
        watch = run.kubelet_plugin.watch_health()
        assert by_name(watch.next())["gpu-1"].health == "UNHEALTHY"
        # Recovery through healthy probes; until then no slice version lost the taint.
        eventually(lambda: tainted(pool(apiserver)) == {}, timeout_s=3 * DEADLINE)
        versions = run.history.drain()
        first_untainted = next(i for i, o in enumerate(versions) if not tainted([o]))
        assert all(tainted([o]) == before for o in versions[:first_untainted])
        watch.close()
