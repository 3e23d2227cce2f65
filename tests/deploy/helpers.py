"""Shared checks of the chart and example tests: strict schema validation and helm invocation.

Validation uses the ``kubernetes_validate`` Python API in strict mode (unknown fields are errors).
A document whose kind has no schema for the Kubernetes version is a failure, except for the kinds
listed as allowed (this project's own CRD kinds, and cert-manager's when the chart uses it).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

import kubernetes_validate
import yaml

from tests.paths import REPO_ROOT

CHART_DIR = REPO_ROOT / "deploy" / "helm" / "sharegpu"
EXAMPLES_DIR = REPO_ROOT / "examples"

#: The Kubernetes versions every user-facing manifest is validated for: the oldest supported
#: release and the first with consumable capacity on by default.
KUBERNETES_VERSIONS = ("1.34", "1.36")

#: API groups whose kinds have no Kubernetes schema and are allowed to lack one.
OWN_GROUPS = frozenset({"resource.sharegpu.dev"})
CERT_MANAGER_GROUPS = frozenset({"cert-manager.io"})


def api_group(doc: Mapping[str, Any]) -> str:
    """The API group of a manifest (``""`` for the core group)."""
    api_version = str(doc.get("apiVersion", ""))
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def describe(doc: Mapping[str, Any]) -> str:
    """``Kind/name`` of a manifest, for messages."""
    metadata = doc.get("metadata") or {}
    return f"{doc.get('kind', '?')}/{metadata.get('name', metadata.get('generateName', '?'))}"


def validation_errors(
    doc: Mapping[str, Any], version: str, allowed_missing_groups: Iterable[str] = OWN_GROUPS
) -> list[str]:
    """Problems of one manifest under the strict schemas of ``version``; empty when valid."""
    try:
        kubernetes_validate.validate(dict(doc), version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        if api_group(doc) in set(allowed_missing_groups):
            return []
        return [f"{describe(doc)}: no schema for {doc.get('apiVersion')} in Kubernetes {version}"]
    except kubernetes_validate.ValidationError as err:
        path = "/".join(str(p) for p in err.path) or "<root>"
        return [f"{describe(doc)}: Kubernetes {version}: {path}: {err.message}"]
    return []


def load_documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def helm_binary() -> str | None:
    """Path of helm: the one tests/install-helm.sh puts into the virtualenv, else one on PATH."""
    venv_helm = REPO_ROOT / ".venv" / "bin" / "helm"
    if venv_helm.exists():
        return str(venv_helm)
    return shutil.which("helm")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``; the caller checks the return code and output."""
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)


def render_chart(
    helm: str, *extra: str, release: str = "sharegpu", namespace: str = "gpu-operators"
) -> list[dict[str, Any]]:
    """The chart's documents rendered by ``helm template`` with ``extra`` arguments (``--set``,
    ``--set-json``, ...); the test fails with helm's error when it does not render."""
    result = run_helm(helm, "template", release, str(CHART_DIR), "--namespace", namespace, *extra)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return load_documents(result.stdout)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The documents of ``kind``, in rendering order."""
    return [doc for doc in docs if doc["kind"] == kind]
