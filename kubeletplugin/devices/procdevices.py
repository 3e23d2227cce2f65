"""Major numbers of character devices, as the kernel lists them in ``<proc root>/devices`` (the
NVIDIA modules' ``nvidia-uvm`` and ``nvidia-caps`` get theirs at load time; the file is the same
in every mount namespace).

Invariants (the file is host input): read whole in one bounded read (:data:`MAX_FILE_BYTES`,
never truncated) as ASCII; every line is empty, a section header or ``<major> <name>`` (major
0..4095, 1..64 printable characters) under a header, else the whole file is refused naming the
file and the line; only the character section is used, and a name listed with two majors fails
its lookup."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kubeletplugin.containeredits import MAX_DEVICE_MAJOR
from kubeletplugin.fsutil import HostFileError, read_host_text

#: Where procfs lives; tests point this at a temporary directory.
DEFAULT_PROC_ROOT: Final = Path("/proc")
#: The file below the proc root.
DEVICES_FILE: Final = "devices"
#: Far above what a kernel writes (about 1 KiB: a few dozen majors of a few bytes each).
MAX_FILE_BYTES: Final = 64 * 1024

CHARACTER_SECTION: Final = "Character devices:"
BLOCK_SECTION: Final = "Block devices:"

_ENTRY_RE: Final = re.compile(r" *([0-9]{1,4}) ([!-~][ -~]{0,63})")


class ProcDevicesError(HostFileError):
    """``/proc/devices`` cannot be used or lacks a device; the message names the file and what
    is wrong or missing."""


def parse_char_majors(text: str, where: str) -> dict[str, frozenset[int]]:
    """Each character device name of a ``/proc/devices`` text and its majors (see the module
    invariants); :class:`ProcDevicesError` naming ``where`` and the line for garbage."""
    majors: dict[str, set[int]] = {}
    section: str | None = None
    seen_character = False
    for number, line in enumerate(text.split("\n"), start=1):
        if not line:
            continue
        if line in (CHARACTER_SECTION, BLOCK_SECTION):
            section = line
            seen_character |= line == CHARACTER_SECTION
            continue
        match = _ENTRY_RE.fullmatch(line)
        if match is None or section is None:
            raise ProcDevicesError(
                f"{where} line {number}: {line[:80]!r} is not a '<major> <name>' entry under "
                f"{CHARACTER_SECTION!r} or {BLOCK_SECTION!r}"
            )
        major = int(match.group(1))
        if major > MAX_DEVICE_MAJOR:
            raise ProcDevicesError(
                f"{where} line {number}: major {major} is outside 0..{MAX_DEVICE_MAJOR}"
            )
        if section == CHARACTER_SECTION:
            majors.setdefault(match.group(2), set()).add(major)
    if not seen_character:
        raise ProcDevicesError(f"{where} has no {CHARACTER_SECTION!r} section")
    return {name: frozenset(found) for name, found in majors.items()}


@dataclass(frozen=True)
class ProcDevices:
    """Looks up character device majors in ``<proc_root>/devices``, read again on every lookup
    (a module loaded after the plugin started registers its major then)."""

    proc_root: Path = DEFAULT_PROC_ROOT

    @property
    def path(self) -> Path:
        return self.proc_root / DEVICES_FILE

    def char_majors(self) -> Mapping[str, frozenset[int]]:
        """Every character device name and its majors; :class:`ProcDevicesError` when the file
        cannot be read or is not a ``/proc/devices`` file."""
        try:
            text = read_host_text(self.path, MAX_FILE_BYTES)
        except HostFileError as exc:
            raise ProcDevicesError(str(exc)) from None
        return parse_char_majors(text, str(self.path))

    def char_major(self, name: str) -> int:
        """The major of character device ``name``; :class:`ProcDevicesError` naming the file and
        ``name`` when it is not listed (its module is not loaded) or listed with two majors."""
        majors = self.char_majors().get(name, frozenset())
        if not majors:
            raise ProcDevicesError(
                f"{self.path} lists no character device {name!r} (is its kernel module loaded?)"
            )
        if len(majors) > 1:
            listed = ", ".join(str(m) for m in sorted(majors))
            raise ProcDevicesError(
                f"{self.path} lists character device {name!r} with several majors ({listed})"
            )
        return next(iter(majors))
