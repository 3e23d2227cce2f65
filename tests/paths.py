"""Where the tests find the repository's own files. The suite reads nothing outside the repository:
data it needs from elsewhere is vendored under ``tests/data/`` with its source and license. The
one exception is the upstream binaries of ``tests/e2e/``, built from the Go modules pinned under
``tests/e2e/upstream/`` into the user's cache directory."""

from __future__ import annotations

from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
DOCS_DIR: Final = REPO_ROOT / "docs"
EXAMPLES_DIR: Final = REPO_ROOT / "examples"
#: Vendored test data (each subdirectory names its source and license).
DATA_DIR: Final = REPO_ROOT / "tests" / "data"
#: The CDI JSON schema (schema.json + defs.json).
CDI_SCHEMA_DIR: Final = DATA_DIR / "cdi"
