"""In-process Kubernetes API server for tests and the demo (see :mod:`.server`)."""

from sharegpuctl.local.apiserver.errors import ApiError
from sharegpuctl.local.apiserver.faults import Fault
from sharegpuctl.local.apiserver.resources import ResourceRegistry, ResourceType, default_resources
from sharegpuctl.local.apiserver.server import KubeAPIServer
from sharegpuctl.local.apiserver.store import Event, ObjectStore

__all__ = [
    "ApiError",
    "Event",
    "Fault",
    "KubeAPIServer",
    "ObjectStore",
    "ResourceRegistry",
    "ResourceType",
    "default_resources",
]
