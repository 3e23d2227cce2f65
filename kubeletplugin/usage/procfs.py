"""From a host process to its pod: the pod UID in ``/proc/<pid>/cgroup``.

Why the cgroup: kubelet puts every container of a pod under a cgroup named after the pod's UID
(``.../kubepods/burstable/pod<uid>/<container>`` with the cgroupfs driver,
``.../kubepods-burstable-pod<uid with _>.slice/...`` with the systemd driver), and a process in
the container cannot move itself out of it. ``/proc/<pid>/cgroup`` is readable by every user
(no ptrace access is needed, unlike ``/proc/<pid>/environ``), small, and set by the node, not by
the workload. It needs the host's ``/proc`` (the chart mounts it read-only at ``/host/proc``;
no host PID namespace).

Bounded and never raising: at most :data:`MAX_CGROUP_BYTES` are read, undecodable bytes are
replaced, and a process that is gone or unreadable gives a :class:`PodLookup` with a reason.
"""

from __future__ import annotations

import errno
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

REASON_GONE: Final = "process exited"
REASON_UNREADABLE: Final = "cgroup unreadable"
REASON_NOT_A_POD: Final = "not in a pod's cgroup"


@dataclass(frozen=True, slots=True)
class PodLookup:
    """The pod UID of a process (dashed, lower case), or None and ``reason``."""

    pod_uid: str | None
    reason: str = ""


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
