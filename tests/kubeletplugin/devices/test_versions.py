"""Version strings from NVML become strict semver."""

from __future__ import annotations

import re

import pytest

from kubeletplugin.devices.versions import VersionError, to_semver

#: The semver 2.0.0 grammar (semver.org), used as an independent check.
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("9.0", "9.0.0"),
        ("580.159.04", "580.159.4"),
        ("12.8", "12.8.0"),
        ("13", "13.0.0"),
        ("580.95.05", "580.95.5"),
        ("08.00.00", "8.0.0"),
        (" 12.4 ", "12.4.0"),
        ("v1.2.3", "1.2.3"),
        ("1.2.3-rc.01+build.7", "1.2.3-rc.1+build.7"),
    ],
)
def test_normalises(raw: str, expected: str) -> None:
    assert to_semver(raw) == expected
    assert SEMVER.match(expected)


@pytest.mark.parametrize("raw", ["", "abc", "1.2.3.4", "1..2", "12.x", "N/A", "1.2.3-"])
def test_rejects_junk_with_a_clear_message(raw: str) -> None:
    with pytest.raises(VersionError, match="is not a version number"):
        to_semver(raw)


def test_rejects_overlong() -> None:
    with pytest.raises(VersionError, match="longer than 64"):
        to_semver("1.2.3-" + "a" * 70)
