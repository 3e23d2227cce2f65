"""Options of the real-GPU suite: ``--keep-gpu-settings`` (see :mod:`tests.gpu.settingsguard`)
and ``--gpu-report PATH`` (a JSON report: each test's outcome, seconds and recorded evidence, and
the setting changes recorded instead of run)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.runner import HostRunner
from tests.gpu.gpuenv import skip_reason
from tests.gpu.settingsguard import SettingsGuard

_GUARD_KEY = pytest.StashKey[SettingsGuard]()
_RESULTS_KEY = pytest.StashKey[list[dict[str, Any]]]()


def add_gpu_options(parser: pytest.Parser) -> None:
    """The suite's options (registered by the root conftest: options must exist at start)."""
    group = parser.getgroup("real GPU")
    group.addoption(
        "--keep-gpu-settings",
        action="store_true",
        help="record nvidia-smi compute-mode and time-slice changes instead of running them",
    )
    group.addoption("--gpu-report", metavar="PATH", help="write a JSON report of the GPU suite")


@pytest.fixture(scope="session", autouse=True)
def settings_guard(request: pytest.FixtureRequest) -> Iterator[SettingsGuard | None]:
    """The guard of ``--keep-gpu-settings`` (None without it)."""
    if not request.config.getoption("--keep-gpu-settings"):
        yield None
        return
    guard = SettingsGuard()
    request.config.stash[_GUARD_KEY] = guard
    original = guard.install()
    try:
        yield guard
    finally:
        HostRunner.run = original  # type: ignore[method-assign]


def result_entry(report: pytest.TestReport) -> dict[str, Any]:
    """One test's line of the report. An expected failure (``xfail``: an open finding that still
    holds) is ``xfailed`` with its reason; a strict xfail that passed is ``failed`` with a detail
    starting ``[XPASS(strict)]`` (the finding is fixed: the mark must go). ``properties`` holds
    what the test recorded with ``record_property`` (its evidence), whatever the outcome."""
    xfailed = report.skipped and hasattr(report, "wasxfail")
    entry: dict[str, Any] = {
        "test": report.nodeid,
        "outcome": "xfailed" if xfailed else report.outcome,
        "seconds": round(report.duration, 3),
        "detail": str(report.longrepr)[-2000:] if report.outcome != "passed" else "",
    }
    if xfailed:
        entry["reason"] = str(report.wasxfail)
    if report.user_properties:
        entry["properties"] = {str(k): v for k, v in report.user_properties}
    return entry


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome: Any = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        item.config.stash.setdefault(_RESULTS_KEY, []).append(result_entry(report))


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--gpu-report")
    if not path:
        return
    guard = session.config.stash.get(_GUARD_KEY, None)
    report = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "skipReason": skip_reason(),
        "keepGpuSettings": bool(session.config.getoption("--keep-gpu-settings")),
        "results": session.config.stash.get(_RESULTS_KEY, []),
        **(dict(guard.summary()) if guard else {}),
    }
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
