"""The real kubectl run against an embedded API server with one kubeconfig, as a user runs it
(its own HOME for the discovery cache, ``KUBE_EDITOR`` for ``kubectl edit``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Final

#: kubectl talks to a local server; a generous bound keeps a hung call from hanging the run.
KUBECTL_TIMEOUT_S: Final = 120


class Kubectl:
    """Runs ``binary`` with ``kubeconfig``, in ``cwd`` (relative paths of manifests) if given."""

    def __init__(self, binary: str, kubeconfig: str, home: Path, cwd: Path | None = None) -> None:
        self.binary = binary
        self.cwd = cwd
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),  # kubectl's discovery cache lives there
            "KUBECONFIG": kubeconfig,
        }

    def run(self, *args: str, editor: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **({"KUBE_EDITOR": editor} if editor else {})}
        return subprocess.run(
            [self.binary, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=KUBECTL_TIMEOUT_S,
            cwd=self.cwd,
            check=False,
        )

    def ok(self, *args: str, editor: str | None = None) -> str:
        out = self.run(*args, editor=editor)
        assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
        return out.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "-o", "json"))
