"""The device nodes that give a container access to one MIG device (NVIDIA capabilities).

Besides the parent GPU's ``/dev/nvidia<minor>``, a process needs two capability device nodes to
use a MIG device: the access capability of its GPU instance and that of its compute instance,
``/dev/nvidia-caps/nvidia-cap<N>``. The driver lists every capability's minor number ``N`` in
``/proc/driver/nvidia-caps/mig-minors``, one per line::

    gpu0/gi1/access 12
    gpu0/gi1/ci0/access 13

where ``gpu<M>`` is the parent GPU's minor number (the ``<minor>`` of ``/dev/nvidia<minor>``).

Invariants: the file is read whole but at most :data:`MAX_FILE_BYTES`; a line that is not of
this form (garbage, other capabilities, out-of-range numbers) is ignored; a capability listed
twice with different minors is ambiguous and left out, so a lookup names it as missing rather
than hand out a node that may belong to another MIG device.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

#: Where procfs lives; tests point this at a temporary directory.
DEFAULT_PROC_ROOT: Final = Path("/proc")
#: The file below the proc root.
MIG_MINORS_FILE: Final = Path("driver") / "nvidia-caps" / "mig-minors"
#: Directory of the capability device nodes below the device root.
CAPS_DIR: Final = "nvidia-caps"
#: More than any driver writes (8 GI + 64 CI entries per GPU, 32 GPUs, about 30 bytes a line).
MAX_FILE_BYTES: Final = 1024 * 1024
#: Largest minor number of a Linux device (20 bits).
MAX_MINOR: Final = (1 << 20) - 1

_LINE_RE: Final = re.compile(
    r"gpu([0-9]{1,4})/gi([0-9]{1,4})(?:/ci([0-9]{1,4}))?/access ([0-9]{1,7})"
)

#: (GPU minor, GPU instance, compute instance or None for the GPU instance) -> capability minor.
CapKey = tuple[int, int, int | None]


class MigCapsError(OSError):
    """The capability nodes of a MIG device cannot be found; the message names the device and
    the file. An :class:`OSError`, so prepare reports it as the claim's I/O failure."""


def parse_mig_minors(text: str) -> dict[CapKey, int]:
    """Every well-formed line of a ``mig-minors`` file (see the module docstring)."""
    found: dict[CapKey, int] = {}
    ambiguous: set[CapKey] = set()
    ignored = 0
    for line in text.splitlines():
        match = _LINE_RE.fullmatch(line.strip())
        if match is None:
            ignored += bool(line.strip())
            continue
        gpu, gi, ci, minor = match.groups()
        key: CapKey = (int(gpu), int(gi), None if ci is None else int(ci))
        value = int(minor)
        if value > MAX_MINOR:
            ignored += 1
            continue
        if found.get(key, value) != value:
            ambiguous.add(key)
        found[key] = value
    if ignored:
        log.debug("ignored %d lines of the MIG capability minors that are not entries", ignored)
    for key in ambiguous:
        log.warning("MIG capability %s is listed with different minors; ignoring it", key)
        del found[key]
    return found


@dataclass(frozen=True)
class MigCaps:
    """Looks up the capability nodes of MIG devices in ``<proc_root>/driver/nvidia-caps/
    mig-minors``, read again on every lookup (MIG devices come and go with their admin)."""

    proc_root: Path = DEFAULT_PROC_ROOT

    @property
    def path(self) -> Path:
        return self.proc_root / MIG_MINORS_FILE

    def read(self) -> Mapping[CapKey, int]:
        """The parsed file; :class:`MigCapsError` when it cannot be read."""
        try:
            with self.path.open("rb") as f:
                data = f.read(MAX_FILE_BYTES)
        except OSError as exc:
            raise MigCapsError(
                f"cannot read the MIG capability minors {self.path}: {exc}"
            ) from None
        return parse_mig_minors(data.decode("utf-8", errors="replace"))

    def minors(self, gpu_minor: int, gpu_instance: int, compute_instance: int) -> tuple[int, int]:
        """(GPU instance access minor, compute instance access minor) of one MIG device;
        :class:`MigCapsError` naming what is missing."""
        table = self.read()
        result = []
        for key in ((gpu_minor, gpu_instance, None), (gpu_minor, gpu_instance, compute_instance)):
            minor = table.get(key)
            if minor is None:
                what = f"gpu{key[0]}/gi{key[1]}" + ("" if key[2] is None else f"/ci{key[2]}")
                raise MigCapsError(f"{self.path} has no entry for {what}/access")
            result.append(minor)
        return result[0], result[1]


def cap_node_name(minor: int) -> str:
    """The capability node's path below the device root: ``nvidia-caps/nvidia-cap<minor>``."""
    return f"{CAPS_DIR}/nvidia-cap{minor}"
