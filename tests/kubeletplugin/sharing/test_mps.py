"""MPS daemons per GPU and time-slice intervals: the exact commands for start, adopt, restart,
stop, set and restore, with a FakeRunner over the simulated NVIDIA tools and daemon pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.runner import CommandError, FakeRunner
from kubeletplugin.sharing.daemons import DaemonError, DaemonPhase
from kubeletplugin.sharing.mps import MpsManager, compute_mode_argument, share_edits
from kubeletplugin.sharing.mpspaths import MpsPathError, MpsPaths, short_id
from kubeletplugin.sharing.simulator import SimulatedLauncher, SimulatedNvidiaTools
from kubeletplugin.sharing.timeslice import TimeSliceConflict, TimeSliceManager
from tests.kubeletplugin.sharing.helpers import query_compute_mode

U = "GPU-11111111-2222-3333-4444-555555555555"


QUERY_MODE = query_compute_mode(U)


def tools() -> tuple[SimulatedNvidiaTools, FakeRunner, SimulatedLauncher]:
    sim = SimulatedNvidiaTools()
    return sim, sim.install(FakeRunner()), SimulatedLauncher(sim)


def manager(fake: FakeRunner, pods: SimulatedLauncher, root: Path, **kw: float) -> MpsManager:
    return MpsManager(fake, root, pods, sleep=lambda _: None, **kw)


def env(mps: MpsManager) -> dict[str, str]:
    return {
        "CUDA_VISIBLE_DEVICES": U,
        "CUDA_MPS_PIPE_DIRECTORY": str(mps.root / short_id(U) / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(mps.root / short_id(U) / "log"),
    }


def test_start_sets_exclusive_process_then_launches_the_daemon(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    daemon = mps.ensure_running(U)
    assert fake.argvs() == [
        QUERY_MODE,
        ("nvidia-smi", "-i", U, "-c", "EXCLUSIVE_PROCESS"),
        ("nvidia-cuda-mps-control",),  # get_server_list: the launched daemon answers
    ]
    assert fake.calls[2].env == env(mps)
    assert pods.present() == [short_id(U)] and pods.pods[short_id(U)].env == env(mps)
    base = tmp_path / short_id(U)
    assert {p.name for p in base.iterdir()} == {"pipe", "shm", "log"}
    assert (base / "shm").stat().st_mode & 0o7777 == 0o1777
    assert (daemon.previous_compute_mode, daemon.adopted) == ("DEFAULT", False)
    assert sim.mode(U) == "EXCLUSIVE_PROCESS"


def test_an_alive_daemon_is_only_checked(tmp_path: Path) -> None:
    _, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(U)
    fake.clear()
    mps.ensure_running(U)
    assert [c.stdin for c in fake.calls] == ["get_server_list\n"]
    assert pods.launches == 1


def test_daemon_defaults_are_keyed_by_the_gpu_uuid(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(U)
    fake.clear()
    mps.set_default_limits(U, 40, 12 * 1024**3 + 7)
    assert [c.stdin for c in fake.calls] == [
        "set_default_active_thread_percentage 40\n",
        f"set_default_device_pinned_mem_limit {U} 12288M\n",
    ]
    assert all(c.env == env(mps) for c in fake.calls)
    assert sim.default_limits[str(mps.pipe_dir(U))] == {
        "active_thread_percentage": "40",
        "pinned_mem_limit": "12288M",
    }


def test_stop_quits_removes_the_pod_then_restores_the_mode(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    sim.compute_modes[U] = "PROHIBITED"
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(U)
    fake.clear()
    mps.stop(U)
    assert fake.argvs() == [
        ("nvidia-cuda-mps-control",),
        ("nvidia-smi", "-i", U, "-c", "PROHIBITED"),
    ]
    assert fake.calls[0].stdin == "quit\n"
    assert fake.calls[0].env == env(mps)
    assert sim.daemons == {} and sim.mode(U) == "PROHIBITED"
    assert mps.running() == {} and pods.present() == []
    assert not mps.pipe_dir(U).exists() and (tmp_path / short_id(U) / "log").is_dir()


def test_a_running_daemon_survives_a_plugin_restart_and_is_adopted(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    first = manager(fake, pods, tmp_path)
    first.ensure_running(U)
    state = first.export_state()
    assert state == {
        U: {
            "previousComputeMode": "DEFAULT",
            "shortId": short_id(U),
            "daemon": f"simulated daemon {short_id(U)}",
        }
    }
    fake.clear()
    # The plugin restarts: a fresh manager over the same directories, GPU and daemon pods.
    second = manager(fake, pods, tmp_path)
    daemon = second.ensure_running(U, MpsManager.previous_modes(state)[U])
    assert [c.stdin for c in fake.calls] == ["get_server_list\n"]
    assert daemon.adopted and daemon.previous_compute_mode == "DEFAULT"
    assert sim.daemons_started == 1 and pods.launches == 1
    fake.clear()
    second.stop(U)
    assert fake.argvs() == [("nvidia-cuda-mps-control",), ("nvidia-smi", "-i", U, "-c", "DEFAULT")]


def test_a_dead_daemon_pod_is_replaced_keeping_the_recorded_mode(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    first = manager(fake, pods, tmp_path)
    first.ensure_running(U)
    state = first.export_state()
    sim.kill_daemons()  # the daemon died (or is a zombie): its pod is still there
    assert pods.phase(first.spec(U)) is DaemonPhase.FAILED
    fake.clear()
    second = manager(fake, pods, tmp_path)
    daemon = second.ensure_running(U, MpsManager.previous_modes(state)[U])
    # The dead daemon is never asked: its pod's phase says it is dead.
    assert fake.argvs() == [
        ("nvidia-smi", "-i", U, "-c", "EXCLUSIVE_PROCESS"),
        ("nvidia-cuda-mps-control",),  # get_server_list: the new daemon answers
    ]
    # The GPU is still in EXCLUSIVE_PROCESS; stop must restore the mode from before, not that.
    assert daemon.previous_compute_mode == "DEFAULT" and not daemon.adopted
    assert sim.daemons_started == 2 and pods.launches == 2 and pods.present() == [short_id(U)]


def test_an_owned_daemon_that_stops_answering_is_replaced(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(U)
    fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1, once=True)
    mps.ensure_running(U)
    assert sim.daemons_started == 2 and pods.launches == 2
    assert mps.running()[U].previous_compute_mode == "DEFAULT"


def test_restart_keeps_the_directories_that_containers_have_mounted(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    first = manager(fake, pods, tmp_path)
    first.ensure_running(U)
    shm = tmp_path / short_id(U) / "shm"
    inodes = (first.pipe_dir(U).stat().st_ino, shm.stat().st_ino)
    (first.pipe_dir(U) / "stale-socket").touch()
    (shm / "cuda.shm.stale").touch()
    sim.kill_daemons()
    second = manager(fake, pods, tmp_path)
    second.ensure_running(U, "DEFAULT")
    assert (second.pipe_dir(U).stat().st_ino, shm.stat().st_ino) == inodes
    assert not (second.pipe_dir(U) / "stale-socket").exists()
    assert list(shm.iterdir()) == []


def test_a_daemon_that_fails_to_start_is_removed_and_the_mode_restored(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    # The simulated daemon refuses to start unless the GPU is in EXCLUSIVE_PROCESS.
    fake.on("nvidia-smi", "-i", U, "-c", "EXCLUSIVE_PROCESS", stdout="ignored")
    mps = manager(fake, pods, tmp_path)
    with pytest.raises(DaemonError, match=f"the MPS control daemon of GPU {U} failed to start"):
        mps.ensure_running(U)
    assert fake.argvs()[-1] == ("nvidia-smi", "-i", U, "-c", "DEFAULT")
    assert sim.mode(U) == "DEFAULT" and mps.running() == {} and pods.present() == []


def test_a_failed_removal_keeps_the_daemon_for_a_retry(tmp_path: Path) -> None:
    _, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(U)
    pods.failing_removals = 1
    with pytest.raises(DaemonError, match="simulated refusal"):
        mps.stop(U)
    assert U in mps.running()
    mps.stop(U)
    assert mps.running() == {} and pods.present() == []


def test_cleanup_of_a_gone_daemon_only_restores_the_mode(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    sim.compute_modes[U] = "EXCLUSIVE_PROCESS"
    mps = manager(fake, pods, tmp_path)
    mps.cleanup(U, "DEFAULT")
    assert fake.argvs() == [
        QUERY_MODE,
        ("nvidia-cuda-mps-control",),
        ("nvidia-smi", "-i", U, "-c", "DEFAULT"),
    ]
    assert fake.calls[1].stdin == "quit\n"
    assert sim.mode(U) == "DEFAULT"


@pytest.mark.parametrize("recorded", ["PROHIBITED", "EXCLUSIVE_THREAD"])
def test_cleanup_never_switches_a_gpu_the_plugin_did_not_switch(
    tmp_path: Path, recorded: str
) -> None:
    # A checkpoint naming a mode for a GPU in DEFAULT (no daemon of ours put it in
    # EXCLUSIVE_PROCESS) must not change the GPU: the recorded mode is only restored over ours.
    sim, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.cleanup(U, recorded)
    assert ("nvidia-smi", "-i", U, "-c", recorded) not in fake.argvs()
    assert sim.mode(U) == "DEFAULT"


def test_leftovers_are_found_by_directory_or_daemon_and_only_for_node_gpus(
    tmp_path: Path,
) -> None:
    _, fake, pods = tools()
    other = "GPU-99999999-2222-3333-4444-555555555555"
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(U)
    (tmp_path / "0badc0de" / "pipe").mkdir(parents=True)  # no GPU of this node
    (tmp_path / short_id(other) / "pipe").mkdir(parents=True)
    assert mps.leftovers([U]) == [U]
    assert mps.leftovers([U, other]) == sorted([U, other])
    # A daemon pod whose directory is gone is still found.
    import shutil

    shutil.rmtree(tmp_path / short_id(U))
    assert mps.leftovers([U]) == [U]


@pytest.mark.parametrize(
    ("printed", "argument"),
    [
        ("Default", "DEFAULT"),
        ("Exclusive_Process", "EXCLUSIVE_PROCESS"),
        ("Prohibited\n", "PROHIBITED"),
    ],
)
def test_compute_mode_spellings(printed: str, argument: str) -> None:
    assert compute_mode_argument(printed) == argument


def test_unexpected_compute_mode_output_is_a_clear_error(tmp_path: Path) -> None:
    fake = FakeRunner()
    fake.on("nvidia-smi", "-i", U, "--query-gpu=compute_mode", stdout="[N/A]\n")
    with pytest.raises(CommandError, match=r"unexpected output '\[N/A\]'"):
        manager(fake, SimulatedLauncher(SimulatedNvidiaTools()), tmp_path).ensure_running(U)


# --- socket paths -------------------------------------------------------------------------------


def test_a_root_whose_sockets_would_not_fit_fails_naming_the_path_before_any_command(
    tmp_path: Path,
) -> None:
    _, fake, pods = tools()
    # A root under kubelet's plugin directory with a long driver name does not fit.
    root = Path("/var/lib/kubelet/plugins/gpu.sharegpu.example.com/mps") / ("x" * 40)
    mps = manager(fake, pods, root)
    path = f"{root}/{short_id(U)}/pipe/control_privileged"
    with pytest.raises(MpsPathError) as info:
        mps.ensure_running(U)
    assert f"the MPS socket path {path} is {len(path)} bytes" in str(info.value)
    assert "at most 107" in str(info.value)
    assert fake.argvs() == [] and pods.present() == []


def test_the_chart_root_fits_with_room_to_spare() -> None:
    from kubeletplugin.sharing.mpspaths import check_socket_paths

    paths = MpsPaths(Path("/run/sharegpu/mps"), U)
    check_socket_paths(paths.pipe)
    assert len(str(paths.pipe / "control_privileged")) == 50


# --- client edits -------------------------------------------------------------------------------


def test_share_edits_give_pipe_and_shm_but_never_the_log_or_the_privileged_socket() -> None:
    paths = MpsPaths(Path("/run/sharegpu/mps"), U)
    edits = share_edits(paths, 30, 10 * 1024**3 + 5)
    assert edits.env == (
        f"CUDA_MPS_PIPE_DIRECTORY=/run/sharegpu/mps/{U}/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={U}=10240M",
    )
    host = f"/run/sharegpu/mps/{short_id(U)}"
    assert [(m.host_path, m.container_path) for m in edits.mounts] == [
        (f"{host}/pipe", f"/run/sharegpu/mps/{U}/pipe"),
        ("/dev/null", f"/run/sharegpu/mps/{U}/pipe/control_privileged"),
        (f"{host}/shm", "/dev/shm"),
    ]
    pipe, masked, shm = edits.mounts
    assert "rw" in pipe.options and "rw" in shm.options
    assert "ro" in masked.options
    assert not any("/log" in m.host_path for m in edits.mounts)


# --- time-slicing ------------------------------------------------------------------------------


def test_time_slice_set_by_first_holder_restored_after_last() -> None:
    sim, fake, _ = tools()
    ts = TimeSliceManager(fake)
    ts.acquire(U, "Long", "claim-a")
    ts.acquire(U, "Long", "claim-b")
    assert fake.argvs() == [
        QUERY_MODE,
        ("nvidia-smi", "compute-policy", "-i", U, "--set-timeslice=3"),
    ]
    assert sim.timeslices[U] == 3
    ts.release(U, "claim-a")
    assert len(fake.argvs()) == 2
    ts.release(U, "claim-b")
    assert fake.argvs()[2:] == [("nvidia-smi", "compute-policy", "-i", U, "--set-timeslice=0")]
    assert sim.timeslices[U] == 0 and ts.gpus() == []


def test_time_slice_conflict_names_interval_and_holders() -> None:
    _, fake, _ = tools()
    ts = TimeSliceManager(fake)
    ts.acquire(U, "Short", "claim-a")
    with pytest.raises(TimeSliceConflict) as info:
        ts.acquire(U, "Medium", "claim-b")
    assert str(info.value) == (
        f"time-slice interval Medium conflicts with interval Short already used on GPU {U} "
        "by claim(s) claim-a"
    )
    assert ts.holders(U) == {"claim-a"}


@pytest.mark.parametrize(("interval", "value"), [("Default", 0), ("Short", 1), ("Medium", 2)])
def test_time_slice_values(interval: str, value: int) -> None:
    _, fake, _ = tools()
    TimeSliceManager(fake).set_interval(U, interval)
    assert fake.argvs() == [("nvidia-smi", "compute-policy", "-i", U, f"--set-timeslice={value}")]


def test_failed_restore_is_kept_for_a_retry() -> None:
    _, fake, _ = tools()
    ts = TimeSliceManager(fake)
    ts.acquire(U, "Long", "claim-a")
    fake.on("nvidia-smi", "compute-policy", returncode=15, stderr="Unknown Error", once=True)
    with pytest.raises(CommandError, match="exit code 15: Unknown Error"):
        ts.release(U, "claim-a")
    assert ts.export_state() == {U: {"interval": "Long"}}
    ts.release(U, "claim-a")
    assert ts.export_state() == {}


def test_start_waits_until_the_daemon_answers(tmp_path: Path) -> None:
    _, fake, pods = tools()
    for _ in range(2):  # the control socket is not there yet for the first two polls
        fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1, once=True)
    manager(fake, pods, tmp_path).ensure_running(U)
    polls = [c for c in fake.calls if c.stdin == "get_server_list\n"]
    assert len(polls) == 3


def test_a_daemon_that_never_answers_is_removed_and_the_mode_restored(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1)
    mps = MpsManager(fake, tmp_path, pods, start_timeout=0.3)
    with pytest.raises(DaemonError) as info:
        mps.ensure_running(U)
    assert f"the MPS control daemon of GPU {U} did not answer within 0.3s of starting" in str(
        info.value
    )
    assert fake.argvs()[-1] == ("nvidia-smi", "-i", U, "-c", "DEFAULT")
    assert sim.daemons == {} and sim.mode(U) == "DEFAULT" and mps.running() == {}
    assert pods.present() == []
