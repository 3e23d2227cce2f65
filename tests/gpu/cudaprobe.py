"""Allocate device memory through the CUDA driver API (ctypes over libcuda; no toolkit needed).

Usage: ``python cudaprobe.py GIB`` (a positive number of GiB). Prints one JSON line
``{"gib": .., "step": .., "code": .., "sms": ..}`` and exits 0 when ``cuMemAlloc`` of that size
succeeded, 1 when the allocation failed, 2 when CUDA could not start (``step`` names the call that
failed), 64 for bad arguments. Standalone: it runs with only an emulated container's environment.
"""

from __future__ import annotations

import ctypes
import json
import sys
from collections.abc import Callable
from typing import Any, Final

GIB: Final = 1024**3
#: ``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`` in cuda.h.
ATTR_SM_COUNT: Final = 16
EXIT_OK, EXIT_ALLOC, EXIT_START, EXIT_USAGE = 0, 1, 2, 64


class UsageError(ValueError):
    """Bad command line; the message says what is expected."""


def parse_gib(argv: list[str]) -> float:
    """The GiB to allocate from ``argv`` (without the program name)."""
    if len(argv) != 1:
        raise UsageError("usage: cudaprobe.py GIB (one positive number)")
    try:
        gib = float(argv[0])
    except ValueError:
        raise UsageError(f"GIB must be a number, got {argv[0]!r}") from None
    if not 0 < gib < 1 << 20:
        raise UsageError(f"GIB must be positive and below 1048576, got {argv[0]!r}")
    return gib


def probe(gib: float, library: str = "libcuda.so.1") -> tuple[int, dict[str, object]]:
    """(exit status, report) of one allocation of ``gib`` GiB on device 0."""
    report: dict[str, object] = {"gib": gib, "step": "load", "code": None, "sms": None}
    try:
        cuda: Any = ctypes.CDLL(library)
    except OSError as exc:
        report["code"] = str(exc)
        return EXIT_START, report
    device, context, sms = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
    steps: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
        (
            "cuDevicePrimaryCtxRetain",
            lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
        ),
        ("cuCtxSetCurrent", lambda: cuda.cuCtxSetCurrent(context)),
        (
            "cuDeviceGetAttribute",
            lambda: cuda.cuDeviceGetAttribute(ctypes.byref(sms), ATTR_SM_COUNT, device),
        ),
    )
    for step, call in steps:
        report["step"], report["code"] = step, int(call())
        if report["code"] != 0:
            return EXIT_START, report
    report["sms"] = sms.value
    pointer = ctypes.c_uint64()
    report["step"] = "cuMemAlloc_v2"
    report["code"] = int(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(gib * GIB))))
    if report["code"] != 0:
        return EXIT_ALLOC, report
    cuda.cuMemFree_v2(pointer)
    cuda.cuDevicePrimaryCtxRelease(device)
    return EXIT_OK, report


def main(argv: list[str]) -> int:
    try:
        gib = parse_gib(argv[1:])
    except UsageError as exc:
        print(f"cudaprobe.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    status, report = probe(gib)
    print(json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
