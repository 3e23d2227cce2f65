"""A CUDA client for the real-GPU test, over the driver API (ctypes over libcuda; no toolkit).

Usage (standalone: it runs with only an emulated container's environment):

- ``python cudaprobe.py GIB``: one ``cuMemAlloc`` of GIB GiB (a positive number); exits 0 when it
  succeeded, 1 when the allocation failed;
- ``python cudaprobe.py hold GIB``: like GIB, but keeps the allocation, prints its line, and
  holds it until its standard input closes (a client that runs while others start);
- ``python cudaprobe.py compute ITERATIONS BLOCKS``: loads :data:`PTX` with ``cuModuleLoadData``
  (the driver JITs it for the GPU), runs ``spin`` once briefly to warm up, then launches it over
  a fixed grid of BLOCKS blocks (the caller sizes it from the whole GPU, :data:`BLOCKS_PER_SM`
  per SM: under MPS the SM count a client reads is already its share's, so a grid sized from it
  would take the same time in every share) with ITERATIONS loop turns per thread; ``seconds``
  is the wall time of that launch up to ``cuCtxSynchronize``; exits 0;
- ``python cudaprobe.py fault``: launches ``fault``, which stores through a null pointer (an MMU
  fault, XID 31); exits 3 when the synchronize reports the fault (``code`` is its CUDA error),
  0 if it did not fault.

Every mode prints one JSON line (``mode``, ``step``, ``code``, ``sms`` and the mode's result) and
exits 2 when CUDA could not start or another driver call failed (``step`` names the call,
``code`` its result), 64 for bad arguments.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

GIB: Final = 1024**3
#: ``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`` in cuda.h.
ATTR_SM_COUNT: Final = 16
EXIT_OK, EXIT_ALLOC, EXIT_START, EXIT_FAULTED, EXIT_USAGE = 0, 1, 2, 3, 64
MODES: Final = ("alloc", "hold", "compute", "fault")
MAX_BLOCKS: Final = 2**31 - 1
#: Blocks per SM of the compute launch and threads per block.
BLOCKS_PER_SM: Final = 64
THREADS: Final = 256
#: Loop turns of the warm-up launch (loads the module's code onto the GPU).
WARMUP_ITERATIONS: Final = 1000
MAX_ITERATIONS: Final = 2**32 - 1

#: ``spin(out, n)``: n dependent FMAs per thread; the result is stored only when it is exactly
#: zero (never, but the compiler cannot know), so the loop is not removed. ``fault(p)``: stores
#: through ``p``. PTX ISA 7.0 / sm_80 is JIT-compiled by the driver for any later GPU (H100, H200).
PTX: Final = r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry spin(.param .u64 out, .param .u32 n)
{
    .reg .pred %p<3>;
    .reg .b32 %i, %n;
    .reg .f32 %x;
    .reg .b64 %o;
    ld.param.u64 %o, [out];
    ld.param.u32 %n, [n];
    mov.u32 %i, 0;
    mov.f32 %x, 0f3F800000;
LOOP:
    fma.rn.f32 %x, %x, 0f3F7FFFF0, 0f33D6BF95;
    add.u32 %i, %i, 1;
    setp.lt.u32 %p1, %i, %n;
    @%p1 bra LOOP;
    setp.eq.f32 %p2, %x, 0f00000000;
    @!%p2 bra DONE;
    cvta.to.global.u64 %o, %o;
    st.global.f32 [%o], %x;
DONE:
    ret;
}

.visible .entry fault(.param .u64 p)
{
    .reg .b64 %a;
    .reg .b32 %v;
    ld.param.u64 %a, [p];
    mov.u32 %v, 1;
    st.global.u32 [%a], %v;
    ret;
}
"""


class UsageError(ValueError):
    """Bad command line; the message says what is expected."""


@dataclass(frozen=True)
class Request:
    """What to do: ``mode`` in :data:`MODES`; ``gib`` for alloc and hold, ``iterations`` and
    ``blocks`` for compute."""

    mode: str
    gib: float = 0.0
    iterations: int = 0
    blocks: int = 0


USAGE: Final = "usage: cudaprobe.py GIB | hold GIB | compute ITERATIONS BLOCKS | fault"


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


