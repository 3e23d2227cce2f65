"""One MPS control daemon per claim and GPU, outside the plugin container, and the container edits
that attach a share to it (why one per claim, and what was measured: docs/sharing.md).

Invariants: a daemon is started only on a GPU in compute mode ``DEFAULT``, in the
:class:`~kubeletplugin.sharing.mpspaths.MpsPaths` directories the plugin owns, with its claim's
limits as its defaults (environment, :data:`DEFAULTS_ENV` after every container restart, and set
and read back once it answers, before any client can know it); it is alive when its
:class:`~kubeletplugin.sharing.daemons.DaemonLauncher` says it runs *and* it answers
``get_server_list``; an alive daemon found after a plugin restart is adopted, never started twice;
stop is ``quit``, removal, tmpfs unmount and directory removal, also for leftovers. Clients get
the pipe directory read-only with ``control_privileged`` masked and the daemon's ``shm`` at
``/dev/shm``, never the log directory; a client sees its one GPU as device 0."""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kubeletplugin.containeredits import ContainerEdits, Mount
from kubeletplugin.runner import MPS_CONTROL, CommandError, Runner
from kubeletplugin.sharing.computemode import DEFAULT_COMPUTE_MODE, query_compute_mode
from kubeletplugin.sharing.daemons import DaemonError, DaemonLauncher, DaemonPhase, DaemonSpec
from kubeletplugin.sharing.mpspaths import (
    PRIVILEGED_SOCKET,
    MpsPathError,
    MpsPaths,
    check_socket_paths,
    is_daemon_id,
)
from kubeletplugin.sharing.shm import DEFAULT_SHM_BYTES, PlainDirectory, ShmMounter

log = logging.getLogger(__name__)

#: Where containers see the daemon's pipe directory (per GPU, so two GPUs never collide).
CONTAINER_MPS_ROOT: Final = "/run/sharegpu/mps"
#: Where MPS clients and their daemon share memory.
CONTAINER_SHM: Final = "/dev/shm"
MIB: Final = 1024 * 1024
#: Seconds a newly launched daemon has to answer ``get_server_list`` (a pod must be scheduled
#: and its init container copy the driver files first).
START_TIMEOUT_S: Final = 60.0
#: Longest wait between two polls of a starting daemon: a daemon pod takes about a second to run,
#: and a longer back-off added up to that much again to every MPS prepare (each poll is one
#: status read of the daemon and one control command).
MAX_START_POLL_S: Final = 0.2
#: The daemon's environment variable holding its ``set_default_*`` commands (one per line).
DEFAULTS_ENV: Final = "SHAREGPU_MPS_DEFAULTS"
#: What a failed MPS operation raises.
MPS_ERRORS: Final = (CommandError, DaemonError, MpsPathError, OSError)


class ComputeModeError(DaemonError):
    """The GPU's compute mode does not let several MPS servers share it."""


@dataclass(frozen=True)
class MpsLimits:
    """A daemon's default limits: active thread percentage (1-100) and pinned device memory in
    bytes (passed in whole MiB, rounded down: never above the share)."""

    cores: int
    memory: int

    def pinned_limit(self, uuid: str) -> str:
        """NVIDIA's ``<device>=<limit>`` form, keyed by the GPU's UUID."""
        return f"{uuid}={self.memory // MIB}M"

    def default_commands(self, uuid: str) -> tuple[str, str]:
        """The control commands that make these limits a daemon's defaults on GPU ``uuid``."""
        return (
            f"set_default_active_thread_percentage {self.cores}",
            f"set_default_device_pinned_mem_limit {uuid} {self.memory // MIB}M",
        )


@dataclass(frozen=True)
class MpsDaemon:
    """A daemon the plugin started or adopted for claim ``claim_uid`` on GPU ``uuid``."""

    claim_uid: str
    uuid: str
    paths: MpsPaths
    limits: MpsLimits
    adopted: bool = False


def container_pipe_dir(uuid: str) -> str:
    """Where a client container sees its claim's pipe directory of GPU ``uuid``."""
    return f"{CONTAINER_MPS_ROOT}/{uuid}/pipe"


