"""``python -m kubeletplugin`` as a process against the in-process API server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from api import names
from sharegpu.kube.slicerules import validate_resource_slice
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.helpers import eventually
from tests.kubeletplugin.publish.helpers import (
    DEADLINE,
    NODE,
    create_node,
    devices,
    is_consistent,
    pool,
)

pytestmark = pytest.mark.process

EXPECTED = {
    names.SHARING_MODE_CONSUMABLE: (1, 8),
    names.SHARING_MODE_PARTITIONS: (3, 120),
    names.SHARING_MODE_EXCLUSIVE: (1, 8),
}


def plugin_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("KUBECONFIG", "NODE_NAME", "DRIVER_NAME"):
        env.pop(var, None)
    return env


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_daemon_publishes_and_stops_cleanly_on_sigterm(
    apiserver: KubeAPIServer, tmp_path: Path, mode: str
) -> None:
    create_node(apiserver)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    log_file = tmp_path / "plugin.log"
    with log_file.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubeletplugin",
                "--device-backend",
                "mock",
                "--node-name",
                NODE,
                "--kubeconfig",
                kubeconfig,
                "--sharing-mode",
                mode,
                "--log-format",
                "json",
                "--plugin-data-dir",
                str(tmp_path / "data"),
                "--plugin-registry-dir",
                str(tmp_path / "registry"),
                "--cdi-dir",
                str(tmp_path / "cdi"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=plugin_env(),
        )
        try:
            count, device_count = EXPECTED[mode]

            def published() -> bool:
                slices = pool(apiserver)
                return is_consistent(slices, count) and len(devices(slices)) == device_count

            eventually(published, log_file.read_text, timeout_s=DEADLINE)
            for obj in pool(apiserver):
                assert validate_resource_slice(obj) == []
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=DEADLINE) == 0, log_file.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = log_file.read_text()
    assert "Traceback" not in output
    assert '"msg": "received SIGTERM, stopping"' in output
    # stopping leaves the slices for kubelet to clean up
    assert len(pool(apiserver)) == EXPECTED[mode][0]


def test_print_slices_needs_no_api_server() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeletplugin",
            "--device-backend",
            "mock",
            "--mock-gpus",
            "2",
            "--node-name",
            "demo",
            "--sharing-mode",
            "partitions",
            "--print-slices",
        ],
        capture_output=True,
        text=True,
        env=plugin_env(),
        timeout=DEADLINE,
        check=True,
    )
    slices = list(yaml.safe_load_all(out.stdout))
    assert [sorted(s["spec"]) for s in slices] == [
        ["driver", "nodeName", "pool", "sharedCounters"],
        ["devices", "driver", "nodeName", "pool"],
    ]
    assert len(slices[1]["spec"]["devices"]) == 30
    for obj in slices:
        assert validate_resource_slice(obj) == []


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--device-backend", "mock"], 2, "--node-name is required (or set $NODE_NAME)"),
        (["--node-name", "n1"], 1, "cannot initialise NVML"),
        (["--node-name", "n1", "--device-backend", "mock"], 1, "not running in a cluster"),
        (
            ["--node-name", "n1", "--device-backend", "mock", "--kubeconfig", "/nonexistent/k"],
            1,
            "kubeconfig /nonexistent/k (from --kubeconfig) does not exist",
        ),
        (["--node-name", "N_1", "--device-backend", "mock"], 2, "must be a DNS subdomain"),
        (["--node-name", "n1", "--sharing-mode", "shared"], 2, "invalid choice: 'shared'"),
    ],
)
def test_expected_failures_are_one_line(args: list[str], code: int, message: str) -> None:
    if "--device-backend" not in args and Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver; NVML would initialise")
    out = subprocess.run(
        [sys.executable, "-m", "kubeletplugin", *args],
        capture_output=True,
        text=True,
        env=plugin_env(),
        timeout=DEADLINE,
    )
    assert out.returncode == code
    assert message in out.stderr
    assert "Traceback" not in out.stderr
