"""Every name the components share: driver, API group, attributes, capacities, CDI kinds.

This module is the single source of these strings; nothing else spells them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: Default DRA driver name (``spec.driver`` of our ResourceSlices, ``driver`` of results).
DEFAULT_DRIVER_NAME: Final = "gpu.sharegpu.dev"

#: Our own API group and version (GpuConfig, GPU).
API_GROUP: Final = "resource.sharegpu.dev"
API_VERSION: Final = "v1alpha1"
GROUP_VERSION: Final = f"{API_GROUP}/{API_VERSION}"

#: Kubernetes' DRA API group and the version this project speaks.
RESOURCE_GROUP: Final = "resource.k8s.io"
RESOURCE_VERSION: Final = "v1"
RESOURCE_GROUP_VERSION: Final = f"{RESOURCE_GROUP}/{RESOURCE_VERSION}"

# --- Device attributes (unqualified names live under the driver's domain) ---
ATTR_UUID: Final = "uuid"
ATTR_PRODUCT_NAME: Final = "productName"
ATTR_BRAND: Final = "brand"
ATTR_ARCHITECTURE: Final = "architecture"
ATTR_INDEX: Final = "index"
ATTR_MINOR: Final = "minor"
ATTR_CUDA_COMPUTE_CAPABILITY: Final = "cudaComputeCapability"
ATTR_DRIVER_VERSION: Final = "driverVersion"
ATTR_CUDA_DRIVER_VERSION: Final = "cudaDriverVersion"
ATTR_NUMA_NODE: Final = "numaNode"
#: The GPU's NVLink domain: GPUs of one node with the same value reach each other over NVLink
#: (:mod:`kubeletplugin.devices.nvlink`); absent on a GPU with no NVLink peer.
ATTR_NVLINK_DOMAIN: Final = "nvlinkDomain"
ATTR_PARTITION: Final = "partition"
ATTR_PARENT_UUID: Final = "parentUUID"
#: MIG devices: the profile (e.g. ``1g.10gb``), the parent GPU's NVML index, NVML's GPU and
#: compute instance ids on the parent, and the device's streaming multiprocessors.
ATTR_PROFILE: Final = "profile"
ATTR_PARENT_INDEX: Final = "parentIndex"
ATTR_MIG_GPU_INSTANCE: Final = "migGpuInstance"
ATTR_MIG_COMPUTE_INSTANCE: Final = "migComputeInstance"
ATTR_MULTIPROCESSORS: Final = "multiprocessorCount"
#: Dynamic MIG devices (one per profile placement, created at prepare): the placement's first
#: memory slice and its size, NVML's GPU-instance profile id, and the profile's engines.
ATTR_PLACEMENT_START: Final = "placementStart"
ATTR_PLACEMENT_SIZE: Final = "placementSize"
ATTR_MIG_PROFILE_ID: Final = "migProfileId"
ATTR_COPY_ENGINES: Final = "copyEngineCount"
ATTR_DECODERS: Final = "decoderCount"
ATTR_ENCODERS: Final = "encoderCount"
ATTR_JPEG_ENGINES: Final = "jpegCount"
ATTR_OFA_ENGINES: Final = "ofaCount"
#: True on devices whose MIG instance the driver creates at prepare (dynamic MIG).
ATTR_MIG_DYNAMIC: Final = "migDynamic"
#: Standard, fully qualified attributes defined by Kubernetes.
ATTR_PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
#: The device's NUMA node (k8s.io/dynamic-resource-allocation v0.37 ``deviceattribute``): a
#: scalar int, never published for a device without NUMA affinity.
ATTR_STANDARD_NUMA_NODE: Final = "resource.kubernetes.io/numaNode"

# --- Device capacities ---
CAP_MEMORY: Final = "memory"
CAP_CORES: Final = "cores"
#: ``cores`` is a percentage of the GPU's streaming multiprocessors.
CORES_PER_GPU: Final = 100
#: Memory shares are granted in steps of this many bytes (256Mi).
MEMORY_STEP_BYTES: Final = 256 * 1024 * 1024

# --- Sharing modes of the kubelet plugin (--sharing-mode) ---
SHARING_MODE_CONSUMABLE: Final = "consumable"
SHARING_MODE_PARTITIONS: Final = "partitions"
SHARING_MODE_EXCLUSIVE: Final = "exclusive"
SHARING_MODES: Final = (SHARING_MODE_CONSUMABLE, SHARING_MODE_PARTITIONS, SHARING_MODE_EXCLUSIVE)

# --- Device backends of the kubelet plugin and the CLI (--device-backend) ---
#: ``nvml``: the node's NVIDIA GPUs; ``mock``: simulated GPUs (the plugin's simulated host).
NVML_BACKEND: Final = "nvml"
MOCK_BACKEND: Final = "mock"
DEVICE_BACKENDS: Final = (NVML_BACKEND, MOCK_BACKEND)

# --- MIG strategies of the kubelet plugin (--mig) ---
#: ``static``: publish the MIG devices an administrator created. ``dynamic`` (``partitions`` mode
#: only): publish every placement of every MIG profile of an unpartitioned MIG-enabled GPU and
#: create the MIG instance at prepare.
MIG_STRATEGY_STATIC: Final = "static"
MIG_STRATEGY_DYNAMIC: Final = "dynamic"
MIG_STRATEGIES: Final = (MIG_STRATEGY_STATIC, MIG_STRATEGY_DYNAMIC)

#: Shared counters of a dynamic-MIG GPU's counter set: one per memory slice, the compute slices,
#: and one per profile that allows fewer instances than it has placements.
COUNTER_COMPUTE_SLICES: Final = "compute-slices"


def memory_slice_counter(slot: int) -> str:
    """Counter of memory slice ``slot`` of a dynamic-MIG GPU: ``memory-slice-<slot>`` (counter
    names are DNS labels)."""
    return f"memory-slice-{slot}"


def profile_instances_counter(profile_id: int) -> str:
    """Counter limiting the instances of GPU-instance profile ``profile_id``:
    ``profile-<id>-instances``."""
    return f"profile-{profile_id}-instances"


#: Partition profiles of the ``partitions`` mode: name -> fraction denominator.
PARTITION_PROFILES: Final = {"whole": 1, "half": 2, "quarter": 4, "eighth": 8}

# --- Device taints ---
TAINT_UNHEALTHY_SUFFIX: Final = "unhealthy"


def device_name(index: int) -> str:
    """Name of the device that stands for the whole GPU with NVML index ``index``."""
    return f"gpu-{index}"


def partition_device_name(index: int, profile: str, j: int) -> str:
    """Name of partition ``j`` of profile ``profile`` (``half``, ``quarter``, ``eighth``)."""
    return f"gpu-{index}-{profile}-{j}"


def mig_placement_device_name(index: int, profile: str, start: int) -> str:
    """Name of the dynamic MIG device of profile ``profile`` at memory slice ``start`` of GPU
    ``index``: ``gpu-<index>-mig-<profile>-<start>`` with the profile's ``.`` and ``+`` as
    ``-`` (``gpu-0-mig-1g-10gb-3``, ``gpu-0-mig-1g-10gb-me-0``). Never equal to a static MIG
    device's name (``gpu-<i>-mig-<gi>-<ci>``: digits only after ``mig-``)."""
    return f"gpu-{index}-mig-{profile.replace('.', '-').replace('+', '-')}-{start}"


