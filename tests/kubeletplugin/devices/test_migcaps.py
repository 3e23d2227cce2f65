"""The MIG capability nodes: ``/proc/driver/nvidia-caps/mig-minors`` parsed strictly, and the
nodes named by their numbers.

``data/mig-minors`` is the first 272 lines of the file as read on an H200 node (driver
580.159.04; the whole file lists 32 GPUs in 4,322 lines, 109,408 bytes): ``config 1`` and
``monitor 2`` first, then per GPU and GPU instance (0 to 14) the instance's access capability
followed by those of its eight compute instances, numbered from 3 on. ``data/proc-devices``,
read on the same node, gives ``nvidia-caps`` the major 241.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubeletplugin.containeredits import DeviceNode
from kubeletplugin.devices.migcaps import (
    CAP_FILE_MODE,
    MAX_FILE_BYTES,
    MIG_MINORS_FILE,
    MigCaps,
    MigCapsError,
    cap_node_name,
    parse_mig_minors,
)

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "mig-minors"
H200_CAPS_MAJOR = 241


def proc_with(tmp_path: Path, data: bytes, devices: bytes | None = None) -> MigCaps:
    path = tmp_path / MIG_MINORS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if devices is None:
        shutil.copy(DATA / "proc-devices", tmp_path / "devices")
    else:
        (tmp_path / "devices").write_bytes(devices)
    return MigCaps(proc_root=tmp_path)


def test_the_driver_file_is_parsed_whole() -> None:
    table = parse_mig_minors(FIXTURE.read_text(), "mig-minors")
    assert len(table.minors) == 2 * 15 * 9 and not table.ambiguous
    assert table.minors[(0, 0, None)] == 3 and table.minors[(0, 0, 0)] == 4
    assert table.minors[(0, 1, None)] == 12 and table.minors[(0, 1, 0)] == 13
    assert table.minors[(0, 9, None)] == 84 and table.minors[(0, 9, 0)] == 85
    assert table.minors[(1, 2, None)] == 156 and table.minors[(1, 2, 7)] == 164


def test_lookup_gives_the_gpu_and_compute_instance_minors(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, FIXTURE.read_bytes())
    assert caps.minors(0, 0, 0) == (3, 4)
    assert caps.minors(0, 9, 0) == (84, 85)
    assert caps.minors(1, 2, 1) == (156, 158)
    assert cap_node_name(84) == "nvidia-caps/nvidia-cap84"


def test_the_nodes_are_character_devices_by_their_numbers(tmp_path: Path) -> None:
    """No node file is needed on the host: the runtime creates them from the numbers."""
    caps = proc_with(tmp_path, FIXTURE.read_bytes())
    gi, ci = caps.device_nodes(0, 9, 0)
    assert gi == DeviceNode.char("/dev/nvidia-caps/nvidia-cap84", H200_CAPS_MAJOR, 84, 0o444)
    assert ci.to_json() == {
        "path": "/dev/nvidia-caps/nvidia-cap85",
        "type": "c",
        "major": H200_CAPS_MAJOR,
        "minor": 85,
        "fileMode": CAP_FILE_MODE,
        "permissions": "rw",
    }
    assert "hostPath" not in gi.to_json()


def test_a_caps_major_the_kernel_does_not_list_fails_naming_both(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, FIXTURE.read_bytes(), devices=b"Character devices:\n195 nvidia\n")
    with pytest.raises(MigCapsError) as info:
        caps.device_nodes(0, 9, 0)
    message = str(info.value)
    assert str(tmp_path / "devices") in message and "'nvidia-caps'" in message
    assert isinstance(info.value, OSError)


def test_an_unreadable_proc_devices_fails_the_lookup(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, FIXTURE.read_bytes())
    (tmp_path / "devices").unlink()
    with pytest.raises(MigCapsError, match=rf"cannot read {tmp_path / 'devices'}"):
        caps.device_nodes(0, 9, 0)


@pytest.mark.parametrize(
    "line",
    [
        "gpu0/gi1/../access 99",
        "gpu0/gi1/access 12 13",
        "gpu0/gi1/access -12",
        "gpu0/gi1/access 0x12",
        "gpu0/gi1/access 99999999",
        "gpu0/gi1/ci/access 12/",
        "gpu0//gi1/access 12",
        "gpu0/gi1/access\t12",
        "gpu0/gi1/access  12",
        "gpu0/gi1/access 12 ",
        " gpu0/gi1/access 12",
        "/gpu0/gi1/access 12",
        "GPU0/gi1/access 12",
        "gpu0/gi1/access",
        "x" * 10000,
    ],
)
def test_garbage_refuses_the_file_naming_the_line(line: str) -> None:
    expected = r"^mig-minors line 2: .* is not a '<capability> <minor>'"
    with pytest.raises(MigCapsError, match=expected):
        parse_mig_minors(f"gpu0/gi2/access 21\n{line}\ngpu0/gi2/ci0/access 22\n", "mig-minors")


def test_a_minor_beyond_twenty_bits_is_refused() -> None:
    with pytest.raises(MigCapsError, match=r"line 1: minor 2000000 is outside 0\.\.1048575"):
        parse_mig_minors("gpu0/gi1/access 2000000\n", "mig-minors")


def test_capabilities_the_plugin_does_not_use_are_accepted() -> None:
    table = parse_mig_minors(
        "config 1\nmonitor 2\nfabric-imex-mgmt 7\ngpu0/gi1/access 12\ngpu00000/gi1/access 9\n",
        "mig-minors",
    )
    assert table.minors == {(0, 1, None): 12}


def test_a_capability_listed_twice_with_different_minors_fails_its_lookup(
    tmp_path: Path,
) -> None:
    caps = proc_with(tmp_path, b"gpu0/gi1/access 12\ngpu0/gi1/access 40\ngpu0/gi1/ci0/access 13\n")
    with pytest.raises(MigCapsError, match="lists gpu0/gi1/access twice with different minors"):
        caps.minors(0, 1, 0)
    same = parse_mig_minors("gpu0/gi1/access 12\ngpu0/gi1/access 12\n", "mig-minors")
    assert same.minors == {(0, 1, None): 12} and not same.ambiguous


def test_bytes_that_are_not_ascii_refuse_the_file(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, b"\xff\xfe garbage\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    with pytest.raises(MigCapsError, match="is not ASCII text"):
        caps.minors(0, 1, 0)


def test_a_file_larger_than_the_bound_is_refused_not_truncated(tmp_path: Path) -> None:
    entries = b"gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"
    filler = b"\n" * (MAX_FILE_BYTES - len(entries) + 1)
    with pytest.raises(MigCapsError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        proc_with(tmp_path, entries + filler).minors(0, 1, 0)
    assert proc_with(tmp_path, entries + filler[:-1]).minors(0, 1, 0) == (12, 13)


def test_a_missing_entry_names_the_file_and_the_capability(tmp_path: Path) -> None:
    caps = proc_with(tmp_path, b"gpu0/gi1/access 12\n")
    with pytest.raises(MigCapsError) as info:
        caps.minors(0, 1, 3)
    assert str(info.value) == f"{tmp_path / MIG_MINORS_FILE} has no entry for gpu0/gi1/ci3/access"


def test_a_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MigCapsError) as info:
        MigCaps(proc_root=tmp_path).minors(0, 1, 0)
    assert str(info.value) == (
        f"MIG capability minors: cannot read {tmp_path / MIG_MINORS_FILE}: "
        "No such file or directory"
    )
    assert isinstance(info.value, OSError)
