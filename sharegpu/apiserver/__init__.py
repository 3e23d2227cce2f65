"""In-process Kubernetes API server for tests and the demo (see :mod:`.server`)."""

from sharegpu.apiserver.errors import ApiError
from sharegpu.apiserver.faults import Fault
from sharegpu.apiserver.resources import ResourceRegistry, ResourceType, default_resources
from sharegpu.apiserver.server import KubeAPIServer
from sharegpu.apiserver.store import Event, ObjectStore

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
