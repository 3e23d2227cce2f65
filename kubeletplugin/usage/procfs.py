"""From a host process to its pod: the pod UID in ``/proc/<pid>/cgroup``.

Why the cgroup: kubelet puts every container of a pod under a cgroup named after the pod's UID
(``.../kubepods/burstable/pod<uid>/<container>`` with the cgroupfs driver,
``.../kubepods-burstable-pod<uid with _>.slice/...`` with the systemd driver), and a process in
the container cannot move itself out of it. ``/proc/<pid>/cgroup`` is readable by every user
(no ptrace access is needed, unlike ``/proc/<pid>/environ``), small, and set by the node, not by
the workload. It needs the host's ``/proc``: the chart runs the plugin in the host PID
namespace (without it NVML lists no process of another PID namespace), where ``/proc`` is the
host's; ``--usage-proc-root`` names another mount of it.

Bounded and never raising: at most :data:`MAX_CGROUP_BYTES` are read, undecodable bytes are
replaced, and a process that is gone or unreadable gives a :class:`PodLookup` with a reason.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kubeletplugin.fsutil import read_bounded

#: A cgroup file larger than this is not a kubelet-made one; only this much is read.
MAX_CGROUP_BYTES: Final = 16 * 1024

#: ``pod`` then a UUID (dashes, or underscores under the systemd driver) or the 32 hex digits
#: static pods have, ending the path element.
_POD_UID: Final = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"
    r"(?:\.slice)?(?=/|$)",
    re.MULTILINE,
)

#: A pod UID as kubelet writes it (lower case; dashed, or 32 hex digits for static pods).
_POD_UID_TEXT: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}"
)

#: The inode of the initial (host) PID namespace (``PROC_PID_INIT_INO`` of the kernel).
INITIAL_PID_NAMESPACE: Final = "pid:[4026531836]"

REASON_GONE: Final = "process exited"
REASON_UNREADABLE: Final = "cgroup unreadable"
REASON_NOT_A_POD: Final = "not in a pod's cgroup"


@dataclass(frozen=True, slots=True)
class PodLookup:
    """The pod UID of a process (dashed, lower case), or None and ``reason``."""

    pod_uid: str | None
    reason: str = ""


def is_pod_uid(text: str) -> bool:
    """Whether ``text`` is a pod UID as :func:`pod_uid_of_cgroup` gives them."""
    return _POD_UID_TEXT.fullmatch(text) is not None


def pod_uid_of_cgroup(text: str) -> str | None:
    """The pod UID in the contents of a cgroup file, None when it names no pod (the last pod
    element wins: nested runtimes put the pod's cgroup below the node's)."""
    found = _POD_UID.findall(text)
    if not found:
        return None
    return str(found[-1]).replace("_", "-")


def pod_of_process(proc_root: Path, pid: int) -> PodLookup:
    """The pod of host process ``pid`` under ``proc_root`` (the host's ``/proc``)."""
    if pid <= 0:
        return PodLookup(None, f"invalid pid {pid}")
    try:
        raw = read_bounded(proc_root / str(pid) / "cgroup", MAX_CGROUP_BYTES)
    except FileNotFoundError:
        return PodLookup(None, REASON_GONE)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return PodLookup(None, REASON_GONE)
        return PodLookup(None, f"{REASON_UNREADABLE}: {exc.strerror or type(exc).__name__}")
    uid = pod_uid_of_cgroup(raw.decode("utf-8", errors="replace"))
    return PodLookup(uid) if uid is not None else PodLookup(None, REASON_NOT_A_POD)


def pid_namespace_problem(own_proc: Path = Path("/proc")) -> str | None:
    """Why NVML would miss the node's processes from here, or None: NVML lists only the
    processes of the caller's PID namespace (and those below it), so the sampler must run in the
    initial one (the chart's ``hostPID``). None as well when the namespace cannot be read."""
    try:
        own = os.readlink(own_proc / "self" / "ns" / "pid")
    except OSError:
        return None
    if own == INITIAL_PID_NAMESPACE:
        return None
    return (
        f"the plugin runs in PID namespace {own}, not the host's: NVML lists no process of "
        "another PID namespace, so measured usage misses the workloads (run it with hostPID)"
    )
