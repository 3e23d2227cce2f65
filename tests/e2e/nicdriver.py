"""A test-only DRA driver for RDMA NICs, the second driver of the GPU-and-NIC example
(examples/gpu-and-nic-same-pcie-root): it publishes NICs the way DRANET does (driver and
DeviceClass ``dra.net``, attribute ``dra.net/rdma``, the standard
``resource.kubernetes.io/pcieRoot`` and ``pciBusID``), so that example applies unchanged.

``python -m tests.e2e.nicdriver`` is its kubelet plugin for one node: it publishes the node's
ResourceSlice (:func:`nic_slice`), then serves DRA and kubelet registration through this
project's gRPC layer (:class:`~kubeletplugin.kubelet.server.PluginServer`). Preparing a claim
reads its allocation from the API server and writes one CDI spec per claim
(``dra.net-<claim uid>.json``, environment ``NIC_DEVICES`` and ``NIC_PCIE_ROOTS``) into the
node's CDI directory; unpreparing removes it. SIGTERM stops it; the slice is deleted on the way
out. :func:`start` runs it on a real node of the e2e harness.

Invariants: it only answers for results of its own driver and the node's pool; a claim that is
not allocated or does not exist gets an error, never a made-up device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from kubeletplugin.kubelet.preparer import ClaimRef, PrepareOutcome, UnprepareOutcome
from kubeletplugin.kubelet.server import PluginServer

#: The driver name and DeviceClass DRANET uses.
DRIVER: Final = "dra.net"
DEVICE_CLASS: Final = "dra.net"
CDI_KIND: Final = f"{DRIVER}/nic"
RESOURCE_API: Final = "/apis/resource.k8s.io/v1"

log = logging.getLogger("nicdriver")


@dataclasses.dataclass(frozen=True)
class Nic:
    """One RDMA NIC: its device name, PCIe root and PCI bus ID."""

    name: str
    pcie_root: str
    pci_bus_id: str


#: The NICs of the e2e node: ``nic-0`` under the PCIe root of the mock GPUs 4 to 7
#: (``pci0000:80``), ``nic-1`` under a root with no GPU (``pci0000:40``).
DEFAULT_NICS: Final = (
    Nic("nic-0", "pci0000:80", "0000:81:00.0"),
    Nic("nic-1", "pci0000:40", "0000:41:00.0"),
)


def device_class() -> dict[str, Any]:
    """The DeviceClass DRANET installs: every device of its driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def nic_device(nic: Nic) -> dict[str, Any]:
    return {
        "name": nic.name,
        "attributes": {
            "rdma": {"bool": True},
            "ifName": {"string": f"ib{nic.name.rsplit('-', 1)[-1]}"},
            "resource.kubernetes.io/pcieRoot": {"string": nic.pcie_root},
            "resource.kubernetes.io/pciBusID": {"string": nic.pci_bus_id},
        },
    }


def nic_slice(node: str, nics: Sequence[Nic] = DEFAULT_NICS) -> dict[str, Any]:
    """The node's one ResourceSlice of NICs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [nic_device(n) for n in nics],
        },
    }


def parse_nics(text: str) -> list[Nic]:
    """``name=root=bus,...`` -> NICs (the ``--nics`` flag)."""
    nics = []
    for item in text.split(","):
        parts = item.split("=")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"--nics entry {item!r} is not name=pcieRoot=pciBusID")
        nics.append(Nic(*parts))
    return nics


@dataclasses.dataclass(frozen=True)
class PreparedNic:
    """One prepared NIC, as the gRPC layer answers it to the kubelet."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


