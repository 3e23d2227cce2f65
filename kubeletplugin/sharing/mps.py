"""One MPS control daemon per shared GPU, outside the plugin container, and the container edits
that attach a share to it.

Per GPU (UUID ``U``) the plugin owns the host directories of :class:`~kubeletplugin.sharing.
mpspaths.MpsPaths` (``<root>/<short id>/{pipe,shm,log}``); a
:class:`~kubeletplugin.sharing.daemons.DaemonLauncher` runs the daemon (a pod per GPU on a real
node), so a plugin restart, OOM kill or upgrade leaves it running.

- start: every socket path the daemon will create must fit a unix socket address (else the
  prepare fails naming the path); remember the GPU's compute mode, set ``EXCLUSIVE_PROCESS``,
  launch the daemon with ``CUDA_VISIBLE_DEVICES=U`` and the pipe and log directories, and wait
  until it answers ``get_server_list``: a share is only handed out once its daemon serves;
- alive: the launcher says the daemon runs (a crashed, exited or zombie daemon, or a pod being
  deleted, is dead) *and* it answers ``get_server_list``. Checked before every share attaches;
- adopt: a daemon that is alive but not owned (found after a plugin restart) is taken over,
  never started a second time and never stopped while a prepared claim uses it;
- restart: an owned daemon that is not alive is removed and launched again (the remembered
  compute mode is kept) before another share attaches;
- limits: the daemon's defaults (``set_default_active_thread_percentage`` and
  ``set_default_device_pinned_mem_limit U <N>M``) are the largest share on the GPU, set again
  whenever a share attaches; each client's own variables lower them to its share;
- stop: ``quit``, then the launcher removes the daemon, then the compute mode is restored and
  the pipe and shm directories are removed (the log directory stays for inspection).

Because the daemon is started with only its GPU visible, a client sees that GPU as device 0 and
attaches to one daemon (one GPU) at a time; the enforcer keeps the MPS devices of a request on
one GPU. Clients get the pipe directory (with ``control_privileged`` masked) and the GPU's
``shm`` directory at ``/dev/shm``; never the log directory.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kubeletplugin.containeredits import ContainerEdits, Mount
from kubeletplugin.runner import MPS_CONTROL, NVIDIA_SMI, CommandError, Runner
from kubeletplugin.sharing.daemons import DaemonError, DaemonLauncher, DaemonPhase, DaemonSpec
from kubeletplugin.sharing.mpspaths import (
    PRIVILEGED_SOCKET,
    MpsPathError,
    MpsPaths,
    check_socket_paths,
    short_id,
)

log = logging.getLogger(__name__)

EXCLUSIVE_PROCESS: Final = "EXCLUSIVE_PROCESS"
DEFAULT_COMPUTE_MODE: Final = "DEFAULT"
#: Compute modes ``nvidia-smi -c`` accepts, by the names ``--query-gpu=compute_mode`` prints.
_COMPUTE_MODES: Final = {
    "default": "DEFAULT",
    "exclusive_process": "EXCLUSIVE_PROCESS",
    "exclusive_thread": "EXCLUSIVE_THREAD",
    "prohibited": "PROHIBITED",
}
#: Where containers see the daemon's pipe directory (per GPU, so two GPUs never collide).
CONTAINER_MPS_ROOT: Final = "/run/sharegpu/mps"
#: Where MPS clients and their daemon share memory.
CONTAINER_SHM: Final = "/dev/shm"
MIB: Final = 1024 * 1024
#: Seconds a newly launched daemon has to answer ``get_server_list`` (a pod must be scheduled
#: and its init container copy the driver files first).
START_TIMEOUT_S: Final = 60.0
#: What a failed MPS operation raises.
MPS_ERRORS: Final = (CommandError, DaemonError, MpsPathError, OSError)


@dataclass(frozen=True)
class MpsDaemon:
    """A daemon the plugin started or adopted for GPU ``uuid``."""

    uuid: str
    paths: MpsPaths
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


def container_pipe_dir(uuid: str) -> str:
    """Where a client container sees GPU ``uuid``'s pipe directory."""
    return f"{CONTAINER_MPS_ROOT}/{uuid}/pipe"


