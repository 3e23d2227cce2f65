"""Shared helpers of the state-module tests: claims as kube-scheduler writes them, a dict-backed
ClaimGetter, a DeviceState factory over the mock backend, and CDI schema validation."""

from __future__ import annotations

import copy
import json
import tempfile
import threading
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

from api import names
from api.gpuconfig import DriverConfigs
from api.quantity import format_quantity
from kubeletplugin.containeredits import ContainerEdits, Mount
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.table import node_devices
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.cdi import CdiSpecWriter, NvidiaCdiDetector
from kubeletplugin.prepare.checkpoint import Checkpoint, checksum_of
from kubeletplugin.prepare.claims import REASON_NOT_FOUND, ClaimError
from kubeletplugin.prepare.state import DeviceState
from kubeletplugin.sharing.enforcement import (
    Applied,
    ShareEnforcer,
    ShareError,
)
from tests.kubeletplugin.prepare.checkpoint_files import read_document
from tests.paths import CDI_SCHEMA_DIR

DRIVER = names.DEFAULT_DRIVER_NAME
NODE = "node-a"
GI = 1024**3


def cdi_validator() -> jsonschema.Draft7Validator:
    """A validator for CDI specs: schema.json with its ``defs.json`` references resolved."""
    directory = CDI_SCHEMA_DIR
    schema = json.loads((directory / "schema.json").read_text())
    defs = json.loads((directory / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=_draft7())
    )
    return jsonschema.Draft7Validator(schema, registry=registry)


def _draft7() -> Any:
    from referencing.jsonschema import DRAFT7

    return DRAFT7


def assert_valid_cdi(path: Path) -> dict[str, Any]:
    """Validate a spec file against the CDI schema; returns the document."""
    doc: dict[str, Any] = json.loads(path.read_text())
    cdi_validator().validate(doc)
    return doc


def gpus(count: int = 8, node: str = NODE) -> list[GpuInfo]:
    return MockBackend(node, count).discover()


def result(
    request: str,
    device: str,
    *,
    driver: str = DRIVER,
    pool: str = NODE,
    share: Mapping[str, int] | None = None,
    admin: bool = False,
) -> dict[str, Any]:
    """An allocation result as kube-scheduler writes it (``share``: consumed cores/memory)."""
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if admin:
        out["adminAccess"] = True
    if share is not None:
        out["shareID"] = str(uuid.uuid4())
        out["consumedCapacity"] = {k: format_quantity(v) for k, v in share.items()}
    return out


