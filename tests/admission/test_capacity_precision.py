"""Capacity amounts the GPU's request policy cannot round in Kubernetes 1.37 are refused."""

from __future__ import annotations

from decimal import Decimal

import pytest

from api.names import DEFAULT_DRIVER_NAME as DRIVER
from api.names import MEMORY_STEP_BYTES as MI256
from api.quantity import parse_quantity
from sharegpu.admission import checks
from sharegpu.admission.checks import reserved_cores, reserved_memory

from .test_hints import CAP, share


@pytest.mark.parametrize(
    ("cores", "memory", "path"),
    [("1500u", "1Gi", "cores"), ("20", "1073741824.0005", "memory"), ("20.0001", "1Gi", "cores")],
)
def test_amounts_finer_than_a_thousandth_are_errors(cores: str, memory: str, path: str) -> None:
    """Kubernetes 1.37 works the GPU's request policy in milli-units and refuses the rest."""
    findings = checks.check_object(share(cores, memory), DRIVER, ())
    errors = [f for f in findings if f.severity == checks.ERROR]
    assert [f.path for f in errors] == [f"{CAP}{path}]"]
    assert "finer than a thousandth" in errors[0].message


def test_thousandths_are_fine() -> None:
    findings = checks.check_object(share("1500m", "1Gi"), DRIVER, ())
    assert [f.severity for f in findings] == [checks.WARNING]  # reserved as 2 cores


@pytest.mark.parametrize(("cores", "reserved"), [("150m", "1"), ("500m", "1"), ("12.5", "13")])
def test_fractional_cores_are_reserved_as_the_policy_rounds_them(cores: str, reserved: str) -> None:
    """The cores policy (min 1, step 1) rounds a request up, below 1 to the minimum, as
    kube-scheduler does: the webhook warns what is reserved instead of refusing the claim."""
    findings = checks.check_object(share(cores, "1Gi"), DRIVER, ())
    [finding] = findings
    assert finding.severity == checks.WARNING, finding
    assert finding.path == f"{CAP}cores]"
    assert finding.message.endswith(f"{parse_quantity(cores)} is reserved as {reserved}")


@pytest.mark.parametrize("cores", ["0", "-1", "101", "100.5"])
def test_cores_outside_the_policy_are_errors(cores: str) -> None:
    [finding] = checks.check_object(share(cores, "1Gi"), DRIVER, ())
    assert finding.severity == checks.ERROR
    assert "cores must be" in finding.message


def test_fractional_memory_is_shown_as_requested() -> None:
    [finding] = checks.check_object(share("20", "1073741824.5"), DRIVER, ())
    assert finding.severity == checks.WARNING
    assert finding.message.endswith("1073741824.5 is reserved as 1280Mi")


@pytest.mark.parametrize(
    ("requested", "reserved"),
    [
        (Decimal("0.001"), MI256),
        (Decimal(MI256), MI256),
        (Decimal(MI256) + Decimal("0.5"), 2 * MI256),
        (Decimal(4 * MI256 - 1), 4 * MI256),
    ],
)
def test_reserved_memory_is_exact(requested: Decimal, reserved: int) -> None:
    assert reserved_memory(requested) == reserved


@pytest.mark.parametrize(
    ("requested", "reserved"),
    [(Decimal("0.15"), 1), (Decimal(1), 1), (Decimal("12.001"), 13), (Decimal(100), 100)],
)
def test_reserved_cores_is_the_policy_rounding(requested: Decimal, reserved: int) -> None:
    assert reserved_cores(requested) == reserved
