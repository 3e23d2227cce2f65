"""The seam that creates and destroys MIG instances (dynamic MIG), and its error.

Implementations: :class:`kubeletplugin.devices.nvmlmig.NvmlMigPartitioner` (real GPUs, through
NVML) and :class:`kubeletplugin.devices.mockmig.MockMigPartitioner` (the mock backend; its
instances live in a file so that they survive a kill -9 of the daemon, like a real GPU's).

A created MIG instance is described as a :class:`~kubeletplugin.model.GpuInfo` with ``mig`` set
(its UUID, memory, GPU and compute instance ids, placement and profile id), the same record a
discovered MIG device has, so CDI and enforcement treat created and existing MIG devices alike.

Invariants every implementation keeps:
- :meth:`MigPartitioner.create` makes one GPU instance of ``profile`` at exactly ``placement``
  and one compute instance of ``profile.compute_profile`` filling it; on any failure after the
  GPU instance exists it destroys it again before raising, so a failed create leaves nothing;
- :meth:`MigPartitioner.destroy` destroys every compute instance of the GPU instance, then the
  GPU instance; a GPU instance that does not exist is not an error (returns False);
- :meth:`MigPartitioner.instances` lists every GPU instance of the GPU (created by anyone), one
  record per GPU instance (its first compute instance's MIG device; ``compute_instance`` -1 and
  the UUID empty for a GPU instance without a compute instance).
"""

from __future__ import annotations

from typing import Protocol

from kubeletplugin.model import GpuInfo, MigPlacement, MigProfile


class MigError(Exception):
    """An expected failure to create, destroy or list MIG instances (NVML error, placement in
    use, MIG mode off). The message is one line naming the GPU, the profile or instance and the
    cause."""


class MigPartitioner(Protocol):
    """Creates, destroys and lists the MIG instances of physical GPUs (see the module
    docstring for the invariants)."""

    def instances(self, parent: GpuInfo) -> tuple[GpuInfo, ...]:
        """Every GPU instance on ``parent``, ordered by GPU instance id; raises MigError."""
        ...

    def create(self, parent: GpuInfo, profile: MigProfile, placement: MigPlacement) -> GpuInfo:
        """Create a GPU instance of ``profile`` at ``placement`` with one compute instance
        filling it; return its MIG device. Raises MigError (nothing is left behind)."""
        ...

    def destroy(self, parent: GpuInfo, gpu_instance: int) -> bool:
        """Destroy GPU instance ``gpu_instance`` of ``parent`` and its compute instances;
        False when it did not exist. Raises MigError."""
        ...
