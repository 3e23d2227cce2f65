"""A GPU's compute mode as ``nvidia-smi`` prints and takes it.

``nvidia-smi --query-gpu=compute_mode`` prints ``Default``, ``Exclusive_Process``, ...;
``nvidia-smi -c`` takes ``DEFAULT``, ``EXCLUSIVE_PROCESS``, ...: the plugin always holds the
second spelling. Time-slicing needs ``DEFAULT`` (it sets it and restores the previous mode);
MPS needs ``DEFAULT`` too (each claim's MPS server runs beside the others') and never changes it.
"""

from __future__ import annotations

from typing import Final

from kubeletplugin.runner import NVIDIA_SMI, CommandError, Runner

EXCLUSIVE_PROCESS: Final = "EXCLUSIVE_PROCESS"
DEFAULT_COMPUTE_MODE: Final = "DEFAULT"
#: Compute modes ``nvidia-smi -c`` accepts, by the names ``--query-gpu=compute_mode`` prints.
COMPUTE_MODES: Final = {
    "default": "DEFAULT",
    "exclusive_process": "EXCLUSIVE_PROCESS",
    "exclusive_thread": "EXCLUSIVE_THREAD",
    "prohibited": "PROHIBITED",
}


def compute_mode_argument(reported: str) -> str:
    """``nvidia-smi -c`` spelling of a mode as ``--query-gpu=compute_mode`` prints it
    (``Exclusive_Process`` -> ``EXCLUSIVE_PROCESS``); raises ValueError for unknown text."""
    key = reported.strip().lower().replace(" ", "_")
    if key not in COMPUTE_MODES:
        raise ValueError(f"unknown compute mode {reported.strip()!r}")
    return COMPUTE_MODES[key]


def query_compute_mode(runner: Runner, uuid: str) -> str:
    """The GPU's compute mode in ``nvidia-smi -c`` spelling; CommandError for odd output."""
    result = runner.run(
        NVIDIA_SMI, ["-i", uuid, "--query-gpu=compute_mode", "--format=csv,noheader"]
    )
    try:
        return compute_mode_argument(result.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        raise CommandError(result.argv, f"unexpected output {result.stdout.strip()!r}") from None
