"""Upstream's DRA test driver (``k8s.io/kubernetes/test/e2e/dra/test-driver`` at the pinned
Kubernetes release), the Go peer the benchmarks measure sharegpu against.

:func:`start` runs its ``kubelet-plugin`` on a real node of the e2e harness, beside sharegpu's
plugin, with its own driver name (:data:`DRIVER`) and DeviceClass (:data:`DEVICE_CLASS`): it
registers with the kubelet, publishes ``--num-devices`` devices (``device-00``...) with no
attributes and writes a CDI spec per claim into the node's CDI directory. :func:`slice_for`
builds the same slice for a Node object without a kubelet (the scheduling bench), and
:func:`claim_spec` is upstream's simplest claim shape (one device of the class).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from tests.e2e.binaries import TEST_DRIVER, test_driver_dir
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import RealNode, wait_for_kubelet_plugin
from tests.e2e.processes import Process

#: The test driver's default driver name (its ``--drivername``).
DRIVER: Final = "test-driver.cdi.k8s.io"
#: The DeviceClass of its devices (upstream's deploy/example/deviceclass.yaml, renamed).
DEVICE_CLASS: Final = "bench-test-driver"


def binary() -> Path | None:
    """The built test driver, or None (``tests/e2e/build-binaries.sh test-driver`` builds it)."""
    path = test_driver_dir() / TEST_DRIVER
    return path if os.access(path, os.X_OK) else None


def device_class() -> dict[str, Any]:
    """Every device of :data:`DRIVER`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_spec() -> dict[str, Any]:
    """One device of :data:`DEVICE_CLASS` (upstream's deploy/example/resourceclaim.yaml)."""
    return {
        "devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": DEVICE_CLASS}}]}
    }


def slice_for(node: str, devices: int) -> dict[str, Any]:
    """The ResourceSlice the test driver publishes for ``node`` with ``--num-devices=devices``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"device-{i:02d}"} for i in range(devices)],
        },
    }


def start(plane: ControlPlane, node: RealNode, devices: int, executable: Path) -> Process:
    """Run the test driver's kubelet plugin for ``node`` (admin credentials) and wait until its
    ResourceSlice is published and its registration socket is there. Its data directory is
    created first: the driver creates only the directory above it."""
    (node.plugins_dir / DRIVER).mkdir(parents=True, exist_ok=True)
    node.cdi_dir.mkdir(parents=True, exist_ok=True)
    process = plane.processes.start(
        "test-driver",
        [
            str(executable),
            f"--kubeconfig={plane.admin_kubeconfig}",
            "kubelet-plugin",
            f"--node-name={node.name}",
            f"--num-devices={devices}",
            f"--datadir={node.plugins_dir}",
            f"--plugin-registration-path={node.registry_dir}",
            f"--cdi-dir={node.cdi_dir}",
        ],
    )

    wait_for_kubelet_plugin(plane, node, DRIVER, "start the test driver", process)
    return process