class MpsManager:
    """Starts, adopts, restarts and stops the per-GPU MPS control daemons. Callers serialise
    calls for one GPU (the enforcer holds that GPU's lock); the table of owned daemons is
    thread-safe."""

    def __init__(
        self,
        runner: Runner,
        root: str | Path,
        launcher: DaemonLauncher,
        *,
        start_timeout: float = START_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.runner = runner
        self.root = Path(root)
        self.launcher = launcher
        self.start_timeout = start_timeout
        self._sleep = sleep
        self._daemons: dict[str, MpsDaemon] = {}
        self._lock = threading.Lock()

    # --- paths and environment ---

    def paths(self, uuid: str) -> MpsPaths:
        return MpsPaths(self.root, uuid)

    def pipe_dir(self, uuid: str) -> Path:
        return self.paths(uuid).pipe

    def daemon_env(self, uuid: str) -> dict[str, str]:
        """Environment of the daemon and of every control command for GPU ``uuid``."""
        paths = self.paths(uuid)
        return {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(paths.log),
        }

    def spec(self, uuid: str) -> DaemonSpec:
        return DaemonSpec(self.paths(uuid), self.daemon_env(uuid))

    # --- lifecycle ---

    def running(self) -> dict[str, MpsDaemon]:
        """Daemons currently owned, by GPU UUID."""
        with self._lock:
            return dict(self._daemons)

    def ensure_running(self, uuid: str, previous_compute_mode: str | None = None) -> MpsDaemon:
        """The daemon of ``uuid``: owned and alive, adopted, restarted or started now.

        ``previous_compute_mode`` (from a checkpoint) is what stop restores; when None it is
        queried before the mode is changed. Raises one of :data:`MPS_ERRORS`.
        """
        check_socket_paths(self.paths(uuid).pipe, container_pipe_dir(uuid))
        with self._lock:
            known = self._daemons.get(uuid)
        if known is not None:
            if self.is_alive(uuid):
                return known
            # A client that cannot reach a daemon runs without MPS, i.e. without limits: start
            # a new daemon rather than attach another share to a dead one.
            log.warning("the MPS control daemon of GPU %s is dead; starting it again", uuid)
            daemon = self._start(uuid, known.previous_compute_mode)
        elif self.is_alive(uuid):
            daemon = MpsDaemon(
                uuid,
                self.paths(uuid),
                previous_compute_mode or DEFAULT_COMPUTE_MODE,
                adopted=True,
            )
            log.info(
                "adopted the running MPS control daemon of GPU %s (%s)",
                uuid,
                self.launcher.describe(self.spec(uuid)),
            )
        else:
            daemon = self._start(uuid, previous_compute_mode)
        with self._lock:
            self._daemons[uuid] = daemon
        return daemon

    def _start(self, uuid: str, previous_compute_mode: str | None) -> MpsDaemon:
        previous = previous_compute_mode or self.query_compute_mode(uuid)
        spec = self.spec(uuid)
        if self.launcher.phase(spec) is not DaemonPhase.ABSENT:
            self.launcher.remove(spec)  # dead, or not answering: never two daemons for a GPU
        paths = spec.paths
        # Stale sockets and shared memory of a dead daemon go; the directories stay, because
        # running containers hold bind mounts of them and must see the new daemon's files.
        for directory, mode in ((paths.pipe, 0o755), (paths.shm, 0o1777), (paths.log, 0o755)):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(mode)
        _clear_directory(paths.pipe)
        _clear_directory(paths.shm)
        self.runner.run(NVIDIA_SMI, ["-i", uuid, "-c", EXCLUSIVE_PROCESS])
        try:
            self.launcher.launch(spec)
            self._wait_until_answering(uuid)
        except (CommandError, DaemonError):
            self._remove_quietly(spec)
            self._restore_mode(uuid, previous)
            raise
        log.info("started the MPS control daemon of GPU %s (compute mode was %s)", uuid, previous)
        return MpsDaemon(uuid, paths, previous)

    def set_default_limits(self, uuid: str, cores: int, memory_bytes: int) -> None:
        """Set the daemon's default active thread percentage and pinned memory limit of GPU
        ``uuid`` (whole MiB, rounded down): what a client that sets no variable of its own gets.
        Raises CommandError when the daemon refuses."""
        env = self.daemon_env(uuid)
        for command in (
            f"set_default_active_thread_percentage {cores}",
            f"set_default_device_pinned_mem_limit {uuid} {memory_bytes // MIB}M",
        ):
            self.runner.run(MPS_CONTROL, [], env=env, stdin=command + "\n")

    def stop(self, uuid: str) -> None:
        """Quit the daemon of ``uuid`` (owned or found), remove it, restore the compute mode.
        A GPU without a daemon is left alone. Raises CommandError or DaemonError on failure;
        the daemon then stays owned so a later stop can retry."""
        spec = self.spec(uuid)
        with self._lock:
            daemon = self._daemons.get(uuid)
        if daemon is None:
            if self.launcher.phase(spec) is DaemonPhase.ABSENT:
                return
            daemon = MpsDaemon(uuid, spec.paths, DEFAULT_COMPUTE_MODE, adopted=True)
            with self._lock:
                self._daemons[uuid] = daemon
        # ``quit`` lets the daemon end its servers cleanly; a daemon that is dead already
        # does not answer, and removing it is enough.
        self.runner.run(MPS_CONTROL, [], env=spec.env, stdin="quit\n", check=False)
        self.launcher.remove(spec)
        self._restore_mode(uuid, daemon.previous_compute_mode)
        with self._lock:
            self._daemons.pop(uuid, None)
        for directory in (spec.paths.pipe, spec.paths.shm):
            shutil.rmtree(directory, ignore_errors=True)
        log.info("stopped the MPS control daemon of GPU %s", uuid)

    def cleanup(self, uuid: str, previous_compute_mode: str) -> None:
        """Stop a daemon no share needs any more (found after a restart), if it still exists,
        and restore ``previous_compute_mode``; never starts anything.

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
                uuid, MpsDaemon(uuid, self.paths(uuid), previous_compute_mode, adopted=True)
            )
        self.stop(uuid)

    def leftovers(self, node_gpus: Collection[str]) -> list[str]:
        """UUIDs of ``node_gpus`` with a daemon directory or a daemon the launcher knows
        (daemons may have run there); other names found are logged and ignored."""
        by_id = {short_id(u): u for u in node_gpus}
        found: set[str] = set()
        with contextlib.suppress(OSError):
            found |= {p.name for p in self.root.iterdir() if (p / "pipe").is_dir()}
        try:
            found |= set(self.launcher.present())
        except DaemonError as exc:
            log.error("cannot list the MPS daemons of this node: %s", exc)
        for name in sorted(found - set(by_id)):
            log.warning("ignoring the MPS daemon or directory %r: this node has no such GPU", name)
        return sorted(by_id[name] for name in found if name in by_id)

    def is_alive(self, uuid: str) -> bool:
        """True when the launcher says the daemon runs and it answers ``get_server_list``."""
        spec = self.spec(uuid)
        if self.launcher.phase(spec) is not DaemonPhase.RUNNING:
            return False
        return self._answers(spec)

    def _answers(self, spec: DaemonSpec) -> bool:
        answer = self.runner.run(
            MPS_CONTROL, [], env=spec.env, stdin="get_server_list\n", check=False
        )
        return answer.returncode == 0

    def _wait_until_answering(self, uuid: str) -> None:
        """Poll until the launched daemon runs and answers; DaemonError when it failed or after
        the start timeout."""
        spec = self.spec(uuid)
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        while True:
            phase = self.launcher.phase(spec)
            if phase is DaemonPhase.FAILED:
                raise DaemonError(
                    f"the MPS control daemon of GPU {uuid} failed to start "
                    f"(see {self.launcher.describe(spec)} and {spec.paths.log})"
                )
            if phase is DaemonPhase.RUNNING and self._answers(spec):
                return
            if time.monotonic() + delay > deadline:
                raise DaemonError(
                    f"the MPS control daemon of GPU {uuid} did not answer within "
                    f"{self.start_timeout:g}s of starting ({self.launcher.describe(spec)} is "
                    f"{phase.value})"
                )
            self._sleep(delay)
            delay = min(delay * 2, 1.0)

    def _remove_quietly(self, spec: DaemonSpec) -> None:
        try:
            self.launcher.remove(spec)
        except DaemonError as exc:
            log.warning("could not remove the failed MPS daemon of GPU %s: %s", spec.uuid, exc)

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
        """``{uuid: {"previousComputeMode", "shortId", "daemon"}}`` for every owned daemon (the
        last two say where it runs; only the mode is read back)."""
        with self._lock:
            daemons = sorted(self._daemons.items())
        return {
            uuid: {
                "previousComputeMode": d.previous_compute_mode,
                "shortId": d.paths.id,
                "daemon": self.launcher.describe(self.spec(uuid)),
            }
            for uuid, d in daemons
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
        return share_edits(self.paths(uuid), active_thread_percentage, pinned_memory_bytes)


def share_edits(
    paths: MpsPaths, active_thread_percentage: int, pinned_memory_bytes: int
) -> ContainerEdits:
    """Mounts of the daemon's pipe and shm directories and the MPS client variables of one share.

    - the pipe directory at :func:`container_pipe_dir`, with ``control_privileged`` (the socket
      of ``quit`` and the ``set_*`` commands) covered by ``/dev/null``: a root client cannot
      reconfigure or stop a daemon other tenants use through it;
    - the GPU's shm directory at ``/dev/shm``, where the MPS client library and the daemon
      exchange shared memory (a private ``/dev/shm`` makes clients fail or hang);
    - never the log directory, and no ``CUDA_MPS_LOG_DIRECTORY``;
    - the pinned memory limit in whole MiB, rounded down (never above the share), keyed by the
      GPU's UUID (NVIDIA's ``<device>=<limit>`` format).
    """
    uuid = paths.uuid
    pipe = container_pipe_dir(uuid)
    options = ("rbind", "rw", "nosuid", "nodev", "noexec")
    masked = ("bind", "ro", "nosuid", "nodev", "noexec")
    return ContainerEdits(
        env=(
            f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={active_thread_percentage}",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}={pinned_memory_bytes // MIB}M",
        ),
        mounts=(
            Mount(str(paths.pipe), pipe, options=options),
            Mount("/dev/null", f"{pipe}/{PRIVILEGED_SOCKET}", options=masked),
            Mount(str(paths.shm), CONTAINER_SHM, options=options),
        ),
    )


def _clear_directory(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