def counter_set_name(index: int) -> str:
    """Name of the shared counter set of GPU ``index`` in ``partitions`` mode."""
    return f"gpu-{index}-counters"


def unhealthy_taint_key(driver_name: str) -> str:
    """Taint key put on an unhealthy device: ``<driver>/unhealthy``."""
    return f"{driver_name}/{TAINT_UNHEALTHY_SUFFIX}"


#: ``kind`` of the usage record the node plugin writes into a claim's ``status.devices[].data``.
SHARE_USAGE_KIND: Final = "ShareUsage"
#: What a share may exceed: ``memory`` (bytes used above the reserved memory) and ``compute``
#: (SM utilisation above the reserved cores plus the plugin's margin).
OVER_MEMORY: Final = "memory"
OVER_COMPUTE: Final = "compute"
OVERCOMMIT_RESOURCES: Final = (OVER_MEMORY, OVER_COMPUTE)
#: The GPU object's condition type for shares that use more than they reserved.
CONDITION_OVERCOMMITTED: Final = "Overcommitted"
#: Suffix of the optional device taint of an overcommitted GPU: ``<driver>/overcommitted``.
TAINT_OVERCOMMITTED_SUFFIX: Final = "overcommitted"


def overcommitted_taint_key(driver_name: str) -> str:
    """Taint key the node plugin may put on a GPU one of whose shares is overcommitted."""
    return f"{driver_name}/{TAINT_OVERCOMMITTED_SUFFIX}"


