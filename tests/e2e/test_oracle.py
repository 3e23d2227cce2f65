"""What a real kube-apiserver answers to objects an API server must refuse (or prune): the
oracle the embedded API server (sharegpuctl.local.apiserver) is compared with.

Each case is sent as a dry run (nothing is stored) and its answer, without the fields that
change from run to run, must equal ``tests/data/apiserver-oracle/<case>.json``, which also names
the Kubernetes version that gave it. ``SHAREGPU_E2E_RECORD_ORACLE=1 make e2e`` rewrites the
files (after a version bump, for instance); otherwise a different answer fails the case, on the
default pin and on the second one (``make e2e K8S=1.36.3``) alike.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.binaries import kubernetes_version
from tests.e2e.controlplane import ControlPlane
from tests.e2e.oracle import CASES, ORACLE_DIR, OracleCase, normalized
from tests.e2e.processes import step

RECORD = os.environ.get("SHAREGPU_E2E_RECORD_ORACLE") == "1"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_real_apiserver_answer(crds: ControlPlane, case: OracleCase) -> None:
    if case.setup is not None:
        create = case.path.rsplit("/", 1)[0]
        code, body = crds.request("POST", create, case.setup)
        assert code in (201, 409), body
    separator = "&" if "?" in case.path else "?"
    code, body = crds.request(
        case.method, f"{case.path}{separator}dryRun=All", case.body, content_type=case.content_type
    )
    answer = case.record(kubernetes_version(), code, normalized(body))
    path = ORACLE_DIR / f"{case.name}.json"
    if RECORD:
        ORACLE_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(answer, indent=2, sort_keys=True) + "\n")
        return
    with step(f"oracle {case.name}", f"{case.method} {case.path}"):
        assert path.exists(), f"{path} missing: record it with SHAREGPU_E2E_RECORD_ORACLE=1"
        expected = json.loads(path.read_text())
        # The record names the release that gave it; another pinned release (make e2e
        # K8S=1.36.3) must give the same answer.
        same = {k: v for k, v in expected.items() if k != "kubernetesVersion"} == {
            k: v for k, v in answer.items() if k != "kubernetesVersion"
        }
        assert same, (
            f"kube-apiserver {kubernetes_version()} answers differently from {path.name} "
            f"(recorded with {expected.get('kubernetesVersion')}); re-record if the change is "
            f"expected:\n{json.dumps(answer, indent=2, sort_keys=True)}"
        )
