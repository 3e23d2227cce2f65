"""MPS daemons per GPU and time-slice intervals: the exact commands for start, adopt, stop, set
and restore, with a FakeRunner over the simulated NVIDIA tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.runner import CommandError, FakeRunner
from kubeletplugin.sharing.mps import MpsManager, compute_mode_argument, share_edits
from kubeletplugin.sharing.simulator import SimulatedNvidiaTools
from kubeletplugin.sharing.timeslice import TimeSliceConflict, TimeSliceManager

U = "GPU-11111111-2222-3333-4444-555555555555"


QUERY_MODE = ("nvidia-smi", "-i", U, "--query-gpu=compute_mode", "--format=csv,noheader")


def tools() -> tuple[SimulatedNvidiaTools, FakeRunner]:
    sim = SimulatedNvidiaTools()
    return sim, sim.install(FakeRunner())


def env(mps: MpsManager) -> dict[str, str]:
    return {
        "CUDA_VISIBLE_DEVICES": U,
        "CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir(U)),
        "CUDA_MPS_LOG_DIRECTORY": str(mps.log_dir(U)),
    }


def test_start_sets_exclusive_process_then_starts_the_daemon(tmp_path: Path) -> None:
    sim, fake = tools()
    mps = MpsManager(fake, tmp_path)
    daemon = mps.ensure_running(U)
    assert fake.argvs() == [
        ("nvidia-smi", "-i", U, "--query-gpu=compute_mode", "--format=csv,noheader"),
        ("nvidia-smi", "-i", U, "-c", "EXCLUSIVE_PROCESS"),
        ("nvidia-cuda-mps-control", "-d"),
        ("nvidia-cuda-mps-control",),  # get_server_list: the daemon answers
    ]
    assert fake.calls[2].env == env(mps)
    assert mps.pipe_dir(U) == tmp_path / "mps" / U / "pipe"
    assert mps.log_dir(U).is_dir()
    assert (daemon.previous_compute_mode, daemon.adopted) == ("DEFAULT", False)
    assert sim.mode(U) == "EXCLUSIVE_PROCESS"


def test_second_ensure_runs_nothing(tmp_path: Path) -> None:
    _, fake = tools()
    mps = MpsManager(fake, tmp_path)
    mps.ensure_running(U)
    fake.clear()
    mps.ensure_running(U)
    assert fake.argvs() == []


def test_stop_quits_with_the_same_env_then_restores_the_mode(tmp_path: Path) -> None:
    sim, fake = tools()
    sim.compute_modes[U] = "PROHIBITED"
    mps = MpsManager(fake, tmp_path)
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
    assert mps.running() == {}


def test_a_running_daemon_is_adopted_never_started_twice(tmp_path: Path) -> None:
    sim, fake = tools()
    first = MpsManager(fake, tmp_path)
    first.ensure_running(U)
    state = first.export_state()
    fake.clear()
    # The plugin restarts: a fresh manager over the same directories and the same GPU.
    second = MpsManager(fake, tmp_path)
    daemon = second.ensure_running(U, MpsManager.previous_modes(state)[U])
    assert fake.argvs() == [("nvidia-cuda-mps-control",)]
    assert fake.calls[0].stdin == "get_server_list\n"
    assert daemon.adopted and daemon.previous_compute_mode == "DEFAULT"
    assert sim.daemons_started == 1
    fake.clear()
    second.stop(U)
    assert fake.argvs() == [("nvidia-cuda-mps-control",), ("nvidia-smi", "-i", U, "-c", "DEFAULT")]


def test_a_dead_daemon_is_started_again_keeping_the_recorded_mode(tmp_path: Path) -> None:
    sim, fake = tools()
    first = MpsManager(fake, tmp_path)
    first.ensure_running(U)
    state = first.export_state()
    sim.kill_daemons()  # the daemon died with the old plugin; its files are left behind
    fake.clear()
    second = MpsManager(fake, tmp_path)
    daemon = second.ensure_running(U, MpsManager.previous_modes(state)[U])
    assert fake.argvs() == [
        ("nvidia-cuda-mps-control",),  # get_server_list: no answer
        ("nvidia-smi", "-i", U, "-c", "EXCLUSIVE_PROCESS"),
        ("nvidia-cuda-mps-control", "-d"),
        ("nvidia-cuda-mps-control",),  # get_server_list: the daemon answers
    ]
    # The GPU is still in EXCLUSIVE_PROCESS; stop must restore the mode from before, not that.
    assert daemon.previous_compute_mode == "DEFAULT" and not daemon.adopted


def test_restart_keeps_the_pipe_directory_that_containers_have_mounted(tmp_path: Path) -> None:
    sim, fake = tools()
    first = MpsManager(fake, tmp_path)
    first.ensure_running(U)
    inode = first.pipe_dir(U).stat().st_ino
    (first.pipe_dir(U) / "stale-socket").touch()
    sim.kill_daemons()
    second = MpsManager(fake, tmp_path)
    second.ensure_running(U, "DEFAULT")
    assert second.pipe_dir(U).stat().st_ino == inode
    assert not (second.pipe_dir(U) / "stale-socket").exists()


def test_failed_start_restores_the_mode_and_raises(tmp_path: Path) -> None:
    sim, fake = tools()
    fake.on("nvidia-cuda-mps-control", "-d", returncode=1, stderr="cannot create pipe")
    mps = MpsManager(fake, tmp_path)
    with pytest.raises(CommandError, match="nvidia-cuda-mps-control -d: exit code 1"):
        mps.ensure_running(U)
    assert fake.argvs()[-1] == ("nvidia-smi", "-i", U, "-c", "DEFAULT")
    assert sim.mode(U) == "DEFAULT" and mps.running() == {}


def test_failed_quit_keeps_the_daemon_for_a_retry(tmp_path: Path) -> None:
    _, fake = tools()
    mps = MpsManager(fake, tmp_path)
    mps.ensure_running(U)
    fake.on("nvidia-cuda-mps-control", stdin="quit\n", returncode=1, stderr="busy", once=True)
    with pytest.raises(CommandError, match="still running"):
        mps.stop(U)
    assert U in mps.running()
    mps.stop(U)
    assert mps.running() == {}


def test_cleanup_of_a_gone_daemon_only_restores_the_mode(tmp_path: Path) -> None:
    sim, fake = tools()
    sim.compute_modes[U] = "EXCLUSIVE_PROCESS"
    mps = MpsManager(fake, tmp_path)
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
    sim, fake = tools()
    mps = MpsManager(fake, tmp_path)
    mps.cleanup(U, recorded)
    assert ("nvidia-smi", "-i", U, "-c", recorded) not in fake.argvs()
    assert sim.mode(U) == "DEFAULT"


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
        MpsManager(fake, tmp_path).ensure_running(U)


def test_share_edits_follow_nvidias_formats() -> None:
    edits = share_edits(Path("/d/pipe"), Path("/d/log"), U, 30, 10 * 1024**3 + 5)
    assert edits.env == (
        f"CUDA_MPS_PIPE_DIRECTORY=/run/sharegpu/mps/{U}/pipe",
        f"CUDA_MPS_LOG_DIRECTORY=/run/sharegpu/mps/{U}/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
    )
    assert [(m.host_path, m.container_path) for m in edits.mounts] == [
        ("/d/pipe", f"/run/sharegpu/mps/{U}/pipe"),
        ("/d/log", f"/run/sharegpu/mps/{U}/log"),
    ]
    pipe, log = edits.mounts
    assert "rw" in pipe.options
    # Only the daemon writes its logs: a client (of any tenant) cannot tamper with them.
    assert "ro" in log.options and "rw" not in log.options


# --- time-slicing ------------------------------------------------------------------------------


def test_time_slice_set_by_first_holder_restored_after_last() -> None:
    sim, fake = tools()
    ts = TimeSliceManager(fake)
    ts.acquire(U, "Long", "claim-a")
    ts.acquire(U, "Long", "claim-b")
    assert fake.argvs() == [("nvidia-smi", "compute-policy", "-i", U, "--set-timeslice=3")]
    assert sim.timeslices[U] == 3
    ts.release(U, "claim-a")
    assert len(fake.argvs()) == 1
    ts.release(U, "claim-b")
    assert fake.argvs()[1:] == [("nvidia-smi", "compute-policy", "-i", U, "--set-timeslice=0")]
    assert sim.timeslices[U] == 0 and ts.gpus() == []


def test_time_slice_conflict_names_interval_and_holders() -> None:
    _, fake = tools()
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
    _, fake = tools()
    TimeSliceManager(fake).set_interval(U, interval)
    assert fake.argvs() == [("nvidia-smi", "compute-policy", "-i", U, f"--set-timeslice={value}")]


def test_failed_restore_is_kept_for_a_retry() -> None:
    _, fake = tools()
    ts = TimeSliceManager(fake)
    ts.acquire(U, "Long", "claim-a")
    fake.on("nvidia-smi", "compute-policy", returncode=15, stderr="Unknown Error", once=True)
    with pytest.raises(CommandError, match="exit code 15: Unknown Error"):
        ts.release(U, "claim-a")
    assert ts.export_state() == {U: {"interval": "Long"}}
    ts.release(U, "claim-a")
    assert ts.export_state() == {}


def test_start_waits_until_the_daemon_answers(tmp_path: Path) -> None:
    _, fake = tools()
    for _ in range(2):  # the control socket is not there yet for the first two polls
        fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1, once=True)
    MpsManager(fake, tmp_path).ensure_running(U)
    polls = [c for c in fake.calls if c.stdin == "get_server_list\n"]
    assert len(polls) == 3


def test_a_daemon_that_never_answers_is_quit_and_the_mode_restored(tmp_path: Path) -> None:
    sim, fake = tools()
    fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1)
    mps = MpsManager(fake, tmp_path, start_timeout=0.3)
    with pytest.raises(CommandError) as info:
        mps.ensure_running(U)
    assert f"the MPS control daemon of GPU {U} did not answer within 0.3s of starting" in str(
        info.value
    )
    assert [c.stdin for c in list(fake.calls)[-2:]] == ["quit\n", None]
    assert fake.argvs()[-1] == ("nvidia-smi", "-i", U, "-c", "DEFAULT")
    assert sim.daemons == {} and sim.mode(U) == "DEFAULT" and mps.running() == {}
