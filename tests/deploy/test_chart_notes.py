"""The chart's NOTES.txt, as ``helm install`` prints it: the DeviceClasses it installs, and a
warning while the image is left at the chart's default (no registry)."""

from __future__ import annotations

import pytest

from tests.deploy.helpers import CHART_DIR, run_helm

pytestmark = pytest.mark.helm


def notes(helm: str, *sets: str) -> str:
    """What ``helm install --dry-run=client`` prints after ``NOTES:``."""
    args = [a for item in sets for a in ("--set", item)]
    result = run_helm(
        helm, "install", "sharegpu", str(CHART_DIR), "--dry-run=client", "-n", "gpus", *args
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_the_default_image_is_warned_about(helm: str) -> None:
    text = notes(helm)
    assert "WARNING: image.repository is left at the chart's default" in text
    assert "make image" in text


@pytest.mark.parametrize(
    "sets",
    [
        ["image.repository=registry.example.com/gpu/sharegpu"],
        ["image.repository=localhost:5000/sharegpu", "image.tag=dev"],
        ["kubeletPlugin.enabled=false", "controller.enabled=false"],
    ],
)
def test_no_warning_once_the_image_is_set_or_unused(helm: str, sets: list[str]) -> None:
    assert "WARNING" not in notes(helm, *sets)


def test_every_installed_device_class_is_named(helm: str) -> None:
    text = notes(helm)
    assert "deviceClassName gpu.sharegpu.dev." in text
    assert "deviceClassName mig.gpu.sharegpu.dev." in text
    assert "mig.gpu.sharegpu.dev" not in notes(helm, "deviceClasses.mig.enabled=false")
