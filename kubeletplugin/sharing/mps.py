"""One MPS control daemon per shared GPU, and the container edits that attach a share to it.

Per GPU (UUID ``U``) the plugin owns ``<data-dir>/mps/U/pipe`` and ``<data-dir>/mps/U/log``.

- start: remember the GPU's compute mode (``nvidia-smi -i U --query-gpu=compute_mode``), set
  ``EXCLUSIVE_PROCESS`` (``nvidia-smi -i U -c EXCLUSIVE_PROCESS``), then run
  ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES=U`` and the pipe and log directories,
  and wait until the daemon answers ``get_server_list`` (a share is only handed out once its
  daemon serves);
- adopt: a daemon whose pid file names a live process, or whose control socket exists, and that
  answers ``get_server_list`` is taken over instead of started again (a daemon is never started
  twice for one GPU);
- restart: an owned daemon whose pid file names a dead process and that no longer answers
  ``get_server_list`` is started again (keeping the remembered compute mode) before another
  share is attached to it;
- stop: ``quit`` on the control's stdin with the same environment, then the remembered compute
  mode is restored.

Because the daemon is started with only its GPU visible, every client sees that GPU as device 0,
so a share's pinned memory limit is always ``0=<N>M`` (NVIDIA's ``<ordinal>=<limit>`` format) and a
container can attach to one MPS daemon (one GPU) at a time. The enforcer keeps the MPS devices of a
request on one GPU, so that GPU is also the one the request's ``NVIDIA_VISIBLE_DEVICES`` lists.

Deployment note: the daemon runs as a child of the plugin, in the plugin's mount and IPC
namespaces. Other MPS deployments also give clients the server's ``/dev/shm``; where clients fail
to connect although the pipe directory is mounted, share ``/dev/shm`` between the plugin pod and
the workloads.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kubeletplugin.containeredits import ContainerEdits, Mount
from kubeletplugin.fsutil import child_path
from kubeletplugin.runner import MPS_CONTROL, NVIDIA_SMI, CommandError, Runner

log = logging.getLogger(__name__)

PID_FILE: Final = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET: Final = "control"
EXCLUSIVE_PROCESS: Final = "EXCLUSIVE_PROCESS"
DEFAULT_COMPUTE_MODE: Final = "DEFAULT"
#: Compute modes ``nvidia-smi -c`` accepts, by the names ``--query-gpu=compute_mode`` prints.
_COMPUTE_MODES: Final = {
    "default": "DEFAULT",
    "exclusive_process": "EXCLUSIVE_PROCESS",
    "exclusive_thread": "EXCLUSIVE_THREAD",
    "prohibited": "PROHIBITED",
}
#: Where containers see the daemon's directories (per GPU, so two GPUs never collide).
CONTAINER_MPS_ROOT: Final = "/run/sharegpu/mps"
MIB: Final = 1024 * 1024
#: Seconds a newly started daemon has to answer ``get_server_list``.
START_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class MpsDaemon:
    """A daemon the plugin started or adopted for GPU ``uuid``."""

    uuid: str
    pipe_dir: Path
    log_dir: Path
    #: Compute mode to restore when the daemon stops (``nvidia-smi -c`` spelling).
    previous_compute_mode: str
    adopted: bool = False


def compute_mode_argument(reported: str) -> str:
    """``nvidia-smi -c`` spelling of a mode as ``--query-gpu=compute_mode`` prints it
    (``Exclusive_Process`` -> ``EXCLUSIVE_PROCESS``); raises ValueError for unknown text."""
    key = reported.strip().lower().replace(" ", "_")
    if key not in _COMPUTE_MODES:
        raise ValueError(f"unknown compute mode {reported.strip()!r}")
    return _COMPUTE_MODES[key]


class MpsManager:
    """Starts, adopts and stops the per-GPU MPS control daemons. Thread-safe per GPU: callers
    serialise calls for one GPU (the enforcer holds that GPU's lock)."""

    def __init__(
        self, runner: Runner, data_dir: str | Path, *, start_timeout: float = START_TIMEOUT_S
    ) -> None:
        self.runner = runner
        self.start_timeout = start_timeout
        self.root = Path(data_dir) / "mps"
        self._daemons: dict[str, MpsDaemon] = {}
        self._lock = threading.Lock()

    # --- paths and environment ---

    def pipe_dir(self, uuid: str) -> Path:
        return child_path(self.root, uuid) / "pipe"

    def log_dir(self, uuid: str) -> Path:
        return child_path(self.root, uuid) / "log"

    def directories(self) -> list[str]:
        """GPU UUIDs that have a directory under the MPS root (daemons may have run there)."""
        try:
            return sorted(p.name for p in self.root.iterdir() if (p / "pipe").is_dir())
        except OSError:
            return []

    def daemon_env(self, uuid: str) -> dict[str, str]:
        """Environment of every control command for GPU ``uuid``."""
        return {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(uuid)),
        }

    # --- lifecycle ---

    def running(self) -> dict[str, MpsDaemon]:
        """Daemons currently owned, by GPU UUID."""
        with self._lock:
            return dict(self._daemons)

    def ensure_running(self, uuid: str, previous_compute_mode: str | None = None) -> MpsDaemon:
        """The daemon of ``uuid``: already owned, adopted, or started now.

        ``previous_compute_mode`` (from a checkpoint) is what stop restores; when None it is
        queried before the mode is changed. Raises CommandError when a command fails.
        """
        with self._lock:
            known = self._daemons.get(uuid)
        if known is not None:
            if not self._looks_dead(uuid) or self.is_alive(uuid):
                return known
            # A client that cannot reach a daemon runs without MPS, i.e. without limits: start
            # a new daemon rather than attach another share to a dead one.
            log.warning("the MPS control daemon of GPU %s has died; starting it again", uuid)
            daemon = self._start(uuid, known.previous_compute_mode)
            with self._lock:
                self._daemons[uuid] = daemon
            return daemon
        if self.is_alive(uuid):
            daemon = MpsDaemon(
                uuid,
                self.pipe_dir(uuid),
                self.log_dir(uuid),
                previous_compute_mode or DEFAULT_COMPUTE_MODE,
                adopted=True,
            )
            log.info("adopted the running MPS control daemon of GPU %s", uuid)
        else:
            daemon = self._start(uuid, previous_compute_mode)
        with self._lock:
            self._daemons[uuid] = daemon
        return daemon

    def _start(self, uuid: str, previous_compute_mode: str | None) -> MpsDaemon:
        previous = previous_compute_mode or self.query_compute_mode(uuid)
        pipe, logs = self.pipe_dir(uuid), self.log_dir(uuid)
        pipe.mkdir(parents=True, mode=0o755, exist_ok=True)
        # Stale sockets of a dead daemon go; the directory itself stays, because running
        # containers hold bind mounts of it and must see the new daemon's sockets.
        _clear_directory(pipe)
        logs.mkdir(parents=True, mode=0o755, exist_ok=True)
        self.runner.run(NVIDIA_SMI, ["-i", uuid, "-c", EXCLUSIVE_PROCESS])
        try:
            self.runner.run(MPS_CONTROL, ["-d"], env=self.daemon_env(uuid))
            self._wait_until_answering(uuid)
        except CommandError:
            self._restore_mode(uuid, previous)
            raise
        log.info("started the MPS control daemon of GPU %s (compute mode was %s)", uuid, previous)
        return MpsDaemon(uuid, pipe, logs, previous)

    def stop(self, uuid: str) -> None:
        """Quit the daemon of ``uuid`` (owned or found running) and restore the compute mode.
        A GPU without a daemon is left alone. Raises CommandError when a command fails; the
        daemon then stays owned so a later stop can retry."""
        with self._lock:
            daemon = self._daemons.get(uuid)
        if daemon is None:
            if not self.is_alive(uuid):
                return
            daemon = MpsDaemon(
                uuid, self.pipe_dir(uuid), self.log_dir(uuid), DEFAULT_COMPUTE_MODE, adopted=True
            )
            with self._lock:
                self._daemons[uuid] = daemon
        answer = self.runner.run(
            MPS_CONTROL, [], env=self.daemon_env(uuid), stdin="quit\n", check=False
        )
        if answer.returncode != 0 and self.is_alive(uuid):
            raise CommandError(
                answer.argv,
                f"exit code {answer.returncode}; the daemon is still running",
                returncode=answer.returncode,
                stderr=answer.stderr or answer.stdout,
            )
        self._restore_mode(uuid, daemon.previous_compute_mode)
        with self._lock:
            self._daemons.pop(uuid, None)
        shutil.rmtree(daemon.pipe_dir, ignore_errors=True)
        log.info("stopped the MPS control daemon of GPU %s", uuid)

    def cleanup(self, uuid: str, previous_compute_mode: str) -> None:
        """Stop a daemon no share needs any more (found in a checkpoint after a restart), if it
        still runs, and restore ``previous_compute_mode``; never starts anything.

        The mode is restored only while the GPU is in ``EXCLUSIVE_PROCESS``, the mode the plugin
        sets for MPS: a recorded mode never changes a GPU the plugin did not switch."""
        current = self.query_compute_mode(uuid)
        if current != EXCLUSIVE_PROCESS and previous_compute_mode != current:
            log.info(
                "GPU %s is in compute mode %s, not %s: leaving it (the checkpoint says %s)",
                uuid,
                current,
                EXCLUSIVE_PROCESS,
                previous_compute_mode,
            )
            previous_compute_mode = current
        with self._lock:
            self._daemons.setdefault(
                uuid,
                MpsDaemon(
                    uuid,
                    self.pipe_dir(uuid),
                    self.log_dir(uuid),
                    previous_compute_mode,
                    adopted=True,
                ),
            )
        self.stop(uuid)

    def _looks_dead(self, uuid: str) -> bool:
        """Cheap check of an owned daemon (no command run): True when its pid file names a
        process that no longer exists, or when neither its pid file nor its control socket is
        left in the pipe directory (a daemon of another PID namespace looks dead too, so the
        caller confirms with :meth:`is_alive`)."""
        pipe = self.pipe_dir(uuid)
        pid_file = pipe / PID_FILE
        if pid_file.exists():
            return not _pid_alive(pid_file)
        return not (pipe / CONTROL_SOCKET).exists()

    def is_alive(self, uuid: str) -> bool:
        """True when a daemon for ``uuid`` exists (pid file of a live process or control
        socket) and answers ``get_server_list``."""
        pipe = self.pipe_dir(uuid)
        if not (_pid_alive(pipe / PID_FILE) or (pipe / CONTROL_SOCKET).exists()):
            return False
        answer = self.runner.run(
            MPS_CONTROL, [], env=self.daemon_env(uuid), stdin="get_server_list\n", check=False
        )
        return answer.returncode == 0

    def _wait_until_answering(self, uuid: str) -> None:
        """Poll ``get_server_list`` until the new daemon answers (``-d`` returns once it has
        forked, before its control socket exists); CommandError after the start timeout."""
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        while True:
            answer = self.runner.run(
                MPS_CONTROL, [], env=self.daemon_env(uuid), stdin="get_server_list\n", check=False
            )
            if answer.returncode == 0:
                return
            if time.monotonic() + delay > deadline:
                self._quit_quietly(uuid)
                raise CommandError(
                    answer.argv,
                    f"the MPS control daemon of GPU {uuid} did not answer within "
                    f"{self.start_timeout:g}s of starting",
                    returncode=answer.returncode,
                    stderr=answer.stderr or answer.stdout,
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _quit_quietly(self, uuid: str) -> None:
        try:
            self.runner.run(MPS_CONTROL, [], env=self.daemon_env(uuid), stdin="quit\n", check=False)
        except CommandError as exc:
            log.warning("could not quit the unresponsive MPS daemon of GPU %s: %s", uuid, exc)

    def query_compute_mode(self, uuid: str) -> str:
        """The GPU's compute mode in ``nvidia-smi -c`` spelling."""
        result = self.runner.run(
            NVIDIA_SMI, ["-i", uuid, "--query-gpu=compute_mode", "--format=csv,noheader"]
        )
        try:
            return compute_mode_argument(result.stdout.strip().splitlines()[0])
        except (ValueError, IndexError):
            raise CommandError(
                result.argv, f"unexpected output {result.stdout.strip()!r}"
            ) from None

    def _restore_mode(self, uuid: str, mode: str) -> None:
        self.runner.run(NVIDIA_SMI, ["-i", uuid, "-c", mode])

    # --- checkpoint ---

    def export_state(self) -> dict[str, Any]:
        """``{uuid: {"previousComputeMode": mode}}`` for every owned daemon."""
        with self._lock:
            return {
                uuid: {"previousComputeMode": d.previous_compute_mode}
                for uuid, d in sorted(self._daemons.items())
            }

    @staticmethod
    def previous_modes(state: Mapping[str, Any] | None) -> dict[str, str]:
        """Compute modes to restore, read back from :meth:`export_state` output (bad entries
        are skipped)."""
        modes: dict[str, str] = {}
        for uuid, entry in (state or {}).items():
            mode = entry.get("previousComputeMode") if isinstance(entry, Mapping) else None
            if isinstance(uuid, str) and isinstance(mode, str) and mode in _COMPUTE_MODES.values():
                modes[uuid] = mode
        return modes

    # --- per-share container edits ---

    def container_edits(
        self, uuid: str, active_thread_percentage: int, pinned_memory_bytes: int
    ) -> ContainerEdits:
        """Edits attaching a container to GPU ``uuid``'s daemon with the given limits."""
        return share_edits(
            self.pipe_dir(uuid),
            self.log_dir(uuid),
            uuid,
            active_thread_percentage,
            pinned_memory_bytes,
        )


def share_edits(
    pipe_dir: Path,
    log_dir: Path,
    uuid: str,
    active_thread_percentage: int,
    pinned_memory_bytes: int,
) -> ContainerEdits:
    """Mounts of the daemon's directories and the MPS client variables of one share.

    The pinned memory limit is given in whole MiB, rounded down (never above the share), for
    device ordinal 0: the only device the per-GPU daemon exposes.
    """
    container_pipe = f"{CONTAINER_MPS_ROOT}/{uuid}/pipe"
    container_log = f"{CONTAINER_MPS_ROOT}/{uuid}/log"
    # Clients talk to the daemon through the pipe directory; only the daemon and its server
    # write the log directory, so clients (possibly of other tenants) get it read-only.
    options = ("rbind", "rw", "nosuid", "nodev")
    log_options = ("rbind", "ro", "nosuid", "nodev", "noexec")
    return ContainerEdits(
        env=(
            f"CUDA_MPS_PIPE_DIRECTORY={container_pipe}",
            f"CUDA_MPS_LOG_DIRECTORY={container_log}",
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={active_thread_percentage}",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={pinned_memory_bytes // MIB}M",
        ),
        mounts=(
            Mount(str(pipe_dir), container_pipe, options=options),
            Mount(str(log_dir), container_log, options=log_options),
        ),
    )


def _clear_directory(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _pid_alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
