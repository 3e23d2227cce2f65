"""The ``GPU`` custom resource (``resource.sharegpu.dev/v1alpha1``): one object per physical GPU.

The controller's tracker owns these objects; users read them with ``kubectl get gpus``. They are
cluster-scoped and named ``<node>-gpu-<index>`` (:func:`api.names.gpu_object_name`).

Invariants kept by the tracker:

- ``spec`` describes the hardware as the node's ResourceSlices publish it and changes only when
  the slices change.
- ``status.allocated`` is the sum of ``status.allocations[].cores`` / ``.memory``;
  ``status.allocatable`` is ``capacity - allocated`` (never below zero).
- ``status.allocations`` is sorted by (claim namespace, claim name, request, device, shareID), so
  two computations from the same inputs give equal objects and no needless writes.
- Memory amounts are canonical Kubernetes quantities (:func:`api.quantity.format_quantity`).
- ``metadata.labels`` is derived from ``spec``, never stored apart: the node label
  (:data:`api.names.GPU_NODE_LABEL`) equals ``spec.node`` whenever the node name is a valid label
  value (at most 63 characters; see :func:`node_label_value`), and is absent otherwise.
- ``status.allocations[].usage`` is what the node plugin last measured for that allocation (see
  :class:`ShareUsage`); absent when nothing was measured. ``status.conditions`` holds the
  ``Overcommitted`` condition only when at least one allocation carries a measurement: True
  naming the claims whose usage exceeds what they reserved, else False; and the
  ``MPSEscaped`` condition only when at least one MPS share's usage judged escapes: True when a
  compute process runs outside MPS on the GPU, else False.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from api.names import GPU_KIND, GPU_NODE_LABEL, GROUP_VERSION, SHARING_MODES

HEALTHY: Literal["Healthy"] = "Healthy"
UNHEALTHY: Literal["Unhealthy"] = "Unhealthy"
Health = Literal["Healthy", "Unhealthy"]

#: A Kubernetes label value: empty, or at most 63 alphanumerics, ``-``, ``_`` and ``.`` that
#: begin and end with an alphanumeric.
_LABEL_VALUE: Final = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def node_label_value(node: str) -> str | None:
    """The value of the node label for ``node``, or None when ``node`` cannot be a label value.

    Node names are DNS subdomains of up to 253 characters while label values hold at most 63, so
    a GPU on a node with a longer name carries no node label (select it by ``spec.node`` instead).
    """
    return node if node and _LABEL_VALUE.fullmatch(node) else None


def _json_name(name: str) -> str:
    """camelCase JSON name of a field; a trailing ``_id`` becomes ``ID`` (``shareID``)."""
    camel = to_camel(name)
    return camel[:-2] + "ID" if camel.endswith("Id") else camel


class _Model(BaseModel):
    """Base: camelCase JSON names, unknown fields rejected, instances immutable."""

    model_config = ConfigDict(
        alias_generator=_json_name, populate_by_name=True, extra="forbid", frozen=True
    )

    def to_json_dict(self) -> dict[str, Any]:
        """The object's JSON shape (camelCase keys, unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class GpuSpec(_Model):
    """The hardware: where the GPU is and what it offers, as published in ResourceSlices."""

    node: str = Field(description="Name of the node the GPU is attached to.")
    index: int = Field(ge=0, description="NVML index of the GPU on its node.")
    uuid: str = Field(description="GPU UUID as reported by NVML.")
    model: str = Field(description="Product name, e.g. 'NVIDIA H100 80GB HBM3'.")
    memory: str = Field(description="Usable memory (quantity).")
    cores: int = Field(ge=0, description="Compute capacity in percent of the GPU's SMs (100).")
    sharing_mode: str = Field(
        description="How the node publishes the GPU: consumable, partitions or exclusive.",
        json_schema_extra={"enum": list(SHARING_MODES)},
    )
    pool: str = Field(description="ResourceSlice pool that publishes the GPU.")
    devices: list[str] = Field(
        default_factory=list, description="Names of the DRA devices backed by this GPU."
    )


class Resources(_Model):
    """An amount of compute and memory."""

    cores: int = Field(ge=0, description="Percent of the GPU's SMs.")
    memory: str = Field(description="Memory (quantity).")


class ShareUsage(_Model):
    """What one allocation's processes used at the node plugin's last sample.

    The same shape is the ``data`` of the claim's ``status.devices[]`` entry the plugin writes
    (with ``apiVersion`` and ``kind`` :data:`SHARE_USAGE_KIND` added there) and the ``usage`` of
    the allocation in the GPU object. ``smUtilization`` is absent where the GPU does not report
    per-process utilisation (never reported as zero). Both daemons build and read this shape
    with the codec of :mod:`api.shareusage` (a test keeps the two in agreement).
    """

    used_memory: str = Field(description="GPU memory the share's processes use (quantity).")
    sm_utilization: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Percent of the GPU's SMs the share's processes used over the last "
        "sample interval; absent where the GPU does not report it.",
    )
    processes: int = Field(ge=0, description="Compute processes of the share on the GPU.")
    sampled_at: str | None = Field(
        default=None, description="When the sample was taken (RFC 3339, UTC)."
    )
    overcommitted: list[Literal["memory", "compute"]] = Field(
        default_factory=list,
        description="What the share uses beyond its reservation: memory, compute.",
    )
    processes_outside_mps: int | None = Field(
        default=None,
        ge=0,
        alias="processesOutsideMPS",
        description="MPS shares: compute processes on the share's GPU that run outside MPS "
        "(whoever runs them; each gets the whole GPU); absent where this was not judged.",
    )
    escaped_pods: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="MPS shares: UIDs of the share's own pods that run a compute process "
        "outside MPS.",
    )


