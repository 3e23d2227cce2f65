"""CDI container edits (device nodes, mounts, hooks, environment) and which GPUs a container
given some devices of a claim sees. Pure values: rendering a spec file is
:mod:`kubeletplugin.prepare.cdi`'s job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kubeletplugin.model import GpuInfo, base_request_names

# --- Container edits ---------------------------------------------------------------------------


#: Largest major and minor number of a Linux device (12 and 20 bits).
MAX_DEVICE_MAJOR: Final = (1 << 12) - 1
MAX_DEVICE_MINOR: Final = (1 << 20) - 1


@dataclass(frozen=True)
class DeviceNode:
    """A device node to create in the container; ``host_path`` defaults to ``path``.

    A node given by its numbers (:meth:`char`: ``type`` ``c``, ``major``, ``minor``,
    ``file_mode``) is created by the runtime from them, whether or not the host has such a node
    file; one given by ``host_path`` alone takes its numbers and mode from the host's node."""

    path: str
    host_path: str | None = None
    #: cgroup access the container gets: a subset of ``rwm`` (runtime default ``rwm``).
    permissions: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    #: Permission bits of the node the runtime creates (CDI ``fileMode``).
    file_mode: int | None = None

    @classmethod
    def char(
        cls, path: str, major: int, minor: int, file_mode: int, permissions: str = "rw"
    ) -> DeviceNode:
        """A character device by its numbers. ValueError for a major outside 1..4095 (CDI
        takes 0 for "unknown" and would look the node up on the host), a minor outside the
        20-bit range or a mode with bits beyond ``0o777``."""
        if not 1 <= major <= MAX_DEVICE_MAJOR:
            raise ValueError(f"device major {major} of {path} is outside 1..{MAX_DEVICE_MAJOR}")
        if not 0 <= minor <= MAX_DEVICE_MINOR:
            raise ValueError(f"device minor {minor} of {path} is outside 0..{MAX_DEVICE_MINOR}")
        if not 0 <= file_mode <= 0o777:
            raise ValueError(f"file mode {file_mode:o} of {path} is not a permission mode")
        return cls(
            path=path,
            permissions=permissions,
            type="c",
            major=major,
            minor=minor,
            file_mode=file_mode,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path is not None:
            out["hostPath"] = self.host_path
        if self.type is not None:
            out["type"] = self.type
        if self.major is not None:
            out["major"] = self.major
        if self.minor is not None:
            out["minor"] = self.minor
        if self.file_mode is not None:
            out["fileMode"] = self.file_mode
        if self.permissions is not None:
            out["permissions"] = self.permissions
        return out


@dataclass(frozen=True)
class Mount:
    """A bind mount (``type`` unset) or a typed mount into the container."""

    host_path: str
    container_path: str
    type: str | None = None
    options: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.type is not None:
            out["type"] = self.type
        if self.options:
            out["options"] = list(self.options)
        return out


@dataclass(frozen=True)
class Hook:
    """An OCI hook (``hook_name`` one of prestart, createRuntime, ... poststop)."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


@dataclass(frozen=True)
class ContainerEdits:
    """CDI container edits of one device (the subset of the CDI spec this project uses)."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        """These edits followed by ``other``'s (an ``env`` entry of ``other`` replaces one of
        these with the same variable name)."""
        other_keys = {e.split("=", 1)[0] for e in other.env}
        env = tuple(e for e in self.env if e.split("=", 1)[0] not in other_keys) + other.env
        return ContainerEdits(
            env=env,
            device_nodes=self.device_nodes + other.device_nodes,
            mounts=self.mounts + other.mounts,
            hooks=self.hooks + other.hooks,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [d.to_json() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_json() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_json() for h in self.hooks]
        return out


# --- Which devices a container gets together ---------------------------------------------------


def cuda_order(gpus: Iterable[GpuInfo]) -> tuple[GpuInfo, ...]:
    """The distinct ``gpus`` in the order CUDA numbers them under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    (by PCI bus ID, then NVML index; NVML itself numbers GPUs by PCI bus ID, so this is NVML index
    order on a real node): the ``i``-th GPU is CUDA device ``i`` in a container given exactly
    these GPUs. MIG devices of one GPU follow their parent's place, by (GPU instance, compute
    instance)."""
    by_uuid = {g.uuid: g for g in gpus}
    return tuple(sorted(by_uuid.values(), key=_cuda_key))


def _cuda_key(gpu: GpuInfo) -> tuple[str, int, int, int]:
    mig = gpu.mig
    instance = (-1, -1) if mig is None else (mig.gpu_instance, mig.compute_instance)
    return (gpu.pci_bus_id.lower(), gpu.index, *instance)


def given_together(requests_of_devices: Sequence[Iterable[str]]) -> list[tuple[int, ...]]:
    """For each device of a claim (given by the requests it serves, ``req`` or ``req/sub``): the
    positions of the devices that every container given this device also gets, itself included.

    kubelet gives a container every device of each request it names, so a device that serves
    the base requests ``R`` comes with every device whose requests include all of ``R``: for a
    device of one request, exactly the devices of that request.
    """
    bases = [frozenset(base_request_names(r)) for r in requests_of_devices]
    return [tuple(j for j, other in enumerate(bases) if mine <= other) for mine in bases]


def visible_gpus(
    requests_of_devices: Sequence[Iterable[str]], gpus: Sequence[GpuInfo]
) -> list[tuple[GpuInfo, ...]]:
    """For each device (its requests and its GPU, by position): the GPUs a container given it
    sees, in :func:`cuda_order` (its ``NVIDIA_VISIBLE_DEVICES``; a GPU's position is its CUDA
    ordinal there)."""
    if len(requests_of_devices) != len(gpus):
        raise ValueError("visible_gpus needs one GPU per device")
    return [
        cuda_order(gpus[j] for j in together) for together in given_together(requests_of_devices)
    ]
