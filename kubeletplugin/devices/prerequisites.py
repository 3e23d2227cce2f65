"""Start-up check: will workloads get the NVIDIA driver libraries?

The plugin's claim specs carry device nodes and environment only; the driver's user-space
libraries (``libcuda.so``, ``libnvidia-ml.so``, ...) and tools reach a container in one of two
ways, both from the NVIDIA Container Toolkit:

1. the toolkit's CDI spec (kind ``nvidia.com/gpu``, written by ``nvidia-ctk cdi generate`` or
   the GPU Operator) in a CDI directory: the plugin then returns its device IDs with its own;
2. the ``nvidia`` runtime as containerd's default runtime (``default_runtime_name = "nvidia"``),
   whose hook injects the libraries into every container.

When neither is there, CUDA programs start and fail with "CUDA driver version is insufficient"
or "libcuda.so.1: cannot open shared object file"; :func:`driver_library_problem` says so in one
line at start instead.

Invariants: the check reads files only, never raises for a missing or malformed file (an
unreadable containerd config makes the finding a warning, since the runtime might still be set
up), and returns at most one finding.
"""

from __future__ import annotations

import glob
import logging
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

DEFAULT_CONTAINERD_CONFIG: Final = Path("/etc/containerd/config.toml")
NVIDIA_RUNTIME: Final = "nvidia"
#: Deepest chain of ``imports`` followed (containerd itself allows one level).
MAX_IMPORT_DEPTH: Final = 4


@dataclass(frozen=True)
class Finding:
    """One start-up finding: the logging level and the one-line message."""

    level: int
    message: str


class _Unreadable(Exception):
    """Internal: the containerd config cannot be read or parsed (message: why)."""


def _load(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _Unreadable(f"{path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _Unreadable(f"{path} is not valid TOML: {exc}") from None


def _documents(path: Path, depth: int = 0) -> Iterator[dict[str, Any]]:
    """``path`` and then the files its ``imports`` name (globs, relative to its directory), in
    the order containerd merges them (later documents win)."""
    doc = _load(path)
    yield doc
    if depth >= MAX_IMPORT_DEPTH:
        return
    imports = doc.get("imports")
    for pattern in imports if isinstance(imports, list) else []:
        if not isinstance(pattern, str):
            continue
        full = pattern if Path(pattern).is_absolute() else str(path.parent / pattern)
        for match in sorted(glob.glob(full)):
            try:
                yield from _documents(Path(match), depth + 1)
            except _Unreadable as exc:
                log.debug("skipping an unreadable containerd drop-in: %s", exc)


def _runtime_names(doc: dict[str, Any]) -> Iterator[str]:
    """Every ``plugins.<cri plugin>.containerd.default_runtime_name`` of one document
    (``io.containerd.grpc.v1.cri`` in config version 2, ``io.containerd.cri.v1.runtime`` in 3)."""
    plugins = doc.get("plugins")
    for plugin in plugins.values() if isinstance(plugins, dict) else []:
        section = plugin.get("containerd") if isinstance(plugin, dict) else None
        name = section.get("default_runtime_name") if isinstance(section, dict) else None
        if isinstance(name, str):
            yield name


def containerd_default_runtime(config: Path) -> str | None:
    """containerd's default runtime name (the last one set wins), None when the config sets
    none (containerd then uses ``runc``). Raises :class:`_Unreadable`."""
    found: str | None = None
    for doc in _documents(config):
        for name in _runtime_names(doc):
            found = name
    return found


def driver_library_problem(
    cdi_spec_found: bool,
    cdi_kind: str,
    cdi_dirs: Sequence[Path],
    containerd_config: Path | None = DEFAULT_CONTAINERD_CONFIG,
) -> Finding | None:
    """None when workloads get the driver libraries (a CDI spec of ``cdi_kind`` was found, or
    ``nvidia`` is containerd's default runtime), else one error (a warning when the containerd
    config cannot be read: the runtime may still be set up)."""
    if cdi_spec_found:
        return None
    where = ", ".join(str(d) for d in cdi_dirs) or "no CDI directory"
    head = (
        f"workloads will get no NVIDIA driver libraries: no CDI spec of kind {cdi_kind} in {where}"
    )
    fix = (
        "install the NVIDIA Container Toolkit and run 'nvidia-ctk cdi generate "
        "--output=/var/run/cdi/nvidia.yaml', or make nvidia containerd's default runtime"
    )
    if containerd_config is None:
        return Finding(logging.ERROR, f"{head}; {fix}")
    try:
        runtime = containerd_default_runtime(containerd_config)
    except _Unreadable as exc:
        return Finding(
            logging.WARNING,
            f"{head}, and containerd's default runtime is unknown ({exc}); unless it is "
            f"nvidia, {fix}",
        )
    if runtime == NVIDIA_RUNTIME:
        return None
    return Finding(
        logging.ERROR,
        f"{head}, and containerd's default runtime is {runtime or 'runc'!r}, not "
        f"{NVIDIA_RUNTIME!r} ({containerd_config}); {fix}",
    )


def check_driver_libraries(
    cdi_spec_found: bool,
    cdi_kind: str,
    cdi_dirs: Sequence[Path],
    containerd_config: Path | None = DEFAULT_CONTAINERD_CONFIG,
) -> bool:
    """Log the finding of :func:`driver_library_problem` (one line); True when there is none."""
    finding = driver_library_problem(cdi_spec_found, cdi_kind, cdi_dirs, containerd_config)
    if finding is None:
        return True
    log.log(finding.level, "%s", finding.message)
    return False