#: The GPU object's condition type for compute processes that run outside MPS on a GPU with MPS
#: shares (they get the whole GPU, beyond every share's limits).
CONDITION_MPS_ESCAPED: Final = "MPSEscaped"
#: The GPU object's condition type for shares whose measured usage stayed under the controller's
#: idle threshold of what they reserved for its idle period (reported, never evicted).
CONDITION_SHARES_IDLE: Final = "SharesIdle"
#: Suffix of the optional device taint of a GPU where a process escaped MPS:
#: ``<driver>/mps-escape``.
TAINT_MPS_ESCAPE_SUFFIX: Final = "mps-escape"


def mps_escape_taint_key(driver_name: str) -> str:
    """Taint key the node plugin may put on a GPU where a compute process runs outside MPS."""
    return f"{driver_name}/{TAINT_MPS_ESCAPE_SUFFIX}"


def base_request_name(request_name: str) -> str:
    """``req/sub`` (a subrequest, DRA's name for an alternative of ``firstAvailable``) ->
    ``req``; a plain request name is returned unchanged."""
    return request_name.split("/", 1)[0]


def qualify(driver_name: str, name: str) -> str:
    """Fully qualified attribute or capacity name (names with a ``/`` are already qualified)."""
    return name if "/" in name else f"{driver_name}/{name}"


def driver_value(mapping: Mapping[str, Any], driver_name: str, name: str) -> Any:
    """The value of attribute or capacity ``name`` in ``mapping``, under its plain name or the
    driver-qualified one (the plain one first); None when under neither."""
    if name in mapping:
        return mapping[name]
    return mapping.get(qualify(driver_name, name))


def cdi_vendor(driver_name: str) -> str:
    """CDI vendor of the claim specs: ``k8s.<driver>``."""
    return f"k8s.{driver_name}"


def cdi_kind(driver_name: str) -> str:
    """CDI kind of the transient per-claim specs: ``k8s.<driver>/claim``."""
    return f"{cdi_vendor(driver_name)}/claim"


#: Kind of the NVIDIA Container Toolkit's CDI spec, used to inject driver libraries.
NVIDIA_CTK_CDI_KIND: Final = "nvidia.com/gpu"

#: The GPU custom resource (one object per physical GPU, cluster-scoped).
GPU_KIND: Final = "GPU"
GPU_PLURAL: Final = "gpus"
GPU_CRD_NAME: Final = f"{GPU_PLURAL}.{API_GROUP}"


def gpu_object_name(node_name: str, index: int) -> str:
    """Name of the GPU object for GPU ``index`` on ``node_name``."""
    return f"{node_name}-gpu-{index}"


#: Label on every GPU object naming the driver whose tracker manages it.
GPU_DRIVER_LABEL: Final = f"{API_GROUP}/driver"
#: Default name of the controller's leader-election Lease.
CONTROLLER_LEASE_NAME: Final = "sharegpu-controller"
#: Label on every GPU object naming the node the GPU is attached to
#: (``kubectl get gpus -l resource.sharegpu.dev/node=node-a``).
GPU_NODE_LABEL: Final = f"{API_GROUP}/node"
#: Short name of the GPU resource (``kubectl get sgpu``); distinct from the plural and singular.
GPU_SHORT_NAME: Final = "sgpu"
#: The kind, plural, CRD name and ``kubectl get`` short name of the quota resource.
GPU_QUOTA_KIND: Final = "GpuQuota"
GPU_QUOTA_PLURAL: Final = "gpuquotas"
GPU_QUOTA_CRD_NAME: Final = f"{GPU_QUOTA_PLURAL}.{API_GROUP}"
GPU_QUOTA_SHORT_NAME: Final = "gpuq"
#: Category of this project's resources (``kubectl get sharegpu`` lists the GPU objects).
GPU_CATEGORY: Final = "sharegpu"
