"""Fixtures of the prepare-stage tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kubeletplugin.prepare.helpers import Node


@pytest.fixture
def node(tmp_path: Path) -> Node:
    """A simulated node's directories (CDI, data, boot ID) under ``tmp_path``."""
    return Node(tmp_path)
