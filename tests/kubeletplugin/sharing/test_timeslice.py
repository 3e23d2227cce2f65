"""Time-slicing and the GPU's compute mode, over the simulated NVIDIA tools."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.hosts.simtools import SimulatedNvidiaTools
from kubeletplugin.runner import CommandError
from kubeletplugin.sharing.timeslice import TimeSliceManager

GPU = "GPU-11111111-2222-3333-4444-555555555555"


def tools() -> tuple[SimulatedNvidiaTools, FakeRunner]:
    sim = SimulatedNvidiaTools()
    return sim, sim.install(FakeRunner())


def test_exclusive_process_is_set_to_default_and_restored_after_the_last_holder(
    tmp_path: Path,
) -> None:
    sim, runner = tools()
    sim.compute_modes[GPU] = "EXCLUSIVE_PROCESS"
    manager = TimeSliceManager(runner, tmp_path / "markers")
    manager.acquire(GPU, "Long", "claim-a")
    assert (sim.mode(GPU), sim.timeslices[GPU]) == ("DEFAULT", 3)
    manager.acquire(GPU, "Long", "claim-b")
    manager.release(GPU, "claim-a")
    assert sim.mode(GPU) == "DEFAULT"
    manager.release(GPU, "claim-b")
    assert (sim.mode(GPU), sim.timeslices[GPU]) == ("EXCLUSIVE_PROCESS", 0)
    assert manager.marked() == []


def test_the_previous_mode_is_recorded_before_the_mode_changes(tmp_path: Path) -> None:
    sim, runner = tools()
    sim.compute_modes[GPU] = "PROHIBITED"
    markers = tmp_path / "markers"
    manager = TimeSliceManager(runner, markers)
    order: list[str] = []
    real = manager.set_compute_mode

    def spy(uuid: str, mode: str) -> None:
        order.append((markers / uuid).read_text())
        real(uuid, mode)

    manager.set_compute_mode = spy  # type: ignore[method-assign]
    manager.acquire(GPU, "Default", "claim-a")
    assert order == ["Default\nPROHIBITED\n"]
    assert manager.export_state() == {
        GPU: {"interval": "Default", "previousComputeMode": "PROHIBITED"}
    }


def test_a_gpu_in_default_mode_is_left_alone(tmp_path: Path) -> None:
    _sim, runner = tools()
    manager = TimeSliceManager(runner, tmp_path / "markers")
    manager.acquire(GPU, "Short", "claim-a")
    assert not any("-c" in argv for argv in runner.argvs())
    assert (tmp_path / "markers" / GPU).read_text() == "Short\n"
    assert manager.export_state() == {GPU: {"interval": "Short"}}
    manager.release(GPU, "claim-a")
    assert not any("-c" in argv for argv in runner.argvs())


@pytest.mark.parametrize("crash_after", ["mark", "mode", "interval"])
def test_a_restart_after_a_crash_restores_the_mode(tmp_path: Path, crash_after: str) -> None:
    """The plugin dies at each step of the first acquire; the next start (adopt from the marker,
    then release of the holder-less GPU, as the enforcer's restore does) restores the mode."""
    sim, runner = tools()
    sim.compute_modes[GPU] = "EXCLUSIVE_PROCESS"
    markers = tmp_path / "markers"
    manager = TimeSliceManager(runner, markers)

    class Crash(Exception):
        pass

    steps = {"mark": "set_compute_mode", "mode": "set_interval", "interval": None}
    stop_before = steps[crash_after]
    if stop_before is not None:

        def crash(*_args: object) -> None:
            raise Crash

        setattr(manager, stop_before, crash)
    with contextlib.suppress(Crash):
        manager.acquire(GPU, "Medium", "claim-a")
    assert sim.mode(GPU) == ("EXCLUSIVE_PROCESS" if crash_after == "mark" else "DEFAULT")
    # Restart: a new manager, nothing in the checkpoint (the claim never got its record).
    restarted = TimeSliceManager(runner, markers)
    assert restarted.marked() == [GPU]
    restarted.adopt(GPU, "Default")
    restarted.release(GPU, "")
    assert (sim.mode(GPU), sim.timeslices.get(GPU, 0)) == ("EXCLUSIVE_PROCESS", 0)
    assert restarted.marked() == []


def test_a_surviving_claim_keeps_the_recorded_previous_mode(tmp_path: Path) -> None:
    sim, runner = tools()
    sim.compute_modes[GPU] = "EXCLUSIVE_PROCESS"
    markers = tmp_path / "markers"
    TimeSliceManager(runner, markers).acquire(GPU, "Long", "claim-a")
    assert sim.mode(GPU) == "DEFAULT"
    restarted = TimeSliceManager(runner, markers)
    restarted.adopt(GPU, "Long")
    restarted.acquire(GPU, "Long", "claim-a")  # the enforcer resumes the checkpointed claim
    assert (markers / GPU).read_text() == "Long\nEXCLUSIVE_PROCESS\n"
    restarted.release(GPU, "claim-a")
    assert sim.mode(GPU) == "EXCLUSIVE_PROCESS"


def test_a_failed_mode_restore_is_retried(tmp_path: Path) -> None:
    sim, runner = tools()
    sim.compute_modes[GPU] = "EXCLUSIVE_PROCESS"
    manager = TimeSliceManager(runner, tmp_path / "markers")
    manager.acquire(GPU, "Long", "claim-a")
    runner.on(
        "nvidia-smi", "-i", GPU, "-c", returncode=9, stderr="Insufficient Permissions", once=True
    )
    with pytest.raises(CommandError, match="Insufficient Permissions"):
        manager.release(GPU, "claim-a")
    assert manager.gpus() == [GPU] and manager.marked() == [GPU]
    manager.release(GPU, "")
    assert sim.mode(GPU) == "EXCLUSIVE_PROCESS"
    assert manager.gpus() == [] and manager.marked() == []


def test_odd_compute_mode_output_fails_the_acquire_before_anything_changes(
    tmp_path: Path,
) -> None:
    runner = FakeRunner()
    runner.on("nvidia-smi", "-i", GPU, "--query-gpu=compute_mode", stdout="[N/A]\n")
    manager = TimeSliceManager(runner, tmp_path / "markers")
    with pytest.raises(CommandError, match="unexpected output"):
        manager.acquire(GPU, "Long", "claim-a")
    assert manager.gpus() == [] and manager.marked() == []
    assert [a[1] for a in runner.argvs()] == ["-i"]


def test_a_marker_with_an_unknown_mode_is_ignored(tmp_path: Path) -> None:
    _sim, runner = tools()
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / GPU).write_text("Long\nWEIRD\n")
    manager = TimeSliceManager(runner, markers)
    manager.adopt(GPU, "Default")
    manager.release(GPU, "")
    assert not any("-c" in argv for argv in runner.argvs())
    assert manager.marked() == []
