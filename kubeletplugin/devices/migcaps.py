"""The capability device nodes that give a container access to one MIG device: besides
``/dev/nvidia<minor>``, ``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU instance
(``gpu<minor>/gi<G>/access``) and of its compute instance (``gpu<minor>/gi<G>/ci<C>/access``),
minors from ``/proc/driver/nvidia-caps/mig-minors``, major from ``/proc/devices``.

Invariants (the file is host input): the nodes go in by their numbers
(:meth:`MigCaps.device_nodes`), never as copies of host nodes (the host creates them only on
demand); the file is read whole in one bounded read (:data:`MAX_FILE_BYTES`, never truncated),
as ASCII, every non-empty line ``<name> <minor>`` (lowercase ``/``-separated segments, a 20-bit
decimal minor) or the whole file is refused naming the file and the line; a capability listed
twice with different minors fails its lookup. docs/sharing.md shows the file of a real node."""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kubeletplugin.containeredits import MAX_DEVICE_MINOR, DeviceNode
from kubeletplugin.devices.procdevices import DEFAULT_PROC_ROOT, ProcDevices
from kubeletplugin.fsutil import HostFileError, read_host_text

#: The file below the proc root.
MIG_MINORS_FILE: Final = Path("driver") / "nvidia-caps" / "mig-minors"
#: Directory of the capability device nodes below the device root.
CAPS_DIR: Final = "nvidia-caps"
#: The ``/proc/devices`` name of the capability nodes' major.
CAPS_DEVICE_NAME: Final = "nvidia-caps"
#: Mode the driver gives MIG access capability nodes (``DeviceFileMode: 292`` in their
#: ``/proc/driver/nvidia/capabilities/.../access`` files): readable by everyone, which is all a
#: process needs to prove the capability.
CAP_FILE_MODE: Final = 0o444
#: More than any driver writes (8 GI + 64 CI entries per GPU, 32 GPUs, about 30 bytes a line).
MAX_FILE_BYTES: Final = 1024 * 1024

_LINE_RE: Final = re.compile(r"([a-z][a-z0-9_-]{0,31}(?:/[a-z][a-z0-9_-]{0,31}){0,7}) ([0-9]{1,7})")
_ACCESS_RE: Final = re.compile(r"gpu([0-9]{1,4})/gi([0-9]{1,4})(?:/ci([0-9]{1,4}))?/access")

#: (GPU minor, GPU instance, compute instance or None for the GPU instance) -> capability minor.
CapKey = tuple[int, int, int | None]


class MigCapsError(HostFileError):
    """The capability nodes of a MIG device cannot be named; the message names the file and
    the entry. An :class:`OSError`, so prepare reports it as the claim's I/O failure."""


@dataclass(frozen=True)
class MigMinors:
    """A parsed ``mig-minors`` file: the access capabilities and the ambiguous ones."""

    minors: Mapping[CapKey, int] = field(default_factory=dict)
    ambiguous: Set[CapKey] = frozenset()


def parse_mig_minors(text: str, where: str) -> MigMinors:
    """The access capabilities of a ``mig-minors`` text (see the module invariants);
    :class:`MigCapsError` naming ``where`` and the line for garbage."""
    found: dict[CapKey, int] = {}
    ambiguous: set[CapKey] = set()
    for number, line in enumerate(text.split("\n"), start=1):
        if not line:
            continue
        match = _LINE_RE.fullmatch(line)
        if match is None:
            raise MigCapsError(
                f"{where} line {number}: {line[:80]!r} is not a '<capability> <minor>' entry"
            )
        name, minor_text = match.groups()
        minor = int(minor_text)
        if minor > MAX_DEVICE_MINOR:
            raise MigCapsError(
                f"{where} line {number}: minor {minor} is outside 0..{MAX_DEVICE_MINOR}"
            )
        access = _ACCESS_RE.fullmatch(name)
        if access is None:
            continue
        gpu, gi, ci = access.groups()
        key: CapKey = (int(gpu), int(gi), None if ci is None else int(ci))
        if found.setdefault(key, minor) != minor:
            ambiguous.add(key)
    return MigMinors(minors=found, ambiguous=frozenset(ambiguous))


def capability_name(key: CapKey) -> str:
    """The entry of a capability in ``mig-minors``: ``gpu0/gi1/access``, ``gpu0/gi1/ci0/access``."""
    gpu, gi, ci = key
    return f"gpu{gpu}/gi{gi}" + ("" if ci is None else f"/ci{ci}") + "/access"


def cap_node_name(minor: int) -> str:
    """The capability node's path below the device root: ``nvidia-caps/nvidia-cap<minor>``."""
    return f"{CAPS_DIR}/nvidia-cap{minor}"


@dataclass(frozen=True)
class MigCaps:
    """Names the capability nodes of MIG devices from ``<proc_root>/driver/nvidia-caps/
    mig-minors`` and ``<proc_root>/devices``, read again on every lookup (MIG devices come and
    go with their admin)."""

    proc_root: Path = DEFAULT_PROC_ROOT

    @property
    def path(self) -> Path:
        return self.proc_root / MIG_MINORS_FILE

    def read(self) -> MigMinors:
        """The parsed file; :class:`MigCapsError` when it cannot be read or is garbage."""
        try:
            text = read_host_text(self.path, MAX_FILE_BYTES)
        except HostFileError as exc:
            raise MigCapsError(f"MIG capability minors: {exc}") from None
        return parse_mig_minors(text, str(self.path))

    def minors(self, gpu_minor: int, gpu_instance: int, compute_instance: int) -> tuple[int, int]:
        """(GPU instance access minor, compute instance access minor) of one MIG device;
        :class:`MigCapsError` naming the file and the entry that is missing or ambiguous."""
        table = self.read()
        result = []
        for key in ((gpu_minor, gpu_instance, None), (gpu_minor, gpu_instance, compute_instance)):
            if key in table.ambiguous:
                raise MigCapsError(
                    f"{self.path} lists {capability_name(key)} twice with different minors"
                )
            minor = table.minors.get(key)
            if minor is None:
                raise MigCapsError(f"{self.path} has no entry for {capability_name(key)}")
            result.append(minor)
        return result[0], result[1]

    def device_nodes(
        self, gpu_minor: int, gpu_instance: int, compute_instance: int
    ) -> tuple[DeviceNode, DeviceNode]:
        """The GPU instance's and the compute instance's access capability nodes of one MIG
        device, as character devices by their numbers (``/dev/nvidia-caps/nvidia-cap<N>``,
        major of ``nvidia-caps``, mode :data:`CAP_FILE_MODE`). :class:`MigCapsError` naming the
        file and the entry when either number cannot be found."""
        gi_minor, ci_minor = self.minors(gpu_minor, gpu_instance, compute_instance)
        devices = ProcDevices(self.proc_root)
        try:
            major = devices.char_major(CAPS_DEVICE_NAME)
        except HostFileError as exc:
            raise MigCapsError(f"MIG capability nodes: {exc}") from None
        gi_node, ci_node = (
            DeviceNode.char(f"/dev/{cap_node_name(minor)}", major, minor, CAP_FILE_MODE)
            for minor in (gi_minor, ci_minor)
        )
        return gi_node, ci_node
