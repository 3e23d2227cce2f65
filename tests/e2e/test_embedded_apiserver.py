"""The embedded API server (sharegpuctl.local.apiserver) against the real one, through the real
kubectl: ``kubectl explain`` reads the same documentation from both (the embedded server
generates its OpenAPI from the CRDs and the Kubernetes schemas it validates with), and discovery
gives the resources both serve the same short names and categories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sharegpuctl.local.apiserver import KubeAPIServer
from tests.e2e.controlplane import ControlPlane
from tests.e2e.processes import step

#: Fields of the project's kinds and of built-in kinds the driver's users read.
EXPLAINED = (
    "gpus",
    "gpus.spec",
    "gpus.status",
    "gpuquotas.spec",
    "resourceclaims.spec.devices.requests",
    "resourceclaimtemplates.spec.spec.devices.config.opaque",
    "resourceslices.spec.devices.capacity",
    "pods.spec.resourceClaims",
    "namespaces",
)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kubeconfig of an embedded API server, running for this module."""
    with KubeAPIServer() as server:
        yield Path(server.write_kubeconfig(tmp_path_factory.mktemp("embedded") / "kubeconfig"))


@pytest.mark.parametrize("field", EXPLAINED)
def test_explain_reads_the_same_documentation(
    crds: ControlPlane, embedded: Path, field: str
) -> None:
    real = crds.kubectl("explain", field, step_name=f"kubectl explain {field} (real)").stdout
    mine = crds.kubectl(
        "explain", field, kubeconfig=embedded, step_name=f"kubectl explain {field} (embedded)"
    ).stdout
    with step(f"kubectl explain {field}: embedded == real", f"kubectl explain {field}"):
        assert mine == real


def _api_resources(plane: ControlPlane, kubeconfig: Path | None) -> dict[str, list[str]]:
    """Resource (``plural.group``) -> its SHORTNAMES and CATEGORIES cells."""
    header, *lines = plane.kubectl(
        "api-resources", "-o", "wide", kubeconfig=kubeconfig, step_name="kubectl api-resources"
    ).stdout.splitlines()
    starts = {name: header.index(name) for name in ("SHORTNAMES", "APIVERSION", "CATEGORIES")}
    rows: dict[str, list[str]] = {}
    for line in lines:
        name = line.split()[0]
        group = line[starts["APIVERSION"] :].split()[0].rpartition("/")[0]
        short = line[starts["SHORTNAMES"] : starts["APIVERSION"]].strip()
        categories = line[starts["CATEGORIES"] :].strip()
        rows[f"{name}.{group}" if group else name] = [short, categories]
    return rows


def test_discovery_gives_the_same_short_names_and_categories(
    crds: ControlPlane, embedded: Path
) -> None:
    real = _api_resources(crds, None)
    mine = _api_resources(crds, embedded)
    with step("short names and categories: embedded == real", "kubectl api-resources -o wide"):
        assert {r: mine[r] for r in mine if r in real} == {r: real[r] for r in mine if r in real}
        assert set(mine) <= set(real), sorted(set(mine) - set(real))
