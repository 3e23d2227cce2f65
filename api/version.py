"""The release version of sharegpu: the one place it is written.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``), every command prints it with
``--version``, and a test checks that the Helm chart's ``version``/``appVersion`` match it.
"""

from __future__ import annotations

from typing import Final

VERSION: Final = "0.2.0"
