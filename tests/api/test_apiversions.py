"""The table of ``resource.k8s.io`` versions per release (:mod:`api.apiversions`), checked
against the kube-apiserver sources the e2e build caches (each pinned release whose source is
there: its ``pkg/controlplane/instance.go`` lists the versions enabled and disabled by
default), and the message for a version a release does not serve."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from api.apiversions import RESOURCE_API_VERSIONS, served_versions, unserved_problem
from api.gates import LATEST_KUBERNETES
from api.upstream import UPSTREAM


def kubernetes_sources() -> list[Path]:
    """``k8s.io/kubernetes@v1.X.Y`` module directories of the e2e build's Go module cache."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return sorted((base / "sharegpu-e2e" / "gomod" / "k8s.io").glob("kubernetes@v1.*"))


def _block(source: str, variable: str) -> str:
    match = re.search(rf"\b{variable} = \[\]schema\.GroupVersion\{{(.*?)\n\t\}}", source, re.S)
    assert match, f"{variable} not found"
    return match.group(1)


def resource_versions_of(instance_go: str) -> tuple[set[str], set[str]]:
    """(enabled by default, disabled by default) resource.k8s.io versions of instance.go."""
    aliases = dict(re.findall(r'\t(\w+) "k8s\.io/api/resource/(\w+)"', instance_go))

    def versions(*variables: str) -> set[str]:
        found = set()
        for variable in variables:
            for alias in re.findall(r"\b(\w+)\.SchemeGroupVersion", _block(instance_go, variable)):
                if alias in aliases:
                    found.add(aliases[alias])
        return found

    return (
        versions("stableAPIGroupVersionsEnabledByDefault"),
        versions("betaAPIGroupVersionsDisabledByDefault", "alphaAPIGroupVersionsDisabledByDefault"),
    )


def test_the_table_covers_every_supported_release() -> None:
    assert sorted(RESOURCE_API_VERSIONS) == [(1, m) for m in range(34, LATEST_KUBERNETES[1] + 1)]
    for versions in RESOURCE_API_VERSIONS.values():
        assert not set(versions.served) & set(versions.disabled)


@pytest.mark.parametrize("module", kubernetes_sources(), ids=lambda p: p.name)
def test_the_table_is_what_kube_apiserver_enables(module: Path) -> None:
    minor = int(module.name.split("@v1.")[1].split(".")[0])
    enabled, disabled = resource_versions_of(
        (module / "pkg" / "controlplane" / "instance.go").read_text()
    )
    table = RESOURCE_API_VERSIONS[(1, minor)]
    assert enabled == set(table.served)
    assert disabled == set(table.disabled)


def test_the_sources_are_cached_or_the_check_says_so() -> None:
    if not kubernetes_sources():
        pytest.skip("no kube-apiserver source cached: run `python -m tests.e2e.binaries` first")
    assert {p.name for p in kubernetes_sources()} >= {f"kubernetes@v{UPSTREAM.kubernetes}"}


def test_served_versions_follow_runtime_config() -> None:
    assert served_versions((1, 37)) == ("v1",)
    assert served_versions((1, 37), {"resource.k8s.io/v1beta2"}) == ("v1", "v1beta2")
    assert served_versions((1, 37), {"other.example.com/v1beta2"}) == ("v1",)
    assert served_versions((1, 33)) is None


def test_the_problem_names_the_served_versions_and_the_flag() -> None:
    assert unserved_problem("resource.k8s.io/v1", (1, 34)) is None
    assert unserved_problem("apps/v1beta1", (1, 37)) is None
    assert unserved_problem("resource.k8s.io/v1beta1", (1, 37), {"resource.k8s.io/v1beta1"}) is None
    assert unserved_problem("resource.k8s.io/v1beta1", (1, 37)) == (
        "Kubernetes 1.37 does not serve resource.k8s.io/v1beta1 (it serves resource.k8s.io/v1); "
        "its API server serves resource.k8s.io/v1beta1 only with "
        "--runtime-config=resource.k8s.io/v1beta1=true (pass the same to this command if yours "
        "does)"
    )
    assert unserved_problem("resource.k8s.io/v1alpha2", (1, 36), {"resource.k8s.io/v1beta2"}) == (
        "Kubernetes 1.36 does not serve resource.k8s.io/v1alpha2 (it serves resource.k8s.io/v1, "
        "resource.k8s.io/v1beta2); Kubernetes 1.36 has no resource.k8s.io/v1alpha2"
    )
