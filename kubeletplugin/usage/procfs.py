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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


#: Stand-ins for the elements of the reader's own ancestry that a ``..`` path hides.
_ANY_KUBEPODS: Final = "\0kubepods"
_ANY_QOS: Final = "\0qos"
_OWN: Final = "\0own"
#: Where systemd puts itself (PID 1's cgroup); its parent is the kubelet's view of the root.
_INIT_SCOPE: Final = "init.scope"


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the kubelet's pods live, as this reader sees ``/proc/<pid>/cgroup``.

    ``root``: the kubelet's ``--cgroup-root`` (``cgroupRoot``) elements, cgroupfs notation
    (``()`` for ``/``). ``bases``: per hierarchy id, PID 1's cgroup directory as read (its
    leading ``..`` count, then its elements; systemd's ``init.scope`` dropped), the top the
    kubelet's root is relative to; a hierarchy without one is read as ``(0, ())``. Invariant: a
    path names a pod only when its pod element sits directly under ``<base>/<root>/kubepods``
    (or a QoS class of it), so a process outside every pod that owns a delegated subtree
    elsewhere cannot name one.
    """

    root: tuple[str, ...] = ()
    bases: Mapping[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)

    def base(self, hierarchy: str) -> tuple[int, tuple[str, ...]]:
        return self.bases.get(hierarchy, (0, ()))


#: The layout of a reader in the host's cgroup namespace, kubelet's default cgroup root.
DEFAULT_LAYOUT: Final = CgroupLayout()


def cgroup_root_elements(text: str) -> tuple[str, ...]:
    """The elements of a kubelet ``--cgroup-root`` (``/``, ``/kubelet``); ValueError naming the
    problem for a relative path or one with ``.`` or ``..`` elements."""
    if not text.startswith("/"):
        raise ValueError(f"{text!r} must be an absolute cgroup path such as / or /kubelet")
    elements = tuple(e for e in text.split("/") if e)
    if any(e in (".", "..") for e in elements):
        raise ValueError(f"{text!r} must not have . or .. elements")
    return elements


def _split(path: str) -> tuple[int, list[str]]:
    """(leading ``..`` count, the remaining elements) of a cgroup path as read."""
    elements = [e for e in path.split("/") if e]
    ups = 0
    while ups < len(elements) and elements[ups] == _HIDDEN:
        ups += 1
    return ups, elements[ups:]


def _driver_names(root: tuple[str, ...], systemd: bool) -> tuple[list[str], str]:
    """(the root's elements, the kubepods element) under one cgroup driver: systemd names a
    slice after its ancestors (``/a/b`` is ``a.slice/a-b.slice``, kubepods ``a-b-kubepods``)."""
    if not systemd:
        return list(root), "kubepods"
    slices = ["-".join(root[: i + 1]) + ".slice" for i in range(len(root))]
    return slices, "-".join((*root, "kubepods")) + ".slice"


def _layout_pod(full: Sequence[str], root_names: list[str], kubepods: str) -> str | None:
    """The pod UID of ``full`` (elements from the kubelet's base) when its first element
    below ``<root>/kubepods[/<qos>]`` is a pod element of that driver's layout, else None."""
    r = len(root_names)
    if (
        len(full) <= r + 1
        or list(full[:r]) != root_names
        or full[r] not in (kubepods, _ANY_KUBEPODS)
    ):
        return None
    rest = list(full[r + 1 :])
    systemd = kubepods.endswith(".slice")
    stem = kubepods.removesuffix(".slice")
    qos_names = {f"{stem}-{q}.slice" if systemd else q: q for q in _QOS_CLASSES}
    parents = {stem}
    if rest[0] == _ANY_QOS:
        parents = {f"{stem}-{q}" for q in _QOS_CLASSES}
        rest = rest[1:]
    elif rest[0] in qos_names:
        parents = {f"{stem}-{qos_names[rest[0]]}"}
        rest = rest[1:]
    if not rest:
        return None
    if not systemd:
        m = _CGROUPFS_POD.fullmatch(rest[0])
        return m.group("uid") if m is not None else None
    m = _SYSTEMD_POD.fullmatch(rest[0])
    if m is None or m.group("parent") not in parents:
        return None
    return m.group("uid").replace("_", "-")


def pod_uid_of_path(
    path: str, layout: CgroupLayout = DEFAULT_LAYOUT, hierarchy: str = "0"
) -> str | None:
    """The pod UID of one cgroup path laid out as kubelet makes it, else None.

    The kubelet's layout is ``<root>/kubepods[/<qos>]/pod<uid>/<container>`` (cgroupfs driver)
    or ``<root slices>/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid>.slice/
    <container>.scope`` (systemd driver; with a cgroup root its name as the prefix), below the
    base of ``layout`` (:class:`CgroupLayout`). The pod element must sit exactly there: a
    ``kubepods`` anywhere else is a subtree someone else made (a process outside every pod that
    owns a delegated subtree), and everything below the pod element is the container's own,
    which may create children named as it likes (another pod's name included). A path read
    through the reader's cgroup namespace starts with ``..`` elements: it is resolved against
    the base when it climbs as far, else against the reader's own ancestry, which is itself a
    container of the kubelet's (``<root>/kubepods[/<qos>]/pod<uid>/<container>``).
    """
    ups, elements = _split(path)
    base_ups, base_elements = layout.base(hierarchy)
    for systemd in (False, True):
        root_names, kubepods = _driver_names(layout.root, systemd)
        if base_ups == 0:
            if ups:
                continue
            if elements[: len(base_elements)] != list(base_elements):
                continue
            full = elements[len(base_elements) :]
        elif base_elements:
            continue  # PID 1 is not above the reader: its base cannot be resolved
        elif ups == base_ups:
            full = elements
        elif ups < base_ups:
            # The reader's container: <root>/kubepods[/<qos>]/pod<own>/<container>.
            qos = base_ups - len(root_names) - 3
            if qos not in (0, 1):
                continue
            own = [*root_names, _ANY_KUBEPODS, *[_ANY_QOS] * qos, _OWN, _OWN]
            full = own[: base_ups - ups] + elements
        else:
            continue
        uid = _layout_pod(full, root_names, kubepods)
        if uid is not None:
            return uid
    return None


def pod_uid_of_cgroup(text: str, layout: CgroupLayout = DEFAULT_LAYOUT) -> str | None:
    """The pod UID in the contents of a cgroup file (``<id>:<controllers>:<path>`` per line;
    cgroup v2 has one line, v1 one per hierarchy), None when no line names a pod or two lines
    name different pods (:func:`pod_uid_of_path` per line)."""
    found: set[str] = set()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (uid := pod_uid_of_path(parts[2], layout, parts[0])) is not None:
            found.add(uid)
    return found.pop() if len(found) == 1 else None


def kubelet_layout(proc_root: Path, cgroup_root: tuple[str, ...]) -> CgroupLayout:
    """The :class:`CgroupLayout` of a reader of ``proc_root`` (the host's ``/proc``, where PID 1
    is the node's init) and the kubelet's ``cgroup_root`` elements. An unreadable PID 1 gives no
    bases: paths are then read as the host's cgroup namespace shows them."""
    try:
        raw = read_bounded(proc_root / "1" / "cgroup", MAX_CGROUP_BYTES)
    except OSError:
        return CgroupLayout(cgroup_root)
    bases: dict[str, tuple[int, tuple[str, ...]]] = {}
    for line in raw.decode("utf-8", errors="replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ups, elements = _split(parts[2])
        if elements and elements[-1] == _INIT_SCOPE:
            elements = elements[:-1]
        bases[parts[0]] = (ups, tuple(elements))
    return CgroupLayout(cgroup_root, bases)


def pod_of_process(proc_root: Path, pid: int, layout: CgroupLayout = DEFAULT_LAYOUT) -> PodLookup:
    """The pod of host process ``pid`` under ``proc_root`` (the host's ``/proc``), its cgroup
    read by ``layout`` (:func:`kubelet_layout`)."""
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
    uid = pod_uid_of_cgroup(raw.decode("utf-8", errors="replace"), layout)
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
