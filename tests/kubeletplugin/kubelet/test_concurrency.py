"""Prepares of different claims run in parallel: the gRPC layer does not serialise them."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from kubeletplugin.kubelet.preparer import ClaimRef, PrepareOutcome
from kubeletplugin.kubelet.server import PluginServer
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.kubelet.helpers import (
    DRIVER,
    Dirs,
    FakePreparer,
    one_device,
    running_server,
    socket_dirs,
)

CALLS = 32
# Generous: on a loaded machine the 32 calls still arrive well within this.
BARRIER_TIMEOUT_S = 60.0


def test_32_prepares_are_in_the_preparer_at_the_same_time() -> None:
    barrier = threading.Barrier(CALLS, timeout=BARRIER_TIMEOUT_S)

    def wait_for_all(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        # Breaks (BrokenBarrierError -> per-claim error) unless all 32 calls are inside at once.
        barrier.wait()
        return {c.uid: one_device(c) for c in claims}

    preparer = FakePreparer(prepare_fn=wait_for_all)
    claims = [ClaimRef("ns", f"uid-{i}", f"c{i}") for i in range(CALLS)]
    with (
        socket_dirs() as dirs,
        running_server(dirs, preparer, max_workers=CALLS),
        KubeletSim(dirs.registry) as kubelet,
        ThreadPoolExecutor(CALLS) as pool,
    ):
        plugin = kubelet.register(DRIVER)
        results = list(pool.map(lambda c: plugin.prepare([c]), claims))
    assert not barrier.broken
    assert [r[c.uid].error for r, c in zip(results, claims, strict=True)] == [""] * CALLS
    assert len(preparer.prepare_calls) == CALLS


def test_the_liveness_check_fails_while_every_worker_is_stuck(dirs: Dirs) -> None:
    """``responsive()`` backs the plugin's /healthz: it calls the DRA endpoint on its own socket,
    so a plugin whose workers are all stuck is restarted by kubelet's liveness probe."""
    release = threading.Event()
    entered = threading.Semaphore(0)

    def stuck(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        if claims:
            entered.release()
            release.wait(timeout=60)
        return {c.uid: one_device(c) for c in claims}

    server = PluginServer(DRIVER, dirs.registry, dirs.data, FakePreparer(stuck), max_workers=2)
    assert server.responsive()  # not started: nothing to probe
    server.start()
    try:
        assert server.responsive(timeout_s=10)
        with KubeletSim(dirs.registry) as kubelet:
            plugin = kubelet.register(DRIVER)
            calls = [
                threading.Thread(
                    target=plugin.prepare, args=([ClaimRef("ns", f"uid-{i}", f"c{i}")],)
                )
                for i in range(2)
            ]
            for call in calls:
                call.start()
            for _ in calls:
                assert entered.acquire(timeout=30)
            assert not server.responsive(timeout_s=0.5)
            release.set()
            for call in calls:
                call.join(timeout=30)
            assert server.responsive(timeout_s=10)
    finally:
        release.set()
        server.stop(grace=1.0)
