"""Socket handling: modes, stale sockets, cleanup, bad paths, start order."""

from __future__ import annotations

import logging
import socket
import stat
from pathlib import Path

import pytest

from kubeletplugin.kubelet.server import PluginServer
from kubeletplugin.kubelet.sockets import SocketPathError, UnixSocketPath
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.kubelet.helpers import (
    DRIVER,
    Dirs,
    FakePreparer,
    running_server,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _stale_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the file stays: a socket left behind by a dead process


def test_sockets_are_0600_in_created_0750_directories(dirs: Dirs) -> None:
    with running_server(dirs) as server:
        for path in (server.dra_socket.path, server.registration_socket.path):
            assert stat.S_ISSOCK(path.lstat().st_mode)
            assert _mode(path) == 0o600
        assert _mode(dirs.registry) == 0o750
        assert _mode(dirs.data) == 0o750
        assert _mode(dirs.data.parent) == 0o750


def test_existing_directory_keeps_its_mode(dirs: Dirs) -> None:
    dirs.registry.mkdir(mode=0o755)
    dirs.registry.chmod(0o755)
    with running_server(dirs):
        assert _mode(dirs.registry) == 0o755


def _connects(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        return False
    finally:
        probe.close()
    return True


def test_stale_sockets_are_replaced(dirs: Dirs, caplog: pytest.LogCaptureFixture) -> None:
    dra = dirs.data / "dra.sock"
    reg = dirs.registry / f"{DRIVER}-reg.sock"
    _stale_socket(dra)
    _stale_socket(reg)
    assert not _connects(dra) and not _connects(reg)
    with caplog.at_level(logging.INFO), running_server(dirs), KubeletSim(dirs.registry) as k:
        assert _connects(dra) and _connects(reg)
        assert k.register(DRIVER).version == "v1.DRAPlugin"
    removed = {r.getMessage() for r in caplog.records if "stale socket" in r.getMessage()}
    assert removed == {f"removing stale socket {dra}", f"removing stale socket {reg}"}


def test_sockets_removed_on_stop_and_stop_is_idempotent(dirs: Dirs) -> None:
    server = PluginServer(DRIVER, dirs.registry, dirs.data, FakePreparer())
    server.start()
    paths = [server.dra_socket.path, server.registration_socket.path]
    assert all(p.exists() for p in paths)
    server.stop()
    assert not any(p.exists() for p in paths)
    server.stop()
    with pytest.raises(RuntimeError, match="only once"):
        server.start()


def test_non_socket_at_the_path_is_refused_and_kept(dirs: Dirs) -> None:
    dirs.data.mkdir(parents=True)
    squatter = dirs.data / "dra.sock"
    squatter.write_text("not a socket")
    server = PluginServer(DRIVER, dirs.registry, dirs.data, FakePreparer())
    with pytest.raises(SocketPathError, match="exists and is not a socket"):
        server.start()
    assert squatter.read_text() == "not a socket"
    assert not (dirs.registry / f"{DRIVER}-reg.sock").exists()


def test_failed_registration_bind_leaves_no_dra_socket(dirs: Dirs) -> None:
    dirs.registry.mkdir(parents=True)
    (dirs.registry / f"{DRIVER}-reg.sock").mkdir()
    server = PluginServer(DRIVER, dirs.registry, dirs.data, FakePreparer())
    with pytest.raises(SocketPathError):
        server.start()
    assert not (dirs.data / "dra.sock").exists()


def test_parent_that_is_a_file_is_reported(dirs: Dirs) -> None:
    blocker = dirs.root / "file"
    blocker.write_text("")
    with pytest.raises(SocketPathError, match="is not a directory"):
        UnixSocketPath(blocker / "sub" / "x.sock").prepare()


def test_too_long_and_relative_paths_are_rejected() -> None:
    with pytest.raises(SocketPathError, match="bytes long"):
        UnixSocketPath(Path("/tmp/" + "x" * 120 + ".sock"))
    with pytest.raises(SocketPathError, match="must be absolute"):
        UnixSocketPath(Path("relative.sock"))


def test_dra_endpoint_answers_as_soon_as_registration_is_visible(dirs: Dirs) -> None:
    with running_server(dirs), KubeletSim(dirs.registry) as kubelet:
        # The endpoint is served before the registration socket exists: it accepts at once.
        assert _connects(Path(kubelet.get_info(DRIVER).endpoint))
