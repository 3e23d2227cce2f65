"""From a host process to its pod: the pod UID in ``/proc/<pid>/cgroup``.

Why the cgroup: kubelet puts every container of a pod under a cgroup named after the pod's UID
(``.../kubepods/burstable/pod<uid>/<container>`` with the cgroupfs driver,
``.../kubepods-burstable-pod<uid with _>.slice/...`` with the systemd driver), and a process in
the container cannot move itself out of it, only into children it creates below its container's
cgroup: so the pod is the first pod element of the path, directly under the kubepods
hierarchy (:func:`pod_uid_of_path`), never a deeper one a container named after another pod.
``/proc/<pid>/cgroup`` is readable by every user
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

_UUID: Final = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}"
_UUID_SYSTEMD: Final = r"[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}|[0-9a-f]{32}"
#: Anything that looks like a pod element: the first one of a path must be the real one.
_POD_LIKE: Final = re.compile(r"pod(?:[0-9a-f]{8}[-_]|[0-9a-f]{32})")
#: cgroupfs driver: ``pod<uid>`` below ``kubepods`` or ``kubepods/<qos>``.
_CGROUPFS_POD: Final = re.compile(rf"pod(?P<uid>{_UUID})")
#: systemd driver: ``<parent>-pod<uid with _>.slice`` below ``<parent>.slice``, where the parent
#: is ``[<cgroup root>-]kubepods[-<qos>]`` (systemd names a slice after its ancestors).
_SYSTEMD_POD: Final = re.compile(
    rf"(?P<parent>(?:[A-Za-z0-9_.]+-)?kubepods(?:-besteffort|-burstable)?)-pod(?P<uid>{_UUID_SYSTEMD})\.slice"
)
_QOS_CLASSES: Final = ("besteffort", "burstable")
#: Where the reader's cgroup namespace hides an ancestor, the path starts with ``..`` elements.
_HIDDEN: Final = ".."

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


def _under_kubepods(elements: list[str], k: int) -> bool:
    """Whether cgroupfs element ``k`` sits directly under the kubepods hierarchy: its parent is
    ``kubepods``, or a QoS class whose parent is; an ancestor the reader cannot see (``..``)
    stands for either."""
    parent = elements[k - 1] if k > 0 else ""
    if parent in ("kubepods", _HIDDEN):
        return True
    grandparent = elements[k - 2] if k > 1 else ""
    return parent in _QOS_CLASSES and grandparent in ("kubepods", _HIDDEN)


def pod_uid_of_path(path: str) -> str | None:
    """The pod UID of one cgroup path laid out as kubelet makes it, else None.

    The kubelet's layout is ``kubepods[/<qos>]/pod<uid>/<container>`` (cgroupfs driver) or
    ``kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid>.slice/<container>.scope``
    (systemd driver; with ``--cgroup-root`` its name as the prefix), under whatever holds the
    node. The FIRST element that looks like a pod is the pod's own: everything below it is the
    container's, which may create children named as it likes (another pod's name included). So
    that element must sit directly under the kubepods hierarchy, or the path names no pod.
    """
    elements = [e for e in path.split("/") if e]
    for k, element in enumerate(elements):
        if _POD_LIKE.search(element) is None:
            continue
        if (m := _CGROUPFS_POD.fullmatch(element)) is not None:
            return m.group("uid") if _under_kubepods(elements, k) else None
        if (m := _SYSTEMD_POD.fullmatch(element)) is not None:
            parent = elements[k - 1] if k > 0 else ""
            if parent in (f"{m.group('parent')}.slice", _HIDDEN):
                return m.group("uid").replace("_", "-")
            return None
        return None  # a pod-like element out of the layout: not attributable
    return None


def pod_uid_of_cgroup(text: str) -> str | None:
    """The pod UID in the contents of a cgroup file (``<id>:<controllers>:<path>`` per line;
    cgroup v2 has one line, v1 one per hierarchy), None when no line names a pod or two lines
    name different pods (:func:`pod_uid_of_path` per line)."""
    found: set[str] = set()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (uid := pod_uid_of_path(parts[2])) is not None:
            found.add(uid)
    return found.pop() if len(found) == 1 else None


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
