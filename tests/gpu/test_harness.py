"""The parts of the real-GPU test that need no GPU: CDI -> emulated container, entering it, the
CUDA probe's arguments and PTX, the checks' pure parts (:mod:`tests.gpu.checks`), the host
launcher's process scan, the skip decision, the pipe-directory probe (:mod:`tests.gpu.pipeprobe`)
and the JSON report's lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from api import names
from kubeletplugin.containeredits import ContainerEdits, DeviceNode
from kubeletplugin.sharing.daemons import DaemonPhase, DaemonSpec
from kubeletplugin.sharing.mps import container_pipe_dir, share_edits
from kubeletplugin.sharing.mpspaths import MpsPaths
from tests.gpu import checks, cudaprobe, enter, pipeprobe
from tests.gpu.conftest import result_entry
from tests.gpu.container import (
    BindMount,
    CdiError,
    ContainerPlan,
    load_specs,
    missing_targets,
    plan_for,
)
from tests.gpu.gpuenv import skip_reason
from tests.gpu.hostlauncher import HostMpsLauncher, control_processes

UUID = "GPU-00000000-1111-2222-3333-444444444444"
KIND = names.cdi_kind(names.DEFAULT_DRIVER_NAME)
GI = 1024**3


def share_spec(mps_root: Path) -> dict[str, Any]:
    """A claim spec as the plugin writes it for one MPS share, plus top-level edits."""
    edits = ContainerEdits(
        env=(f"NVIDIA_VISIBLE_DEVICES={UUID}", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"),
        device_nodes=(DeviceNode("/dev/null"),),
    ).merged(share_edits(MpsPaths.of(mps_root, "claim", UUID), UUID, 25, 10 * GI))
    return {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "containerEdits": {"env": ["SPEC_LEVEL=1", "NVIDIA_VISIBLE_DEVICES=void"]},
        "devices": [
            {"name": "other", "containerEdits": {"env": ["OTHER=1"]}},
            {"name": "claim-gpu", "containerEdits": edits.to_json()},
        ],
    }


# --- CDI -> plan -----------------------------------------------------------------------------


def test_plan_has_exactly_the_spec_env_and_mounts_in_order(tmp_path: Path) -> None:
    spec = share_spec(tmp_path)
    ids = ["nvidia.com/gpu=0", f"{KIND}=claim-gpu"]
    plan = plan_for([spec], ids, skip_kinds=["nvidia.com/gpu"])
    pipe = container_pipe_dir(UUID)
    paths = MpsPaths.of(tmp_path, "claim", UUID)
    assert plan.env == {
        "SPEC_LEVEL": "1",
        "NVIDIA_VISIBLE_DEVICES": UUID,  # the device's entry replaces the spec-level one
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",  # the share's, given last
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{UUID}=10240M",
    }
    assert plan.mounts == (
        BindMount(str(paths.pipe), pipe, read_only=True, recursive=True),
        BindMount("/dev/null", f"{pipe}/control_privileged", read_only=True, recursive=False),
        BindMount(str(paths.shm), "/dev/shm", read_only=False, recursive=True),
    )
    assert plan.device_nodes == ("/dev/null",)


def test_spec_level_edits_come_once_per_spec(tmp_path: Path) -> None:
    spec = share_spec(tmp_path)
    plan = plan_for([spec], [f"{KIND}=other", f"{KIND}=claim-gpu"])
    assert list(plan.env)[:2] == ["SPEC_LEVEL", "OTHER"]
    assert len(plan.mounts) == 3


@pytest.mark.parametrize(
    ("cdi_id", "edits", "message"),
    [
        ("no-equals", {}, "not of the form"),
        (f"{KIND}=absent", {}, "no CDI spec has the device"),
        (
            f"{KIND}=d",
            {"mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "tmpfs"}]},
            "type 'tmpfs'",
        ),
        (
            f"{KIND}=d",
            {"mounts": [{"hostPath": "/a", "containerPath": "/b", "options": ["x"]}]},
            "options ['x']",
        ),
        (f"{KIND}=d", {"mounts": [{"hostPath": "/a"}]}, "lacks hostPath or containerPath"),
        (f"{KIND}=d", {"hooks": [{"hookName": "prestart", "path": "/bin/true"}]}, "hooks"),
        (f"{KIND}=d", {"env": ["NOVALUE"]}, "not KEY=VALUE"),
        (f"{KIND}=d", {"deviceNodes": [{"path": "/dev/no-such-node"}]}, "absent on the host"),
    ],
)
def test_what_cannot_be_emulated_is_named(cdi_id: str, edits: dict[str, Any], message: str) -> None:
    spec = {"kind": KIND, "devices": [{"name": "d", "containerEdits": edits}]}
    with pytest.raises(CdiError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_for([spec], [cdi_id])


def test_load_specs_reads_json_and_refuses_other_documents(tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text(json.dumps(share_spec(tmp_path)))
    (tmp_path / "a.yaml").write_text("ignored: true\n")
    assert [s["kind"] for s in load_specs(tmp_path)] == [KIND]
    (tmp_path / "c.json").write_text("[]")
    with pytest.raises(CdiError, match=r"c\.json: not a CDI spec"):
        load_specs(tmp_path)


def test_missing_targets_parents_first_and_not_inside_earlier_mounts(tmp_path: Path) -> None:
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    plan = ContainerPlan(
        {},
        (
            BindMount(str(source_dir), str(tmp_path / "x" / "pipe")),
            BindMount("/dev/null", str(tmp_path / "x" / "pipe" / "control_privileged")),
            BindMount("/dev/null", str(tmp_path / "file")),
            BindMount(str(source_dir), str(tmp_path)),
        ),
    )
    assert missing_targets(plan) == [
        (tmp_path / "x", True),
        (tmp_path / "x" / "pipe", True),
        (tmp_path / "file", False),
    ]


# --- entering the container ------------------------------------------------------------------


class FakeLibc:
    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[bytes | None, bytes, int]] = []
        self.fail_on = fail_on

    def mount(
        self, source: bytes | None, target: bytes, fstype: None, flags: Any, data: None
    ) -> int:
        self.calls.append((source, target, flags.value))
        return -1 if target == (self.fail_on or "").encode() else 0


def test_mounts_are_private_then_bound_in_order_read_only_remounted() -> None:
    plan = ContainerPlan(
        {"A": "1"},
        (
            BindMount("/h/pipe", "/c/pipe", recursive=True),
            BindMount("/dev/null", "/c/x", read_only=True),
        ),
    )
    doc = json.loads(plan.to_json(["/bin/true"], 1000))
    assert (doc["argv"], doc["uid"], doc["env"]) == (["/bin/true"], 1000, {"A": "1"})
    libc = FakeLibc()
    enter.apply_mounts(libc, doc["mounts"])
    assert libc.calls == [
        (None, b"/", enter.MS_REC | enter.MS_PRIVATE),
        (b"/h/pipe", b"/c/pipe", enter.MS_BIND | enter.MS_REC),
        (b"/dev/null", b"/c/x", enter.MS_BIND),
        (None, b"/c/x", enter.MS_REMOUNT | enter.MS_BIND | enter.MS_RDONLY),
    ]


def test_a_failing_mount_names_its_target() -> None:
    with pytest.raises(enter.SetupError, match="/dev/null -> /c/x"):
        enter.apply_mounts(FakeLibc(fail_on="/c/x"), [vars(BindMount("/dev/null", "/c/x"))])


@pytest.mark.parametrize("argv", [["enter.py"], ["enter.py", "not json"], ["enter.py", "{}"]])
def test_enter_refuses_a_bad_plan_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert enter.main(argv) == enter.EXIT_SETUP
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "enter.py" in err


# --- the CUDA probe --------------------------------------------------------------------------


def test_probe_arguments() -> None:
    assert cudaprobe.parse_gib(["9"]) == 9.0
    assert cudaprobe.parse_gib(["0.5"]) == 0.5
    for bad, message in (
        (["x"], "must be a number"),
        (["0"], "must be positive"),
        ([], "usage"),
        (["1", "2"], "usage"),
    ):
        with pytest.raises(cudaprobe.UsageError, match=message):
            cudaprobe.parse_gib(bad)


def test_probe_modes() -> None:
    assert cudaprobe.parse_args(["9"]) == cudaprobe.Request("alloc", gib=9.0)
    assert cudaprobe.parse_args(["hold", "2"]) == cudaprobe.Request("hold", gib=2.0)
    assert cudaprobe.parse_args(["compute", "1000", "8448"]) == cudaprobe.Request(
        "compute", iterations=1000, blocks=8448
    )
    assert cudaprobe.parse_args(["fault"]) == cudaprobe.Request("fault")
    for bad, message in (
        (["compute"], "compute takes two arguments"),
        (["compute", "1"], "compute takes two arguments"),
        (["compute", "1", "2", "3"], "compute takes two arguments"),
        (["compute", "x", "1"], "ITERATIONS must be an integer"),
        (["compute", "0", "1"], "ITERATIONS must be in 1..4294967295"),
        (["compute", str(2**32), "1"], "ITERATIONS must be in 1..4294967295"),
        (["compute", "1", "0"], "BLOCKS must be in 1..2147483647"),
        (["hold"], "GIB"),
        (["fault", "1"], "fault takes no arguments"),
        (["faulty"], "must be a number"),
    ):
        with pytest.raises(cudaprobe.UsageError, match=message):
            cudaprobe.parse_args(bad)


def test_probe_ptx_has_both_kernels_for_a_jit_target() -> None:
    ptx = cudaprobe.PTX
    assert ".version 7.0" in ptx and ".target sm_80" in ptx
    assert ".visible .entry spin(.param .u64 out, .param .u32 n)" in ptx
    assert ".visible .entry fault(.param .u64 p)" in ptx
    assert ptx.count("{") == ptx.count("}") == 2


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_probe_ptx_assembles(arch: str, tmp_path: Path) -> None:
    """What the driver JITs on A100/H100 (needs only ``ptxas`` of a CUDA toolkit)."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) not installed")
    source = tmp_path / "probe.ptx"
    source.write_text(cudaprobe.PTX)
    done = subprocess.run(
        [ptxas, f"-arch={arch}", str(source), "-o", str(tmp_path / "probe.cubin")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_probe_usage_error_exit(capsys: pytest.CaptureFixture[str]) -> None:
    assert cudaprobe.main(["cudaprobe.py", "-1"]) == cudaprobe.EXIT_USAGE
    assert "must be positive" in capsys.readouterr().err
    assert cudaprobe.main(["cudaprobe.py", "compute", "-1", "1"]) == cudaprobe.EXIT_USAGE
    assert "ITERATIONS must be in" in capsys.readouterr().err


@pytest.mark.parametrize(
    "request_",
    [
        cudaprobe.Request("alloc", gib=1.0),
        cudaprobe.Request("compute", iterations=10),
        cudaprobe.Request("fault"),
    ],
)
def test_probe_without_libcuda_reports_the_load_step(request_: cudaprobe.Request) -> None:
    status, report = cudaprobe.probe(request_, library="libno-such-cuda.so.1")
    assert status == cudaprobe.EXIT_START
    assert report["mode"] == request_.mode
    assert report["step"] == "load" and "libno-such-cuda" in str(report["code"])


# --- the checks' pure parts --------------------------------------------------------------------


def test_scaled_iterations() -> None:
    assert checks.scaled_iterations(1000, 0.1, target=2.0) == 20_000
    assert checks.scaled_iterations(1000, 5.0, target=2.0) == 1000  # never fewer than measured
    assert checks.scaled_iterations(2**31, 0.001, target=2.0) == checks.MAX_ITERATIONS
    for iterations, seconds in ((0, 1.0), (10, 0.0), (10, -1.0)):
        with pytest.raises(ValueError, match="cannot scale"):
            checks.scaled_iterations(iterations, seconds)


def test_ratio_in_range() -> None:
    assert checks.ratio_in_range(4.0, 2.0)
    assert checks.ratio_in_range(3.0, 2.0)  # 1.5: the lower end is included
    assert checks.ratio_in_range(5.4, 2.0)  # 2.7: the upper end is included
    assert not checks.ratio_in_range(2.9, 2.0)
    assert not checks.ratio_in_range(5.5, 2.0)
    assert not checks.ratio_in_range(1.0, 0.0)


POLICY_LIST = """\
+-------------------------------------+
| GPU compute policies:               |
| GPU   Name                  Value   |
|=====================================|
|  0    Timeslice             {}   |
+-------------------------------------+
"""


@pytest.mark.parametrize(
    ("value", "expected"),
    [("Long", "Long"), ("DEFAULT", "Default"), ("2", "Medium"), ("0", "Default"), ("N/A", None)],
)
def test_timeslice_from_policy_list(value: str, expected: str | None) -> None:
    assert checks.timeslice_from_policy_list(POLICY_LIST.format(value)) == expected


def test_timeslice_from_other_layouts() -> None:
    assert checks.timeslice_from_policy_list("Time-slice config: SHORT\n") == "Short"
    assert checks.timeslice_from_policy_list("GPU 0\n  timeslice = 3\n") == "Long"
    assert checks.timeslice_from_policy_list("No compute policies\n") is None
    assert checks.timeslice_from_policy_list("") is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_until_returns_once_ready() -> None:
    clock, answers = FakeClock(), iter([False, False, True])
    assert checks.wait_until(lambda: next(answers), 10.0, 0.5, clock.time, clock.sleep)
    assert clock.sleeps == [0.5, 0.5]


def test_wait_until_gives_up_at_the_deadline_after_a_last_try() -> None:
    clock, calls = FakeClock(), []

    def never() -> bool:
        calls.append(clock.now)
        return False

    assert not checks.wait_until(never, 1.0, 0.4, clock.time, clock.sleep)
    assert calls == [0.0, 0.4, 0.8, 1.0]


def test_taint_recorder_keeps_copies_of_the_latest_map() -> None:
    recorder = checks.TaintRecorder()
    assert recorder.latest("gpu-0") == []
    taint = {"key": "k", "effect": "NoSchedule"}
    given = {"gpu-0": [taint]}
    recorder.set_taints(given)
    taint["effect"] = "NoExecute"
    assert recorder.latest("gpu-0") == [{"key": "k", "effect": "NoSchedule"}]
    recorder.set_taints({})
    assert recorder.latest("gpu-0") == []


# --- the host launcher -----------------------------------------------------------------------


def fake_process(proc: Path, pid: int, argv0: str, state: str, env: dict[str, str]) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(argv0.encode() + b"\0-d\0")
    (d / "stat").write_text(f"{pid} (nvidia-cuda-mps) {state} 1 1 1\n")
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def test_launcher_finds_its_daemons_in_proc(tmp_path: Path) -> None:
    proc, mps = tmp_path / "proc", tmp_path / "mps"
    paths = MpsPaths.of(mps, "claim", UUID)
    other = MpsPaths.of(mps, "claim", "GPU-other")
    fake_process(
        proc,
        10,
        "/usr/bin/nvidia-cuda-mps-control",
        "S",
        {"CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe)},
    )
    fake_process(
        proc, 11, "nvidia-cuda-mps-server", "S", {"CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe)}
    )
    fake_process(
        proc, 12, "nvidia-cuda-mps-control", "Z", {"CUDA_MPS_PIPE_DIRECTORY": str(other.pipe)}
    )
    fake_process(
        proc, 13, "nvidia-cuda-mps-control", "S", {"CUDA_MPS_PIPE_DIRECTORY": "/elsewhere/x/pipe"}
    )
    (proc / "self").mkdir()
    assert sorted((p.pid, p.zombie) for p in control_processes(proc)) == [
        (10, False),
        (12, True),
        (13, False),
    ]
    launcher = HostMpsLauncher(mps, "/usr/bin/nvidia-cuda-mps-control", proc_root=proc)
    assert launcher.phase(DaemonSpec(paths)) is DaemonPhase.RUNNING
    assert launcher.phase(DaemonSpec(other)) is DaemonPhase.FAILED
    assert launcher.phase(DaemonSpec(MpsPaths.of(mps, "claim", "GPU-none"))) is DaemonPhase.ABSENT
    assert launcher.present() == sorted({paths.id, other.id})
    launcher.launch(DaemonSpec(paths))  # running already: nothing is started
    assert launcher.pids(DaemonSpec(paths)) == [10]
    assert launcher.pids(DaemonSpec(other)) == []  # a zombie is no live daemon


def test_launcher_command_binds_the_gpu_shm(tmp_path: Path) -> None:
    paths = MpsPaths.of(tmp_path, "claim", UUID)
    spec = DaemonSpec(paths, {"CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe)})
    command = HostMpsLauncher(tmp_path, "/usr/bin/nvidia-cuda-mps-control").command(spec)
    assert command[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    plan = json.loads(command[-1])
    assert plan["argv"] == ["/usr/bin/nvidia-cuda-mps-control", "-d"]
    assert plan["env"] == dict(spec.env) and plan["uid"] == 0
    assert plan["mounts"] == [vars(BindMount(str(paths.shm), "/dev/shm"))]


# --- skipping --------------------------------------------------------------------------------


def nvml(count: int = 1, init_error: Exception | None = None) -> types.ModuleType:
    module = types.ModuleType("pynvml")

    def init() -> None:
        if init_error is not None:
            raise init_error

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    return module


def _no_pynvml() -> types.ModuleType:
    raise ImportError("No module named 'pynvml'")


def test_skip_reasons() -> None:
    def which(c: str) -> str | None:
        return f"/usr/bin/{c}"

    def root() -> int:
        return 0

    assert skip_reason(root, lambda: nvml(), which) is None
    reason = skip_reason(root, _no_pynvml, which)
    assert reason is not None and "no NVIDIA GPU" in reason
    reason = skip_reason(root, lambda: nvml(init_error=OSError("libnvidia-ml.so.1")), which)
    assert reason is not None and "libnvidia-ml.so.1" in reason
    assert (
        skip_reason(root, lambda: nvml(count=0), which) == "no NVIDIA GPU here (NVML reports none)"
    )
    reason = skip_reason(lambda: 1000, lambda: nvml(), which)
    assert reason is not None and "needs root" in reason
    reason = skip_reason(root, lambda: nvml(), lambda c: None if c == "unshare" else which(c))
    assert reason == "commands missing: unshare"


# --- the pipe-directory probe ----------------------------------------------------------------


def run_pipeprobe(*args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-I", "-S", pipeprobe.__file__, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {"stderr": done.stderr}


def test_pipeprobe_reads_what_a_writer_puts_in_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "log"
    os.mkfifo(fifo, 0o777)
    line = b"[2026-01-01 00:00:00.000 Control 1] Starting new server for user 1000\n"

    def write() -> None:
        with open(fifo, "wb") as writer:  # blocks until the probe opens the read end
            writer.write(line)

    writer = threading.Thread(target=write)
    writer.start()
    # 30 s is only the safety net: the probe stops once the line's bytes arrived.
    status, report = run_pipeprobe("read", str(fifo), "30", str(len(line)))
    writer.join(timeout=30)
    assert status == 0
    assert report["exists"] and report["fifo"] and report["opened"], report
    assert (report["bytes"], report["head"]) == (len(line), line.decode()), report


@pytest.mark.parametrize("limit", ["0", "-1", "x", str(pipeprobe.MAX_BYTES + 1)])
def test_pipeprobe_refuses_a_byte_limit_out_of_range(
    limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pipeprobe.main(["pipeprobe.py", "read", "/nonexistent", "1", limit]) == (
        pipeprobe.EXIT_USAGE
    )
    assert "pipeprobe.py read PATH SECONDS [BYTES]" in capsys.readouterr().err


def test_pipeprobe_reports_an_absent_entry_and_an_open_refused(tmp_path: Path) -> None:
    status, report = run_pipeprobe("read", str(tmp_path / "log"), "0")
    assert status == 0
    assert (report["exists"], report["opened"], report["bytes"]) == (False, False, 0), report
    (tmp_path / "target").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    status, report = run_pipeprobe("read", str(tmp_path / "link"), "0")
    assert (report["exists"], report["fifo"], report["opened"]) == (True, False, False), report
    assert report["error"], report


def test_pipeprobe_plants_links_replacing_what_was_there(tmp_path: Path) -> None:
    shm, outside = tmp_path / "shm", tmp_path / "outside"
    shm.mkdir()
    (shm / "cuda.shm.1").write_text("the server's")
    status, report = run_pipeprobe("plant", str(shm), str(outside), "cuda.shm.1", "fresh")
    assert status == 0
    assert report == {"planted": ["cuda.shm.1", "fresh"], "errors": {}}
    assert os.readlink(shm / "cuda.shm.1") == str(outside / "cuda.shm.1")
    assert os.readlink(shm / "fresh") == str(outside / "fresh")


@pytest.mark.parametrize("args", [[], ["read", "x"], ["read", "x", "soon"], ["plant", "d", "t"]])
def test_pipeprobe_usage_errors(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-S", pipeprobe.__file__, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == pipeprobe.EXIT_USAGE and done.stdout == ""
    assert "pipeprobe.py read PATH SECONDS" in done.stderr


# --- the JSON report -------------------------------------------------------------------------


def test_report_entry_of_an_open_finding_a_fixed_one_and_a_plain_pass() -> None:
    def report(outcome: str, longrepr: str | None, **extra: Any) -> pytest.TestReport:
        return pytest.TestReport(
            "tests/gpu/test_real_gpu.py::t",
            ("tests/gpu/test_real_gpu.py", 1, "t"),
            {},
            outcome,  # type: ignore[arg-type]
            longrepr,
            "call",
            duration=1.23456,
            user_properties=[("defaults", {"set": ["25.0"]})],
            **extra,
        )

    holds = result_entry(report("skipped", "FindingStillHolds: changed", wasxfail="N5 open: x"))
    assert holds == {
        "test": "tests/gpu/test_real_gpu.py::t",
        "outcome": "xfailed",
        "seconds": 1.235,
        "detail": "FindingStillHolds: changed",
        "reason": "N5 open: x",
        "properties": {"defaults": {"set": ["25.0"]}},
    }
    fixed = result_entry(report("failed", "[XPASS(strict)] N5 open: x"))
    assert (fixed["outcome"], fixed["detail"]) == ("failed", "[XPASS(strict)] N5 open: x")
    assert "reason" not in fixed
    passed = result_entry(report("passed", None))
    assert (passed["outcome"], passed["detail"]) == ("passed", "")
    assert passed["properties"] == {"defaults": {"set": ["25.0"]}}
