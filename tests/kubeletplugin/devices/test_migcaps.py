"""The MIG capability minors (``/proc/driver/nvidia-caps/mig-minors``): parsing and lookups.

``data/mig-minors`` is the file as the driver writes it for two GPUs: ``config`` and
``monitor`` first, then per GPU and GPU instance (0 to 14) the instance's access capability
followed by those of its eight compute instances, numbered from 3 on.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeletplugin.devices.migcaps import (
    MAX_FILE_BYTES,
    MIG_MINORS_FILE,
    MigCaps,
    MigCapsError,
    cap_node_name,
    parse_mig_minors,
)

FIXTURE = Path(__file__).parent / "data" / "mig-minors"


def proc_with(tmp_path: Path, data: bytes) -> MigCaps:
    path = tmp_path / MIG_MINORS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return MigCaps(proc_root=tmp_path)


def test_the_driver_file_is_parsed_whole() -> None:
    table = parse_mig_minors(FIXTURE.read_text())
    assert len(table) == 2 * 15 * 9
    assert table[(0, 1, None)] == 12 and table[(0, 1, 0)] == 13
    assert table[(0, 9, None)] == 84 and table[(0, 9, 0)] == 85
    assert table[(1, 2, None)] == 156 and table[(1, 2, 7)] == 164


def test_lookup_gives_the_gpu_and_compute_instance_minors(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, FIXTURE.read_bytes())
    assert caps.minors(0, 9, 0) == (84, 85)
    assert caps.minors(1, 2, 1) == (156, 158)
    assert cap_node_name(84) == "nvidia-caps/nvidia-cap84"


@pytest.mark.parametrize(
    "line",
    [
        "gpu0/gi1/../access 99",
        "gpu0/gi1/access 12 13",
        "gpu0/gi1/access -12",
        "gpu0/gi1/access 0x12",
        "gpu0/gi1/access 99999999",
        "gpu0/gi1/access 2000000",  # above the 20-bit minor range
        "gpu-1/gi1/access 12",
        "gpu0/gi1/ci/access 12",
        "gpu0/gi1/ci0/ci0/access 12",
        "gpu\uff10/gi1/access 12",  # a full-width digit
        "gpu0/gi1/access\t12",
        "/gpu0/gi1/access 12",
        "gpu00000/gi1/access 12",
        "x" * 10000,
        "",
    ],
)
def test_hostile_lines_are_ignored(line: str) -> None:
    table = parse_mig_minors(f"{line}\ngpu0/gi2/access 21\n")
    assert table == {(0, 2, None): 21}


def test_a_capability_listed_twice_with_different_minors_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        table = parse_mig_minors("gpu0/gi1/access 12\ngpu0/gi1/access 40\ngpu0/gi1/ci0/access 13\n")
    assert table == {(0, 1, 0): 13}
    assert "different minors" in caplog.text
    assert parse_mig_minors("gpu0/gi1/access 12\ngpu0/gi1/access 12\n") == {(0, 1, None): 12}


def test_bytes_that_are_not_utf8_do_not_stop_the_parse(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, b"\xff\xfe garbage\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    assert caps.minors(0, 1, 0) == (12, 13)


def test_only_the_first_megabyte_is_read(tmp_path: Path) -> None:
    filler = b"#" * (MAX_FILE_BYTES - 10) + b"\n"
    caps = proc_with(tmp_path, filler + b"gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    with pytest.raises(MigCapsError, match="no entry for gpu0/gi1"):
        caps.minors(0, 1, 0)


def test_a_missing_entry_names_the_capability(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, b"gpu0/gi1/access 12\n")
    with pytest.raises(MigCapsError, match=r"no entry for gpu0/gi1/ci3/access"):
        caps.minors(0, 1, 3)


def test_a_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MigCapsError, match="cannot read the MIG capability minors") as info:
        MigCaps(proc_root=tmp_path).minors(0, 1, 0)
    assert isinstance(info.value, OSError)
