"""Shared helpers for the gRPC layer's tests: a scriptable fake ClaimPreparer and a running
PluginServer in a short temporary socket directory."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kubeletplugin.kubelet.healthservice import HealthSource
from kubeletplugin.kubelet.preparer import (
    ClaimPreparer,
    ClaimRef,
    PrepareOutcome,
    UnprepareOutcome,
)
from kubeletplugin.kubelet.server import PluginServer

DRIVER = "gpu.sharegpu.dev"


@dataclass(frozen=True)
class PlainPreparedDevice:
    """A :class:`~kubeletplugin.kubelet.preparer.PreparedDevice` of the fake preparer."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


PrepareFn = Callable[[Sequence[ClaimRef]], Mapping[str, PrepareOutcome]]
UnprepareFn = Callable[[Sequence[ClaimRef]], Mapping[str, UnprepareOutcome]]


def one_device(
    claim: ClaimRef, request: str = "gpu", share_id: str | None = None
) -> PrepareOutcome:
    """A successful outcome with one device whose names derive from the claim."""
    return PrepareOutcome(
        devices=(
            PlainPreparedDevice(
                request_names=(request,),
                pool_name="node-1",
                device_name="gpu-0",
                cdi_device_ids=(f"k8s.gpu.sharegpu.dev/claim={claim.uid}-gpu-0",),
                share_id=share_id,
            ),
        )
    )


class FakePreparer:
    """Records every call; answers with ``prepare_fn``/``unprepare_fn`` (default: one device
    per claim, and success)."""

    def __init__(
        self, prepare_fn: PrepareFn | None = None, unprepare_fn: UnprepareFn | None = None
    ) -> None:
        self.prepare_fn = prepare_fn or (lambda claims: {c.uid: one_device(c) for c in claims})
        self.unprepare_fn = unprepare_fn or (
            lambda claims: {c.uid: UnprepareOutcome() for c in claims}
        )
        self.prepare_calls: list[list[ClaimRef]] = []
        self.unprepare_calls: list[list[ClaimRef]] = []
        self._lock = threading.Lock()

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        with self._lock:
            self.prepare_calls.append(list(claims))
        return self.prepare_fn(claims)

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        with self._lock:
            self.unprepare_calls.append(list(claims))
        return self.unprepare_fn(claims)


@dataclass(frozen=True)
class Dirs:
    root: Path
    registry: Path
    data: Path


@contextmanager
def socket_dirs() -> Iterator[Dirs]:
    """A fresh short directory under /tmp (unix socket paths must stay below 108 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="sg-", dir="/tmp"))
    try:
        yield Dirs(root=root, registry=root / "registry", data=root / "plugins" / DRIVER)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def running_server(
    dirs: Dirs,
    preparer: ClaimPreparer | None = None,
    health_source: HealthSource | None = None,
    max_workers: int = 32,
) -> Iterator[PluginServer]:
    server = PluginServer(
        DRIVER,
        dirs.registry,
        dirs.data,
        preparer or FakePreparer(),
        health_source=health_source,
        max_workers=max_workers,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=1.0)