def _bounded_int(name: str, text: str, limit: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {text!r}") from None
    if not 0 < value <= limit:
        raise UsageError(f"{name} must be in 1..{limit}, got {text!r}")
    return value


def parse_args(argv: list[str]) -> Request:
    """The request of ``argv`` (without the program name); :class:`UsageError` when bad."""
    if argv[:1] == ["fault"]:
        if len(argv) != 1:
            raise UsageError(f"fault takes no arguments; {USAGE}")
        return Request("fault")
    if argv[:1] == ["hold"]:
        return Request("hold", gib=parse_gib(argv[1:]))
    if argv[:1] == ["compute"]:
        if len(argv) != 3:
            raise UsageError(f"compute takes two arguments; {USAGE}")
        iterations = _bounded_int("ITERATIONS", argv[1], MAX_ITERATIONS)
        blocks = _bounded_int("BLOCKS", argv[2], MAX_BLOCKS)
        return Request("compute", iterations=iterations, blocks=blocks)
    return Request("alloc", gib=parse_gib(argv))


class CudaFailed(Exception):
    """A driver call returned an error; the report names it."""


class Cuda:
    """A context on device 0; every call records its name and result in ``report``."""

    def __init__(self, library: str, report: dict[str, object]) -> None:
        self.report = report
        self.lib: Any = ctypes.CDLL(library)
        self.lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p,
            *[ctypes.c_uint] * 7,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self.device, self.context, sms = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
        self.call("cuInit", lambda: self.lib.cuInit(0))
        self.call("cuDeviceGet", lambda: self.lib.cuDeviceGet(ctypes.byref(self.device), 0))
        self.call(
            "cuDevicePrimaryCtxRetain",
            lambda: self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device),
        )
        self.call("cuCtxSetCurrent", lambda: self.lib.cuCtxSetCurrent(self.context))
        self.call(
            "cuDeviceGetAttribute",
            lambda: self.lib.cuDeviceGetAttribute(ctypes.byref(sms), ATTR_SM_COUNT, self.device),
        )
        self.sms = sms.value
        report["sms"] = self.sms

    def call(self, step: str, call: Callable[[], Any]) -> None:
        """Run one driver call; :class:`CudaFailed` when it returns an error."""
        self.report["step"], self.report["code"] = step, int(call())
        if self.report["code"] != 0:
            raise CudaFailed(step)

    def function(self, name: str) -> ctypes.c_void_p:
        """``name`` from :data:`PTX` (the module is loaded on first use)."""
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        source = ctypes.c_char_p(PTX.encode())
        self.call(
            "cuModuleLoadData", lambda: self.lib.cuModuleLoadData(ctypes.byref(module), source)
        )
        self.call(
            "cuModuleGetFunction",
            lambda: self.lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()),
        )
        return function

    def launch(self, function: ctypes.c_void_p, blocks: int, args: list[Any]) -> None:
        """Launch ``function`` on ``blocks`` x :data:`THREADS` threads (no wait)."""
        params = (ctypes.c_void_p * len(args))(
            *[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args]
        )
        self.call(
            "cuLaunchKernel",
            lambda: self.lib.cuLaunchKernel(
                function, blocks, 1, 1, THREADS, 1, 1, 0, None, params, None
            ),
        )

    def synchronize(self) -> None:
        self.call("cuCtxSynchronize", lambda: self.lib.cuCtxSynchronize())

    def release(self) -> None:
        self.lib.cuDevicePrimaryCtxRelease(self.device)


def _alloc(cuda: Cuda, gib: float, report: dict[str, object], hold: bool = False) -> int:
    pointer = ctypes.c_uint64()
    try:
        cuda.call(
            "cuMemAlloc_v2",
            lambda: cuda.lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(gib * GIB))),
        )
    except CudaFailed:
        return EXIT_ALLOC
    if hold:
        print(json.dumps(report), flush=True)
        sys.stdin.read()
    cuda.lib.cuMemFree_v2(pointer)
    return EXIT_OK


def _compute(cuda: Cuda, iterations: int, blocks: int, report: dict[str, object]) -> int:
    out = ctypes.c_uint64()
    cuda.call(
        "cuMemAlloc_v2", lambda: cuda.lib.cuMemAlloc_v2(ctypes.byref(out), ctypes.c_size_t(4))
    )
    spin = cuda.function("spin")
    cuda.launch(spin, cuda.sms, [out, ctypes.c_uint32(WARMUP_ITERATIONS)])
    cuda.synchronize()
    started = time.perf_counter()
    cuda.launch(spin, blocks, [out, ctypes.c_uint32(iterations)])
    cuda.synchronize()
    report["seconds"] = time.perf_counter() - started
    report["blocks"] = blocks
    cuda.lib.cuMemFree_v2(out)
    return EXIT_OK


def _fault(cuda: Cuda, report: dict[str, object]) -> int:
    cuda.launch(cuda.function("fault"), 1, [ctypes.c_uint64(0)])
    try:
        cuda.synchronize()
    except CudaFailed:
        return EXIT_FAULTED
    return EXIT_OK


def probe(request: Request, library: str = "libcuda.so.1") -> tuple[int, dict[str, object]]:
    """(exit status, report) of ``request`` on device 0."""
    report: dict[str, object] = {"mode": request.mode, "step": "load", "code": None, "sms": None}
    if request.mode in ("alloc", "hold"):
        report["gib"] = request.gib
    try:
        cuda = Cuda(library, report)
    except OSError as exc:
        report["code"] = str(exc)
        return EXIT_START, report
    except CudaFailed:
        return EXIT_START, report
    try:
        if request.mode in ("alloc", "hold"):
            return _alloc(cuda, request.gib, report, hold=request.mode == "hold"), report
        if request.mode == "compute":
            return _compute(cuda, request.iterations, request.blocks, report), report
        return _fault(cuda, report), report
    except CudaFailed:
        return EXIT_START, report
    finally:
        cuda.release()


def main(argv: list[str]) -> int:
    try:
        request = parse_args(argv[1:])
    except UsageError as exc:
        print(f"cudaprobe.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    status, report = probe(request)
    print(json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
