"""The checkpoint's file as tests see it: the document in use in the two-slot file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubeletplugin.prepare.checkpoint import CHECKPOINT_FILE
from kubeletplugin.prepare.slotfile import scan


def read_document(data_dir: Path) -> dict[str, Any]:
    """The JSON document of the newest valid slot of ``<data_dir>/checkpoint.dat`` (its
    checksum unchecked: tests check it)."""
    fd = os.open(data_dir / CHECKPOINT_FILE, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = scan(fd)
    finally:
        os.close(fd)
    assert found.valid, f"no valid slot: {found.problems}"
    doc: dict[str, Any] = json.loads(found.valid[0].body)
    return doc