class NicPreparer:
    """Prepares the NICs of a claim: reads the claim (``get``: path -> object or None) and
    writes its CDI spec into ``cdi_dir``."""

    def __init__(self, get: Any, node: str, nics: Sequence[Nic], cdi_dir: Path) -> None:
        self._get = get
        self._node = node
        self._nics = {n.name: n for n in nics}
        self._cdi_dir = cdi_dir

    def spec_path(self, uid: str) -> Path:
        return self._cdi_dir / f"{DRIVER}-{uid}.json"

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        return {c.uid: self._prepare(c) for c in claims}

    def _prepare(self, ref: ClaimRef) -> PrepareOutcome:
        path = f"{RESOURCE_API}/namespaces/{ref.namespace}/resourceclaims/{ref.name}"
        claim = self._get(path)
        if claim is None or claim.get("metadata", {}).get("uid") != ref.uid:
            return PrepareOutcome(error=f"claim {ref.namespace}/{ref.name} ({ref.uid}) not found")
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
        mine = [
            r
            for r in results.get("results") or []
            if r.get("driver") == DRIVER and r.get("pool") == self._node
        ]
        unknown = [r["device"] for r in mine if r.get("device") not in self._nics]
        if not mine or unknown:
            return PrepareOutcome(error=f"claim {ref.name}: no NIC of this node ({unknown})")
        nics = [self._nics[r["device"]] for r in mine]
        device = ref.uid
        spec = {
            "cdiVersion": "0.6.0",
            "kind": CDI_KIND,
            "devices": [
                {
                    "name": device,
                    "containerEdits": {
                        "env": [
                            "NIC_DEVICES=" + ",".join(n.name for n in nics),
                            "NIC_PCIE_ROOTS=" + ",".join(n.pcie_root for n in nics),
                        ]
                    },
                }
            ],
        }
        target = self.spec_path(ref.uid)
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(spec))
        partial.replace(target)
        cdi_id = f"{CDI_KIND}={device}"
        return PrepareOutcome(
            devices=tuple(
                PreparedNic((r["request"],), self._node, r["device"], (cdi_id,)) for r in mine
            )
        )

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        for claim in claims:
            self.spec_path(claim.uid).unlink(missing_ok=True)
        return {c.uid: UnprepareOutcome() for c in claims}


def main(argv: Sequence[str] | None = None) -> int:
    from sharegpu.kube.rest import KubeApiError, KubeRest, load_connection

    parser = argparse.ArgumentParser(prog="nicdriver", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--registry-dir", required=True, type=Path)
    parser.add_argument("--plugins-dir", required=True, type=Path)
    parser.add_argument("--cdi-dir", required=True, type=Path)
    parser.add_argument("--nics", type=parse_nics, default=list(DEFAULT_NICS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rest = KubeRest(load_connection(args.kubeconfig))

    def get(path: str) -> dict[str, Any] | None:
        try:
            return rest.get(path, expected=(404,))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    slice_ = nic_slice(args.node_name, args.nics)
    slice_path = f"{RESOURCE_API}/resourceslices/{slice_['metadata']['name']}"
    if get(slice_path) is not None:
        rest.request("DELETE", slice_path)
    rest.request("POST", f"{RESOURCE_API}/resourceslices", body=slice_)
    log.info("published %s", slice_path)
    args.cdi_dir.mkdir(parents=True, exist_ok=True)
    preparer = NicPreparer(get, args.node_name, args.nics, args.cdi_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with PluginServer(DRIVER, args.registry_dir, args.plugins_dir / DRIVER, preparer):
        log.info("serving %s for node %s", DRIVER, args.node_name)
        stop.wait()
    try:
        rest.request("DELETE", slice_path, expected=(404,))
    except KubeApiError as exc:
        log.warning("slice not deleted: %s", exc)
    return 0


def start(plane: Any, node: Any) -> Any:
    """Run the NIC driver's kubelet plugin for the real ``node`` of the e2e harness (admin
    credentials) and wait until its slice is published and its registration socket is there."""
    from tests.e2e.kubelet import wait_for_kubelet_plugin
    from tests.paths import REPO_ROOT

    (node.plugins_dir / DRIVER).mkdir(parents=True, exist_ok=True)
    process = plane.processes.start(
        "nic-driver",
        [
            sys.executable,
            "-m",
            "tests.e2e.nicdriver",
            f"--kubeconfig={plane.admin_kubeconfig}",
            f"--node-name={node.name}",
            f"--registry-dir={node.registry_dir}",
            f"--plugins-dir={node.plugins_dir}",
            f"--cdi-dir={node.cdi_dir}",
        ],
        env={
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            )
        },
    )

    wait_for_kubelet_plugin(plane, node, DRIVER, "start the NIC driver", process)
    return process


if __name__ == "__main__":
    sys.exit(main())
