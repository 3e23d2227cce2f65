"""The seam between the MPS manager and whatever runs the MPS control daemons.

The manager decides when a claim's daemon on a GPU must run and which limits it starts with; a
:class:`DaemonLauncher` only makes the daemon process exist or not, outside the plugin container
so that it outlives plugin restarts and upgrades:
:class:`~kubeletplugin.sharing.daemonpods.PodLauncher` runs each daemon as its own pod;
:class:`~kubeletplugin.hosts.simtools.SimulatedLauncher` stands in for it with the mock backend.

Invariants every launcher keeps:

- ``launch`` of a daemon that already exists (in any phase) changes nothing: a daemon is never
  started twice for one claim and GPU;
- ``phase`` is :attr:`DaemonPhase.RUNNING` only for a daemon process that is running now; a
  daemon that exited, crashed or is being deleted is :attr:`DaemonPhase.FAILED`, never running
  (a zombie counts as dead);
- ``remove`` returns once the daemon is gone (``phase`` is :attr:`DaemonPhase.ABSENT`), or raises
  :class:`DaemonError`;
- ``present`` lists the ids of this node's daemons that exist, whatever their phase;
- ``phase``, ``remove`` and ``describe`` need only the spec's ``paths`` (a leftover daemon found by
  its id has no known claim or GPU).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kubeletplugin.sharing.mpspaths import MpsPaths


class DaemonError(RuntimeError):
    """A daemon that could not be created, inspected or removed; the message says why."""


class DaemonPhase(enum.Enum):
    ABSENT = "absent"
    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"


@dataclass(frozen=True)
class DaemonSpec:
    """What the daemon of one claim on one GPU runs with: its directories and its environment
    (``uuid``, ``claim_uid`` and ``env`` are empty for a leftover known only by its id)."""

    paths: MpsPaths
    #: ``CUDA_VISIBLE_DEVICES``, ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY`` and
    #: the share's default limits.
    env: Mapping[str, str] = field(default_factory=dict)
    uuid: str = ""
    claim_uid: str = ""

    @property
    def id(self) -> str:
        return self.paths.id


class DaemonLauncher(Protocol):
    """Creates, inspects and removes MPS control daemons (see the module docstring)."""

    def launch(self, spec: DaemonSpec) -> None: ...

    def phase(self, spec: DaemonSpec) -> DaemonPhase: ...

    def remove(self, spec: DaemonSpec) -> None: ...

    def present(self) -> list[str]: ...

    def describe(self, spec: DaemonSpec) -> str:
        """Where the daemon runs, for messages and the checkpoint (``pod <ns>/<name>``)."""
        ...


class NoLauncher:
    """For a plugin that cannot run daemons (no pod template configured): every launch fails
    with ``reason``; nothing is ever present."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def launch(self, spec: DaemonSpec) -> None:
        raise DaemonError(self.reason)

    def phase(self, spec: DaemonSpec) -> DaemonPhase:
        return DaemonPhase.ABSENT

    def remove(self, spec: DaemonSpec) -> None:
        return None

    def present(self) -> list[str]:
        return []

    def describe(self, spec: DaemonSpec) -> str:
        return "nowhere"
