"""Creates and destroys MIG instances of real GPUs through NVML (dynamic MIG).

:class:`NvmlMigPartitioner` implements :class:`~kubeletplugin.devices.migpartition.MigPartitioner`
over the pynvml module of an :class:`~kubeletplugin.devices.nvml.NvmlBackend`, and describes the
MIG devices it creates with the backend's own MIG device reader, so a created MIG device is the
same record discovery gives.

Invariants (beyond the protocol's):
- every operation runs in its own NVML session (NVML counts sessions, so it may overlap the
  health monitor's or another operation's);
- create and destroy on one GPU are serialized by a per-GPU lock (concurrent prepares call
  them); operations on different GPUs run in parallel. :meth:`instances` takes the same lock, so
  it never sees a half-created instance made by this process;
- an NVML failure becomes one :class:`~kubeletplugin.devices.migpartition.MigError` line naming
  the GPU (index and UUID), the profile and placement or instance, and NVML's error; a create
  that fails after its GPU instance exists destroys it (compute instances first) before raising;
- every count NVML returns is bounded (:data:`~kubeletplugin.devices.nvml.MAX_NVML_COUNT`)
  before an array is allocated or a loop runs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import Any, Final

from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.migpartition import MigError
from kubeletplugin.devices.nvml import (
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_ERROR_IN_USE,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlBackend,
    bounded_count,
    mig_profile_name,
    nvml_error_code,
)
from kubeletplugin.model import GpuInfo, MigInfo, MigPlacement, MigProfile

log = logging.getLogger(__name__)

MIB: Final = 1024**2

#: ``NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED``.
ENGINE_PROFILE_SHARED: Final = 0

#: Return codes that mean "no such profile on this GPU" when enumerating profiles.
_SKIP_PROFILE: Final = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT})


def _where(parent: GpuInfo) -> str:
    return f"GPU {parent.index} ({parent.uuid})"


def _at(profile: MigProfile, placement: MigPlacement) -> str:
    return f"profile {profile.name} (id {profile.profile_id}) at {placement.start}:{placement.size}"


class NvmlMigPartitioner:
    """Dynamic MIG on real GPUs (see the module docstring). ``backend`` gives the pynvml module
    (imported on first use), NVML sessions and the MIG device reader."""

    def __init__(self, backend: NvmlBackend) -> None:
        self._backend = backend
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # --- plumbing ---------------------------------------------------------------------

    def _lock(self, parent: GpuInfo) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(parent.uuid, threading.Lock())

    @contextmanager
    def _session(self, parent: GpuInfo, what: str) -> Iterator[tuple[ModuleType, Any]]:
        """Lock ``parent``, open an NVML session and yield (module, parent handle); a failure
        to start NVML or find the GPU is a MigError naming ``what``."""
        with self._lock(parent), ExitStack() as stack:
            try:
                nvml = stack.enter_context(self._backend.session())
            except DiscoveryError as exc:
                raise MigError(f"{_where(parent)}: cannot {what}: {exc}") from None
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(parent.uuid)
            except self._error() as exc:
                raise MigError(
                    f"{_where(parent)}: cannot {what}: NVML cannot find the GPU: {exc}"
                ) from None
            yield nvml, handle

    def _error(self) -> type[BaseException]:
        return self._backend.nvml_error()

    def _fn(self, nvml: ModuleType, name: str) -> Any:
        fn = getattr(nvml, name, None)
        if fn is None:
            raise MigError(f"NVML function {name} is missing (pynvml or driver too old)")
        return fn

    # --- create -----------------------------------------------------------------------

    def create(self, parent: GpuInfo, profile: MigProfile, placement: MigPlacement) -> GpuInfo:
        """Create a GPU instance of ``profile`` at ``placement`` and a compute instance filling
        it; return its MIG device. Raises MigError; nothing is left behind then."""
        what = f"create {_at(profile, placement)}"
        with self._session(parent, what) as (nvml, handle):
            place = self._fn(nvml, "c_nvmlGpuInstancePlacement_t")()
            place.start, place.size = placement.start, placement.size
            try:
                gi = self._fn(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement")(
                    handle, profile.profile_id, ctypes.byref(place)
                )
            except self._error() as exc:
                raise MigError(f"{_where(parent)}: cannot {what}: {exc}") from None
            try:
                return self._fill(nvml, parent, handle, gi, profile, placement)
            except Exception as exc:
                if not isinstance(exc, MigError | self._error()):
                    self._rollback(nvml, gi, parent, what)
                    raise
                left = self._rollback(nvml, gi, parent, what)
                raise MigError(f"{_where(parent)}: cannot {what}: {exc}{left}") from None

    def _fill(
        self,
        nvml: ModuleType,
        parent: GpuInfo,
        handle: Any,
        gi: Any,
        profile: MigProfile,
        placement: MigPlacement,
    ) -> GpuInfo:
        """Create the compute instance filling ``gi`` and read its MIG device."""
        ci_info = self._fn(nvml, "nvmlGpuInstanceGetComputeInstanceProfileInfo")(
            gi, profile.compute_profile, ENGINE_PROFILE_SHARED
        )
        if int(ci_info.sliceCount) != profile.slice_count:
            raise MigError(
                f"compute instance profile {profile.compute_profile} has {ci_info.sliceCount} "
                f"slices, not the GPU instance's {profile.slice_count}"
            )
        ci = self._fn(nvml, "nvmlGpuInstanceCreateComputeInstance")(gi, int(ci_info.id))
        gi_id = int(self._fn(nvml, "nvmlGpuInstanceGetInfo")(gi).id)
        ci_id = int(self._fn(nvml, "nvmlComputeInstanceGetInfo")(ci).id)
        device = self._mig_device(nvml, parent, handle, gi_id, ci_id)
        if device is None or device.mig is None:
            raise MigError(
                f"the MIG device of GPU instance {gi_id} compute instance {ci_id} does not appear"
            )
        mig = dataclasses.replace(
            device.mig, placement=placement, profile_id=profile.profile_id, profile=profile.name
        )
        return dataclasses.replace(device, mig=mig)

    def _rollback(self, nvml: ModuleType, gi: Any, parent: GpuInfo, what: str) -> str:
        """Destroy the half-created ``gi``; "" when done, else a suffix for the error line."""
        try:
            self._destroy_gpu_instance(nvml, gi)
        except (MigError, self._error()) as exc:
            log.warning(
                "%s: %s: destroying the new GPU instance failed: %s", _where(parent), what, exc
            )
            return f"; destroying the new GPU instance again failed ({exc}): it is left behind"
        return ""

    def _mig_device(
        self, nvml: ModuleType, parent: GpuInfo, handle: Any, gi_id: int, ci_id: int
    ) -> GpuInfo | None:
        """The MIG device of (``gi_id``, ``ci_id``) on ``parent``, found among the MIG device
        slots; None when no slot holds it."""
        slots = bounded_count(
            "MIG device slots", self._fn(nvml, "nvmlDeviceGetMaxMigDeviceCount")(handle)
        )
        get = self._fn(nvml, "nvmlDeviceGetMigDeviceHandleByIndex")
        for slot in range(slots):
            try:
                mig_handle = get(handle, slot)
            except self._error() as exc:
                if nvml_error_code(exc) in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            if int(nvml.nvmlDeviceGetGpuInstanceId(mig_handle)) != gi_id:
                continue
            if int(nvml.nvmlDeviceGetComputeInstanceId(mig_handle)) != ci_id:
                continue
            try:
                return self._backend.mig_device(parent, slot, mig_handle, handle)
            except (DiscoveryError, ValueError) as exc:
                raise MigError(f"NVML cannot describe MIG device {slot}: {exc}") from None
        return None

    # --- destroy ----------------------------------------------------------------------

    def destroy(self, parent: GpuInfo, gpu_instance: int) -> bool:
        """Destroy GPU instance ``gpu_instance`` and its compute instances; False when it does
        not exist. Raises MigError (IN_USE: processes still use it)."""
        what = f"destroy GPU instance {gpu_instance}"
        with self._session(parent, what) as (nvml, handle):
            try:
                gi = self._fn(nvml, "nvmlDeviceGetGpuInstanceById")(handle, gpu_instance)
            except self._error() as exc:
                if nvml_error_code(exc) in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    return False
                raise MigError(f"{_where(parent)}: cannot {what}: {exc}") from None
            try:
                self._destroy_gpu_instance(nvml, gi)
            except (MigError, self._error()) as exc:
                raise MigError(f"{_where(parent)}: cannot {what}: {exc}") from None
            return True

    def _destroy_gpu_instance(self, nvml: ModuleType, gi: Any) -> None:
        """Destroy every compute instance of ``gi``, then ``gi``; MigError for IN_USE, NVMLError
        otherwise."""
        for ci in self._compute_instances(nvml, gi):
            try:
                self._fn(nvml, "nvmlComputeInstanceDestroy")(ci)
            except self._error() as exc:
                code = nvml_error_code(exc)
                if code == NVML_ERROR_NOT_FOUND:
                    continue
                if code == NVML_ERROR_IN_USE:
                    raise MigError(f"processes still use its compute instance ({exc})") from None
                raise
        try:
            self._fn(nvml, "nvmlGpuInstanceDestroy")(gi)
        except self._error() as exc:
            if nvml_error_code(exc) == NVML_ERROR_IN_USE:
                raise MigError(f"processes still use it ({exc})") from None
            raise

    def _compute_instances(self, nvml: ModuleType, gi: Any) -> list[Any]:
        """Every compute instance of ``gi``, of every compute instance profile."""
        count = bounded_count(
            "compute instance profile indexes",
            getattr(
                nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", NVML_COMPUTE_INSTANCE_PROFILE_COUNT
            ),
        )
        info_fn = self._fn(nvml, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        list_fn = self._fn(nvml, "nvmlGpuInstanceGetComputeInstances")
        array_type = self._fn(nvml, "c_nvmlComputeInstance_t")
        found: list[Any] = []
        seen: set[int] = set()
        for index in range(count):
            try:
                info = info_fn(gi, index, ENGINE_PROFILE_SHARED)
            except self._error() as exc:
                if nvml_error_code(exc) in _SKIP_PROFILE:
                    continue
                raise
            profile_id = int(info.id)
            if profile_id in seen:
                continue
            seen.add(profile_id)
            found.extend(self._listed(list_fn, array_type, gi, profile_id, info.instanceCount))
        return found

    @staticmethod
    def _listed(fn: Any, array_type: Any, owner: Any, profile_id: int, capacity: Any) -> list[Any]:
        """The handles ``fn(owner, profile_id, array, &count)`` lists, in an array sized by the
        profile's instance count (what nvml.h asks for)."""
        size = max(1, bounded_count(f"instances of profile {profile_id}", capacity))
        array = (array_type * size)()
        count = ctypes.c_uint(size)
        fn(owner, profile_id, array, ctypes.byref(count))
        filled = bounded_count(f"instances of profile {profile_id}", count.value, size)
        return [array[i] for i in range(filled)]

    # --- instances --------------------------------------------------------------------

    def instances(self, parent: GpuInfo) -> tuple[GpuInfo, ...]:
        """Every GPU instance on ``parent`` (created by anyone), ordered by GPU instance id;
        each its first compute instance's MIG device (named by its GPU instance profile, as
        :meth:`create` names it, when that compute instance fills the GPU instance). A GPU
        instance without a compute
        instance, or whose MIG device NVML cannot describe, is described from its profile with
        ``compute_instance`` -1 (or the compute instance's id) and the UUID empty."""
        with self._session(parent, "list MIG instances") as (nvml, handle):
            try:
                found = self._list_instances(nvml, parent, handle)
            except self._error() as exc:
                raise MigError(f"{_where(parent)}: cannot list MIG instances: {exc}") from None
            except ValueError as exc:
                raise MigError(f"{_where(parent)}: cannot list MIG instances: {exc}") from None
        return tuple(sorted(found, key=lambda d: d.mig.gpu_instance if d.mig else -1))

    def _list_instances(self, nvml: ModuleType, parent: GpuInfo, handle: Any) -> list[GpuInfo]:
        list_fn = self._fn(nvml, "nvmlDeviceGetGpuInstances")
        array_type = self._fn(nvml, "c_nvmlGpuInstance_t")
        found: list[GpuInfo] = []
        for index, info in self._backend.gpu_instance_profile_infos(handle):
            profile_id = int(info.id)
            for gi in self._listed(list_fn, array_type, handle, profile_id, info.instanceCount):
                found.append(self._describe(nvml, parent, handle, gi, index, info))
        return found

    def _describe(
        self, nvml: ModuleType, parent: GpuInfo, handle: Any, gi: Any, index: int, info: Any
    ) -> GpuInfo:
        """The record of one GPU instance (see :meth:`instances`)."""
        gi_info = self._fn(nvml, "nvmlGpuInstanceGetInfo")(gi)
        gi_id = int(gi_info.id)
        placement = MigPlacement(int(gi_info.placement.start), int(gi_info.placement.size))
        slices = int(info.sliceCount)
        memory_mb = int(info.memorySizeMB)
        name = mig_profile_name(
            getattr(info, "name", b""), index, slices, parent.memory_total, memory_mb
        )
        ci_ids = sorted(
            int(self._fn(nvml, "nvmlComputeInstanceGetInfo")(ci).id)
            for ci in self._compute_instances(nvml, gi)
        )
        if ci_ids:
            try:
                device = self._mig_device(nvml, parent, handle, gi_id, ci_ids[0])
            except MigError as exc:
                log.warning("%s: GPU instance %d: %s", _where(parent), gi_id, exc)
                device = None
            if device is not None and device.mig is not None:
                mig = dataclasses.replace(device.mig, placement=placement, profile_id=int(info.id))
                if mig.compute_slices == mig.gpu_slices:
                    mig = dataclasses.replace(mig, profile=name)
                return dataclasses.replace(device, mig=mig)
        return parent.mig_device(
            "",
            memory_mb * MIB,
            MigInfo(
                parent_uuid=parent.uuid,
                gpu_instance=gi_id,
                compute_instance=ci_ids[0] if ci_ids else -1,
                profile=name,
                multiprocessors=max(1, int(info.multiprocessorCount)),
                gpu_slices=slices,
                compute_slices=0,
                placement=placement,
                profile_id=int(info.id),
            ),
        )
