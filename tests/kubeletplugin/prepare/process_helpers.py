"""The real plugin process for the crash tests: started, killed with SIGKILL before a call or at
a chosen step of it (kill points by event: :mod:`tests.kubeletplugin.prepare.crashpoints`) and
restarted, a kubelet that retries every call it lost, the choice of kill points from a seed, and
the node check after each step."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.checkpoint import checksum_of
from sharegpuctl.local.kubelet import KubeletSim, RegisteredPlugin
from tests.helpers import eventually
from tests.kubeletplugin.prepare.checkpoint_files import read_document
from tests.kubeletplugin.prepare.crashpoints import ARM_FILE, TRACE_FILE
from tests.kubeletplugin.prepare.helpers import DRIVER, NODE, assert_valid_cdi
from tests.paths import REPO_ROOT

GPUS = 4
#: The kill point before kubelet sends the call (the call is certainly lost).
BEFORE_CALL: Final = ("before the call", 0)
#: A kill point within a call: just before the k-th step of a name (a step of
#: :mod:`~tests.kubeletplugin.prepare.crashpoints`, such as ``replace:cdi/.tmp``).
Target = tuple[str, int]
#: The environment variable that replaces a crash test's seed (to replay a failure, or to try
#: others).
SEED_ENV: Final = "SHAREGPU_CRASH_SEED"


def crash_seed(default: int) -> int:
    """The seed of a crash test: ``$SHAREGPU_CRASH_SEED`` when set, else ``default``."""
    return int(os.environ.get(SEED_ENV) or default)


class ForkServer:
    """The :mod:`~tests.kubeletplugin.prepare.crashpoints` fork server of one test's root."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kubeletplugin.prepare.crashpoints", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer and not answer.startswith("error"), f"fork server: {line!r} -> {answer!r}"
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Forked:
    """A child of the fork server, handled like a ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            answer = self.server.ask(f"poll {self.pid}")
            if answer != "running":
                self.returncode = int(answer)
        return self.returncode

    def wait(self, timeout: float) -> int:
        """The exit status, once the child ended (it is dead or a zombie when a SIGKILL to it
        returned); TimeoutExpired after ``timeout`` seconds (a safety net)."""
        end = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"plugin {self.pid}", timeout)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)  # an unreaped child keeps its pid: never another process

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


@dataclass
class PluginProcess:
    """The node daemon with the mock backend, forked by a
    :mod:`~tests.kubeletplugin.prepare.crashpoints` server (so it can be armed to kill itself
    at a step), restartable, killable with SIGKILL. :meth:`close` ends the server."""

    root: Path
    kubeconfig: Path
    #: Further daemon flags (e.g. the sharing mode).
    extra_args: tuple[str, ...] = ()
    #: ``--mock-gpus``.
    gpus: int = GPUS
    proc: Forked | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)
    server: ForkServer | None = None
    #: Inode and change time of the registration socket a killed daemon left behind.
    stale_socket: tuple[int, int] | None = None

    @property
    def registry(self) -> Path:
        return self.root / "reg"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def start(self) -> None:
        self.starts += 1
        log = self.root / f"plugin-{self.starts}.log"
        self.logs.append(log)
        flags = [
            "--device-backend=mock",
            f"--mock-gpus={self.gpus}",
            f"--node-name={NODE}",
            f"--kubeconfig={self.kubeconfig}",
            f"--plugin-registry-dir={self.registry}",
            f"--plugin-data-dir={self.data_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--mock-boot-id-file={self.root / 'boot_id'}",
            f"--nvidia-cdi-dirs={self.root / 'no-toolkit'}",
            "--disable-health",
            *self.extra_args,
        ]
        if self.server is None:
            self.server = ForkServer(self.root)
        try:
            found = self.registration_socket.stat()
            self.stale_socket = (found.st_ino, found.st_ctime_ns)
        except FileNotFoundError:
            self.stale_socket = None
        pid = int(self.server.ask(f"start {log} {json.dumps(flags)}"))
        self.proc = Forked(self.server, pid)

    @property
    def registration_socket(self) -> Path:
        return self.registry / f"{DRIVER}-reg.sock"

    def arm(self, generation: int, target: Target | None) -> None:
        """Trace the running process's next steps as ``generation`` (new for each arming) and,
        with a ``target``, make it kill itself just before that step."""
        step, occurrence = target or ("-", 0)
        tmp = self.root / f".{ARM_FILE}.tmp"
        tmp.write_text(f"{generation} {step} {occurrence}\n")
        os.replace(tmp, self.root / ARM_FILE)

    def disarm(self) -> None:
        (self.root / ARM_FILE).unlink(missing_ok=True)

    def steps(self, generation: int) -> list[Target]:
        """The steps taken while ``generation`` was armed, each with its count so far."""
        prefix = f"{generation} "
        counts: dict[str, int] = {}
        out: list[Target] = []
        for line in (self.root / TRACE_FILE).read_text().splitlines():
            if line.startswith(prefix):
                name = line.split()[1]
                counts[name] = counts.get(name, 0) + 1
                out.append((name, counts[name]))
        return out

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        """Stop the daemon and end the fork server."""
        self.stop()
        if self.server is not None:
            self.server.close()
            self.server = None

    def register(self, sim: KubeletSim) -> RegisteredPlugin:
        """Wait until the plugin answers registration (as kubelet's watcher would)."""
        errors: list[Exception] = []

        def answered() -> RegisteredPlugin | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                tail = self.logs[-1].read_text()[-3000:]
                raise AssertionError(f"plugin exited with {self.proc.returncode}:\n{tail}")
            try:
                found = self.registration_socket.stat()
                if (found.st_ino, found.st_ctime_ns) == self.stale_socket:
                    return None  # not replaced yet: connecting now would only back off
            except FileNotFoundError:
                return None
            try:
                return sim.register(DRIVER, timeout=2)
            except Exception as exc:
                errors.append(exc)
                return None

        return eventually(
            answered,
            lambda: f"registration (last error: {errors[-1] if errors else None!r})",
            timeout_s=60,
        )


@dataclass(frozen=True, order=True)
class KillPoint:
    """A place a kill can land: a kind of call (``"prepare share"``) and the step of the call it
    comes before (:data:`BEFORE_CALL`, or the k-th step of a name)."""

    call: str
    target: Target

    def __str__(self) -> str:
        step, occurrence = self.target
        return f"{self.call}: before {step}" + (f" #{occurrence}" if occurrence > 1 else "")


@dataclass
class CrashingKubelet:
    """Kubelet's side of the kill -9 loops: one call at a time, the plugin killed before a call
    or at a chosen step of it, and every call retried (restarting a killed plugin) until it
    gets an answer, as kubelet retries. Every first attempt of a call is traced, so the kill
    points its kind of call offers are known (:meth:`uncovered`)."""

    plugin: PluginProcess
    sim: KubeletSim
    kplugin: RegisteredPlugin
    kills: int = 0
    lost_calls: int = 0
    generation: int = 0
    #: Every kill made, where it landed.
    killed_at: list[KillPoint] = field(default_factory=list)
    #: The steps of the calls that ran unkilled and succeeded, by kind of call (a refused call
    #: is killed at a step only where a successful one makes it too).
    offers: dict[str, set[Target]] = field(default_factory=dict)

    def call(self, op: str, r: ClaimRef, kill_at: Target | None, kind: str = "") -> tuple[str, Any]:
        """One kubelet call; ``kill_at`` :data:`BEFORE_CALL` kills the plugin before it, a step
        makes the plugin kill itself just before that step (a call that makes no such step is
        answered). ``kind`` names the call in the kill points ("" for a retry: not traced)."""
        label = f"{op} {kind}"
        if kill_at == BEFORE_CALL:
            self.plugin.kill()
            self.killed_at.append(KillPoint(label, BEFORE_CALL))
            kill_at = None
        self.generation += 1
        self.plugin.arm(self.generation, kill_at)
        answer: tuple[str, Any]
        try:
            if op == "prepare":
                answer = "done", self.kplugin.prepare([r])[r.uid].error
            else:
                answer = "done", self.kplugin.unprepare([r])[r.uid]
        except grpc.RpcError as exc:
            answer = "lost", exc
        finally:
            self.plugin.disarm()
        if kind:
            self._record(label, kill_at, answer == ("done", ""))
        return answer

    def _record(self, label: str, kill_at: Target | None, succeeded: bool) -> None:
        steps = self.plugin.steps(self.generation)
        if kill_at is not None and kill_at in steps:
            # The armed step was reached: the process killed itself just before it.
            assert self.plugin.proc is not None
            self.plugin.proc.wait(timeout=30)
            self.killed_at.append(KillPoint(label, kill_at))
        elif succeeded:
            self.offers.setdefault(label, set()).update(steps)

    def answered(self, op: str, r: ClaimRef, kill_at: Target | None, kind: str = "call") -> Any:
        """The answer to ``op`` of ``r`` (the prepare error, or the unprepare outcome), after
        as many retries and restarts as it takes."""
        proc = self.plugin
        outcome, value = self.call(op, r, kill_at, kind)
        self.lost_calls += outcome == "lost"
        while outcome == "lost" or (proc.proc is not None and proc.proc.poll() is not None):
            if proc.proc is not None and proc.proc.poll() is not None:
                self.kills += 1
                self.kplugin.close()
                proc.start()
                self.kplugin = proc.register(self.sim)
            if outcome == "lost":
                outcome, value = self.call(op, r, None)
        return value

    def offered(self) -> set[KillPoint]:
        """Every kill point within a call that the calls seen offer."""
        return {KillPoint(label, t) for label, targets in self.offers.items() for t in targets}

    def uncovered(self) -> set[KillPoint]:
        """The kill points offered that no kill landed on yet."""
        return self.offered() - set(self.killed_at)


@dataclass
class KillPlanner:
    """Chooses each call's kill point from a seeded generator and what is not covered yet, so
    the calls and their kill points follow from the seed alone: a share ``before_call`` of
    calls is killed before it is sent; the others are killed at the first (by name) step that
    calls of their kind were seen to make and no kill landed on yet (none while every such step
    is covered)."""

    kubelet: CrashingKubelet
    rng: random.Random
    before_call: float

    def choose(self, label: str) -> Target | None:
        if self.rng.random() < self.before_call:
            return BEFORE_CALL
        open_points = sorted(p.target for p in self.kubelet.uncovered() if p.call == label)
        return open_points[0] if open_points else None


def check_node(plugin: PluginProcess, prepared: set[str], corrupt_copies: int = 0) -> None:
    """The checkpoint loads, the spec files are exactly the prepared claims, no GPU is held
    exclusively by one claim while another claim holds it too."""
    doc = read_document(plugin.data_dir)
    assert doc["checksum"] == checksum_of(doc)
    assert len(list(plugin.data_dir.glob("checkpoint.*.corrupt-*"))) == corrupt_copies
    completed = {u for u, c in doc["claims"].items() if c["state"] == "PrepareCompleted"}
    specs = {}
    for path in plugin.cdi_dir.glob("*.json"):
        uid = path.name.removeprefix(f"k8s.{DRIVER}-claim_").removesuffix(".json")
        specs[uid] = assert_valid_cdi(path)
    assert set(specs) == prepared
    assert completed == prepared
    holders: dict[str, list[tuple[str, bool]]] = {}
    for uid, spec in specs.items():
        for dev in spec["devices"]:
            env = dict(e.split("=", 1) for e in dev["containerEdits"]["env"])
            holders.setdefault(env["SHAREGPU_GPU_UUID"], []).append(
                (uid, "SHAREGPU_SHARE_ID" not in env)
            )
    for gpu, held in holders.items():
        exclusive = [uid for uid, whole in held if whole]
        assert not exclusive or len(held) == 1, f"GPU {gpu} handed out twice: {held}"


@contextlib.contextmanager
def replay_hint(seed: int, where: Callable[[], str]) -> Iterator[None]:
    """Adds to an assertion failing inside the block the seed that replays the run exactly and
    ``where`` it stood (the operation and its kill point)."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n-- at {where()}; replay this run with {SEED_ENV}={seed}"
        ) from exc
