"""An emulated container made from CDI specs: exactly the specs' environment and bind mounts.

:func:`plan_for` merges the edits of the CDI device IDs kubelet would pass to the runtime, in the
CDI library's order: for each ID, its spec's top-level edits (once per spec, with the first of its
devices) and then the device's edits; an ``env`` entry replaces an earlier one of the same name,
mounts keep their order. :mod:`tests.gpu.enter` applies the plan in a private mount namespace.

Invariants:
- only what a spec says reaches the process: no variable of the caller's environment is added;
- every mount is a bind mount (``type`` absent or ``bind``); ``ro`` makes it read-only and
  ``rbind`` recursive; any other mount type, an unknown option or a hook is a :class:`CdiError`
  naming it (the emulation would silently differ from a runtime otherwise);
- device nodes are not recreated (the emulated container shares the host's ``/dev``); each must
  exist on the host.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

#: The script that applies a plan (:mod:`tests.gpu.enter`).
ENTER: Final = Path(__file__).with_name("enter.py")
#: Mount options that change nothing for a bind mount made by :mod:`tests.gpu.enter`.
_NEUTRAL_OPTIONS: Final = frozenset({"bind", "rw", "nosuid", "nodev", "noexec", "private"})


class CdiError(ValueError):
    """A CDI spec or ID the emulation cannot follow; the message names it."""


@dataclass(frozen=True)
class BindMount:
    source: str
    target: str
    read_only: bool = False
    recursive: bool = False


@dataclass(frozen=True)
class ContainerPlan:
    """What :mod:`tests.gpu.enter` sets up before it runs ``argv`` as ``uid``."""

    env: Mapping[str, str]
    mounts: tuple[BindMount, ...]
    device_nodes: tuple[str, ...] = ()

    def to_json(self, argv: Sequence[str], uid: int) -> str:
        return json.dumps(
            {
                "env": dict(self.env),
                "mounts": [vars(m) for m in self.mounts],
                "argv": list(argv),
                "uid": uid,
            }
        )


def load_specs(cdi_dir: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` spec in ``cdi_dir`` (the project writes JSON), by file name."""
    specs = []
    for path in sorted(cdi_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
            raise CdiError(f"{path}: not a CDI spec (no kind)")
        specs.append(doc)
    return specs


def _device(specs: Sequence[Mapping[str, Any]], cdi_id: str) -> tuple[int, Mapping[str, Any]]:
    kind, sep, name = cdi_id.partition("=")
    if not sep or not kind or not name:
        raise CdiError(f"CDI device ID {cdi_id!r} is not of the form vendor/class=name")
    for index, spec in enumerate(specs):
        if spec.get("kind") != kind:
            continue
        for device in spec.get("devices") or ():
            if device.get("name") == name:
                return index, device
    raise CdiError(f"no CDI spec has the device {cdi_id!r}")


def _mount(raw: Mapping[str, Any]) -> BindMount:
    source, target = raw.get("hostPath"), raw.get("containerPath")
    if not isinstance(source, str) or not isinstance(target, str):
        raise CdiError(f"mount {raw!r} lacks hostPath or containerPath")
    if raw.get("type") not in (None, "bind"):
        raise CdiError(f"mount of {target}: type {raw.get('type')!r} is not emulated")
    options = set(raw.get("options") or ())
    unknown = options - _NEUTRAL_OPTIONS - {"ro", "rbind"}
    if unknown:
        raise CdiError(f"mount of {target}: options {sorted(unknown)} are not emulated")
    return BindMount(source, target, read_only="ro" in options, recursive="rbind" in options)


def _apply(edits: Mapping[str, Any], env: dict[str, str], mounts: list[BindMount]) -> list[str]:
    if edits.get("hooks"):
        raise CdiError("CDI hooks are not emulated")
    for entry in edits.get("env") or ():
        key, sep, value = str(entry).partition("=")
        if not sep or not key:
            raise CdiError(f"env entry {entry!r} is not KEY=VALUE")
        env.pop(key, None)  # a later entry replaces an earlier one (and comes last)
        env[key] = value
    mounts.extend(_mount(m) for m in edits.get("mounts") or ())
    nodes = []
    for node in edits.get("deviceNodes") or ():
        host = node.get("hostPath") or node.get("path")
        if not isinstance(host, str):
            raise CdiError(f"device node {node!r} has no path")
        nodes.append(host)
    return nodes


def plan_for(
    specs: Sequence[Mapping[str, Any]], cdi_ids: Iterable[str], skip_kinds: Iterable[str] = ()
) -> ContainerPlan:
    """The container kubelet's runtime would make for ``cdi_ids`` (IDs of a kind in
    ``skip_kinds``, such as the NVIDIA toolkit's, are left out: the host provides the driver)."""
    skipped = set(skip_kinds)
    env: dict[str, str] = {}
    mounts: list[BindMount] = []
    nodes: list[str] = []
    seen_specs: set[int] = set()
    for cdi_id in cdi_ids:
        if cdi_id.partition("=")[0] in skipped:
            continue
        index, device = _device(specs, cdi_id)
        if index not in seen_specs:
            seen_specs.add(index)
            nodes += _apply(specs[index].get("containerEdits") or {}, env, mounts)
        nodes += _apply(device.get("containerEdits") or {}, env, mounts)
    missing = [n for n in nodes if not Path(n).exists()]
    if missing:
        raise CdiError(f"device nodes absent on the host: {missing}")
    return ContainerPlan(env, tuple(mounts), tuple(nodes))


def missing_targets(plan: ContainerPlan) -> list[tuple[Path, bool]]:
    """``(path, is a directory)`` of the mount targets that do not exist on the host, parents
    first; :mod:`tests.gpu.enter` needs them, so the caller creates them (a directory, or an
    empty file for a file source) and removes them afterwards. A target inside an earlier
    mount's target is left out: that mount provides it."""
    out: list[tuple[Path, bool]] = []
    earlier: list[Path] = []
    for mount in plan.mounts:
        target = Path(mount.target)
        if any(target.is_relative_to(e) for e in earlier):
            continue
        earlier.append(target)
        known = {p for p, _ in out}
        chain = [p for p in (target, *target.parents) if not p.exists() and p not in known]
        for path in reversed(chain):
            out.append((path, path != target or Path(mount.source).is_dir()))
    return out


def enter_command(plan: ContainerPlan, argv: Sequence[str], uid: int) -> list[str]:
    """The host command (run as root) that runs ``argv`` as ``uid`` in the container of
    ``plan``: a new private mount namespace entered by :mod:`tests.gpu.enter`."""
    enter = [sys.executable, "-I", "-S", str(ENTER), plan.to_json(argv, uid)]
    return ["unshare", "--mount", "--propagation", "private", "--", *enter]
