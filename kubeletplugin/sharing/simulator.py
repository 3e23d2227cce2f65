"""A simulation of ``nvidia-smi`` and ``nvidia-cuda-mps-control`` behind a FakeRunner.

Used by the mock device backend and by tests: it keeps per-GPU compute modes and time-slice
settings and per-pipe-directory MPS daemons, and writes and removes the daemon's pid file and
control socket placeholder in the pipe directory as the real daemon does, so the plugin's adopt
logic sees the same files. Only the commands the plugin issues are understood; anything else
exits 2 with an error, like an unknown option.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kubeletplugin.runner import (
    MPS_CONTROL,
    NVIDIA_SMI,
    CommandResult,
    FakeRunner,
    RecordedCall,
)
from kubeletplugin.sharing.mps import CONTROL_SOCKET, PID_FILE

_MODE_DISPLAY = {
    "DEFAULT": "Default",
    "EXCLUSIVE_PROCESS": "Exclusive_Process",
    "EXCLUSIVE_THREAD": "Exclusive_Thread",
    "PROHIBITED": "Prohibited",
}


@dataclass
class SimulatedNvidiaTools:
    """State of the simulated GPUs and daemons; :meth:`install` wires it into a FakeRunner."""

    compute_modes: dict[str, str] = field(default_factory=dict)
    timeslices: dict[str, int] = field(default_factory=dict)
    #: Running daemons: pipe directory -> GPU UUID it was started for.
    daemons: dict[str, str] = field(default_factory=dict)
    #: Pid written into pid files (a live process, so the plugin's liveness check passes).
    daemon_pid: int = field(default_factory=os.getpid)
    daemons_started: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, runner: FakeRunner) -> FakeRunner:
        runner.on(NVIDIA_SMI, answer=self._nvidia_smi)
        runner.on(MPS_CONTROL, answer=self._mps_control)
        return runner

    def mode(self, uuid: str) -> str:
        return self.compute_modes.get(uuid, "DEFAULT")

    def kill_daemons(self) -> None:
        """Make every daemon vanish without cleanup (a node-level crash of the daemons)."""
        with self._lock:
            self.daemons.clear()

    def _nvidia_smi(self, call: RecordedCall) -> CommandResult:
        args = list(call.args)
        with self._lock:
            if args[:1] == ["compute-policy"] and len(args) == 4 and args[1] == "-i":
                value = args[3].removeprefix("--set-timeslice=")
                if args[3].startswith("--set-timeslice=") and value in ("0", "1", "2", "3"):
                    self.timeslices[args[2]] = int(value)
                    return CommandResult(call.argv, 0, "")
            if len(args) == 4 and args[0] == "-i" and args[2] == "-c" and args[3] in _MODE_DISPLAY:
                self.compute_modes[args[1]] = args[3]
                return CommandResult(call.argv, 0, f"Compute mode set for GPU {args[1]}.\n")
            if (
                len(args) == 4
                and args[0] == "-i"
                and args[2] == "--query-gpu=compute_mode"
                and args[3] == "--format=csv,noheader"
            ):
                return CommandResult(call.argv, 0, _MODE_DISPLAY[self.mode(args[1])] + "\n")
        return CommandResult(call.argv, 2, "", f"invalid arguments {args}")

    def _mps_control(self, call: RecordedCall) -> CommandResult:
        pipe = call.env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        uuid = call.env.get("CUDA_VISIBLE_DEVICES", "")
        with self._lock:
            running = pipe in self.daemons
            if list(call.args) == ["-d"]:
                if running:
                    return CommandResult(call.argv, 1, "", "An instance of this daemon is running")
                if self.mode(uuid) != "EXCLUSIVE_PROCESS":
                    # The real daemon starts anyway; the plugin must never rely on that.
                    return CommandResult(call.argv, 3, "", "GPU not in EXCLUSIVE_PROCESS mode")
                self.daemons[pipe] = uuid
                self.daemons_started += 1
                Path(pipe).mkdir(parents=True, exist_ok=True)
                (Path(pipe) / PID_FILE).write_text(f"{self.daemon_pid}\n")
                (Path(pipe) / CONTROL_SOCKET).touch()
                return CommandResult(call.argv, 0)
            if call.args or call.stdin is None:
                return CommandResult(call.argv, 2, "", f"invalid arguments {list(call.args)}")
            if not running:
                return CommandResult(call.argv, 1, "Cannot find MPS control daemon process\n")
            command = call.stdin.strip()
            if command == "get_server_list":
                return CommandResult(call.argv, 0, "")
            if command == "quit":
                del self.daemons[pipe]
                for name in (PID_FILE, CONTROL_SOCKET):
                    (Path(pipe) / name).unlink(missing_ok=True)
                return CommandResult(call.argv, 0)
            return CommandResult(call.argv, 1, "", f"unknown command {command!r}")
