"""The CUDA unified-memory device nodes (``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``).

The NVIDIA driver creates ``/dev/nvidia<N>`` and ``/dev/nvidiactl`` when it loads, but the UVM
nodes only appear once something loads the ``nvidia-uvm`` module and creates them (usually the
first CUDA program on the host, through ``nvidia-modprobe``). Claim specs list the nodes that exist
when a claim is prepared, so on a freshly booted node the first workloads would run without UVM
and fail in ``cuInit``. :func:`ensure_uvm_device_nodes` runs ``nvidia-modprobe -u -c=0`` (load
``nvidia-uvm``, create its nodes for minor 0) once at start.

Invariants:
- idempotent: nothing is run when both nodes already exist under ``dev_root``; running it again
  after they were created changes nothing;
- the binary is taken from the driver root through the plugin's
  :class:`~kubeletplugin.runner.Runner` (never from ``PATH``);
- never raises for an expected failure: a missing binary, a failing run or nodes that are still
  absent afterwards give exactly one warning line, and the plugin carries on (claims then get
  the nodes that exist, as before).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from kubeletplugin.runner import CommandError, Runner

log = logging.getLogger(__name__)

NVIDIA_MODPROBE: Final = "nvidia-modprobe"
#: ``-u``: load nvidia-uvm and create its device nodes; ``-c=0``: for minor number 0.
MODPROBE_UVM_ARGS: Final = ("-u", "-c=0")
UVM_DEVICE_NODES: Final = ("nvidia-uvm", "nvidia-uvm-tools")
#: Seconds nvidia-modprobe may take (loading a kernel module is quick).
MODPROBE_TIMEOUT_S: Final = 30.0


def missing_uvm_nodes(dev_root: Path) -> list[Path]:
    """The UVM device nodes absent under ``dev_root``."""
    return [dev_root / name for name in UVM_DEVICE_NODES if not (dev_root / name).exists()]


def ensure_uvm_device_nodes(runner: Runner, dev_root: Path) -> bool:
    """Create the UVM device nodes if absent; True when both exist afterwards.

    ``dev_root`` is the host's ``/dev`` as the plugin sees it (``--dev-root``); nvidia-modprobe
    creates the nodes in the ``/dev`` of the plugin's mount namespace, so the two must be the same
    directory for the nodes to appear (the warning says so otherwise).
    """
    if not missing_uvm_nodes(dev_root):
        log.debug("UVM device nodes present under %s", dev_root)
        return True
    try:
        runner.run(NVIDIA_MODPROBE, MODPROBE_UVM_ARGS, timeout=MODPROBE_TIMEOUT_S)
    except CommandError as exc:
        log.warning(
            "cannot create the UVM device nodes (CUDA workloads may fail until a CUDA program "
            "runs on the host): %s",
            exc,
        )
        return False
    still_missing = missing_uvm_nodes(dev_root)
    if still_missing:
        log.warning(
            "%s ran but %s still absent (is --dev-root the /dev the plugin runs in?)",
            " ".join((NVIDIA_MODPROBE, *MODPROBE_UVM_ARGS)),
            ", ".join(str(p) for p in still_missing),
        )
        return False
    log.info("created the UVM device nodes under %s", dev_root)
    return True
