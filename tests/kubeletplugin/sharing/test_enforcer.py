"""Shares enforced through DeviceState: CDI edits, strategies, conflicts, capacity, restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api import names
from api.gpuconfig import DriverConfigs, decode_driver_configs
from kubeletplugin.devices.slices import partition_share
from kubeletplugin.sharing.enforcement import ShareError
from kubeletplugin.sharing.enforcer import SharingEnforcer
from kubeletplugin.sharing.mpspaths import daemon_id
from kubeletplugin.sharing.strategies.limits import LIMITS_LOCK_BYTES, LimitsNode
from tests.helpers import HANG_GUARD_S
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.sharing.helpers import (
    GI,
    LIBRARY,
    Tools,
    claim_env,
    claim_mounts,
    gpu_config,
    query_compute_mode,
    record,
)


def prepare(state: Any, obj: dict[str, Any]) -> str:
    """Prepare one claim; returns its per-claim error ("" on success)."""
    return str(state.prepare([h.ref(obj)])[obj["metadata"]["uid"]].error)


def setup(tmp_path: Path, **kwargs: Any) -> tuple[h.Node, h.FakeClaims, Tools, Any]:
    node, claims, tools = h.Node(tmp_path), h.FakeClaims(), Tools.new()
    library = kwargs.pop("limits_library", None)
    state = node.state(claims, enforcer=tools.enforcer(node.data_dir, library), **kwargs)
    return node, claims, tools, state


def test_consumable_share_of_30_cores_and_10gi_is_enforced_exactly(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = h.claim("train", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    claims.add(c)
    assert prepare(state, c) == ""
    uuid = h.gpus()[0].uuid
    [env] = claim_env(node, c["metadata"]["uid"])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}=10240M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/sharegpu/mps/{uuid}/pipe"
    # Clients never get the daemon's log directory.
    assert "CUDA_MPS_LOG_DIRECTORY" not in env
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    [mounts] = claim_mounts(node, c["metadata"]["uid"])
    daemon = daemon_id(c["metadata"]["uid"], uuid)
    host = tools.mps_root / daemon
    assert [(m["hostPath"], m["containerPath"]) for m in mounts] == [
        (str(host / "pipe"), f"/run/sharegpu/mps/{uuid}/pipe"),
        ("/dev/null", f"/run/sharegpu/mps/{uuid}/pipe/control_privileged"),
        (str(host / "shm"), "/dev/shm"),
    ]
    assert tools.fake.argvs() == [
        query_compute_mode(uuid),  # must be DEFAULT; never changed for MPS
        ("nvidia-cuda-mps-control",),  # get_server_list: the launched daemon answers
        ("nvidia-cuda-mps-control",),  # set_default_active_thread_percentage 30
        ("nvidia-cuda-mps-control",),  # set_default_device_pinned_mem_limit <uuid> 10240M
        ("nvidia-cuda-mps-control",),  # get_default_active_thread_percentage: read back
    ]
    assert tools.sim.default_limits[str(host / "pipe")] == {
        "active_thread_percentage": "30",
        "pinned_mem_limit": "10240M",
    }
    assert node.checkpoint()["sharing"]["mps"] == {
        daemon: {
            "claim": c["metadata"]["uid"],
            "gpu": uuid,
            "daemon": f"simulated daemon {daemon}",
        }
    }
    tools.fake.clear()
    assert state.unprepare([h.ref(c)])[c["metadata"]["uid"]].error == ""
    assert tools.fake.argvs() == [("nvidia-cuda-mps-control",)]  # quit
    assert tools.pods.present() == []
    assert tools.sim.daemons == {} and node.spec_files() == []


def test_each_claim_on_a_gpu_gets_its_own_daemon_with_its_own_limits(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    a = h.claim("a", [h.result("gpu", "gpu-3", share={"cores": 25, "memory": 20 * GI})])
    b = h.claim("b", [h.result("gpu", "gpu-3", share={"cores": 50, "memory": 40 * GI})])
    claims.add(a, b)
    assert prepare(state, a) == ""
    # a's client starts before b is prepared: its server takes a's limits, b's must not.
    uuid = h.gpus()[3].uuid
    pipe_a, pipe_b = (
        str(tools.mps_root / daemon_id(c["metadata"]["uid"], uuid) / "pipe") for c in (a, b)
    )
    client_a = tools.sim.connect_client(pipe_a, 1000)
    assert prepare(state, b) == ""
    assert tools.sim.daemons_started == 2
    assert client_a == {"active_thread_percentage": "25", "pinned_mem_limit": "20480M"}
    assert tools.sim.connect_client(pipe_b, 1000) == {
        "active_thread_percentage": "50",
        "pinned_mem_limit": "40960M",
    }
    env_a, env_b = (
        claim_env(node, a["metadata"]["uid"])[0],
        claim_env(node, b["metadata"]["uid"])[0],
    )
    assert (
        env_a["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
        env_b["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
    ) == (
        "25",
        "50",
    )
    assert claim_mounts(node, a["metadata"]["uid"])[0][0]["hostPath"] == pipe_a
    assert claim_mounts(node, b["metadata"]["uid"])[0][0]["hostPath"] == pipe_b
    state.unprepare([h.ref(a)])
    assert list(tools.sim.daemons) == [pipe_b]  # b's daemon is left alone
    state.unprepare([h.ref(b)])
    assert tools.sim.daemons == {}
    assert tools.sim.mode(h.gpus()[3].uuid) == "DEFAULT"


def test_whole_gpu_is_exclusive_without_commands_or_limits(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = h.claim("whole", [h.result("gpu", "gpu-1")])
    claims.add(c)
    assert prepare(state, c) == ""
    [env] = claim_env(node, c["metadata"]["uid"])
    assert not [k for k in env if k.startswith("CUDA_")]
    assert tools.fake.argvs() == []


def test_partition_device_is_enforced_as_its_counters(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path, sharing_mode=names.SHARING_MODE_PARTITIONS)
    c = h.claim("half", [h.result("gpu", "gpu-2-half-1")])
    q = h.claim("quarter", [h.result("gpu", "gpu-2-quarter-0")])
    claims.add(c, q)
    assert prepare(state, c) == "" and prepare(state, q) == ""
    gpu = h.gpus()[2]
    uuid = gpu.uuid
    _, half_memory = partition_share(gpu, "half")
    _, quarter_memory = partition_share(gpu, "quarter")
    [env] = claim_env(node, c["metadata"]["uid"])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}={half_memory // 2**20}M"
    [env_q] = claim_env(node, q["metadata"]["uid"])
    assert env_q["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env_q["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}={quarter_memory // 2**20}M"


def test_mps_overrides_below_the_share(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path)
    config = gpu_config(
        {"strategy": "MPS", "mps": {"activeThreadPercentage": 20, "pinnedMemoryLimit": "5Gi"}}
    )
    c = h.claim(
        "c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})], configs=[config]
    )
    claims.add(c)
    assert prepare(state, c) == ""
    [env] = claim_env(node, c["metadata"]["uid"])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{h.gpus()[0].uuid}=5120M"


def test_overrides_above_the_share_are_per_claim_errors(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    cores = gpu_config({"strategy": "MPS", "mps": {"activeThreadPercentage": 40}})
    memory = gpu_config({"strategy": "MPS", "mps": {"pinnedMemoryLimit": "12Gi"}})
    share = {"cores": 30, "memory": 10 * GI}
    a = h.claim("a", [h.result("gpu", "gpu-0", share=share)], configs=[cores])
    b = h.claim("b", [h.result("gpu", "gpu-0", share=share)], configs=[memory])
    claims.add(a, b)
    assert prepare(state, a).endswith(
        'device gpu-0 (request "gpu"): sharing.mps.activeThreadPercentage 40 is above the '
        "share's 30 cores"
    )
    assert prepare(state, b).endswith(
        'device gpu-0 (request "gpu"): sharing.mps.pinnedMemoryLimit 12Gi is above the '
        "share's memory 10Gi"
    )
    assert tools.fake.argvs() == [] and node.spec_files() == []


def test_invalid_config_is_a_per_claim_error(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path)
    c = h.claim(
        "c",
        [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})],
        configs=[gpu_config({"strategy": "Mps"})],
    )
    claims.add(c)
    uid = c["metadata"]["uid"]
    assert prepare(state, c) == (
        f'ResourceClaim default/c (UID {uid}): device gpu-0 (request "gpu"): invalid '
        "GpuConfig: config[0]: sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, "
        'Limits (got "Mps")'
    )
    assert node.spec_files() == []


def test_limits_strategy_preloads_the_library_with_per_device_limits(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path, limits_library=LIBRARY)
    config = gpu_config({"strategy": "Limits"})
    c = h.claim(
        "c",
        [
            h.result("gpu", "gpu-5", share={"cores": 40, "memory": 16 * GI}),
            h.result("gpu", "gpu-4", share={"cores": 10, "memory": 8 * GI}),
        ],
        configs=[config],
    )
    claims.add(c)
    assert prepare(state, c) == ""
    env5, env4 = claim_env(node, c["metadata"]["uid"])
    # Ordinals follow PCI bus ID order: gpu-4 sorts before gpu-5.
    assert env4["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert env4["CUDA_DEVICE_SM_LIMIT_0"] == "10"
    assert env5["CUDA_DEVICE_MEMORY_LIMIT_1"] == "16384m"
    assert env5["CUDA_DEVICE_SM_LIMIT_1"] == "40"
    for env in (env4, env5):
        assert env["LD_PRELOAD"] == "/usr/local/sharegpu/lib/libsharegpu-limits.so"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    mounts = claim_mounts(node, c["metadata"]["uid"])[0]
    assert mounts[0]["hostPath"] == LIBRARY and "ro" in mounts[0]["options"]
    lock_dir = node.data_dir / "limits" / "vgpulock" / c["metadata"]["uid"]
    assert (mounts[1]["hostPath"], mounts[1]["containerPath"]) == (str(lock_dir), "/tmp/vgpulock")
    assert lock_dir.stat().st_mode & 0o7777 == 0o1777
    assert lock_dir.parent.stat().st_mode & 0o7777 == 0o755
    assert tools.fake.argvs() == []


def test_each_claim_gets_its_own_limits_lock_directory_removed_at_unprepare(
    tmp_path: Path,
) -> None:
    """Containers of different claims (tenants) never share a writable host directory."""
    node, claims, _, state = setup(tmp_path, limits_library=LIBRARY)
    config = gpu_config({"strategy": "Limits"})
    a = h.claim(
        "a", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": GI})], configs=[config]
    )
    b = h.claim(
        "b", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": GI})], configs=[config]
    )
    claims.add(a, b)
    assert prepare(state, a) == "" and prepare(state, b) == ""
    dir_a = claim_mounts(node, a["metadata"]["uid"])[0][1]["hostPath"]
    dir_b = claim_mounts(node, b["metadata"]["uid"])[0][1]["hostPath"]
    assert dir_a != dir_b
    assert Path(dir_a).parent == Path(dir_b).parent == node.data_dir / "limits" / "vgpulock"
    assert not state.unprepare([h.ref(a)])[a["metadata"]["uid"]].error
    assert not Path(dir_a).exists() and Path(dir_b).is_dir()


def test_limits_without_a_library_is_a_per_claim_error(tmp_path: Path) -> None:
    _, claims, _, state = setup(tmp_path)
    c = h.claim(
        "c",
        [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})],
        configs=[gpu_config({"strategy": "Limits"})],
    )
    claims.add(c)
    assert prepare(state, c).endswith(
        'device gpu-0 (request "gpu"): strategy Limits needs an interception library, and this '
        "node's plugin has none configured (--limits-library)"
    )


def test_time_slicing_whole_gpu_set_and_restored(tmp_path: Path) -> None:
    _, claims, tools, state = setup(tmp_path)
    c = h.claim(
        "c",
        [h.result("gpu", "gpu-6")],
        configs=[gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}})],
    )
    claims.add(c)
    assert prepare(state, c) == ""
    uuid = h.gpus()[6].uuid
    assert tools.fake.argvs() == [
        query_compute_mode(uuid),
        ("nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice=2"),
    ]
    state.unprepare([h.ref(c)])
    assert tools.fake.argvs()[2:] == [
        ("nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice=0")
    ]


def test_a_failed_interval_restore_is_retried_by_the_next_release(tmp_path: Path) -> None:
    _, claims, tools, state = setup(tmp_path)
    medium = gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}})
    sliced = h.claim("sliced", [h.result("gpu", "gpu-6")], configs=[medium])
    other = h.claim("other", [h.result("gpu", "gpu-2")])
    claims.add(sliced, other)
    assert prepare(state, sliced) == "" and prepare(state, other) == ""
    uuid = h.gpus()[6].uuid
    tools.fake.on("nvidia-smi", "compute-policy", returncode=15, stderr="Unknown Error", once=True)
    failed = state.unprepare([h.ref(sliced)])[sliced["metadata"]["uid"]].error
    assert "cannot restore the time-slice interval" in failed
    assert tools.sim.timeslices[uuid] == 2
    # Another claim's release, on another GPU, restores the interval the failed one left.
    assert state.unprepare([h.ref(other)])[other["metadata"]["uid"]].error == ""
    assert tools.sim.timeslices[uuid] == 0


def test_second_claim_with_another_interval_gets_an_error(tmp_path: Path) -> None:
    _, claims, tools, state = setup(tmp_path)
    share = {"cores": 50, "memory": 20 * GI}
    long = gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
    short = gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}})
    a = h.claim("a", [h.result("gpu", "gpu-0", share=share)], configs=[long])
    b = h.claim("b", [h.result("gpu", "gpu-0", share=share)], configs=[short])
    claims.add(a, b)
    assert prepare(state, a) == ""
    uuid = h.gpus()[0].uuid
    assert prepare(state, b).endswith(
        f"device gpu-0: time-slice interval Short conflicts with interval Long already used on "
        f"GPU {uuid} by claim {a['metadata']['uid']}"
    )
    assert tools.sim.timeslices[uuid] == 3


def test_mps_and_time_slicing_cannot_share_a_gpu(tmp_path: Path) -> None:
    _, claims, _, state = setup(tmp_path)
    share = {"cores": 50, "memory": 20 * GI}
    a = h.claim("a", [h.result("gpu", "gpu-0", share=share)])
    b = h.claim(
        "b",
        [h.result("gpu", "gpu-0", share=share)],
        configs=[gpu_config({"strategy": "TimeSlicing"})],
    )
    claims.add(a, b)
    assert prepare(state, a) == ""
    assert prepare(state, b).endswith(
        f"device gpu-0: strategy TimeSlicing cannot share GPU {h.gpus()[0].uuid} with strategy "
        f"MPS already used there by claim {a['metadata']['uid']}"
    )


def test_time_slicing_and_limits_coexist(tmp_path: Path) -> None:
    _, claims, _, state = setup(tmp_path, limits_library=LIBRARY)
    share = {"cores": 50, "memory": 20 * GI}
    a = h.claim(
        "a", [h.result("gpu", "gpu-0", share=share)], configs=[gpu_config({"strategy": "Limits"})]
    )
    b = h.claim(
        "b",
        [h.result("gpu", "gpu-0", share=share)],
        configs=[gpu_config({"strategy": "TimeSlicing"})],
    )
    claims.add(a, b)
    assert prepare(state, a) == "" and prepare(state, b) == ""


def test_sum_of_shares_never_exceeds_the_gpu(tmp_path: Path) -> None:
    _, claims, _, state = setup(tmp_path)
    a = h.claim("a", [h.result("gpu", "gpu-0", share={"cores": 60, "memory": 10 * GI})])
    b = h.claim("b", [h.result("gpu", "gpu-0", share={"cores": 60, "memory": 10 * GI})])
    claims.add(a, b)
    assert prepare(state, a) == ""
    error = prepare(state, b)
    assert "cannot hold this claim's 60 cores and 10Gi: other claims already hold 60 of 100 " in (
        error
    )


def test_mps_shares_of_one_request_on_two_gpus_are_refused(tmp_path: Path) -> None:
    _, claims, _, state = setup(tmp_path)
    share = {"cores": 10, "memory": 4 * GI}
    c = h.claim("c", [h.result("gpu", "gpu-0", share=share), h.result("gpu", "gpu-1", share=share)])
    claims.add(c)
    assert 'request "gpu": MPS shares of one request must be on one GPU' in prepare(state, c)


def test_admin_access_is_neither_counted_nor_enforced(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path)
    a = h.claim("a", [h.result("gpu", "gpu-0", share={"cores": 100, "memory": 10 * GI})])
    mon = h.claim("mon", [h.result("gpu", "gpu-0", admin=True)])
    claims.add(a, mon)
    assert prepare(state, a) == "" and prepare(state, mon) == ""
    [env] = claim_env(node, mon["metadata"]["uid"])
    assert not [k for k in env if k.startswith("CUDA_MPS")]


def test_daemons_are_adopted_after_a_plugin_restart(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = h.claim("c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    claims.add(c)
    assert prepare(state, c) == ""
    tools.fake.clear()
    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    # get_server_list answers: adopted, nothing else is sent (its defaults are set already)
    assert [c.stdin for c in tools.fake.calls] == ["get_server_list\n"]
    assert tools.sim.daemons_started == 1 and tools.pods.launches == 1
    assert restarted.unprepare([h.ref(c)])[c["metadata"]["uid"]].error == ""
    assert tools.sim.daemons == {} and tools.sim.mode(h.gpus()[0].uuid) == "DEFAULT"


def test_daemons_that_died_are_started_again_after_a_restart(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = h.claim("c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    claims.add(c)
    assert prepare(state, c) == ""
    tools.sim.kill_daemons()
    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert tools.sim.daemons_started == 2
    restarted.unprepare([h.ref(c)])
    assert tools.sim.daemons == {} and tools.sim.mode(h.gpus()[0].uuid) == "DEFAULT"


def test_time_slicing_survives_a_restart(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    config = gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
    c = h.claim("c", [h.result("gpu", "gpu-0")], configs=[config])
    claims.add(c)
    assert prepare(state, c) == ""
    uuid = h.gpus()[0].uuid
    tools.sim.timeslices[uuid] = 0  # e.g. reset behind the plugin's back
    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert tools.sim.timeslices[uuid] == 3
    restarted.unprepare([h.ref(c)])
    assert tools.sim.timeslices[uuid] == 0


def test_restart_after_the_last_claim_left_mid_release_stops_the_daemon(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = h.claim("c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    claims.add(c)
    assert prepare(state, c) == ""
    tools.pods.failing_removals = 1
    error = state.unprepare([h.ref(c)])[c["metadata"]["uid"]].error
    assert "cannot stop the MPS daemon" in error and "simulated refusal" in error
    # The plugin restarts; the claim is still recorded (unprepare failed) and kubelet retries.
    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert restarted.unprepare([h.ref(c)])[c["metadata"]["uid"]].error == ""
    assert tools.sim.daemons == {} and tools.sim.mode(h.gpus()[0].uuid) == "DEFAULT"


def test_a_daemon_found_running_without_claims_is_stopped_when_the_checkpoint_is_lost(
    tmp_path: Path,
) -> None:
    tools = Tools.new()
    first = tools.enforcer(tmp_path)
    gpu = h.gpus()[0]
    share = record(gpu, "gpu-0", ("gpu",), 30, 10 * GI, share_id="s-1")
    first.apply("claim-a", [share], DriverConfigs())
    assert len(tools.sim.daemons) == 1
    # Restart with neither the exported state nor any prepared claim (checkpoint lost).
    tools.enforcer(tmp_path).restore(None, {}, node_gpus=[g.uuid for g in h.gpus()])
    assert tools.sim.daemons == {}
    assert tools.sim.mode(gpu.uuid) == "DEFAULT"


def test_a_share_of_the_whole_gpu_defaults_to_exclusive_also_after_a_lost_record(
    tmp_path: Path,
) -> None:
    from api.sharepolicy import memory_policy_max

    tools = Tools.new()
    gpu = h.gpus()[0]
    whole = record(gpu, "gpu-0", ("gpu",), 100, memory_policy_max(gpu.memory_usable), "s-1")
    enforcer = tools.enforcer(tmp_path)
    done = enforcer.apply("claim-a", [whole], DriverConfigs())
    assert done.device_edits[0].env == ()
    assert [e.strategy for e in done.decisions if e] == ["Exclusive"]
    restarted = tools.enforcer(tmp_path)
    # Recorded without a decision (rebuilt from its CDI spec): the default again.
    restored = restarted.restore(None, {"claim-a": [whole]}, node_gpus=[gpu.uuid])
    assert [e.strategy for e in restored["claim-a"].decisions if e] == ["Exclusive"]
    assert restored["claim-a"].device_edits == done.device_edits
    assert [d.enforced.strategy for d in restarted.held()["claim-a"]] == ["Exclusive"]
    assert tools.fake.argvs() == []


def test_a_prepare_interrupted_before_enforcement_runs_no_command_at_restart(
    tmp_path: Path,
) -> None:
    # The plugin recorded PrepareStarted for a share and died before enforcing anything: at
    # the next start the claim is rolled back, which must not start (and stop) an MPS daemon
    # or touch the GPU's compute mode on its behalf.
    from kubeletplugin.prepare.checkpoint import STATE_STARTED, checksum_of

    node, claims, tools = h.Node(tmp_path), h.FakeClaims(), Tools.new()
    c = h.claim("c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    claims.add(c)
    uid = c["metadata"]["uid"]
    assert prepare(node.state(claims), c) == ""
    doc = node.checkpoint()
    doc["claims"][uid]["state"] = STATE_STARTED
    doc["checksum"] = checksum_of(doc)
    (node.data_dir / "checkpoint.json").write_text(json.dumps(doc))
    (node.cdi_dir / f"k8s.{h.DRIVER}-claim_{uid}.json").unlink()

    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert uid not in restarted.prepared_claims()
    assert tools.fake.argvs() == []
    assert tools.sim.daemons_started == 0
    # Kubelet's retry prepares it for real.
    assert prepare(restarted, c) == ""
    assert tools.sim.daemons_started == 1


def test_the_daemon_of_a_claim_rolled_back_at_restart_is_stopped(tmp_path: Path) -> None:
    from kubeletplugin.prepare.checkpoint import STATE_STARTED, checksum_of

    node, claims, tools, state = setup(tmp_path)
    c = h.claim("c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    claims.add(c)
    uid = c["metadata"]["uid"]
    assert prepare(state, c) == "" and len(tools.sim.daemons) == 1
    # The prepare stopped after its daemon started (PrepareStarted on disk): the claim is rolled
    # back at the next start and its daemon, which no other claim needs, is stopped with the
    # compute mode restored.
    doc = node.checkpoint()
    doc["claims"][uid]["state"] = STATE_STARTED
    doc["checksum"] = checksum_of(doc)
    (node.data_dir / "checkpoint.json").write_text(json.dumps(doc))
    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert uid not in restarted.prepared_claims()
    assert tools.sim.daemons == {}
    assert tools.sim.mode(h.gpus()[0].uuid) == "DEFAULT"
    assert node.checkpoint()["sharing"]["mps"] == {}
    assert not (node.cdi_dir / f"k8s.{h.DRIVER}-claim_{uid}.json").exists()


def test_the_lost_spec_of_a_prepared_mps_share_is_restored_with_its_daemon_adopted(
    tmp_path: Path,
) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = h.claim("c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    claims.add(c)
    uid = c["metadata"]["uid"]
    assert prepare(state, c) == "" and tools.sim.daemons_started == 1
    spec = node.cdi_dir / f"k8s.{h.DRIVER}-claim_{uid}.json"
    written = spec.read_bytes()
    assert b"CUDA_MPS_PIPE_DIRECTORY" in written
    spec.unlink()  # a power loss took it (it is written without fsync)
    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert spec.read_bytes() == written  # the MPS mounts and variables included
    assert uid in restarted.prepared_claims()
    assert tools.sim.daemons_started == 1 and len(tools.sim.daemons) == 1  # adopted


def test_another_claims_dead_daemon_neither_blocks_nor_serves_a_new_claim(
    tmp_path: Path,
) -> None:
    # A CUDA client that cannot reach MPS runs without it: no limits. A claim is never handed
    # out attached to a dead daemon: it gets its own. The dead one's pod restarts its daemon
    # (restartPolicy Always) with the limits in its environment.
    _, claims, tools, state = setup(tmp_path)
    first = h.claim("a", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    second = h.claim("b", [h.result("gpu", "gpu-0", share={"cores": 20, "memory": 5 * GI})])
    claims.add(first, second)
    assert prepare(state, first) == "" and tools.sim.daemons_started == 1
    uuid = h.gpus()[0].uuid
    dead = daemon_id(first["metadata"]["uid"], uuid)
    tools.sim.kill_daemons()
    assert tools.pods.present() == [dead]  # the pod is still there
    assert prepare(state, second) == ""
    assert tools.sim.daemons_started == 2 and tools.pods.launches == 2
    pipe = str(tools.mps_root / daemon_id(second["metadata"]["uid"], uuid) / "pipe")
    assert list(tools.sim.daemons) == [pipe]
    assert tools.sim.default_limits[pipe]["active_thread_percentage"] == "20"
    assert tools.sim.mode(uuid) == "DEFAULT"
    outcomes = state.unprepare([h.ref(first), h.ref(second)])
    assert [o.error for o in outcomes.values()] == ["", ""]
    assert tools.sim.daemons == {} and tools.pods.present() == []


def test_a_restart_removes_lock_directories_of_claims_no_longer_prepared(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path, limits_library=LIBRARY)
    config = gpu_config({"strategy": "Limits"})
    kept = h.claim(
        "kept", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": GI})], configs=[config]
    )
    claims.add(kept)
    assert prepare(state, kept) == ""
    root = node.data_dir / "limits" / "vgpulock"
    (root / "0b6c2f04-0000-4000-8000-000000000000").mkdir()  # left by a claim rolled back
    node.state(claims, enforcer=tools.enforcer(node.data_dir, LIBRARY))
    assert sorted(p.name for p in root.iterdir()) == [kept["metadata"]["uid"]]


@pytest.mark.parametrize(
    ("config", "memory", "message"),
    [
        (
            gpu_config({"strategy": "MPS", "mps": {"pinnedMemoryLimit": "1e1500000"}}),
            "1Gi",
            "sharing.mps.pinnedMemoryLimit",
        ),
        (None, "1e1500000", "consumedCapacity.memory"),
    ],
)
@pytest.mark.timeout(HANG_GUARD_S)
def test_an_absurd_quantity_fails_only_its_claim_and_at_once(
    tmp_path: Path, config: Any, memory: str, message: str
) -> None:
    """A quantity like 1e1500000 (in a GpuConfig or a consumed capacity) froze the plugin for
    minutes; it is refused from its exponent, as an error of its claim, and the other claim of
    the same call is prepared."""
    _, claims, _, state = setup(tmp_path)
    hostile = h.claim(
        "hostile",
        [h.result("gpu", "gpu-0", share={"cores": 30, "memory": GI})],
        configs=[config] if config is not None else (),
    )
    result = hostile["status"]["allocation"]["devices"]["results"][0]
    result["consumedCapacity"]["memory"] = memory
    honest = h.claim("honest", [h.result("gpu", "gpu-1", share={"cores": 30, "memory": GI})])
    claims.add(hostile, honest)
    outcomes = state.prepare([h.ref(hostile), h.ref(honest)])
    assert outcomes[honest["metadata"]["uid"]].error == ""
    error = outcomes[hostile["metadata"]["uid"]].error
    assert "ResourceClaim default/hostile" in error and message in error, error


class RecordingMounter:
    """A :class:`~kubeletplugin.sharing.shm.ShmMounter` that records its mounts (``fail``: the
    next mount raises, as mount(2) does without the capability)."""

    def __init__(self) -> None:
        self.mounted: dict[Path, int] = {}
        self.fail = False

    def mount(self, directory: Path, size: int) -> None:
        if self.fail:
            raise OSError(1, f"cannot mount a tmpfs at {directory}: Operation not permitted")
        assert directory.is_dir()
        self.mounted[directory] = size

    def unmount(self, directory: Path) -> None:
        self.mounted.pop(directory, None)


def test_a_limits_lock_directory_is_a_bounded_tmpfs_until_unprepare(tmp_path: Path) -> None:
    tools, mounter = Tools.new(), RecordingMounter()
    enforcer = SharingEnforcer(
        tools.fake,
        tmp_path,
        driver_name=h.DRIVER,
        launcher=tools.pods,
        limits_library=LIBRARY,
        mps_root=tools.mps_root,
        shm=mounter,
    )
    configs = decode_driver_configs([gpu_config({"strategy": "Limits"})], h.DRIVER)
    device = record(h.gpus()[0], "gpu-0", ("gpu",), 30, GI, share_id="s-1")
    enforcer.apply("claim-a", [device], configs)
    lock_dir = enforcer.node_of(LimitsNode).lock_dir("claim-a")
    assert mounter.mounted == {lock_dir: LIMITS_LOCK_BYTES} and LIMITS_LOCK_BYTES <= 4 * 2**20
    enforcer.release("claim-a")
    assert mounter.mounted == {} and not lock_dir.exists()
    mounter.fail = True
    with pytest.raises(ShareError, match=r"cannot make the Limits lock directory: .*not permitted"):
        enforcer.apply("claim-b", [device], configs)