class GpuCondition(_Model):
    """A condition of the GPU object (type Overcommitted or MPSEscaped)."""

    type: str
    status: Literal["True", "False"]
    reason: str
    message: str = ""


class PodRef(_Model):
    """A pod that uses a claim, and which of its containers reference the claim."""

    name: str
    uid: str = ""
    containers: list[str] = Field(default_factory=list)


class Allocation(_Model):
    """One allocation result of a claim on this GPU (a whole GPU, a partition or a share)."""

    claim_namespace: str
    claim_name: str
    claim_uid: str
    request: str = Field(description="Request name of the result (with '/<sub>' if any).")
    device: str = Field(description="The DRA device allocated.")
    share_id: str | None = Field(default=None, description="Consumable-capacity share ID.")
    cores: int = Field(ge=0, description="Cores this allocation consumes.")
    memory: str = Field(description="Memory this allocation consumes (quantity).")
    pods: list[PodRef] = Field(default_factory=list)
    usage: ShareUsage | None = Field(
        default=None, description="Measured on the node (absent when not measured)."
    )
    limit: Resources | None = Field(
        default=None,
        description="What a burstable share may use (its GpuConfig's burstLimit, at least "
        "cores and memory); absent: its caps are what it consumes.",
    )
    idle: bool | None = Field(
        default=None,
        description="True when the measured usage stayed under the controller's idle threshold "
        "of the reserved cores and memory for its idle period (condition SharesIdle); absent "
        "otherwise. Nothing is evicted.",
    )


class GpuTaint(_Model):
    """A taint on one DRA device of the GPU: from its ResourceSlice, or from the
    DeviceTaintRule named in ``device_taint_rule``."""

    device: str = Field(description="The DRA device the taint is on.")
    key: str
    value: str = ""
    effect: str = Field(description="None, NoSchedule or NoExecute.")
    device_taint_rule: str | None = Field(
        default=None, description="The DeviceTaintRule the taint comes from (absent: the slice)."
    )


class GpuStatus(_Model):
    """Health and usage, computed from taints and allocated claims."""

    health: Health
    health_reason: str | None = Field(
        default=None, description="Why the GPU is unhealthy (from the device taint)."
    )
    capacity: Resources
    allocated: Resources
    allocatable: Resources
    allocations: list[Allocation] = Field(default_factory=list)
    claim_count: int = Field(ge=0, description="Number of distinct claims using the GPU.")
    taints: list[GpuTaint] | None = Field(
        default=None,
        description="Taints on the GPU's devices, from the ResourceSlices and from the "
        "DeviceTaintRules that select them (absent when there are none); sorted by device, "
        "then slice taints before rule taints.",
    )
    cores_summary: str = Field(description="'<allocated>/<capacity>' cores, for kubectl.")
    memory_summary: str = Field(description="'<allocated>/<capacity>' memory, for kubectl.")
    conditions: list[GpuCondition] | None = Field(
        default=None,
        description="Overcommitted: whether a share uses more than it reserved (present only "
        "when some allocation carries measured usage). MPSEscaped: whether a compute process "
        "runs outside MPS on this GPU next to MPS shares (present only when some MPS share's "
        "usage judged it).",
    )

    # Burstable shares: present only when an allocation has a limit above what it consumes.
    limits: Resources | None = Field(
        default=None,
        description="Sum of the allocations' limits (an allocation without one counts what it "
        "consumes); absent when no allocation is burstable.",
    )
    limits_summary: str | None = Field(
        default=None, description="'<limits>/<capacity>' cores and memory, for kubectl."
    )
    overcommit: str | None = Field(
        default=None,
        description="Limits over capacity, the larger of the cores and memory ratios "
        "(e.g. 1.25; above 1 the shares may together ask for more than the GPU has).",
    )


class GpuObject(_Model):
    """A whole ``GPU`` object as the tracker writes it (server-set metadata excluded)."""

    api_version: str = GROUP_VERSION
    kind: str = GPU_KIND
    name: str = Field(description="metadata.name: '<node>-gpu-<index>'.")
    spec: GpuSpec
    status: GpuStatus

    @property
    def labels(self) -> dict[str, str]:
        """The object's own labels, derived from ``spec``: the node label when the node name is a
        valid label value (:func:`node_label_value`), else none."""
        value = node_label_value(self.spec.node)
        return {} if value is None else {GPU_NODE_LABEL: value}

    def manifest(self) -> dict[str, Any]:
        """The Kubernetes JSON body: ``metadata.name`` and ``metadata.labels`` (:attr:`labels`;
        the key is left out when there are none), spec and status."""
        metadata: dict[str, Any] = {"name": self.name}
        if self.labels:
            metadata["labels"] = self.labels
        return {
            "apiVersion": GROUP_VERSION,
            "kind": GPU_KIND,
            "metadata": metadata,
            "spec": self.spec.to_json_dict(),
            "status": self.status.to_json_dict(),
        }
