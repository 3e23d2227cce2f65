"""The embedded API server (sharegpuctl.local.apiserver) against the real one, through the real
kubectl: ``kubectl explain`` reads the same documentation from both (the embedded server
generates its OpenAPI from the CRDs and the Kubernetes schemas it validates with), and discovery
gives the resources both serve the same short names and categories, and ``kubectl get`` prints
the same columns for every built-in kind the embedded server serves."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.resources import default_resources
from sharegpuctl.local.apiserver.validation import SCHEMA_KUBERNETES_VERSION
from tests.e2e.binaries import kubernetes_minor, kubernetes_version
from tests.e2e.controlplane import ControlPlane
from tests.e2e.processes import step
from tests.sharegpuctl.local.objects import builtin_samples

#: Tries, a second apart, for the real server to explain a CRD's field after it is Established.
EXPLAIN_TRIES = 60

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
#: Where the header comparison creates its sample objects, on both servers.
SAMPLES_NAMESPACE = "printer-columns"
#: The minor release whose kinds and schemas the embedded API server serves.
EMBEDDED_MINOR = int(SCHEMA_KUBERNETES_VERSION.split(".")[1])


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kubeconfig of an embedded API server, running for this module."""
    with KubeAPIServer() as server:
        yield Path(server.write_kubeconfig(tmp_path_factory.mktemp("embedded") / "kubeconfig"))


@pytest.mark.parametrize("field", EXPLAINED)
def test_explain_reads_the_same_documentation(
    crds: ControlPlane, embedded: Path, field: str
) -> None:
    # The real server publishes a new CRD's discovery and schema a moment after it is
    # Established: ask until it answers (the last try fails the step with its output).
    for _ in range(EXPLAIN_TRIES):
        if crds.kubectl("explain", field, check=False).returncode == 0:
            break
        time.sleep(1)
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


def _listable_built_in_kinds() -> list[str]:
    """The built-in kinds the embedded server serves that ``kubectl get`` lists (not the
    create-only reviews)."""
    return sorted(
        rt.plural for rt in default_resources() if rt.crd is None and "reviews" not in rt.plural
    )


def _apply_samples(plane: ControlPlane, kubeconfig: Path | None, side: str) -> str:
    """Apply one sample object of each kind; returns the manifest (to delete them again)."""
    documents = "\n---\n".join(json.dumps(obj) for obj in builtin_samples(SAMPLES_NAMESPACE))
    if kubeconfig is None:  # the real server admits pods only with the namespace's ServiceAccount
        for args in (
            ("create", "namespace", SAMPLES_NAMESPACE),
            ("create", "serviceaccount", "default", "-n", SAMPLES_NAMESPACE),
        ):
            plane.kubectl(*args, step_name=f"kubectl {' '.join(args)}", check=False)
    plane.kubectl(
        "apply",
        "-f",
        "-",
        stdin=documents,
        kubeconfig=kubeconfig,
        step_name=f"apply samples ({side})",
    )
    return documents


def _headers(plane: ControlPlane, kubeconfig: Path | None, side: str) -> dict[str, list[str]]:
    """``kubectl get`` and ``get -o wide`` header lines, by command."""
    headers: dict[str, list[str]] = {}
    for kind in _listable_built_in_kinds():
        for wide in ((), ("-o", "wide")):
            args = ("get", kind, "-n", SAMPLES_NAMESPACE, *wide)
            out = plane.kubectl(
                *args, kubeconfig=kubeconfig, step_name=f"kubectl {' '.join(args)} ({side})"
            ).stdout
            headers[" ".join(args[1:])] = out.splitlines()[0].split()
    return headers


def test_get_prints_the_same_columns_for_built_in_kinds(crds: ControlPlane, embedded: Path) -> None:
    if kubernetes_minor() != EMBEDDED_MINOR:
        pytest.skip(
            f"the embedded API server serves Kubernetes 1.{EMBEDDED_MINOR}'s kinds "
            f"(DeviceTaintRule in resource.k8s.io/v1 among them); {kubernetes_version()} is "
            "compared with it on explain and discovery only"
        )
    documents = _apply_samples(crds, None, "real")
    try:
        real = _headers(crds, None, "real")
    finally:  # the control plane is shared with the other end-to-end modules
        crds.kubectl(
            "delete", "-f", "-", "--ignore-not-found", stdin=documents, step_name="delete samples"
        )
    _apply_samples(crds, embedded, "embedded")
    mine = _headers(crds, embedded, "embedded")
    with step("kubectl get headers: embedded == real", "kubectl get <kind> [-o wide]"):
        assert mine == real
