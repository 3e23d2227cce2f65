"""The driver's image for the end-to-end node: the image of ``make image``
(``deploy/image/build.py``: a Debian root filesystem with Debian's Python and the project's
wheels, no docker, no registry), written as an OCI archive for ``ctr images import``.

It is named as the chart renders the image by default (``sharegpu:<appVersion>``), so the chart
needs no image value; the Debian base layer is cached in ``~/.cache/sharegpu-image``.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Final

from tests.paths import REPO_ROOT

#: The image's build script (``make image``).
BUILD_SCRIPT: Final = REPO_ROOT / "deploy" / "image" / "build.py"
#: Where Debian's tini package installs it on the host (the real node's prerequisites).
TINI: Final = Path("/usr/bin/tini")


@cache
def builder() -> ModuleType:
    """``deploy/image/build.py`` as a module."""
    spec = importlib.util.spec_from_file_location("sharegpu_image_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def chart_image() -> str:
    """The image the chart renders by default: ``<image.repository>:<appVersion>``."""
    return str(builder().chart_image())


def build(directory: Path, *tags: str) -> tuple[Path, str]:
    """Write the image's OCI archive under ``directory``, named as the chart renders it and also
    with each of ``tags`` instead of its tag; returns the archive and the chart's image name."""
    name = chart_image()
    names = [name, *(f"{name.rsplit(':', 1)[0]}:{tag}" for tag in tags)]
    archive = builder().build(directory / "sharegpu.tar", names)
    return Path(archive), name
