"""Whether this machine can run the real-GPU test, and why not.

:func:`skip_reason` is None only when the process is root, ``pynvml`` starts NVML (a driver and
at least one NVIDIA GPU) and the commands the test runs are installed.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
from collections.abc import Callable
from types import ModuleType
from typing import Final

COMMANDS: Final = ("nvidia-smi", "nvidia-cuda-mps-control", "unshare")


def _load_pynvml() -> ModuleType:
    return importlib.import_module("pynvml")


def skip_reason(
    euid: Callable[[], int] = os.geteuid,
    nvml: Callable[[], ModuleType] = _load_pynvml,
    which: Callable[[str], str | None] = shutil.which,
) -> str | None:
    """Why the real-GPU test cannot run here (None: it can)."""
    try:
        module = nvml()
        module.nvmlInit()
    except Exception as exc:
        return f"no NVIDIA GPU here (libnvidia-ml / nvmlInit: {exc})"
    try:
        if int(module.nvmlDeviceGetCount()) == 0:
            return "no NVIDIA GPU here (NVML reports none)"
    finally:
        with contextlib.suppress(Exception):
            module.nvmlShutdown()
    if euid() != 0:
        return "the real-GPU test needs root (mount namespaces, MPS daemon, compute mode)"
    missing = [c for c in COMMANDS if which(c) is None]
    if missing:
        return f"commands missing: {', '.join(missing)}"
    return None
