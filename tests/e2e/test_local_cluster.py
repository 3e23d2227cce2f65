"""docs/install.md's "Trying sharegpu on a local cluster without docker" run as written: each
command of its shell block, through the ``kubectl`` wrapper ``make local-cluster`` writes, against
the run's cluster (the same control plane, node and release as ``make local-cluster``)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cluster import write_wrappers
from tests.e2e.driver import ControllerDeployment
from tests.e2e.processes import step
from tests.paths import REPO_ROOT

INSTALL_MD = REPO_ROOT / "docs" / "install.md"
SECTION = "## Trying sharegpu on a local cluster without docker"
#: Commands the section says fail, and the words their output must hold.
EXPECTED_FAILURES = {
    "kubectl apply -f examples/gpu-quota/quota-claims.yaml": ("share-a", "team-gpus"),
}


def section_commands() -> list[str]:
    """The commands of the section's second shell block (the one run in another shell), without
    their comments and without the ``export PATH`` line (the test sets PATH itself)."""
    text = INSTALL_MD.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.find("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the section has the make command and the commands to try"
    commands = [line.split("#", 1)[0].strip() for line in blocks[1].splitlines()]
    assert commands[0].startswith("export PATH="), commands[0]
    return [c for c in commands[1:] if c]


def test_the_section_lists_the_commands_it_promises() -> None:
    commands = section_commands()
    assert "kubectl get gpus" in commands
    assert set(EXPECTED_FAILURES) <= set(commands)


@pytest.mark.parametrize("command", section_commands())
def test_install_md_local_cluster_command(
    controller: ControllerDeployment, helm: str, command: str
) -> None:
    plane = controller.plane
    wrappers = write_wrappers(plane, helm, plane.work / "local-cluster-bin")
    env = {**os.environ, "PATH": f"{wrappers}:{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        command, shell=True, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    with step(f"docs/install.md: {command}", command):
        if command in EXPECTED_FAILURES:
            assert result.returncode == 1, output
            assert all(word in output for word in EXPECTED_FAILURES[command]), output
        else:
            assert result.returncode == 0, output
        if command == "kubectl get gpus":
            rows = [line for line in output.splitlines() if " e2e-node " in f" {line} "]
            assert len(rows) >= 8, output
        if command.startswith("kubectl get pods -n sharegpu-system"):
            assert output.count("Running") >= 3, output


def test_wrappers_run_inside_the_namespace(controller: ControllerDeployment, helm: str) -> None:
    plane = controller.plane
    wrappers = write_wrappers(plane, helm, plane.work / "local-cluster-bin")
    script = Path(wrappers / "kubectl").read_text()
    assert f"--net={plane.network.path}" in script and str(plane.admin_kubeconfig) in script
