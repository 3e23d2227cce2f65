"""Throughput of DRA selector evaluation: device checks per second on one core.

Usage: python bench/cel.py [--seconds S]

Each check evaluates one compiled selector against one precomputed device activation, as
the allocator does. Prints one line per typical selector and the overall figure.
"""

from __future__ import annotations

import argparse
import time

from api import names
from sharegpu.cel import compile_selector, device_activation

DRIVER = names.DEFAULT_DRIVER_NAME
SELECTORS = {
    "productName equality": f"device.attributes['{DRIVER}'].productName == 'NVIDIA H100 80GB HBM3'",
    "memory compareTo quantity": (
        f"device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0"
    ),
    "semver compare": (
        f"device.attributes['{DRIVER}'].driverVersion.isGreaterThan(semver('550.0.0'))"
    ),
    "in guard": (
        f"'numaNode' in device.attributes['{DRIVER}'] && "
        f"device.attributes['{DRIVER}'].numaNode == 0"
    ),
    "driver equality": f"device.driver == '{DRIVER}'",
}


def sample_devices(count: int) -> list[dict[str, object]]:
    """Devices shaped like the ones the kubelet plugin publishes."""
    devices = []
    for i in range(count):
        devices.append(
            {
                "name": names.device_name(i),
                "attributes": {
                    "uuid": {"string": f"GPU-{i:08x}-0000-0000-0000-000000000000"},
                    "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    "index": {"int": i},
                    "driverVersion": {"version": "580.159.4"},
                    "cudaComputeCapability": {"version": "9.0.0"},
                    "numaNode": {"int": i // 4},
                    names.ATTR_PCIE_ROOT: {"string": f"pci0000:{i // 2:02x}"},
                },
                "capacity": {"memory": {"value": "81079Mi"}, "cores": {"value": "100"}},
                "allowMultipleAllocations": True,
            }
        )
    return devices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per selector")
    args = parser.parse_args()
    activations = [device_activation(DRIVER, d) for d in sample_devices(8)]
    total_checks = 0
    total_time = 0.0
    for label, expression in SELECTORS.items():
        program = compile_selector(expression)
        checks = 0
        start = time.perf_counter()
        deadline = start + args.seconds
        while time.perf_counter() < deadline:
            for activation in activations:
                program.evaluate(activation)
            checks += len(activations)
        elapsed = time.perf_counter() - start
        total_checks += checks
        total_time += elapsed
        print(f"{label:28s} {checks / elapsed:>10,.0f} checks/s")
    print(f"{'overall':28s} {total_checks / total_time:>10,.0f} checks/s")


if __name__ == "__main__":
    main()
