"""The wire codecs of ``api/`` against the pydantic models they agree with: time per object.

Usage: python bench/wirecodecs.py [--rounds 20000]

Measures, on one measured share's usage and on a GPU status with eight measured allocations:

- reading a claim's ``status.devices[].data``: :func:`api.shareusage.read_usage_data` (what the
  tracker runs on every claim event), :func:`api.shareusage.read_usage` (the strict reader) and
  ``api.gpu.ShareUsage.model_validate``;
- writing the allocation's ``usage``: :func:`api.shareusage.usage_json` and the model's
  ``to_json_dict`` of an instance built from the same values;
- writing a GPU status: :func:`api.gpustatus.gpu_status_json` (what the tracker runs for every
  changed GPU) and validating plus dumping the same JSON through ``api.gpu.GpuStatus``.

Prints microseconds per object (best of three runs of ``--rounds`` each).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.gpu import GpuStatus, ShareUsage
from api.gpustatus import allocation_json, gpu_status_json
from api.shareusage import (
    MeasuredUsage,
    read_usage,
    read_usage_data,
    usage_data,
    usage_json,
)
from controller.reconcile import Alloc

USAGE = MeasuredUsage(
    used_memory=12 * 2**30,
    sm_utilization=37,
    processes=2,
    sampled_at="2026-01-02T03:04:05Z",
    overcommitted=("memory",),
    outside_mps=0,
)
ALLOCS = [
    Alloc(
        gpu="node-a-gpu-0",
        claim_namespace="ml",
        claim_name=f"train-{i}",
        claim_uid=f"uid-{i}",
        request="gpu",
        device="gpu-0",
        share_id=f"share-{i}",
        cores=12,
        memory=10 * 2**30,
        pods=((f"pod-{i}", f"pod-uid-{i}", ("main",)),),
        usage=USAGE,
    )
    for i in range(8)
]


def status() -> dict[str, object]:
    return gpu_status_json(
        capacity=(100, 80 * 2**30),
        allocated=(96, 80 * 2**30),
        allocations=[allocation_json(a) for a in ALLOCS],
        claim_count=len(ALLOCS),
    )


def per_object_us(fn: Callable[[], object], rounds: int) -> float:
    return min(timeit.repeat(fn, number=rounds, repeat=3)) / rounds * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    data = usage_data(USAGE)
    written = usage_json(USAGE)
    model = ShareUsage.model_validate(written)
    built = status()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("read claim data: read_usage_data", lambda: read_usage_data(data)),
        ("read claim data: read_usage (strict)", lambda: read_usage(data)),
        ("read usage: ShareUsage.model_validate", lambda: ShareUsage.model_validate(written)),
        ("write usage: usage_json", lambda: usage_json(USAGE)),
        ("write usage: ShareUsage.to_json_dict", model.to_json_dict),
        ("write GPU status (8 allocations): gpu_status_json", status),
        (
            "GPU status via GpuStatus.model_validate + to_json_dict",
            lambda: GpuStatus.model_validate(built).to_json_dict(),
        ),
    ]
    width = max(len(name) for name, _ in cases)
    for name, fn in cases:
        print(f"{name:<{width}}  {per_object_us(fn, args.rounds):8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
