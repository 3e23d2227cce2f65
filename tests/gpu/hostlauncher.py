"""A test-only MPS daemon launcher: ``nvidia-cuda-mps-control -d`` as a host process.

The daemon runs in its own mount namespace whose ``/dev/shm`` is the GPU's shm directory (what
the chart's daemon pod gets), entered through :mod:`tests.gpu.enter` under ``unshare --mount``.
It keeps the :class:`~kubeletplugin.sharing.daemons.DaemonLauncher` invariants:

- a daemon is found by scanning ``/proc`` for ``nvidia-cuda-mps-control`` processes whose
  environment names the GPU's pipe directory, so a daemon is never started twice and one left
  by an earlier run is seen;
- a zombie counts as failed, never running; ``remove`` returns once no live such process is left
  (SIGTERM, then SIGKILL) or raises :class:`~kubeletplugin.sharing.daemons.DaemonError`; a
  zombie that a non-reaping init leaves behind does not stop a later ``launch``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kubeletplugin.sharing.daemons import DaemonError, DaemonPhase, DaemonSpec
from tests.gpu.container import BindMount, ContainerPlan, enter_command

CONTROL: Final = "nvidia-cuda-mps-control"
REMOVE_WAIT_S: Final = 10.0


@dataclass(frozen=True)
class ControlProcess:
    pid: int
    pipe_dir: str
    zombie: bool


def control_processes(proc_root: Path) -> list[ControlProcess]:
    """Every ``nvidia-cuda-mps-control`` process under ``proc_root`` with its pipe directory
    (``CUDA_MPS_PIPE_DIRECTORY`` of its environment, ``""`` when unset); processes that vanish
    while being read are skipped."""
    found = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            if os.path.basename(argv0.decode(errors="replace")) != CONTROL:
                continue
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        state = stat.rpartition(")")[2].split()[0] if ")" in stat else "?"
        pipe = ""
        for item in environ:
            key, _, value = item.decode(errors="replace").partition("=")
            if key == "CUDA_MPS_PIPE_DIRECTORY":
                pipe = value
        found.append(ControlProcess(int(entry.name), pipe, state == "Z"))
    return found


class HostMpsLauncher:
    """See the module docstring. ``control`` is the path of ``nvidia-cuda-mps-control``."""

    def __init__(self, mps_root: Path, control: str, proc_root: Path = Path("/proc")) -> None:
        self.mps_root = mps_root
        self.control = control
        self.proc_root = proc_root

    def _mine(self, spec: DaemonSpec) -> list[ControlProcess]:
        pipe = str(spec.paths.pipe)
        return [p for p in control_processes(self.proc_root) if p.pipe_dir == pipe]

    def command(self, spec: DaemonSpec) -> list[str]:
        """The host command that starts the daemon of ``spec``."""
        plan = ContainerPlan(
            env=dict(spec.env), mounts=(BindMount(str(spec.paths.shm), "/dev/shm"),)
        )
        return enter_command(plan, [self.control, "-d"], 0)

    def _live(self, spec: DaemonSpec) -> list[ControlProcess]:
        return [p for p in self._mine(spec) if not p.zombie]

    def launch(self, spec: DaemonSpec) -> None:
        if self._live(spec):
            return
        try:
            done = subprocess.run(
                self.command(spec), capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DaemonError(f"cannot start {CONTROL} for GPU {spec.uuid}: {exc}") from None
        if done.returncode != 0:
            raise DaemonError(
                f"{CONTROL} -d for GPU {spec.uuid} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}"
            )

    def pids(self, spec: DaemonSpec) -> list[int]:
        """The process ids of the live (not zombie) daemons of ``spec``, ascending."""
        return sorted(p.pid for p in self._live(spec))

    def phase(self, spec: DaemonSpec) -> DaemonPhase:
        if self._live(spec):
            return DaemonPhase.RUNNING
        return DaemonPhase.FAILED if self._mine(spec) else DaemonPhase.ABSENT

    def remove(self, spec: DaemonSpec) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for process in self._live(spec):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)
            deadline = time.monotonic() + REMOVE_WAIT_S
            while time.monotonic() < deadline:
                if not self._live(spec):
                    return
                time.sleep(0.1)
        raise DaemonError(f"the MPS control daemon of GPU {spec.uuid} does not go away")

    def present(self) -> list[str]:
        ids = set()
        for process in control_processes(self.proc_root):
            pipe = Path(process.pipe_dir)
            if pipe.name == "pipe" and pipe.parent.parent == self.mps_root:
                ids.add(pipe.parent.name)
        return sorted(ids)

    def describe(self, spec: DaemonSpec) -> str:
        pids = [p.pid for p in self._mine(spec)]
        return f"host process {json.dumps(pids)} ({CONTROL} -d)"
