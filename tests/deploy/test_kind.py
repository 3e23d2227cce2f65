"""Consistency of the kind set-up and the image with the rest of the repository.

deploy/kind/run.sh and deploy/Dockerfile cannot run here (no container engine); these tests keep
them in step with what they refer to: every example is exercised by run.sh, the feature gates the
sharing modes need are on in the kind cluster, and the image contains every Python package.
"""

from __future__ import annotations

import re
import subprocess
import tomllib

import yaml

from tests.deploy.helpers import EXAMPLES_DIR, REPO_ROOT

KIND_DIR = REPO_ROOT / "deploy" / "kind"


def test_run_script_runs_every_example() -> None:
    script = (KIND_DIR / "run.sh").read_text()
    mentioned = set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)+|partitions", script))
    examples = {p.name for p in EXAMPLES_DIR.iterdir() if p.is_dir()}
    assert examples - mentioned == set()


def test_run_script_is_valid_bash() -> None:
    result = subprocess.run(
        ["bash", "-n", str(KIND_DIR / "run.sh")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_kind_cluster_enables_the_dra_gates_and_gpu_nodes() -> None:
    config = yaml.safe_load((KIND_DIR / "cluster.yaml").read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    gates = config["featureGates"]
    for gate in (
        "DRAConsumableCapacity",
        "DRAPartitionableDevices",
        "DRADeviceTaints",
        "DRAExtendedResource",
    ):
        assert gates.get(gate) is True, gate
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    assert workers and all(n["labels"]["nvidia.com/gpu.present"] == "true" for n in workers)
    assert any("enable_cdi = true" in patch for patch in config["containerdConfigPatches"])


def test_image_contains_every_python_package_and_runs_unprivileged() -> None:
    dockerfile = (KIND_DIR.parent / "Dockerfile").read_text()
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    for package in packages:
        assert f"COPY {package} ./{package}" in dockerfile, package
    assert re.search(r"^USER 65532:65532$", dockerfile, re.MULTILINE)


def test_image_ships_the_examples_where_the_demo_looks_for_them() -> None:
    from sharegpuctl.cli.demo import IMAGE_EXAMPLES_DIR

    dockerfile = (KIND_DIR.parent / "Dockerfile").read_text()
    assert f"COPY examples {IMAGE_EXAMPLES_DIR}" in dockerfile
    assert "!examples/" in (KIND_DIR.parent / "Dockerfile.dockerignore").read_text()
