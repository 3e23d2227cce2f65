"""How many shares one GPU may hold at once: the one rule the published slices obey.

Each share with the MPS strategy gets an MPS control daemon of its own (a pod on the node), and
MPS bounds how many client CUDA contexts a GPU serves: 16 per device before Volta (compute
capability below 7.0), 48 on Volta and later with CUDA 13.0 and earlier, 60 from CUDA 13.1 (the
"Limitations" of NVIDIA's Multi-Process Service guide). Every share holds at least one client
context, so a GPU never holds more shares than that. The node's ``--max-shares-per-gpu`` bounds
it further (0: MPS's bound alone).

Invariants: :func:`share_limit` is 1 to 60 for every GPU; a consumable device's smallest cores
request (:func:`min_share_cores`) is ``ceil(100 / limit)``, so kube-scheduler never fits more
than ``floor(100 / min_share_cores) <= limit`` shares on it; a partition profile of more parts
than the limit is not published. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Final

from api import names
from kubeletplugin.model import GpuInfo

#: MPS client contexts per device before Volta (compute capability below 7.0).
MPS_CLIENTS_PRE_VOLTA: Final = 16
#: MPS client contexts per device on Volta and later, CUDA 13.0 and earlier.
MPS_CLIENTS_VOLTA: Final = 48
#: MPS client contexts per device on Volta and later from CUDA 13.1.
MPS_CLIENTS_VOLTA_CUDA_13_1: Final = 60
#: The largest ``--max-shares-per-gpu`` accepted (no GPU serves more MPS clients).
MAX_SHARES_PER_GPU: Final = MPS_CLIENTS_VOLTA_CUDA_13_1

_VERSION: Final = re.compile(r"\s*(\d{1,4})(?:\.(\d{1,4}))?")


def _major_minor(raw: str) -> tuple[int, int] | None:
    match = _VERSION.match(raw)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def mps_client_limit(gpu: GpuInfo) -> int:
    """The MPS client contexts ``gpu`` serves (module docstring). A compute capability that
    cannot be read counts as pre-Volta and a CUDA version that cannot be read as before 13.1:
    the smaller bound wins where the GPU is not known."""
    capability = _major_minor(gpu.cuda_compute_capability)
    if capability is None or capability < (7, 0):
        return MPS_CLIENTS_PRE_VOLTA
    cuda = _major_minor(gpu.cuda_driver_version)
    if cuda is not None and cuda >= (13, 1):
        return MPS_CLIENTS_VOLTA_CUDA_13_1
    return MPS_CLIENTS_VOLTA


def share_limit(gpu: GpuInfo, max_shares: int) -> int:
    """The most shares ``gpu`` holds at once: :func:`mps_client_limit`, and at most
    ``max_shares`` unless that is 0."""
    limit = mps_client_limit(gpu)
    return min(limit, max_shares) if max_shares > 0 else limit


def min_share_cores(limit: int) -> int:
    """The smallest cores request of a consumable GPU that holds at most ``limit`` shares
    (``ceil(100 / limit)``; a request below it is charged it, kube-scheduler's rounding)."""
    if limit < 1:
        raise ValueError(f"share limit must be at least 1, got {limit}")
    return -(-names.CORES_PER_GPU // limit)
