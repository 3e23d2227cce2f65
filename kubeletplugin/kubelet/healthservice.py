"""The kubelet device-health stream (``DRAResourceHealth/NodeWatchResources``, KEP-4680).

Two wire versions carry the same messages: ``v1`` (kubelet 1.37 prefers it) and ``v1alpha1``
(kubelet 1.34-1.36; 1.37 still accepts it). :data:`HEALTH_APIS` lists both; one
:class:`HealthServicer` serves every version in it from one source and one stream limit, and
the service names registration advertises are read from that same table, so the plugin
advertises exactly the versions it serves.

The servicer forwards the lists produced by a :class:`HealthSource`. Every list is the driver's
*complete* device list (kubelet marks unreported devices Unknown after a timeout).

:class:`HealthBroadcaster` is a ready-made source: whoever observes device health calls
:meth:`HealthBroadcaster.publish`; every subscriber gets the latest list at once, then each new
one, and the latest list again whenever ``resend_interval_s`` passes without a change.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import grpc

from kubeletplugin.kubelet.grpcapi.gen import (
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
)

log = logging.getLogger(__name__)

DEFAULT_RESEND_INTERVAL_S = 30.0


class Health(enum.IntEnum):
    """Device health as kubelet understands it (values are the wire enum's)."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealthStatus:
    """The health of one published device.

    ``last_updated`` is Unix time in seconds; ``timeout_seconds`` <= 0 means kubelet's default.
    """

    pool_name: str
    device_name: str
    health: Health
    last_updated: int
    message: str = ""
    timeout_seconds: int = 0


class HealthSubscription(Protocol):
    """An iterator of complete device-health lists for one stream.

    ``close`` may be called from any thread, also while another thread waits in ``__next__``;
    that wait must then end promptly with ``StopIteration``. Closing twice is harmless.
    """

    def __iter__(self) -> Iterator[Sequence[DeviceHealthStatus]]: ...

    def __next__(self) -> Sequence[DeviceHealthStatus]: ...

    def close(self) -> None: ...


class HealthSource(Protocol):
    """Hands out one subscription per kubelet stream."""

    def subscribe(self) -> HealthSubscription: ...


class HealthBroadcaster:
    """A thread-safe :class:`HealthSource` fed by :meth:`publish`."""

    def __init__(self, resend_interval_s: float = DEFAULT_RESEND_INTERVAL_S) -> None:
        if resend_interval_s <= 0:
            raise ValueError(f"resend_interval_s must be > 0, got {resend_interval_s}")
        self.resend_interval_s = resend_interval_s
        self._cond = threading.Condition()
        self._latest: tuple[DeviceHealthStatus, ...] | None = None
        self._version = 0
        self._closed = False

    def publish(self, devices: Sequence[DeviceHealthStatus]) -> None:
        """Make ``devices`` (the complete list) the current state and wake every subscriber."""
        with self._cond:
            self._latest = tuple(devices)
            self._version += 1
            self._cond.notify_all()

    def subscribe(self) -> HealthSubscription:
        """A new subscription; it starts with the current list if one was published."""
        return _BroadcastSubscription(self)

    def close(self) -> None:
        """End every subscription, present and future."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _BroadcastSubscription:
    def __init__(self, owner: HealthBroadcaster) -> None:
        self._owner = owner
        self._seen = 0
        self._closed = False

    def __iter__(self) -> Iterator[Sequence[DeviceHealthStatus]]:
        return self

    def __next__(self) -> Sequence[DeviceHealthStatus]:
        owner = self._owner
        with owner._cond:
            deadline = time.monotonic() + owner.resend_interval_s
            while True:
                if self._closed or owner._closed:
                    raise StopIteration
                latest = owner._latest
                if latest is not None and owner._version != self._seen:
                    self._seen = owner._version
                    return latest
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    deadline = time.monotonic() + owner.resend_interval_s
                    if latest is not None:
                        return latest
                    continue
                owner._cond.wait(remaining)

    def close(self) -> None:
        with self._owner._cond:
            self._closed = True
            self._owner._cond.notify_all()


@dataclass(frozen=True)
class HealthApi:
    """One wire version of the health service.

    ``service`` is the gRPC service's full name (``<proto package>.DRAResourceHealth``), read
    from the generated descriptor: it is both what the server serves and what registration
    advertises. ``messages`` is the generated message module; ``add_to_server`` registers a
    servicer for this version on a server.
    """

    service: str
    messages: ModuleType
    add_to_server: Callable[[Any, grpc.Server], None]


def _health_api(messages: ModuleType, stubs: ModuleType) -> HealthApi:
    service = messages.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name
    return HealthApi(str(service), messages, stubs.add_DRAResourceHealthServicer_to_server)


#: Every served health version, newest first (kubelet picks, in its own order of preference,
#: the first version it knows among those advertised).
HEALTH_APIS: tuple[HealthApi, ...] = (
    _health_api(drahealth_v1_pb2, drahealth_v1_pb2_grpc),
    _health_api(drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc),
)


def to_response(devices: Sequence[DeviceHealthStatus], messages: ModuleType) -> Any:
    """The wire message of one complete list, in the version of ``messages``."""
    pb: Any = messages
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
                health=d.health.name,
                last_updated_time=d.last_updated,
                health_check_timeout_seconds=d.timeout_seconds,
                message=d.message,
            )
            for d in devices
        ]
    )


#: Health streams served at once, all versions together. Kubelet keeps one per plugin; the
#: server reserves exactly this many extra workers for them, so open streams can never take a
#: worker a prepare needs.
MAX_HEALTH_STREAMS = 4


class HealthServicer:
    """Serves ``NodeWatchResources`` in every version of :data:`HEALTH_APIS`: one subscription
    per stream, closed when the stream ends.

    Invariant: at most ``max_streams`` streams are open at once, whatever their versions; a
    stream beyond that is refused at once with ``RESOURCE_EXHAUSTED`` (it never waits for a
    slot, so it never holds a worker either)."""

    def __init__(self, source: HealthSource, max_streams: int = MAX_HEALTH_STREAMS) -> None:
        self._source = source
        self.max_streams = max_streams
        self._slots = threading.BoundedSemaphore(max_streams)

    def add_to_server(self, server: grpc.Server) -> None:
        """Serve every version of :data:`HEALTH_APIS` on ``server``."""
        for api in HEALTH_APIS:
            api.add_to_server(_VersionServicer(self, api.messages), server)

    def watch(self, messages: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
        """One stream, its responses built with the version's ``messages``."""
        if not self._slots.acquire(blocking=False):
            log.warning("refusing a device health stream: %d are open already", self.max_streams)
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {self.max_streams} device health streams may be open at once",
            )
        try:
            yield from self._serve(messages, context)
        finally:
            self._slots.release()

    def _serve(self, messages: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
        subscription = self._source.subscribe()
        # Runs when the client goes away or the server stops, waking a blocked __next__.
        context.add_callback(subscription.close)
        log.info("kubelet opened a device health stream (%s)", messages.DESCRIPTOR.package)
        try:
            for devices in subscription:
                if not context.is_active():
                    break
                yield to_response(devices, messages)
        finally:
            subscription.close()
            log.info("device health stream ended")


class _VersionServicer:
    """The gRPC-facing servicer of one version; all logic is :meth:`HealthServicer.watch`."""

    def __init__(self, owner: HealthServicer, messages: ModuleType) -> None:
        self._owner = owner
        self._messages = messages

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self._owner.watch(self._messages, context)
