"""A simulation of ``nvidia-smi``, ``nvidia-cuda-mps-control`` and the daemon launcher.

Used by the simulated host and by tests: it keeps per-GPU compute modes and time-slice
settings and per-pipe-directory MPS daemons with their default limits, and writes and removes the
daemon's pid file and socket placeholders in the pipe directory as the real daemon does.

MPS servers behave as measured on a real GPU (:meth:`SimulatedNvidiaTools.connect_client`): a
daemon starts one server per UID, on the first client of that UID, with the defaults the daemon
has *then* (from its environment, changed by ``set_default_*``); later defaults reach only later
servers, a server outlives its clients until ``quit``, and a client of another UID queues while a
server runs.
:class:`SimulatedLauncher` stands in for the daemon pods. Only the commands the plugin issues are
understood; anything else exits non-zero with an error, like an unknown option or command.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kubeletplugin.hosts.fakerunner import FakeRunner, RecordedCall
from kubeletplugin.runner import MPS_CONTROL, NVIDIA_SMI, CommandResult
from kubeletplugin.sharing.daemons import DaemonError, DaemonPhase, DaemonSpec
from kubeletplugin.sharing.mpspaths import DAEMON_SOCKETS

#: The file ``nvidia-cuda-mps-control`` writes its pid to in the pipe directory.
PID_FILE: Final = "nvidia-cuda-mps-control.pid"

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
    #: Pid written into pid files, as the real daemon does (the plugin never reads it).
    daemon_pid: int = field(default_factory=os.getpid)
    daemons_started: int = 0
    #: Defaults from the daemon's environment and ``set_default_*``, by pipe directory.
    default_limits: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Running servers by pipe directory: UID -> the limits it started with.
    servers: dict[str, dict[int, dict[str, str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, runner: FakeRunner) -> FakeRunner:
        runner.on(NVIDIA_SMI, answer=self._nvidia_smi)
        runner.on(MPS_CONTROL, answer=self.answer_mps_control)
        return runner

    def mode(self, uuid: str) -> str:
        return self.compute_modes.get(uuid, "DEFAULT")

    def kill_daemons(self) -> None:
        """Make every daemon die without cleanup (crashed, or a zombie: its files stay)."""
        with self._lock:
            self.daemons.clear()
            self.default_limits.clear()
            self.servers.clear()

    def connect_client(self, pipe: str, uid: int) -> dict[str, str] | None:
        """A CUDA client of ``uid`` attaching through ``pipe``: the limits of the server it gets
        (started now with the daemon's current defaults when none of that UID runs), or None
        when it queues behind another UID's server. KeyError when no daemon runs there (a real
        client would then run without MPS, on the whole GPU)."""
        with self._lock:
            if pipe not in self.daemons:
                raise KeyError(pipe)
            servers = self.servers.setdefault(pipe, {})
            if uid not in servers and servers:
                return None
            return dict(servers.setdefault(uid, dict(self.default_limits.get(pipe, {}))))

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

    def start_daemon(
        self,
        pipe: str,
        uuid: str,
        env: dict[str, str] | None = None,
        *,
        placeholders: bool = True,
    ) -> bool:
        """Start the daemon of ``pipe`` as ``nvidia-cuda-mps-control -f`` would: write its pid
        file and (with ``placeholders``) empty files where its sockets go, take its defaults from
        ``env``. False (no daemon) when one runs there already or the GPU is not in DEFAULT
        compute mode (the servers of several daemons could not share it; the plugin must never
        rely on that)."""
        env = env or {}
        defaults = {}
        if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env:
            defaults["active_thread_percentage"] = env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
        # As measured: a pinned memory limit in the daemon's environment sets nothing; the
        # daemon pod's start hook runs the commands of SHAREGPU_MPS_DEFAULTS.
        for line in env.get("SHAREGPU_MPS_DEFAULTS", "").splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == "set_default_active_thread_percentage":
                defaults["active_thread_percentage"] = words[1]
            if len(words) == 3 and words[0] == "set_default_device_pinned_mem_limit":
                defaults["pinned_mem_limit"] = words[2]
        with self._lock:
            if pipe in self.daemons or self.mode(uuid) != "DEFAULT":
                return False
            self.daemons[pipe] = uuid
            self.default_limits[pipe] = defaults
            self.daemons_started += 1
        directory = Path(pipe)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / PID_FILE).write_text(f"{self.daemon_pid}\n")
        for name in DAEMON_SOCKETS if placeholders else ():
            (directory / name).touch()
        return True

    def end_daemon(self, pipe: str) -> None:
        """The daemon of ``pipe`` exits and removes its files (after ``quit``, or killed)."""
        with self._lock:
            self.daemons.pop(pipe, None)
            self.default_limits.pop(pipe, None)
            self.servers.pop(pipe, None)
        for name in (PID_FILE, *DAEMON_SOCKETS):
            (Path(pipe) / name).unlink(missing_ok=True)

    def answer_mps_control(self, call: RecordedCall) -> CommandResult:
        """What ``nvidia-cuda-mps-control`` answers to the commands on ``call.stdin``, sent to
        the daemon of the call's ``CUDA_MPS_PIPE_DIRECTORY``."""
        pipe = call.env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        if call.args or call.stdin is None:
            return CommandResult(call.argv, 2, "", f"invalid arguments {list(call.args)}")
        with self._lock:
            uuid = self.daemons.get(pipe)
        if uuid is None:
            return CommandResult(call.argv, 1, "Cannot find MPS control daemon process\n")
        words = call.stdin.split()
        if words == ["get_server_list"]:
            return CommandResult(call.argv, 0, "")
        if words == ["get_default_active_thread_percentage"] or (
            len(words) == 2
            and words[0] == "set_default_active_thread_percentage"
            and not (words[1].isdigit() and 1 <= int(words[1]) <= 100)
        ):
            # As measured: a refused percentage is not applied, and the command exits 0.
            with self._lock:
                value = self.default_limits.get(pipe, {}).get("active_thread_percentage", "100")
            return CommandResult(call.argv, 0, f"{float(value):.1f}\n")
        if words == ["quit"]:
            self.end_daemon(pipe)
            return CommandResult(call.argv, 0)
        if (
            len(words) == 2
            and words[0] == "set_default_active_thread_percentage"
            and words[1].isdigit()
            and 1 <= int(words[1]) <= 100
        ):
            with self._lock:
                self.default_limits.setdefault(pipe, {})["active_thread_percentage"] = words[1]
            return CommandResult(call.argv, 0, f"{float(words[1]):.1f}\n")
        if (
            len(words) == 3
            and words[0] == "set_default_device_pinned_mem_limit"
            and words[1] == uuid
            and re.fullmatch(r"[0-9]+M", words[2])
        ):
            with self._lock:
                self.default_limits.setdefault(pipe, {})["pinned_mem_limit"] = words[2]
            return CommandResult(call.argv, 0)
        return CommandResult(call.argv, 1, "", f"unknown or invalid command {call.stdin.strip()!r}")