def claim(
    name: str,
    results: Iterable[Mapping[str, Any]] | None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    configs: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim in its JSON shape; ``results`` None leaves it unallocated."""
    obj: dict[str, Any] = {
        "apiVersion": names.RESOURCE_GROUP_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": []}},
        "status": {},
    }
    if results is not None:
        obj["status"]["allocation"] = {
            "devices": {"results": list(results), "config": list(configs)},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    return obj


def ref(obj: Mapping[str, Any]) -> ClaimRef:
    md = obj["metadata"]
    return ClaimRef(namespace=md["namespace"], uid=md["uid"], name=md["name"])


class FakeClaims:
    """A dict-backed ClaimGetter that counts GETs; optional barrier to line threads up."""

    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0
        self.barrier = barrier
        self._mu = threading.Lock()

    def add(self, *objs: dict[str, Any]) -> None:
        for obj in objs:
            md = obj["metadata"]
            self.claims[(md["namespace"], md["name"])] = obj

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        with self._mu:
            self.gets += 1
        if self.barrier is not None:
            self.barrier.wait(timeout=60)
        try:
            return copy.deepcopy(self.claims[(namespace, name)])
        except KeyError:
            raise ClaimError(
                f"ResourceClaim {namespace}/{name} not found", REASON_NOT_FOUND
            ) from None


@dataclass
class Node:
    """Directories of one simulated node."""

    root: Path
    cdi_dir: Path = field(init=False)
    data_dir: Path = field(init=False)
    boot_id_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.cdi_dir = self.root / "cdi"
        self.data_dir = self.root / "data"
        self.boot_id_file = self.root / "boot_id"
        if not self.boot_id_file.exists():
            self.boot_id_file.write_text(str(uuid.uuid4()) + "\n")

    def reboot(self) -> None:
        self.boot_id_file.write_text(str(uuid.uuid4()) + "\n")
        for f in self.cdi_dir.glob("*"):
            f.unlink()

    def spec_files(self) -> list[Path]:
        return sorted(self.cdi_dir.glob("*.json"))

    def state(
        self,
        claims: FakeClaims,
        *,
        gpu_list: list[GpuInfo] | None = None,
        sharing_mode: str = names.SHARING_MODE_CONSUMABLE,
        enforcer: ShareEnforcer | None = None,
        dev_root: Path | None = None,
        proc_root: Path | None = None,
        nvidia: NvidiaCdiDetector | None = None,
        start: bool = True,
    ) -> DeviceState:
        """``proc_root`` None: ``<root>/proc``, which has no ``devices`` file unless a test
        writes one (never the machine's own /proc)."""
        state = DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=node_devices(gpu_list if gpu_list is not None else gpus(), sharing_mode),
            claims=claims,
            cdi=CdiSpecWriter(
                self.cdi_dir,
                DRIVER,
                dev_root=dev_root,
                nvidia=nvidia,
                proc_root=proc_root if proc_root is not None else self.root / "proc",
            ),
            checkpoint=Checkpoint(self.data_dir, boot_id_file=self.boot_id_file),
            enforcer=enforcer,
        )
        if start:
            state.start()
        return state

    def checkpoint(self) -> dict[str, Any]:
        """The checkpoint document in use (in the two-slot file)."""
        return read_document(self.data_dir)

    def write_checkpoint(self, doc: dict[str, Any], *, fix_checksum: bool = True) -> None:
        """Write ``doc`` as ``checkpoint.json``, which the next start takes as the newest record
        (and moves into the two-slot file), by default with a matching checksum (the checksum
        detects torn writes, not someone who edits the file)."""
        if fix_checksum:
            doc["checksum"] = checksum_of(doc)
        (self.data_dir / "checkpoint.json").write_text(json.dumps(doc))


def spec_env(doc: Mapping[str, Any], device_index: int = 0) -> dict[str, str]:
    """The environment of one device of a spec as a dict."""
    env = doc["devices"][device_index]["containerEdits"].get("env", [])
    return dict(e.split("=", 1) for e in env)


def short_mps_root() -> Path:
    """A new, short MPS root directory under /tmp (the caller removes it): MPS socket paths hold
    at most 107 bytes, and pytest's temporary paths are long."""
    return Path(tempfile.mkdtemp(prefix="sgm-", dir="/tmp"))


class RecordingEnforcer:
    """A ShareEnforcer that adds an env variable and a typed mount per share, limits each share
    to half its cores with strategy Limits, and records calls."""

    def __init__(self, fail_for: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.active: set[str] = set()
        self.fail_for = fail_for
        self.restored: tuple[Any, Mapping[str, Sequence[DeviceRecord]]] | None = None

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceRecord], configs: DriverConfigs
    ) -> Applied:
        self.calls.append(("apply", claim_uid))
        if claim_uid == self.fail_for:
            raise ShareError("MPS and TimeSlicing cannot share GPU x")
        self.active.add(claim_uid)
        decisions = tuple(
            Enforcement("Limits", d.cores // 2, d.memory) if d.is_share else None for d in devices
        )
        return Applied(decisions=decisions, device_edits=self._edits(devices))

    @staticmethod
    def _edits(devices: Sequence[DeviceRecord]) -> tuple[ContainerEdits, ...]:
        return tuple(
            ContainerEdits(
                env=(f"SHARE_LIMIT={d.cores}",),
                mounts=(Mount("/run/mps", "/run/mps", type="bind", options=("ro", "bind")),),
            )
            if d.is_share
            else ContainerEdits()
            for d in devices
        )

    def release(self, claim_uid: str) -> None:
        self.calls.append(("release", claim_uid))
        self.active.discard(claim_uid)

    def export_state(self) -> dict[str, Any]:
        return {"active": sorted(self.active)}

    def restore(
        self,
        state: Any,
        prepared: Mapping[str, Sequence[DeviceRecord]],
        *,
        node_gpus: Collection[str],
    ) -> dict[str, Applied]:
        self.restored = (state, prepared)
        self.active = set((state or {}).get("active", []))
        return {
            uid: Applied(
                decisions=tuple(d.enforcement for d in devices),
                device_edits=self._edits(devices),
            )
            for uid, devices in prepared.items()
        }
