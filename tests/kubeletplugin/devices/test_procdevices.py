"""Character device majors from ``/proc/devices``: parsing, bounds, lookups.

``data/proc-devices`` is the file as read on an H200 node (driver 580.159.04): ``238
nvidia-uvm``, ``241 nvidia-caps``, and ``195`` listed twice, as ``nvidia`` and ``nvidiactl``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.devices.procdevices import (
    MAX_FILE_BYTES,
    ProcDevices,
    ProcDevicesError,
    parse_char_majors,
)
from kubeletplugin.fsutil import HostFileError

FIXTURE = Path(__file__).parent / "data" / "proc-devices"


def proc_with(tmp_path: Path, data: bytes) -> ProcDevices:
    (tmp_path / "devices").write_bytes(data)
    return ProcDevices(tmp_path)


def test_the_kernel_file_gives_the_nvidia_majors(tmp_path: Path) -> None:
    devices = proc_with(tmp_path, FIXTURE.read_bytes())
    assert devices.char_major("nvidia-uvm") == 238
    assert devices.char_major("nvidia-caps") == 241
    assert devices.char_major("/dev/vc/0") == 4
    assert devices.char_major("nvidia") == devices.char_major("nvidiactl") == 195
    table = devices.char_majors()
    assert "loop" not in table and "zram" not in table, "block devices are not used"
    assert table["infiniband_verbs"] == {231, 244}


def test_a_name_the_kernel_does_not_list_names_the_file_and_the_device(tmp_path: Path) -> None:
    devices = proc_with(tmp_path, b"Character devices:\n195 nvidia-frontend\n")
    with pytest.raises(ProcDevicesError) as info:
        devices.char_major("nvidia-uvm")
    assert str(info.value) == (
        f"{tmp_path / 'devices'} lists no character device 'nvidia-uvm' "
        "(is its kernel module loaded?)"
    )
    assert isinstance(info.value, OSError)


def test_a_name_with_two_majors_is_not_guessed(tmp_path: Path) -> None:
    devices = proc_with(tmp_path, b"Character devices:\n238 nvidia-uvm\n239 nvidia-uvm\n")
    with pytest.raises(ProcDevicesError, match=r"'nvidia-uvm' with several majors \(238, 239\)"):
        devices.char_major("nvidia-uvm")
    same = proc_with(tmp_path, b"Character devices:\n238 nvidia-uvm\n238 nvidia-uvm\n")
    assert same.char_major("nvidia-uvm") == 238


def test_the_same_name_as_a_block_device_does_not_count(tmp_path: Path) -> None:
    text = b"Character devices:\n238 nvidia-uvm\n\nBlock devices:\n  7 nvidia-uvm\n"
    assert proc_with(tmp_path, text).char_major("nvidia-uvm") == 238


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Character devices:\n238 nvidia-uvm extra\tjunk\n", 2),  # a tab
        ("Character devices:\n-1 nvidia-uvm\n", 2),
        ("Character devices:\n0xee nvidia-uvm\n", 2),
        ("Character devices:\n23800 nvidia-uvm\n", 2),  # five digits
        ("Character devices:\n238\n", 2),
        ("Character devices:\n238 \n", 2),
        ("Character devices:\n238  nvidia-uvm\n", 2),  # the name starts with a space
        ("Character devices:\n238 nvidia-uvm\r\n", 2),
        ("Character devices:\n238 " + "x" * 65 + "\n", 2),
        ("238 nvidia-uvm\nCharacter devices:\n", 1),  # an entry before any section
        ("Character devices:\nnvidia-uvm 238\n", 2),
        ("Character Devices:\n238 nvidia-uvm\n", 1),
        ("Character devices:\n238 nvidia-uvm\n<html>\n", 3),
    ],
)
def test_garbage_refuses_the_file_naming_the_line(text: str, line: int) -> None:
    with pytest.raises(ProcDevicesError, match=rf"^/proc/devices line {line}: "):
        parse_char_majors(text, "/proc/devices")


def test_a_major_beyond_twelve_bits_is_refused() -> None:
    with pytest.raises(ProcDevicesError, match=r"line 2: major 4096 is outside 0\.\.4095"):
        parse_char_majors("Character devices:\n4096 big\n", "/proc/devices")


def test_a_file_without_the_character_section_is_refused() -> None:
    with pytest.raises(ProcDevicesError, match="has no 'Character devices:' section"):
        parse_char_majors("", "/proc/devices")
    with pytest.raises(ProcDevicesError, match="has no 'Character devices:' section"):
        parse_char_majors("Block devices:\n  7 loop\n", "/proc/devices")


def test_a_file_larger_than_the_bound_is_refused_not_truncated(tmp_path: Path) -> None:
    entry = b"238 nvidia-uvm\n"
    filler = b"\n" * (MAX_FILE_BYTES - len(b"Character devices:\n") - len(entry) + 1)
    devices = proc_with(tmp_path, b"Character devices:\n" + entry + filler)
    with pytest.raises(ProcDevicesError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        devices.char_major("nvidia-uvm")
    at_bound = proc_with(tmp_path, b"Character devices:\n" + entry + filler[:-1])
    assert at_bound.char_major("nvidia-uvm") == 238


def test_bytes_that_are_not_ascii_refuse_the_file(tmp_path: Path) -> None:
    devices = proc_with(tmp_path, "Character devices:\n238 nvidia-uvm\n239 caf\u00e9\n".encode())
    with pytest.raises(ProcDevicesError, match="is not ASCII text"):
        devices.char_major("nvidia-uvm")


def test_an_unreadable_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProcDevicesError, match=rf"cannot read {tmp_path / 'devices'}") as info:
        ProcDevices(tmp_path).char_major("nvidia-caps")
    assert isinstance(info.value, HostFileError)
    (tmp_path / "real").write_text("Character devices:\n241 nvidia-caps\n")
    (tmp_path / "devices").symlink_to(tmp_path / "real")
    with pytest.raises(ProcDevicesError, match="cannot read"):
        ProcDevices(tmp_path).char_major("nvidia-caps")
