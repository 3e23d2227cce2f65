"""``sharegpu demo --keep-running``: the demo cluster stays up for kubectl with a printed
kubeconfig, and is cleaned up (report printed) on SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import urllib3
import yaml

from api import names
from tests.helpers import PATIENCE_S, built_kubectl
from tests.paths import REPO_ROOT

#: How long the demo may take to allocate and prepare every example claim on a busy machine.
START_TIMEOUT_S = 240.0
DEMO = "import sys; from sharegpuctl.cli import main; sys.exit(main())"


@dataclass
class RunningDemo:
    process: subprocess.Popen[str]
    kubeconfig: str
    server: str
    stderr_lines: list[str]


def _lines(stream: IO[str], sink: queue.Queue[str | None]) -> None:
    for line in stream:
        sink.put(line)
    sink.put(None)


@pytest.fixture(scope="module")
def demo() -> Iterator[RunningDemo]:
    process = subprocess.Popen(
        [sys.executable, "-c", DEMO, "demo", "--keep-running", "-o", "json"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stderr, lines), daemon=True).start()
    seen: list[str] = []
    kubeconfig = None
    try:
        while kubeconfig is None:
            line = lines.get(timeout=START_TIMEOUT_S)
            assert line is not None, f"the demo ended before it printed a kubeconfig: {seen}"
            seen.append(line)
            match = re.search(r"export KUBECONFIG=(\S+)", line)
            kubeconfig = match.group(1) if match else None
        config = yaml.safe_load(Path(kubeconfig).read_text(encoding="utf-8"))
        server = config["clusters"][0]["cluster"]["server"]
        yield RunningDemo(process, kubeconfig, server, seen)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=PATIENCE_S * 4)


def test_the_printed_kubeconfig_reaches_the_running_cluster(demo: RunningDemo) -> None:
    assert any(line.startswith("The demo cluster is running: API") for line in demo.stderr_lines)
    resp = urllib3.request("GET", f"{demo.server}/apis/{names.GROUP_VERSION}/gpus")
    gpus = json.loads(resp.data)["items"]
    assert resp.status == 200 and len(gpus) == 8
    assert sum(g["status"]["claimCount"] for g in gpus) >= 7  # the examples' claims
    resp = urllib3.request("GET", f"{demo.server}/apis/resource.k8s.io/v1/resourceclaims")
    claims = json.loads(resp.data)["items"]
    assert claims and all(c["status"]["allocation"] for c in claims)


def test_kubectl_reads_the_demo_cluster(demo: RunningDemo, tmp_path: Path) -> None:
    kubectl = built_kubectl()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": demo.kubeconfig}
    out = subprocess.run(
        [kubectl, "get", "gpus"], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    header, *rows = out.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "NODE", "MODEL", "HEALTH"] and len(rows) == 8
    out = subprocess.run(
        [kubectl, "get", "resourceclaims", "-n", "default", "-o", "name"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert "resourceclaim.resource.k8s.io/whole-gpu" in out.stdout.splitlines()


def test_sigterm_cleans_up_and_prints_the_report(demo: RunningDemo) -> None:
    demo.process.send_signal(signal.SIGTERM)
    stdout, _ = demo.process.communicate(timeout=PATIENCE_S * 4)
    assert demo.process.returncode == 0
    report = json.loads(stdout)
    assert report["cleanup"]["tempDirRemoved"] and report["cleanup"]["cdiSpecsLeft"] == 0
    assert not Path(demo.kubeconfig).exists()
