"""One MPS daemon per claim and GPU, and time-slice intervals: the exact commands for start,
adopt, restart and stop, with a FakeRunner over the simulated NVIDIA tools and daemon pods; and
the order that broke one daemon per GPU (a later, larger share got the earlier server's limits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.hosts.simtools import SimulatedLauncher, SimulatedNvidiaTools
from kubeletplugin.runner import CommandError
from kubeletplugin.sharing.computemode import compute_mode_argument
from kubeletplugin.sharing.daemons import DaemonError, DaemonSpec
from kubeletplugin.sharing.mps import (
    MAX_START_POLL_S,
    ComputeModeError,
    MpsLimits,
    MpsManager,
    share_edits,
)
from kubeletplugin.sharing.mpspaths import MpsPathError, MpsPaths, daemon_id
from kubeletplugin.sharing.timeslice import TimeSliceConflict, TimeSliceManager
from tests.kubeletplugin.sharing.helpers import query_compute_mode

U = "GPU-11111111-2222-3333-4444-555555555555"
A, B = "claim-a", "claim-b"
GI = 1024**3
SMALL, LARGE = MpsLimits(25, 10 * GI), MpsLimits(50, 20 * GI)
QUERY_MODE = query_compute_mode(U)
CLIENT_UID = 1000


def tools() -> tuple[SimulatedNvidiaTools, FakeRunner, SimulatedLauncher]:
    sim = SimulatedNvidiaTools()
    return sim, sim.install(FakeRunner()), SimulatedLauncher(sim)


class RecordingShm:
    """A :class:`~kubeletplugin.sharing.shm.ShmMounter` that records its calls."""

    def __init__(self) -> None:
        self.mounted: dict[Path, int] = {}
        self.calls: list[tuple[str, Path]] = []

    def mount(self, directory: Path, size: int) -> None:
        self.calls.append(("mount", directory))
        self.mounted[directory] = size

    def unmount(self, directory: Path) -> None:
        self.calls.append(("unmount", directory))
        self.mounted.pop(directory, None)


def manager(fake: FakeRunner, pods: SimulatedLauncher, root: Path, **kw: object) -> MpsManager:
    return MpsManager(fake, root, pods, sleep=lambda _: None, **kw)  # type: ignore[arg-type]


def pipe(root: Path, claim: str) -> str:
    return str(MpsPaths.of(root, claim, U).pipe)


def test_start_checks_the_mode_launches_with_the_limits_and_sets_them_as_defaults(
    tmp_path: Path,
) -> None:
    sim, fake, pods = tools()
    shm = RecordingShm()
    mps = manager(fake, pods, tmp_path, shm=shm, shm_bytes=64 * 1024**2)
    daemon = mps.ensure_running(A, U, SMALL)
    paths = MpsPaths.of(tmp_path, A, U)
    assert fake.argvs() == [QUERY_MODE] + [("nvidia-cuda-mps-control",)] * 4
    assert [c.stdin for c in list(fake.calls)[1:]] == [
        "get_server_list\n",
        "set_default_active_thread_percentage 25\n",
        f"set_default_device_pinned_mem_limit {U} 10240M\n",
        "get_default_active_thread_percentage\n",  # read back: a refusal exits 0
    ]
    assert pods.present() == [daemon_id(A, U)]
    assert pods.pods[daemon_id(A, U)].env == {
        "CUDA_VISIBLE_DEVICES": U,
        "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(paths.log),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "SHAREGPU_MPS_DEFAULTS": (
            f"set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit {U} "
            "10240M\n"
        ),
    }
    assert {p.name for p in paths.directory.iterdir()} == {"pipe", "shm", "log"}
    assert shm.mounted == {paths.shm: 64 * 1024**2}
    assert (daemon.limits, daemon.adopted) == (SMALL, False)
    assert sim.mode(U) == "DEFAULT"  # never changed for MPS


def test_later_larger_share_gets_its_own_limits_while_the_first_client_runs(
    tmp_path: Path,
) -> None:
    """Prepare A, A's client starts (its server takes A's limits), prepare B: B's client gets
    B's limits, not the running server's; A's unprepare leaves B's server alone."""
    sim, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(A, U, SMALL)
    first = sim.connect_client(pipe(tmp_path, A), CLIENT_UID)
    mps.ensure_running(B, U, LARGE)
    second = sim.connect_client(pipe(tmp_path, B), CLIENT_UID)
    assert first == {"active_thread_percentage": "25", "pinned_mem_limit": "10240M"}
    assert second == {"active_thread_percentage": "50", "pinned_mem_limit": "20480M"}
    mps.stop(daemon_id(A, U))
    assert sim.connect_client(pipe(tmp_path, B), CLIENT_UID) == second
    assert pods.present() == [daemon_id(B, U)]


def test_a_daemon_restarted_by_its_pod_keeps_the_limits_from_its_environment(
    tmp_path: Path,
) -> None:
    sim, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(A, U, SMALL)
    spec = pods.pods[daemon_id(A, U)]
    sim.kill_daemons()
    sim.start_daemon(str(spec.paths.pipe), U, dict(spec.env))  # kubelet restarts the container
    assert sim.connect_client(str(spec.paths.pipe), CLIENT_UID) == {
        "active_thread_percentage": "25",
        "pinned_mem_limit": "10240M",
    }


def test_a_client_of_another_uid_queues_behind_the_running_server(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    manager(fake, pods, tmp_path).ensure_running(A, U, SMALL)
    assert sim.connect_client(pipe(tmp_path, A), CLIENT_UID) is not None
    assert sim.connect_client(pipe(tmp_path, A), CLIENT_UID + 1) is None


def test_an_alive_daemon_is_only_checked(tmp_path: Path) -> None:
    _, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(A, U, SMALL)
    fake.clear()
    mps.ensure_running(A, U, SMALL)
    assert [c.stdin for c in fake.calls] == ["get_server_list\n"]
    assert pods.launches == 1


@pytest.mark.parametrize("mode", ["EXCLUSIVE_PROCESS", "PROHIBITED"])
def test_a_gpu_not_in_default_mode_is_refused_naming_the_mode(tmp_path: Path, mode: str) -> None:
    sim, fake, pods = tools()
    sim.compute_modes[U] = mode
    with pytest.raises(ComputeModeError) as info:
        manager(fake, pods, tmp_path).ensure_running(A, U, SMALL)
    assert str(info.value) == (
        f"GPU {U} is in compute mode {mode}; MPS shares need DEFAULT, where each claim's MPS "
        f"server runs beside the others' (sharegpu does not change it for MPS: nvidia-smi -i {U} "
        "-c DEFAULT)"
    )
    assert fake.argvs() == [QUERY_MODE] and pods.present() == [] and sim.mode(U) == mode


def test_stop_quits_removes_the_pod_unmounts_and_removes_the_directory(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    shm = RecordingShm()
    mps = manager(fake, pods, tmp_path, shm=shm)
    mps.ensure_running(A, U, SMALL)
    paths = MpsPaths.of(tmp_path, A, U)
    fake.clear()
    mps.stop(paths.id)
    assert fake.argvs() == [("nvidia-cuda-mps-control",)]
    assert fake.calls[0].stdin == "quit\n"
    assert sim.daemons == {} and mps.running() == {} and pods.present() == []
    assert shm.calls[-1] == ("unmount", paths.shm) and shm.mounted == {}
    assert not paths.directory.exists()


def test_a_running_daemon_survives_a_plugin_restart_and_is_adopted(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    first = manager(fake, pods, tmp_path)
    first.ensure_running(A, U, SMALL)
    assert first.export_state() == {
        daemon_id(A, U): {
            "claim": A,
            "gpu": U,
            "daemon": f"simulated daemon {daemon_id(A, U)}",
        }
    }
    fake.clear()
    second = manager(fake, pods, tmp_path)
    daemon = second.ensure_running(A, U, SMALL)
    assert daemon.adopted and pods.launches == 1 and sim.daemons_started == 1
    assert [c.stdin for c in fake.calls] == ["get_server_list\n"]


def test_a_dead_daemon_is_started_again_with_its_limits(tmp_path: Path) -> None:
    sim, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(A, U, SMALL)
    sim.kill_daemons()
    daemon = mps.ensure_running(A, U, SMALL)
    assert not daemon.adopted and sim.daemons_started == 2 and pods.launches == 2
    assert sim.default_limits[pipe(tmp_path, A)] == {
        "active_thread_percentage": "25",
        "pinned_mem_limit": "10240M",
    }


def test_leftovers_are_the_daemons_no_prepared_claim_needs(tmp_path: Path) -> None:
    _, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(A, U, SMALL)
    mps.ensure_running(B, U, LARGE)
    (tmp_path / "not-a-daemon").mkdir()
    (tmp_path / "0123456789ab").mkdir()  # a directory left without a pod
    assert mps.leftovers([daemon_id(A, U)]) == sorted(["0123456789ab", daemon_id(B, U)])


def test_a_refused_default_is_an_error_and_the_daemon_is_removed(tmp_path: Path) -> None:
    _, fake, pods = tools()
    # nvidia-cuda-mps-control exits 0 and keeps the old value when it refuses a command
    # (measured): the value is read back.
    fake.on(
        "nvidia-cuda-mps-control",
        stdin="get_default_active_thread_percentage\n",
        stdout="100.0\n",
    )
    with pytest.raises(CommandError, match=r"is '100\.0' after setting 25: the daemon refused it"):
        manager(fake, pods, tmp_path).ensure_running(A, U, SMALL)
    assert pods.present() == []


def test_unexpected_compute_mode_output_is_a_clear_error(tmp_path: Path) -> None:
    fake = FakeRunner()
    fake.on("nvidia-smi", "-i", U, "--query-gpu=compute_mode", stdout="[N/A]\n")
    with pytest.raises(CommandError, match=r"unexpected output '\[N/A\]'"):
        manager(fake, SimulatedLauncher(SimulatedNvidiaTools()), tmp_path).ensure_running(
            A, U, SMALL
        )


@pytest.mark.parametrize(
    ("printed", "argument"),
    [
        ("Default", "DEFAULT"),
        ("Exclusive_Process", "EXCLUSIVE_PROCESS"),
        (" Prohibited\n", "PROHIBITED"),
    ],
)
def test_compute_mode_spellings(printed: str, argument: str) -> None:
    assert compute_mode_argument(printed) == argument


def test_start_waits_until_the_daemon_answers(tmp_path: Path) -> None:
    _, fake, pods = tools()
    for _ in range(2):  # the control socket is not there yet for the first two polls
        fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1, once=True)
    manager(fake, pods, tmp_path).ensure_running(A, U, SMALL)
    polls = [c for c in fake.calls if c.stdin == "get_server_list\n"]
    assert len(polls) == 3


def test_a_starting_daemon_is_polled_at_most_max_start_poll_apart(tmp_path: Path) -> None:
    _, fake, pods = tools()
    for _ in range(8):
        fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1, once=True)
    waits: list[float] = []
    MpsManager(fake, tmp_path, pods, sleep=waits.append).ensure_running(A, U, SMALL)
    assert waits == [0.05, 0.1, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]
    assert max(waits) == MAX_START_POLL_S


def test_a_daemon_that_never_answers_is_removed(tmp_path: Path) -> None:
    _, fake, pods = tools()
    fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1)
    mps = MpsManager(fake, tmp_path, pods, start_timeout=0.3)
    with pytest.raises(DaemonError) as info:
        mps.ensure_running(A, U, SMALL)
    assert f"the MPS control daemon of claim {A} on GPU {U} did not answer within 0.3s" in str(
        info.value
    )
    assert pods.present() == []


# --- socket paths -------------------------------------------------------------------------------


def test_a_root_whose_sockets_would_not_fit_fails_naming_the_path_before_any_command(
    tmp_path: Path,
) -> None:
    _, fake, pods = tools()
    root = Path("/var/lib/kubelet/plugins/gpu.sharegpu.example.com/mps") / ("x" * 40)
    mps = manager(fake, pods, root)
    path = f"{root}/{daemon_id(A, U)}/pipe/control_privileged"
    with pytest.raises(MpsPathError) as info:
        mps.ensure_running(A, U, SMALL)
    assert f"the MPS socket path {path} is {len(path)} bytes" in str(info.value)
    assert "at most 107" in str(info.value)
    assert fake.argvs() == [] and pods.present() == []


def test_the_chart_root_fits_with_room_to_spare() -> None:
    from kubeletplugin.sharing.mpspaths import check_socket_paths

    paths = MpsPaths.of(Path("/run/sharegpu/mps"), A, U)
    check_socket_paths(paths.pipe)
    assert len(str(paths.pipe / "control_privileged")) == 54


def test_daemon_ids_differ_per_claim_and_gpu_and_are_stable() -> None:
    ids = {daemon_id(c, g) for c in (A, B) for g in (U, "GPU-other")}
    assert len(ids) == 4 and all(len(i) == 12 for i in ids)
    assert daemon_id(A, U) == daemon_id(A, U)


# --- client edits -------------------------------------------------------------------------------


def test_share_edits_give_a_read_only_pipe_and_shm_but_never_the_log_or_privileged_socket() -> None:
    paths = MpsPaths.of(Path("/run/sharegpu/mps"), A, U)
    edits = share_edits(paths, U, 30, 10 * GI + 5)
    assert edits.env == (
        f"CUDA_MPS_PIPE_DIRECTORY=/run/sharegpu/mps/{U}/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={U}=10240M",
    )
    host = f"/run/sharegpu/mps/{daemon_id(A, U)}"
    assert [(m.host_path, m.container_path) for m in edits.mounts] == [
        (f"{host}/pipe", f"/run/sharegpu/mps/{U}/pipe"),
        ("/dev/null", f"/run/sharegpu/mps/{U}/pipe/control_privileged"),
        (f"{host}/shm", "/dev/shm"),
    ]
    pipe_mount, masked, shm = edits.mounts
    assert "ro" in pipe_mount.options and "rw" not in pipe_mount.options
    assert "ro" in masked.options and "rw" in shm.options
    assert not any("/log" in m.host_path for m in edits.mounts)


def test_a_leftover_spec_needs_only_its_paths(tmp_path: Path) -> None:
    _, fake, pods = tools()
    mps = manager(fake, pods, tmp_path)
    mps.ensure_running(A, U, SMALL)
    leftover = DaemonSpec(MpsPaths(tmp_path, daemon_id(A, U)))
    pods.remove(leftover)
    assert pods.present() == []


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
