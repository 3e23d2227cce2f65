"""Injected GPU health for the mock backend: a watched YAML/JSON file.

The file maps a GPU (its index, as a number or a string, or its UUID) to an entry::

    0: {healthy: false, reason: "XID 79"}      # probes fail with this reason until changed
    GPU-6b2c...: {xids: [79, 13]}              # XID events, subject to the ignore list
    "2": {healthy: true}

Fields: ``healthy`` (bool, default true), ``reason`` (string, with ``healthy: false``),
``xids`` (list of non-negative integers). A missing or empty file means every GPU is healthy.

The file is polled every ``poll_interval`` seconds; whenever its content changes (or
:meth:`MockHealthChecker.reload` is called, e.g. from a SIGUSR1 handler) it is applied at once:
a GPU that became unhealthy is reported as a fault, and every listed XID is reported as an XID
event. An invalid file is logged with the problem and otherwise ignored (the previous content
stays in force).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from kubeletplugin.health.events import EventKind, HealthEvent
from kubeletplugin.health.monitor import EventHandler
from kubeletplugin.model import GpuInfo

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S: Final = 0.2
DEFAULT_MOCK_REASON: Final = "unhealthy (injected)"
_ENTRY_FIELDS: Final = ("healthy", "reason", "xids")


class HealthFileError(ValueError):
    """The health file is invalid; the message names the entry and field."""


@dataclass(frozen=True)
class InjectedHealth:
    """One GPU's entry of the health file."""

    healthy: bool = True
    reason: str = DEFAULT_MOCK_REASON
    xids: tuple[int, ...] = ()


def _resolve(key: Any, gpus: Sequence[GpuInfo]) -> str:
    """The UUID named by ``key`` (an index or a UUID)."""
    if isinstance(key, bool):
        raise HealthFileError(f"key {key!r}: expected a GPU index or UUID")
    text = str(key)
    for gpu in gpus:
        if text == gpu.uuid or (text.isdigit() and int(text) == gpu.index):
            return gpu.uuid
    known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
    raise HealthFileError(f"key {text!r}: no such GPU (known: {known})")


def _entry(where: str, value: Any) -> InjectedHealth:
    if value is None:
        return InjectedHealth()
    if not isinstance(value, Mapping):
        raise HealthFileError(f"{where}: expected a mapping with {', '.join(_ENTRY_FIELDS)}")
    unknown = [k for k in value if k not in _ENTRY_FIELDS]
    if unknown:
        raise HealthFileError(
            f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(_ENTRY_FIELDS)})"
        )
    healthy = value.get("healthy", True)
    if not isinstance(healthy, bool):
        raise HealthFileError(f"{where}.healthy: expected true or false, got {healthy!r}")
    reason = value.get("reason", DEFAULT_MOCK_REASON)
    if not isinstance(reason, str) or not reason:
        raise HealthFileError(f"{where}.reason: expected a non-empty string, got {reason!r}")
    xids = value.get("xids", [])
    if not isinstance(xids, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xids
    ):
        raise HealthFileError(f"{where}.xids: expected a list of non-negative integers")
    return InjectedHealth(healthy, reason, tuple(xids))


def parse_health_file(text: str, gpus: Sequence[GpuInfo]) -> dict[str, InjectedHealth]:
    """GPU UUID -> injected health; raise :class:`HealthFileError` on invalid content."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HealthFileError(f"not valid YAML or JSON: {exc}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise HealthFileError("expected a mapping of GPU index or UUID to an entry")
    result: dict[str, InjectedHealth] = {}
    for key, value in data.items():
        uuid = _resolve(key, gpus)
        if uuid in result:
            raise HealthFileError(f"key {key!r}: GPU {uuid} named twice")
        result[uuid] = _entry(f"entry {key!r}", value)
    return result


class MockHealthChecker:
    """A :class:`~kubeletplugin.health.monitor.HealthChecker` driven by a health file.

    With ``path`` None every GPU is always healthy.
    """

    def __init__(self, path: Path | None, poll_interval: float = DEFAULT_POLL_INTERVAL_S) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        self.path = path
        self.poll_interval = poll_interval
        self._gpus: tuple[GpuInfo, ...] = ()
        self._report: EventHandler | None = None
        self._lock = threading.Lock()
        self._injected: dict[str, InjectedHealth] = {}
        self._last_text: str | None = None
        self._reload = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, gpus: Sequence[GpuInfo], report: EventHandler) -> None:
        """Apply the file's current content and start polling it."""
        self._gpus = tuple(gpus)
        self._report = report
        if self.path is None:
            return
        self.check_file(force=True)
        self._thread = threading.Thread(target=self._poll, name="mock-health-file", daemon=True)
        self._thread.start()

    def reload(self) -> None:
        """Re-apply the file now, even if unchanged (safe to call from a signal handler)."""
        self._reload.set()

    def stop(self) -> None:
        """Stop polling."""
        self._stopping.set()
        self._reload.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def probe(self, gpu: GpuInfo) -> str | None:
        """The injected reason while the file marks ``gpu`` unhealthy, else None."""
        with self._lock:
            entry = self._injected.get(gpu.uuid)
        return entry.reason if entry is not None and not entry.healthy else None

    def _poll(self) -> None:
        while not self._stopping.is_set():
            forced = self._reload.wait(self.poll_interval)
            if self._stopping.is_set():
                return
            self._reload.clear()
            self.check_file(force=forced)

    def check_file(self, force: bool = False) -> None:
        """Read the file; apply it when it changed (or when ``force``)."""
        assert self.path is not None
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            text = ""
        except OSError as exc:
            log.warning("cannot read health file %s: %s", self.path, exc.strerror)
            return
        if text == self._last_text and not force:
            return
        self._last_text = text
        try:
            injected = parse_health_file(text, self._gpus)
        except HealthFileError as exc:
            log.error("health file %s ignored: %s", self.path, exc)
            return
        with self._lock:
            self._injected = injected
        log.info("applied health file %s (%d entries)", self.path, len(injected))
        report = self._report
        if report is None:
            return
        for uuid, entry in injected.items():
            if not entry.healthy:
                report(HealthEvent(uuid, EventKind.FAULT, detail=entry.reason))
            for xid in entry.xids:
                report(HealthEvent(uuid, EventKind.XID, xid=xid))