class SimulatedLauncher:
    """Daemon "pods" over :class:`SimulatedNvidiaTools`: :meth:`launch` creates a record and
    starts the simulated daemon; a record whose daemon has ended (:meth:`SimulatedNvidiaTools.
    kill_daemons`, ``quit``) is :attr:`DaemonPhase.FAILED` until removed, as a pod whose
    container exited. Outlives the plugin objects that use it, as pods do."""

    def __init__(self, tools: SimulatedNvidiaTools) -> None:
        self.tools = tools
        self.pods: dict[str, DaemonSpec] = {}
        self.launches = 0
        #: How many of the next removals fail (an API server that refuses the deletion).
        self.failing_removals = 0
        self._lock = threading.Lock()

    def launch(self, spec: DaemonSpec) -> None:
        with self._lock:
            if spec.id in self.pods:
                return
            self.pods[spec.id] = spec
            self.launches += 1
        self.tools.start_daemon(str(spec.paths.pipe), spec.uuid, dict(spec.env))

    def phase(self, spec: DaemonSpec) -> DaemonPhase:
        with self._lock:
            if spec.id not in self.pods:
                return DaemonPhase.ABSENT
        if str(spec.paths.pipe) in self.tools.daemons:
            return DaemonPhase.RUNNING
        return DaemonPhase.FAILED

    def remove(self, spec: DaemonSpec) -> None:
        with self._lock:
            if self.failing_removals > 0:
                self.failing_removals -= 1
                raise DaemonError(f"cannot delete {self.describe(spec)}: simulated refusal")
            self.pods.pop(spec.id, None)
        self.tools.end_daemon(str(spec.paths.pipe))

    def present(self) -> list[str]:
        with self._lock:
            return sorted(self.pods)

    def describe(self, spec: DaemonSpec) -> str:
        return f"simulated daemon {spec.id}"