def control_env(paths: MpsPaths) -> dict[str, str]:
    """Environment of a control command (``get_server_list``, ``quit``) to the daemon."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe), "CUDA_MPS_LOG_DIRECTORY": str(paths.log)}


class MpsManager:
    """Starts, adopts, restarts and stops the per-claim MPS control daemons. Callers serialise
    calls for one GPU (the enforcer holds that GPU's lock); the table of owned daemons is
    thread-safe."""

    def __init__(
        self,
        runner: Runner,
        root: str | Path,
        launcher: DaemonLauncher,
        *,
        shm: ShmMounter | None = None,
        shm_bytes: int = DEFAULT_SHM_BYTES,
        start_timeout: float = START_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.runner = runner
        self.root = Path(root)
        self.launcher = launcher
        self.shm = shm or PlainDirectory()
        self.shm_bytes = shm_bytes
        self.start_timeout = start_timeout
        self._sleep = sleep
        self._daemons: dict[str, MpsDaemon] = {}
        self._lock = threading.Lock()

    # --- paths and environment ---

    def paths(self, claim_uid: str, uuid: str) -> MpsPaths:
        return MpsPaths.of(self.root, claim_uid, uuid)

    def spec(self, claim_uid: str, uuid: str, limits: MpsLimits) -> DaemonSpec:
        """The daemon's spec; its environment carries the limits as the daemon's defaults."""
        paths = self.paths(claim_uid, uuid)
        env = {
            "CUDA_VISIBLE_DEVICES": uuid,
            **control_env(paths),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(limits.cores),
            DEFAULTS_ENV: "".join(c + "\n" for c in limits.default_commands(uuid)),
        }
        return DaemonSpec(paths, env, uuid=uuid, claim_uid=claim_uid)

    # --- lifecycle ---

    def running(self) -> dict[str, MpsDaemon]:
        """Daemons currently owned, by daemon id."""
        with self._lock:
            return dict(self._daemons)

    def ensure_running(self, claim_uid: str, uuid: str, limits: MpsLimits) -> MpsDaemon:
        """Claim ``claim_uid``'s daemon on ``uuid``: owned and alive, adopted, restarted or
        started now with ``limits``. Raises one of :data:`MPS_ERRORS`."""
        spec = self.spec(claim_uid, uuid, limits)
        check_socket_paths(spec.paths.pipe, container_pipe_dir(uuid))
        with self._lock:
            known = self._daemons.get(spec.id)
        if known is not None and known.limits == limits and self._is_alive(spec):
            return known
        if known is None and self._is_alive(spec):
            daemon = MpsDaemon(claim_uid, uuid, spec.paths, limits, adopted=True)
            log.info(
                "adopted the running MPS control daemon of claim %s on GPU %s (%s)",
                claim_uid,
                uuid,
                self.launcher.describe(spec),
            )
        else:
            if known is not None:
                # A client that cannot reach its daemon runs without MPS, i.e. without limits.
                log.warning(
                    "the MPS control daemon of claim %s on GPU %s is dead; starting it again",
                    claim_uid,
                    uuid,
                )
            daemon = self._start(spec, limits)
        with self._lock:
            self._daemons[spec.id] = daemon
        return daemon

    def _start(self, spec: DaemonSpec, limits: MpsLimits) -> MpsDaemon:
        mode = query_compute_mode(self.runner, spec.uuid)
        if mode != DEFAULT_COMPUTE_MODE:
            raise ComputeModeError(
                f"GPU {spec.uuid} is in compute mode {mode}; MPS shares need {DEFAULT_COMPUTE_MODE}"
                f", where each claim's MPS server runs beside the others' (sharegpu does not "
                f"change it for MPS: nvidia-smi -i {spec.uuid} -c {DEFAULT_COMPUTE_MODE})"
            )
        if self.launcher.phase(spec) is not DaemonPhase.ABSENT:
            self.launcher.remove(spec)  # dead, or not answering: never two daemons for a claim
        paths = spec.paths
        # Stale sockets and shared memory of a dead daemon go; the directories stay, because
        # running containers hold bind mounts of them and must see the new daemon's files.
        for directory, mode_bits in ((paths.pipe, 0o755), (paths.shm, 0o1777), (paths.log, 0o755)):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(mode_bits)
        self.shm.mount(paths.shm, self.shm_bytes)
        try:
            _clear_directory(paths.pipe)
            _clear_directory(paths.shm)
            self.launcher.launch(spec)
            self._wait_until_answering(spec)
            self._set_default_limits(spec, limits)
        except (CommandError, DaemonError, OSError):
            self._remove_quietly(spec)
            raise
        log.info(
            "started the MPS control daemon of claim %s on GPU %s (%d%% of the SMs, %d MiB)",
            spec.claim_uid,
            spec.uuid,
            limits.cores,
            limits.memory // MIB,
        )
        return MpsDaemon(spec.claim_uid, spec.uuid, paths, limits)

    def _set_default_limits(self, spec: DaemonSpec, limits: MpsLimits) -> None:
        """``set_default_*`` on the new daemon, before any server exists, then the thread
        percentage read back (a refused command exits 0). Raises CommandError."""
        env = control_env(spec.paths)
        for command in limits.default_commands(spec.uuid):
            self.runner.run(MPS_CONTROL, [], env=env, stdin=command + "\n")
        answer = self.runner.run(
            MPS_CONTROL, [], env=env, stdin="get_default_active_thread_percentage\n"
        )
        try:
            current: float | None = float(answer.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            current = None
        if current != float(limits.cores):
            raise CommandError(
                answer.argv,
                f"the default active thread percentage is {answer.stdout.strip()!r} after "
                f"setting {limits.cores}: the daemon refused it",
            )

    def stop(self, daemon_id: str) -> None:
        """Quit and remove daemon ``daemon_id`` (owned or found), unmount its shm and remove its
        directory. Raises CommandError, DaemonError or OSError; the daemon then stays owned so a
        later stop can retry."""
        spec = DaemonSpec(MpsPaths(self.root, daemon_id))
        with self._lock:
            daemon = self._daemons.get(daemon_id)
        if daemon is not None:
            spec = DaemonSpec(spec.paths, uuid=daemon.uuid, claim_uid=daemon.claim_uid)
        # ``quit`` lets the daemon end its servers cleanly; a daemon that is dead already
        # does not answer, and removing it is enough.
        if spec.paths.pipe.is_dir():
            self.runner.run(
                MPS_CONTROL, [], env=control_env(spec.paths), stdin="quit\n", check=False
            )
        self.launcher.remove(spec)
        if spec.paths.shm.is_dir():
            self.shm.unmount(spec.paths.shm)
        shutil.rmtree(spec.paths.directory, ignore_errors=True)
        with self._lock:
            self._daemons.pop(daemon_id, None)
        log.info("stopped the MPS control daemon %s (%s)", daemon_id, self.launcher.describe(spec))

    def leftovers(self, needed: Collection[str]) -> list[str]:
        """Ids of daemons with a directory or a launcher record that are not in ``needed``
        (the daemon ids of prepared claims); other names under the root are logged and ignored."""
        found: set[str] = set()
        with contextlib.suppress(OSError):
            for entry in self.root.iterdir():
                if is_daemon_id(entry.name) and entry.is_dir() and not entry.is_symlink():
                    found.add(entry.name)
                else:
                    log.warning("ignoring %s: not an MPS daemon directory", entry)
        try:
            found |= {i for i in self.launcher.present() if is_daemon_id(i)}
        except DaemonError as exc:
            log.error("cannot list the MPS daemons of this node: %s", exc)
        return sorted(found - set(needed))

    def _is_alive(self, spec: DaemonSpec) -> bool:
        if self.launcher.phase(spec) is not DaemonPhase.RUNNING:
            return False
        return self._answers(spec)

    def _answers(self, spec: DaemonSpec) -> bool:
        answer = self.runner.run(
            MPS_CONTROL, [], env=control_env(spec.paths), stdin="get_server_list\n", check=False
        )
        return answer.returncode == 0

    def _wait_until_answering(self, spec: DaemonSpec) -> None:
        """Poll until the launched daemon runs and answers, first after 0.05 s, then doubling up
        to :data:`MAX_START_POLL_S`; DaemonError when it failed or after the start timeout."""
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        what = f"the MPS control daemon of claim {spec.claim_uid} on GPU {spec.uuid}"
        while True:
            phase = self.launcher.phase(spec)
            if phase is DaemonPhase.FAILED:
                raise DaemonError(
                    f"{what} failed to start (see {self.launcher.describe(spec)} and "
                    f"{spec.paths.log})"
                )
            if phase is DaemonPhase.RUNNING and self._answers(spec):
                return
            if time.monotonic() + delay > deadline:
                raise DaemonError(
                    f"{what} did not answer within {self.start_timeout:g}s of starting "
                    f"({self.launcher.describe(spec)} is {phase.value})"
                )
            self._sleep(delay)
            delay = min(delay * 2, MAX_START_POLL_S)

    def _remove_quietly(self, spec: DaemonSpec) -> None:
        """Undo a failed start: the daemon and the shm mount go (the directories stay for a
        retry; a leftover scan finds them)."""
        try:
            self.launcher.remove(spec)
        except DaemonError as exc:
            log.warning("could not remove the failed MPS daemon %s: %s", spec.id, exc)
        try:
            self.shm.unmount(spec.paths.shm)
        except OSError as exc:
            log.warning("could not unmount the shm of MPS daemon %s: %s", spec.id, exc)

    # --- checkpoint (informational: restore derives daemons from the prepared claims) ---

    def export_state(self) -> dict[str, Any]:
        """``{daemon id: {"claim", "gpu", "daemon"}}`` for every owned daemon."""
        with self._lock:
            daemons = sorted(self._daemons.items())
        return {
            daemon_id: {
                "claim": d.claim_uid,
                "gpu": d.uuid,
                "daemon": self.launcher.describe(DaemonSpec(d.paths)),
            }
            for daemon_id, d in daemons
        }

    # --- per-share container edits ---

    def container_edits(
        self, claim_uid: str, uuid: str, active_thread_percentage: int, pinned_memory_bytes: int
    ) -> ContainerEdits:
        """Edits attaching a container to its claim's daemon on ``uuid`` with the given limits."""
        return share_edits(
            self.paths(claim_uid, uuid), uuid, active_thread_percentage, pinned_memory_bytes
        )


def share_edits(
    paths: MpsPaths, uuid: str, active_thread_percentage: int, pinned_memory_bytes: int
) -> ContainerEdits:
    """Mounts of the daemon's pipe and shm directories and the MPS client variables of one share.

    - the pipe directory at :func:`container_pipe_dir`, read-only, with ``control_privileged``
      (the socket of ``quit`` and the ``set_*`` commands) covered by ``/dev/null``;
    - the daemon's shm directory at ``/dev/shm``, where the MPS client library and the daemon
      exchange shared memory;
    - never the log directory, and no ``CUDA_MPS_LOG_DIRECTORY``;
    - the pinned memory limit in whole MiB, rounded down (never above the share), keyed by the
      GPU's UUID (NVIDIA's ``<device>=<limit>`` format).
    """
    pipe = container_pipe_dir(uuid)
    readonly = ("rbind", "ro", "nosuid", "nodev", "noexec")
    masked = ("bind", "ro", "nosuid", "nodev", "noexec")
    limits = MpsLimits(active_thread_percentage, pinned_memory_bytes)
    return ContainerEdits(
        env=(
            f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={active_thread_percentage}",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limits.pinned_limit(uuid)}",
        ),
        mounts=(
            Mount(str(paths.pipe), pipe, options=readonly),
            Mount("/dev/null", f"{pipe}/{PRIVILEGED_SOCKET}", options=masked),
            Mount(
                str(paths.shm), CONTAINER_SHM, options=("rbind", "rw", "nosuid", "nodev", "noexec")
            ),
        ),
    )


def _clear_directory(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
