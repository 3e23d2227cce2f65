"""Crash safety of the real plugin process: kill -9 at every step of every kind of call (and
before calls) in a long prepare/unprepare loop, restart, retry like kubelet, and check the node
after every call. Kill points are events (the process kills itself at a numbered step), chosen
from a seed: a failure names the seed that replays it exactly.

The "scheduler" here deliberately hands some whole GPUs to two claims (a stale decision), so
"no GPU handed out twice" is checked against claims that really conflict.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.prepare.checkpoint import canonical_json
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.prepare.checkpoint_files import read_document
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    GI,
    NODE,
    claim,
    ref,
    result,
)
from tests.kubeletplugin.prepare.process_helpers import (
    BEFORE_CALL,
    GPUS,
    CrashingKubelet,
    KillPlanner,
    PluginProcess,
    check_node,
    crash_seed,
    replay_hint,
)

pytestmark = pytest.mark.process

SEED = 20261122
OPERATIONS = 100
#: The share of calls killed before they are sent (the others are killed at a step of the call
#: while some step of their kind was never killed at).
KILLED_BEFORE_CALL = 0.05


@pytest.fixture
def env() -> Iterator[tuple[KubeAPIServer, PluginProcess]]:
    root = Path(tempfile.mkdtemp(prefix="sgcr-", dir="/tmp"))
    (root / "boot_id").write_text("3c9e1c7e-7d7b-4c42-9a4c-0d9b1f0e0c11\n")
    with KubeAPIServer() as apiserver:
        kubeconfig = root / "kubeconfig"
        apiserver.write_kubeconfig(kubeconfig)
        plugin = PluginProcess(root, kubeconfig)
        try:
            yield apiserver, plugin
        finally:
            plugin.close()
            shutil.rmtree(root, ignore_errors=True)


def _claims(rng: random.Random) -> list[dict[str, Any]]:
    """Whole GPUs (two claims per GPU: conflicting allocations) and small shares."""
    objs = []
    for i in range(GPUS):
        for n in range(2):
            objs.append(claim(f"whole-{i}-{n}", [result("gpu", f"gpu-{i}")]))
    for n in range(8):
        gpu = rng.randrange(GPUS)
        share = {"cores": rng.choice([5, 10, 20]), "memory": rng.choice([1, 2, 4]) * GI}
        objs.append(claim(f"share-{n}", [result("gpu", f"gpu-{gpu}", share=share)]))
    return objs


def test_kill_9_at_every_step(env: tuple[KubeAPIServer, PluginProcess]) -> None:
    apiserver, plugin = env
    seed = crash_seed(SEED)
    rng = random.Random(seed)
    objs = _claims(rng)
    for obj in objs:
        apiserver.store.put("resourceclaims", obj)
    refs = {o["metadata"]["uid"]: ref(o) for o in objs}
    # Chosen by name: the UIDs are random, their order is not the seed's.
    name_of = {uid: r.name for uid, r in refs.items()}
    kinds = {o["metadata"]["uid"]: o["metadata"]["name"].split("-")[0] for o in objs}
    prepared: set[str] = set()
    refusals: list[str] = []
    plugin.start()
    sim = KubeletSim(plugin.registry)
    kubelet = CrashingKubelet(plugin, sim, plugin.register(sim))
    planner = KillPlanner(kubelet, rng, before_call=KILLED_BEFORE_CALL)
    where = "the start"

    try:
        with replay_hint(seed, lambda: where):
            for step in range(OPERATIONS):
                candidates = [u for u in refs if u not in prepared]
                if prepared and (not candidates or rng.random() < 0.45):
                    op, uid = "unprepare", rng.choice(sorted(prepared, key=name_of.get))
                else:
                    op, uid = "prepare", rng.choice(sorted(candidates, key=name_of.get))
                kind = kinds[uid]
                kill_at = planner.choose(f"{op} {kind}")
                where = f"operation {step}: {op} of {refs[uid].name}, kill at {kill_at}"
                value = kubelet.answered(op, refs[uid], kill_at, kind)
                if op == "prepare":
                    if value == "":
                        prepared.add(uid)
                    else:
                        refusals.append(value)
                        assert "refusing to hand it out twice" in value or "exceed" in value, value
                else:
                    assert value == "", value
                    prepared.discard(uid)
                check_node(plugin, prepared)
            where = "the final unprepare"
            # Kubelet unprepares everything at the end.
            errors = kubelet.kplugin.unprepare([refs[u] for u in sorted(prepared)])
            assert set(errors.values()) <= {""}
            prepared.clear()
            check_node(plugin, prepared)
            assert list(plugin.cdi_dir.glob("*.json")) == []
            where = "the coverage check"
            # Every kind of call ran, wrote the checkpoint and was killed at each of its steps.
            assert set(kubelet.offers) == {
                "prepare whole",
                "prepare share",
                "unprepare whole",
                "unprepare share",
            }
            for label, steps in kubelet.offers.items():
                assert ("pwrite:data/checkpoint.dat", 1) in steps, (label, steps)
            uncovered = sorted(map(str, kubelet.uncovered()))
            assert not uncovered, f"kill points never killed at: {uncovered}"
            assert sum(p.target == BEFORE_CALL for p in kubelet.killed_at) >= 2
            assert kubelet.kills == len(kubelet.killed_at)
            assert kubelet.lost_calls == len(kubelet.killed_at)  # every kill lost its call
            assert any("refusing to hand it out twice" in r for r in refusals)
    finally:
        kubelet.kplugin.close()
        sim.close()


def test_garbage_checkpoint_at_start_of_the_real_process(
    env: tuple[KubeAPIServer, PluginProcess],
) -> None:
    apiserver, plugin = env
    objs = [
        claim("keep-whole", [result("gpu", "gpu-0")]),
        claim("keep-share", [result("gpu", "gpu-1", share={"cores": 25, "memory": 2 * GI})]),
    ]
    for obj in objs:
        apiserver.store.put("resourceclaims", obj)
    refs = [ref(o) for o in objs]
    plugin.start()
    with KubeletSim(plugin.registry) as sim:
        kplugin = plugin.register(sim)
        first = kplugin.prepare(refs)
        assert all(r.error == "" for r in first.values())
        kplugin.close()
        plugin.stop()
        (plugin.data_dir / "checkpoint.json").write_bytes(b"\x00garbage{{{")
        plugin.start()
        kplugin = plugin.register(sim)
        # Rebuilt from the spec files: the same answer, and a clean unprepare.
        assert kplugin.prepare(refs) == first
        assert len(list(plugin.data_dir.glob("checkpoint.json.corrupt-*"))) == 1
        assert "corrupt" in plugin.logs[-1].read_text()
        check_node(plugin, {r.uid for r in refs}, corrupt_copies=1)
        assert set(kplugin.unprepare(refs).values()) == {""}
        check_node(plugin, set(), corrupt_copies=1)
        kplugin.close()


def test_spec_lost_or_truncated_after_kill_9_is_restored_identical_by_the_real_process(
    env: tuple[KubeAPIServer, PluginProcess],
) -> None:
    """Spec files are written without fsync, so a power loss may take or cut them short while
    the checkpoint says the claims are prepared: after a kill -9, one spec gone and one cut in
    half, the restarted plugin writes both back byte for byte before it answers kubelet, and
    answers as before."""
    apiserver, plugin = env
    objs = [
        claim("lost-whole", [result("gpu", "gpu-0")]),
        claim("cut-share", [result("gpu", "gpu-1", share={"cores": 25, "memory": 2 * GI})]),
    ]
    for obj in objs:
        apiserver.store.put("resourceclaims", obj)
    refs = [ref(o) for o in objs]
    plugin.start()
    with KubeletSim(plugin.registry) as sim:
        kplugin = plugin.register(sim)
        first = kplugin.prepare(refs)
        assert all(r.error == "" for r in first.values())
        kplugin.close()
        plugin.kill()
        lost, cut = (plugin.cdi_dir / f"k8s.{DRIVER}-claim_{r.uid}.json" for r in refs)
        written = {lost: lost.read_bytes(), cut: cut.read_bytes()}
        lost.unlink()
        cut.write_bytes(written[cut][: len(written[cut]) // 2])
        plugin.start()
        kplugin = plugin.register(sim)
        assert {p: p.read_bytes() for p in written} == written
        assert kplugin.prepare(refs) == first
        check_node(plugin, {r.uid for r in refs})
        assert set(kplugin.unprepare(refs).values()) == {""}
        check_node(plugin, set())
        kplugin.close()


def test_a_checkpoint_json_of_an_earlier_version_is_migrated_by_the_real_process(
    env: tuple[KubeAPIServer, PluginProcess],
) -> None:
    """The node as an earlier version left it (checkpoint.json, no two-slot file): the
    prepared claims survive the upgrade, and the old file is gone."""
    apiserver, plugin = env
    objs = [claim("keep-share", [result("gpu", "gpu-1", share={"cores": 25, "memory": 2 * GI})])]
    for obj in objs:
        apiserver.store.put("resourceclaims", obj)
    refs = [ref(o) for o in objs]
    plugin.start()
    with KubeletSim(plugin.registry) as sim:
        kplugin = plugin.register(sim)
        first = kplugin.prepare(refs)
        assert all(r.error == "" for r in first.values())
        kplugin.close()
        plugin.stop()
        legacy = plugin.data_dir / "checkpoint.json"
        legacy.write_bytes(canonical_json(read_document(plugin.data_dir)))
        (plugin.data_dir / "checkpoint.dat").unlink()
        plugin.start()
        kplugin = plugin.register(sim)
        assert kplugin.prepare(refs) == first
        assert not legacy.exists()
        check_node(plugin, {r.uid for r in refs})
        assert set(kplugin.unprepare(refs).values()) == {""}
        check_node(plugin, set())
        kplugin.close()


def test_unusable_data_dir_is_one_line_not_a_traceback(
    env: tuple[KubeAPIServer, PluginProcess],
) -> None:
    _, plugin = env
    blocker = plugin.root / "a-file"
    blocker.write_text("")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeletplugin",
            "--device-backend=mock",
            f"--node-name={NODE}",
            f"--kubeconfig={plugin.kubeconfig}",
            f"--plugin-registry-dir={plugin.registry}",
            f"--plugin-data-dir={blocker / 'data'}",
            f"--cdi-dir={plugin.cdi_dir}",
            "--disable-health",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith("sharegpu-kubeletplugin: error: cannot start: [Errno 20] Not a directory")
    )


def _run_plugin_once(plugin: PluginProcess, registry: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeletplugin",
            "--device-backend=mock",
            f"--node-name={NODE}",
            f"--kubeconfig={plugin.kubeconfig}",
            f"--plugin-registry-dir={registry}",
            f"--plugin-data-dir={plugin.data_dir}",
            f"--cdi-dir={plugin.cdi_dir}",
            f"--nvidia-cdi-dirs={plugin.root / 'no-toolkit'}",
            "--disable-health",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_non_socket_at_the_registration_path_is_one_line_not_a_traceback(
    env: tuple[KubeAPIServer, PluginProcess],
) -> None:
    _, plugin = env
    plugin.registry.mkdir()
    (plugin.registry / f"{DRIVER}-reg.sock").write_text("not a socket")
    run = _run_plugin_once(plugin, plugin.registry)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("sharegpu-kubeletplugin: error: cannot start: ")
    assert last.endswith("exists and is not a socket; refusing to replace it")


def test_too_long_socket_path_is_one_line_not_a_traceback(
    env: tuple[KubeAPIServer, PluginProcess],
) -> None:
    _, plugin = env
    registry = plugin.root / ("r" * 120)
    run = _run_plugin_once(plugin, registry)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("sharegpu-kubeletplugin: error: ")
    assert "unix sockets allow at most 107" in last
