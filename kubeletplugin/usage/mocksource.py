"""Configurable usage for the mock backend: a YAML/JSON file read at each sample.

The file maps a GPU (its index, as a number or a string, or its UUID) to a list of processes::

    0:
      - {claim: ml/small, memory: 12Gi, sm: 40}   # a process of claim ml/small (or its UID)
      - {claim: ml/large, memory: 1Gi}
    GPU-6b2c...:
      - {pid: 4242, memory: 2Gi}                  # a host process, mapped through /proc
    1:
      - {claim: ml/mps, pod: <uid>, mpsClient: true, memory: 3Gi}  # an MPS client
      - {pod: <uid of an MPS daemon pod>, memory: 64Mi, sm: 30}     # its MPS server
      - {pod: <uid>, memory: 2Gi, sm: 60}         # a plain process: outside MPS

Fields: ``claim`` (a claim UID or ``<namespace>/<name>``: the owner, no /proc lookup), ``pid``
(a positive host pid, looked up like an NVML process), ``pod`` (the pod UID the process's
cgroup names, no /proc lookup), ``mpsClient`` (true: NVML lists it among the GPU's MPS
clients), ``memory`` (a quantity, default 0), ``sm`` (0-100; not on an MPS client, whose SM
time NVML reports under its server). Each process needs a ``claim``, a ``pid`` or a ``pod``. A
GPU reports per-process utilisation only when one of its processes has ``sm`` (the others then
read 0); otherwise utilisation is absent, as on GPUs without support. The GPU's MPS clients are
always known, as on a driver that lists them. A GPU the file does not name has no processes; a
missing file means no processes anywhere. An invalid file fails every GPU's sample with the
problem (logged by the sampler), so a typo never reads as "idle".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import yaml

from api.quantity import QuantityError, quantity_int
from kubeletplugin.fsutil import read_bounded
from kubeletplugin.model import GpuInfo
from kubeletplugin.usage.model import GpuSample, ProcessSample
from kubeletplugin.usage.procfs import is_pod_uid
from kubeletplugin.usage.source import UsageSourceError

#: Largest usage file read.
MAX_FILE_BYTES: Final = 1024 * 1024
_FIELDS: Final = ("claim", "pid", "pod", "mpsClient", "memory", "sm")


def _gpu_uuid(key: Any, gpus: Sequence[GpuInfo]) -> str:
    if isinstance(key, bool):
        raise UsageSourceError(f"key {key!r}: expected a GPU index or UUID")
    text = str(key)
    for gpu in gpus:
        if text == gpu.uuid or (text.isdigit() and int(text) == gpu.index):
            return gpu.uuid
    raise UsageSourceError(f"key {text!r}: no such GPU")


def _process(where: str, value: Any) -> tuple[ProcessSample, int | None]:
    if not isinstance(value, Mapping):
        raise UsageSourceError(f"{where}: expected a mapping with {', '.join(_FIELDS)}")
    unknown = [k for k in value if k not in _FIELDS]
    if unknown:
        raise UsageSourceError(f"{where}: unknown field {unknown[0]!r} (allowed: {_FIELDS})")
    claim, pid = value.get("claim"), value.get("pid", 0)
    if claim is not None and (not isinstance(claim, str) or not claim):
        raise UsageSourceError(f"{where}.claim: expected a claim UID or namespace/name")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise UsageSourceError(f"{where}.pid: expected a positive integer, got {pid!r}")
    pod = value.get("pod")
    if pod is not None and (not isinstance(pod, str) or not is_pod_uid(pod)):
        raise UsageSourceError(f"{where}.pod: expected a pod UID (lower-case), got {pod!r}")
    client = value.get("mpsClient", False)
    if not isinstance(client, bool):
        raise UsageSourceError(f"{where}.mpsClient: expected true or false, got {client!r}")
    if claim is None and pid == 0 and pod is None:
        raise UsageSourceError(f"{where}: needs a claim, a pid or a pod")
    try:
        memory = quantity_int(value.get("memory", 0))
    except QuantityError as exc:
        raise UsageSourceError(f"{where}.memory: {exc}") from None
    if memory < 0:
        raise UsageSourceError(f"{where}.memory: must not be negative")
    sm = value.get("sm")
    if sm is not None and (not isinstance(sm, int) or isinstance(sm, bool) or not 0 <= sm <= 100):
        raise UsageSourceError(f"{where}.sm: expected 0 to 100, got {sm!r}")
    if sm is not None and client:
        raise UsageSourceError(
            f"{where}.sm: NVML reports an MPS client's SM time under its server, not the client"
        )
    return ProcessSample(pid, memory, claim, pod, client), sm


def parse_usage_file(text: str, gpus: Sequence[GpuInfo]) -> dict[str, GpuSample]:
    """GPU UUID -> its sample; raise :class:`UsageSourceError` on invalid content."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageSourceError(f"not valid YAML or JSON: {exc}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise UsageSourceError("expected a mapping of GPU index or UUID to a list of processes")
    out: dict[str, GpuSample] = {}
    for key, value in data.items():
        uuid = _gpu_uuid(key, gpus)
        if uuid in out:
            raise UsageSourceError(f"key {key!r}: GPU {uuid} named twice")
        if not isinstance(value, list):
            raise UsageSourceError(f"entry {key!r}: expected a list of processes")
        processes: list[ProcessSample] = []
        sm: dict[int, int] = {}
        reported = False
        for i, item in enumerate(value):
            process, util = _process(f"entry {key!r}[{i}]", item)
            # Processes without a pid get distinct negative ones, never a host pid.
            pid = process.pid or -(i + 1)
            processes.append(replace(process, pid=pid))
            sm[pid] = util or 0
            reported = reported or util is not None
        out[uuid] = GpuSample(uuid, tuple(processes), sm if reported else None, mps_listed=True)
    return out


class FileUsageSource:
    """A :class:`~kubeletplugin.usage.source.UsageSource` reading :func:`parse_usage_file`'s
    file at every sample (``path`` None: no processes)."""

    def __init__(self, path: Path | None, gpus: Sequence[GpuInfo]) -> None:
        self.path = path
        self._gpus = tuple(gpus)

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def sample(self, gpu_uuid: str, mps: bool = False) -> GpuSample:
        samples = self._read()
        return samples.get(gpu_uuid) or GpuSample(gpu_uuid, (), None, mps_listed=True)

    def _read(self) -> dict[str, GpuSample]:
        if self.path is None:
            return {}
        try:
            raw = read_bounded(self.path, MAX_FILE_BYTES + 1, follow=True)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise UsageSourceError(f"{self.path}: {exc.strerror or exc}") from None
        if len(raw) > MAX_FILE_BYTES:
            raise UsageSourceError(f"{self.path}: larger than {MAX_FILE_BYTES} bytes")
        try:
            return parse_usage_file(raw.decode("utf-8"), self._gpus)
        except UnicodeDecodeError:
            raise UsageSourceError(f"{self.path}: not UTF-8 text") from None
        except UsageSourceError as exc:
            raise UsageSourceError(f"{self.path}: {exc}") from None
