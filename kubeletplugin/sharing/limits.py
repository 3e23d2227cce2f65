"""Container edits for the ``Limits`` strategy: an interception library with HAMi-core's
environment contract, preloaded into the container.

The admin installs the library on the node and gives its host path to the plugin
(``--limits-library``); the project does not ship it. Per device the container gets

- a read-only bind mount of the library at :data:`CONTAINER_LIBRARY_PATH` and ``LD_PRELOAD``;
- ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<N>m`` (MiB, rounded down, never above the share) and
  ``CUDA_DEVICE_SM_LIMIT_<i>=<percent>``, where ``<i>`` is the CUDA ordinal the container sees;
- ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that ordinal is well defined: devices are numbered by PCI
  bus ID among the GPUs the container is given, the order of its ``NVIDIA_VISIBLE_DEVICES``
  (``containeredits.visible_gpus``);
- the claim's own lock directory (``<plugin-data-dir>/limits/vgpulock/<claim-uid>``, mode 1777,
  a tmpfs of at most 4 MiB on a real node, so a tenant cannot fill the kubelet's file system
  through it) at ``/tmp/vgpulock``, where the library expects it: the processes of the claim's
  containers coordinate there; containers of other claims (other tenants) never see it. It is
  unmounted and removed when the claim is unprepared.

What it cannot do: processes that do not load the library (static binaries, a cleared
``LD_PRELOAD``) are not limited, and the library's own accounting decides what counts as memory.
"""

from __future__ import annotations

from typing import Final

from kubeletplugin.containeredits import ContainerEdits, Mount

CONTAINER_LIBRARY_PATH: Final = "/usr/local/sharegpu/lib/libsharegpu-limits.so"
CONTAINER_LOCK_DIR: Final = "/tmp/vgpulock"
MIB: Final = 1024 * 1024


def limits_edits(
    library_host_path: str,
    lock_dir_host_path: str,
    ordinal: int,
    memory_bytes: int,
    sm_percentage: int,
) -> ContainerEdits:
    """The edits enforcing ``memory_bytes`` and ``sm_percentage`` on CUDA device ``ordinal``."""
    return ContainerEdits(
        env=(
            f"LD_PRELOAD={CONTAINER_LIBRARY_PATH}",
            "CUDA_DEVICE_ORDER=PCI_BUS_ID",
            f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}={memory_bytes // MIB}m",
            f"CUDA_DEVICE_SM_LIMIT_{ordinal}={sm_percentage}",
        ),
        mounts=(
            Mount(
                library_host_path,
                CONTAINER_LIBRARY_PATH,
                options=("ro", "nosuid", "nodev", "bind"),
            ),
            Mount(
                lock_dir_host_path,
                CONTAINER_LOCK_DIR,
                options=("rw", "nosuid", "nodev", "bind"),
            ),
        ),
    )
