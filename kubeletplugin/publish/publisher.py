"""Keeps the node's ResourceSlices on the API server equal to what the node has, with the
semantics of Kubernetes' Go helper (``k8s.io/dynamic-resource-allocation/resourceslice``).

Invariants: one pool per node, slices owned by the Node and named
``<4 hex digits>-<driver>-<node>-<random>`` (matched to the desired ones by that index); a sync
first deletes obsolete slices (older generation, bad or duplicate or excess index; with UID and
resourceVersion preconditions), keeps the generation when at most one slice changed and none is
missing, else bumps it and rewrites all; a watch on the node's slices resyncs after anyone
else's change (kubelet wipes them at start); failures are retried with capped backoff (a 422
slowly) and never raise into the caller's thread; syncs start at most once per
``min_interval``. Fields the server dropped from the first slice written (a gate off,
:mod:`.gatecheck`) are reported once (log and Node Event) and then left out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from api import gates, names
from api.jsontypes import Obj
from api.quantity import QuantityError, parse_quantity
from kubeletplugin.devices.slices import (
    desired_slices,
    node_owner_reference,
    resource_slice_objects,
    slice_generate_name,
    slice_index,
    slice_spec,
)
from kubeletplugin.devices.table import NodeDevices
from kubeletplugin.model import Taints
from kubeletplugin.publish import gatecheck
from sharegpu.kube import slicerules
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.informer import Backoff, Informer
from sharegpu.kube.rest import KubeApiError, KubeRest

log = logging.getLogger(__name__)


SLICES_PATH: Final = f"/apis/{names.RESOURCE_GROUP_VERSION}/resourceslices"
#: Fields the API server fills in on its own; their presence is not a difference.
SERVER_DEFAULTED_FIELDS: Final = frozenset({"timeAdded"})


@dataclass(frozen=True)
class PublisherSettings:
    """Timing of the publisher; the defaults suit production, tests shorten them."""

    #: At most one sync starts per this many seconds.
    min_interval: float = 1.0
    backoff: Backoff = field(default_factory=Backoff)
    #: Retry delay after the API server rejected a slice (422).
    invalid_retry: float = 60.0
    #: Full resync even without events, in case a watch missed something.
    resync_period: float = 300.0
    #: Server-side timeout of each watch request.
    watch_timeout_seconds: int = 300


def _resource_version(obj: Obj) -> str:
    """What the informer keeps of a slice: its resourceVersion (the publisher lists the slices
    itself when it syncs, so the watch only needs to notice changes)."""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class SliceRejected(Exception):
    """The desired slices fail validation or the API server rejected them (422)."""


class _Retry(Exception):
    """A sync failed for a reason that is retried with backoff."""


def _same_value(desired: Any, actual: Any) -> bool:
    """Compare as the API server stores values: quantities by value, extra defaults ignored."""
    if isinstance(desired, dict):
        if not isinstance(actual, dict):
            return False
        for key, value in actual.items():
            if (
                key not in desired
                and key not in SERVER_DEFAULTED_FIELDS
                and value
                not in (
                    None,
                    [],
                    {},
                    False,
                )
            ):
                return False
        return all(_same_value(v, actual.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(desired) == len(actual)
            and all(_same_value(d, a) for d, a in zip(desired, actual, strict=True))
        )
    if isinstance(desired, str) and isinstance(actual, str) and desired != actual:
        try:
            return parse_quantity(desired) == parse_quantity(actual)
        except QuantityError:
            return False
    return bool(desired == actual)


def _generation(obj: Obj) -> int:
    value = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return value if isinstance(value, int) else 0


@dataclass
class SyncPlan:
    """What one sync does, computed from the existing and desired slices (pure)."""

    generation: int
    delete: list[Obj]
    update: list[tuple[Obj, Obj]]  # (existing, new spec)
    create: list[int]  # indexes of desired slices without an existing one


def plan_sync(
    existing: Sequence[Obj],
    contents: Sequence[Obj],
    driver_name: str,
    node_name: str,
    owner: Obj | None,
) -> SyncPlan:
    """Compare the pool on the server with the desired slice contents (Go helper semantics)."""
    ours = [
        s
        for s in existing
        if s.get("spec", {}).get("driver") == driver_name
        and s.get("spec", {}).get("pool", {}).get("name") == node_name
    ]
    highest = max([_generation(s) for s in ours], default=0)
    delete: list[Obj] = []
    by_index: dict[int, Obj] = {}
    for obj in sorted(ours, key=lambda s: s.get("metadata", {}).get("name", "")):
        name = obj.get("metadata", {}).get("name", "")
        index = slice_index(name)
        if (
            index is None
            or index >= len(contents)
            or _generation(obj) < highest
            or index in by_index
            or not name.startswith(slice_generate_name(index, driver_name, node_name))
        ):
            delete.append(obj)
        else:
            by_index[index] = obj
    missing = [i for i in range(len(contents)) if i not in by_index]

    def spec_for(index: int, generation: int) -> Obj:
        return slice_spec(contents[index], driver_name, node_name, generation, len(contents))

    def differs(index: int, generation: int) -> bool:
        obj = by_index[index]
        if not _same_value(spec_for(index, generation), obj.get("spec")):
            return True
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return owner is not None and not any(
            r.get("kind") == "Node" and r.get("uid") == owner["uid"] for r in refs
        )

    changed = [i for i in by_index if differs(i, highest)]
    generation = highest
    if missing or len(changed) > 1 or highest == 0:
        generation = highest + 1
    if generation != highest:
        changed = sorted(by_index)
    update = [(by_index[i], spec_for(i, generation)) for i in sorted(changed)]
    return SyncPlan(generation=generation, delete=delete, update=update, create=missing)


class SlicePublisher:
    """Publishes the node's pool and keeps it published until :meth:`stop`.

    Thread-safe: :meth:`update_devices`, :meth:`set_taints` and :meth:`set_hidden_devices` may
    be called from any thread.
    """

    def __init__(
        self,
        rest: KubeRest,
        driver_name: str,
        node_name: str,
        devices: NodeDevices,
        settings: PublisherSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._rest = rest
        self.driver_name = driver_name
        self.node_name = node_name
        self.sharing_mode = devices.sharing_mode
        self.settings = settings or PublisherSettings()
        #: Measures the debounce interval, retry delays and the resync period.
        self._clock = clock
        self._devices = devices
        self._taints: dict[str, list[dict[str, Any]]] = {}
        self._hidden: frozenset[str] = frozenset()
        self._cond = threading.Condition()
        self._dirty = True
        self._not_before = 0.0
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Watches this node's and driver's slices: any change by someone else (kubelet wiping
        #: them, an admin editing one) and every relist after a broken watch asks for a sync.
        self._informer = Informer(
            rest,
            SLICES_PATH,
            lambda _key, _old, _new: self.request_sync(),
            name="resourceslices",
            query=self._selector(),
            transform=_resource_version,
            watch_timeout_s=self.settings.watch_timeout_seconds,
            backoff=self.settings.backoff,
            on_relist=self.request_sync,
            clock=clock,
        )
        self._node_uid: str | None = None
        self._generation = 0
        self._synced_version = -1
        self._desired_version = 0
        self.last_error: str | None = None
        #: Whether a written slice was read back (:mod:`.gatecheck`), and the gates whose
        #: fields the API server dropped then.
        self._read_back = False
        self.dropped_gates: tuple[str, ...] = ()

    # --- entry points for other parts ----------------------------------------------------

    def update_devices(self, devices: NodeDevices) -> None:
        """Publish a new device table (after the next debounce interval); its sharing mode
        must be the publisher's."""
        if devices.sharing_mode != self.sharing_mode:
            raise ValueError(
                f"sharing mode {devices.sharing_mode!r} differs from the published "
                f"{self.sharing_mode!r}"
            )
        with self._cond:
            self._devices = devices
            self._mark_changed()

    @property
    def devices(self) -> NodeDevices:
        """The device table being published."""
        with self._cond:
            return self._devices

    def set_taints(self, taints: Taints) -> None:
        """Replace the per-device taints (device name -> taints; ``gpu-<i>`` covers partitions)."""
        with self._cond:
            self._taints = {k: [dict(t) for t in v] for k, v in taints.items()}
            self._mark_changed()

    def set_hidden_devices(self, device_names: Iterable[str]) -> None:
        """Replace the set of devices left out of the slices (dynamic MIG placements that MIG
        instances created by someone else block); the table itself is unchanged. A name the
        table does not have is ignored. Publishes only when the set changed."""
        hidden = frozenset(device_names)
        with self._cond:
            if hidden == self._hidden:
                return
            self._hidden = hidden
            self._mark_changed()

    @property
    def hidden_devices(self) -> frozenset[str]:
        """The devices left out of the slices (:meth:`set_hidden_devices`)."""
        with self._cond:
            return self._hidden

    def request_sync(self) -> None:
        """Ask for a sync soon (e.g. after something else touched the slices)."""
        with self._cond:
            self._dirty = True
            self._cond.notify_all()

    def desired_contents(self) -> list[Obj]:
        """The slice contents that would be published now (without the fields the API server
        was found to drop)."""
        with self._cond:
            devices, taints, hidden = self._devices, dict(self._taints), self._hidden
        contents = desired_slices(devices, taints, hidden)
        if not self.dropped_gates:
            return contents
        kind = {"kind": "ResourceSlice"}
        return [gates.without({**kind, "spec": c}, self.dropped_gates)["spec"] for c in contents]

    def _mark_changed(self) -> None:
        self._desired_version += 1
        self._dirty = True
        self._cond.notify_all()

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the sync thread and the slice informer; returns at once."""
        if self._threads:
            raise RuntimeError("SlicePublisher already started")
        thread = threading.Thread(target=self._sync_loop, name="slice-sync", daemon=True)
        thread.start()
        self._threads.append(thread)
        self._informer.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads. Slices stay published (kubelet removes them when it must)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        self._informer.stop(timeout)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def wait_synced(self, timeout: float) -> bool:
        """Block until the current desired state was published by a successful sync."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._synced_version != self._desired_version or self._dirty:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping.is_set():
                    return False
                self._cond.wait(min(remaining, 0.1))
            return True

    @property
    def generation(self) -> int:
        """The pool generation of the last successful sync."""
        return self._generation

    # --- sync loop ------------------------------------------------------------------------

    def _sync_loop(self) -> None:
        failures = 0
        last_sync = -1e9
        while not self._stopping.is_set():
            with self._cond:
                while not self._stopping.is_set():
                    now = self._clock.monotonic()
                    if now - last_sync >= self.settings.resync_period:
                        self._dirty = True
                    start_at = max(self._not_before, last_sync + self.settings.min_interval)
                    if self._dirty and now >= start_at:
                        break
                    wait = start_at - now if self._dirty else self.settings.resync_period
                    self._clock.wait_condition(self._cond, max(0.01, min(wait, 1.0)))
                if self._stopping.is_set():
                    return
                self._dirty = False
                version = self._desired_version
            last_sync = self._clock.monotonic()
            try:
                self.sync_once()
            except _Retry as exc:
                failures += 1
                delay = self.settings.backoff.delay(failures)
                self._failed(str(exc), delay, logging.WARNING)
            except SliceRejected as exc:
                failures += 1
                self._failed(str(exc), self.settings.invalid_retry, logging.ERROR)
            except Exception as exc:  # a bug must not stop publishing for good
                failures += 1
                delay = self.settings.backoff.delay(failures)
                log.exception("unexpected error while publishing ResourceSlices")
                self._failed(f"{type(exc).__name__}: {exc}", delay, logging.DEBUG)
            else:
                failures = 0
                with self._cond:
                    self.last_error = None
                    self._synced_version = version
                    self._cond.notify_all()

    def _failed(self, message: str, delay: float, level: int) -> None:
        log.log(level, "publishing ResourceSlices failed, retrying in %.1fs: %s", delay, message)
        with self._cond:
            self.last_error = message
            self._dirty = True
            self._not_before = self._clock.monotonic() + delay
            self._cond.notify_all()

    def _call(self, method: str, path: str, **kwargs: Any) -> Obj:
        try:
            return self._rest.request(method, path, **kwargs)
        except KubeApiError as exc:
            if exc.status == 422:
                raise SliceRejected(
                    f"{method} {path} rejected by the API server: {exc.message}"
                ) from None
            raise _Retry(str(exc)) from None

    def _owner(self) -> Obj:
        """The ownerReference to the Node, read at every sync: a Node deleted and registered
        again has a new UID, and slices naming the old one are garbage-collected."""
        node = self._call("GET", f"/api/v1/nodes/{self.node_name}")
        uid = node.get("metadata", {}).get("uid")
        if not isinstance(uid, str) or not uid:
            raise _Retry(f"Node {self.node_name} has no metadata.uid")
        if self._node_uid is not None and uid != self._node_uid:
            log.info("Node %s was recreated (UID %s, was %s)", self.node_name, uid, self._node_uid)
        self._node_uid = uid
        return node_owner_reference(self.node_name, uid)

    def _selector(self) -> list[tuple[str, str]]:
        return [("fieldSelector", f"spec.nodeName={self.node_name},spec.driver={self.driver_name}")]

    def sync_once(self) -> None:
        """One reconcile pass; raises on failure (the sync loop retries)."""
        contents = self.desired_contents()
        problems = self._validate(contents)
        if problems:
            raise SliceRejected("desired ResourceSlices are invalid: " + "; ".join(problems))
        owner = self._owner()
        listing = self._call("GET", SLICES_PATH, query=self._selector())
        existing = [i for i in listing.get("items") or [] if isinstance(i, dict)]
        plan = plan_sync(existing, contents, self.driver_name, self.node_name, owner)
        for obj in plan.delete:
            meta = obj["metadata"]
            body = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                },
            }
            try:
                self._rest.request("DELETE", f"{SLICES_PATH}/{meta['name']}", body=body)
            except KubeApiError as exc:
                if exc.status != 404:
                    raise _Retry(f"DELETE ResourceSlice {meta['name']}: {exc}") from None
            log.info("deleted obsolete ResourceSlice %s", meta["name"])
        for obj, spec in plan.update:
            meta = dict(obj["metadata"])
            meta["ownerReferences"] = [owner]
            body = {**obj, "metadata": meta, "spec": spec}
            self._check_stored(body, self._call("PUT", f"{SLICES_PATH}/{meta['name']}", body=body))
        objects = resource_slice_objects(
            contents, self.driver_name, self.node_name, owner["uid"], plan.generation
        )
        for index in plan.create:
            created = self._call("POST", SLICES_PATH, body=objects[index])
            self._check_stored(objects[index], created)
            log.debug("created ResourceSlice %s", created.get("metadata", {}).get("name"))
        if plan.delete or plan.update or plan.create:
            log.info(
                "published pool %s generation %d: %d slices (%d created, %d updated, %d deleted)",
                self.node_name,
                plan.generation,
                len(contents),
                len(plan.create),
                len(plan.update),
                len(plan.delete),
            )
        self._generation = plan.generation

    def _check_stored(self, sent: Obj, stored: Obj) -> None:
        """Read back the first slice written (see the module docstring); once per publisher."""
        if self._read_back:
            return
        self._read_back = True
        dropped = gatecheck.dropped_fields(sent, stored)
        if not dropped:
            return
        name = str((stored.get("metadata") or {}).get("name", ""))
        message = gatecheck.dropped_message(name, dropped)
        log.error("%s", message)
        self.dropped_gates = tuple(gatecheck.dropped_gates(dropped))
        event = gatecheck.node_event(
            self.node_name, self._node_uid or "", message, datetime.now(UTC)
        )
        try:
            self._rest.request("POST", "/api/v1/namespaces/default/events", body=event)
        except KubeApiError as exc:
            log.warning("could not record the Warning Event on Node %s: %s", self.node_name, exc)

    def _validate(self, contents: Sequence[Obj]) -> list[str]:
        """The checks the Go helper makes before the API server sees anything."""
        objects = resource_slice_objects(contents, self.driver_name, self.node_name, "uid", 1)
        pool: list[Mapping[str, Any]] = list(objects)
        problems = list(slicerules.validate_pool(pool))
        for obj in objects:
            problems += slicerules.validate_resource_slice(obj)
        return problems
