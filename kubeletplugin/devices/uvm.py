"""The CUDA unified-memory device nodes (``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``).

Every CUDA program needs them (``cuInit`` fails without), but the driver does not create them
when it loads: they exist once the ``nvidia-uvm`` kernel module is loaded and something (udev
rules, ``nvidia-modprobe -u -c=0``, usually run by the first CUDA program on the host) created
the node files, ``nvidia-uvm`` with minor 0 and ``nvidia-uvm-tools`` with minor 1 of the major
that ``/proc/devices`` lists as ``nvidia-uvm``.

The plugin cannot load a kernel module: its image has neither ``modprobe`` nor the host's
``/lib/modules``, so ``nvidia-modprobe -u`` fails there unless the module is loaded already, and
then all it would do is create the two node files from the ``/proc/devices`` major in the host's
``/dev``. The plugin gives containers the same nodes without writing to the host:

- at prepare (:func:`uvm_device_nodes`), a UVM node present under the device root goes into the
  claim's spec as the host's node, as the GPU nodes do; an absent one goes in as a character
  device by its numbers (major from ``/proc/devices``, the minor above, mode ``0666`` as the
  driver's tools create it), which the runtime creates in the container whatever the host has;
- at start (:func:`check_uvm`), absent nodes without the module loaded (no ``nvidia-uvm`` in
  ``/proc/devices``) is reported as the host prerequisite it is, in one warning line.

Invariants: never raises for an expected condition (an unreadable or garbled ``/proc/devices``,
a module that is not loaded): a node that cannot be named is left out with one warning line,
and the plugin carries on (such a container fails in ``cuInit``, as it would on the host).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from kubeletplugin.containeredits import DeviceNode
from kubeletplugin.devices.procdevices import ProcDevices, ProcDevicesError

log = logging.getLogger(__name__)

#: Node name below the device root -> its minor of the ``nvidia-uvm`` major.
UVM_DEVICE_NODES: Final = (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1))
#: The ``/proc/devices`` name of the UVM nodes' major.
UVM_DEVICE_NAME: Final = "nvidia-uvm"
#: Mode ``nvidia-modprobe`` and the driver's udev rules give the UVM nodes.
UVM_FILE_MODE: Final = 0o666
#: What an administrator runs on the host to load the module and create the nodes.
HOST_COMMAND: Final = "nvidia-modprobe -u -c=0"


def missing_uvm_nodes(dev_root: Path) -> list[Path]:
    """The UVM device nodes absent under ``dev_root``."""
    return [dev_root / name for name, _ in UVM_DEVICE_NODES if not (dev_root / name).exists()]


def uvm_device_nodes(dev_root: Path, devices: ProcDevices) -> tuple[DeviceNode, ...]:
    """The UVM nodes of a claim's spec: the host's node where ``dev_root`` has it, else the
    node by its numbers; a node that has neither is left out with a warning."""
    nodes: list[DeviceNode] = []
    major: int | None = None
    for name, minor in UVM_DEVICE_NODES:
        host = dev_root / name
        if host.exists():
            nodes.append(DeviceNode(path=f"/dev/{name}", host_path=str(host)))
            continue
        if major is None:
            try:
                major = devices.char_major(UVM_DEVICE_NAME)
            except ProcDevicesError as exc:
                log.warning(
                    "device node %s is absent on the host and cannot be named: %s", host, exc
                )
                continue
        nodes.append(DeviceNode.char(f"/dev/{name}", major, minor, UVM_FILE_MODE))
    return tuple(nodes)


def check_uvm(dev_root: Path, devices: ProcDevices) -> bool:
    """Report at start whether claims can get the UVM nodes: True when the host has both nodes
    or the module is loaded (claims then get the nodes by their numbers; one info line). Else
    one warning line naming the host prerequisite, and False."""
    missing = missing_uvm_nodes(dev_root)
    if not missing:
        log.debug("UVM device nodes present under %s", dev_root)
        return True
    try:
        major = devices.char_major(UVM_DEVICE_NAME)
    except ProcDevicesError as exc:
        log.warning(
            "the CUDA unified-memory module is not usable on this node, so CUDA workloads fail "
            "in cuInit: load it on the host (%s, or modprobe nvidia-uvm at boot); the plugin "
            "cannot load a kernel module. %s",
            HOST_COMMAND,
            exc,
        )
        return False
    log.info(
        "%s absent on the host; claims get them by their numbers (major %d of nvidia-uvm)",
        ", ".join(str(p) for p in missing),
        major,
    )
    return True
