"""In-process Kubernetes API server for tests and the demo (see :mod:`.server`)."""

from sharegpu.local.apiserver.errors import ApiError
from sharegpu.local.apiserver.faults import Fault
from sharegpu.local.apiserver.resources import ResourceRegistry, ResourceType, default_resources
from sharegpu.local.apiserver.server import KubeAPIServer
from sharegpu.local.apiserver.store import Event, ObjectStore

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
