"""Capacity amounts the GPU's request policy cannot round in Kubernetes 1.37 are refused."""

from __future__ import annotations

import pytest

from api.names import DEFAULT_DRIVER_NAME as DRIVER
from sharegpu.admission import checks

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
