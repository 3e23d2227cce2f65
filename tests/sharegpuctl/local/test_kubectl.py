"""The real kubectl against the embedded API server, as a new user drives it: apply with client
validation on, explain, edit, get with printer columns, short names and categories, and the
requests it does not serve (protobuf bodies, server-side apply) refused naming what to do.
Skips, naming what is missing, where kubectl is not built (``make e2e`` builds it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import names
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.validation import SCHEMA_KUBERNETES_VERSION
from tests.helpers import built_kubectl
from tests.paths import EXAMPLES_DIR
from tests.sharegpuctl.kubectlrun import Kubectl
from tests.sharegpuctl.local.objects import builtin_samples, gpu_spec, gpu_status


@pytest.fixture
def kubectl(apiserver: KubeAPIServer, tmp_path: Path) -> Iterator[Kubectl]:
    binary = built_kubectl()
    yield Kubectl(binary, apiserver.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_version_is_the_kubernetes_release_of_the_schemas(kubectl: Kubectl) -> None:
    out = kubectl.ok("version")
    assert f"Server Version: v{SCHEMA_KUBERNETES_VERSION}+sharegpu" in out


def test_apply_validates_through_the_server_and_reapplies_with_a_merge(
    kubectl: Kubectl, apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    example = EXAMPLES_DIR / "whole-gpu" / "whole-gpu.yaml"
    out = kubectl.ok("apply", "-f", str(example))
    assert "resourceclaimtemplate.resource.k8s.io/whole-gpu created" in out
    assert "pod/whole-gpu created" in out
    # a changed manifest: kubectl sends a strategic merge patch; the container keeps its fields
    changed = example.read_text().replace("; nvidia-smi -L", "")
    out = kubectl.ok("apply", "-f", write(tmp_path / "changed.yaml", changed))
    assert "pod/whole-gpu configured" in out
    [container] = apiserver.store.get("pods", "whole-gpu", "default")["spec"]["containers"]
    assert container["args"][0].endswith("| sort") and container["command"] == ["sh", "-c"]
    assert container["resources"] == {"claims": [{"name": "gpu"}]}
    # validation is on: an unknown field is refused (by the server, with fieldValidation=Strict)
    bad = changed.replace("restartPolicy: Never", "restartPolicy: Never\n  bogusField: 1")
    out = kubectl.run("apply", "-f", write(tmp_path / "bad.yaml", bad))
    assert out.returncode != 0
    assert 'unknown field "spec.bogusField"' in out.stderr
    assert "failed to download openapi" not in out.stderr


def test_explain_reads_the_crd_and_the_built_in_schemas(kubectl: Kubectl) -> None:
    out = kubectl.ok("explain", "gpus.spec")
    assert f"GROUP:      {names.API_GROUP}" in out and "KIND:       GPU" in out
    for field in ("sharingMode", "uuid", "memory", "cores"):
        assert f"  {field}\t<" in out
    out = kubectl.ok("explain", "resourceclaims.spec.devices.requests.exactly")
    assert "KIND:       ResourceClaim" in out and "deviceClassName\t<string>" in out


def test_edit_changes_one_field_and_keeps_the_rest(
    kubectl: Kubectl, apiserver: KubeAPIServer
) -> None:
    kubectl.ok("apply", "-f", str(EXAMPLES_DIR / "whole-gpu" / "whole-gpu.yaml"))
    out = kubectl.ok("edit", "pod/whole-gpu", editor="sed -i s/ubuntu24.04/ubuntu22.04/")
    assert "pod/whole-gpu edited" in out
    [container] = apiserver.store.get("pods", "whole-gpu", "default")["spec"]["containers"]
    assert container["image"].endswith("ubuntu22.04")
    assert container["resources"] == {"claims": [{"name": "gpu"}]}


def test_get_shows_printer_columns_short_names_and_categories(
    kubectl: Kubectl, apiserver: KubeAPIServer
) -> None:
    gpu = apiserver.store.create(names.GPU_PLURAL, {"metadata": {"name": "g0"}, "spec": gpu_spec()})
    apiserver.store.update_status(names.GPU_PLURAL, {**gpu, "status": gpu_status(claims=2)})
    header, row = kubectl.ok("get", "sgpu").splitlines()
    assert header.split() == [
        "NAME",
        "NODE",
        "MODEL",
        "HEALTH",
        "CORES",
        "MEMORY",
        "CLAIMS",
        "LIMITS",
        "OVERCOMMIT",
        "AGE",
    ]
    assert row.split()[:3] == ["g0", "node-1", "NVIDIA"]
    assert "gpu.resource.sharegpu.dev/g0" in kubectl.ok("get", "sharegpu")
    assert "default" in kubectl.ok("get", "ns")


def test_protobuf_bodies_and_server_side_apply_are_refused_plainly(
    kubectl: Kubectl, apiserver: KubeAPIServer, tmp_path: Path
) -> None:
    # kubectl create namespace always sends protobuf: refused naming what is accepted
    out = kubectl.run("create", "namespace", "team-a")
    assert out.returncode != 0 and "UnsupportedMediaType" in out.stderr
    assert "application/json, application/yaml" in out.stderr
    assert "application/vnd.kubernetes.protobuf is not decoded by this server" in out.stderr
    # the same namespace from a manifest is sent as JSON
    manifest = write(
        tmp_path / "ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n"
    )
    assert "namespace/team-a created" in kubectl.ok("create", "-f", manifest)
    assert apiserver.store.get("namespaces", "team-a") is not None
    out = kubectl.run("apply", "--server-side", "-f", manifest)
    assert out.returncode != 0
    assert "server-side apply (application/apply-patch+yaml) is not supported" in out.stderr


#: ``kubectl get <kind>``'s header for every listable built-in kind (the real server's columns).
BUILTIN_HEADERS = {
    "pods": "NAME READY STATUS RESTARTS AGE",
    "nodes": "NAME STATUS ROLES AGE VERSION",
    "namespaces": "NAME STATUS AGE",
    "events": "LAST SEEN TYPE REASON OBJECT MESSAGE",
    "leases": "NAME HOLDER AGE",
    "deviceclasses": "NAME AGE",
    "resourceclaims": "NAME STATE AGE",
    "resourceclaimtemplates": "NAME AGE",
    "resourceslices": "NAME NODE DRIVER POOL AGE",
    "devicetaintrules": "NAME KEY VALUE EFFECT TIMEADDED AGE",
    "customresourcedefinitions": "NAME SCOPE VERSIONS CREATED AT",
}


def test_get_prints_the_built_in_kinds_columns(kubectl: Kubectl, tmp_path: Path) -> None:
    documents = (json.dumps(obj) for obj in builtin_samples("samples"))
    kubectl.ok("apply", "-f", write(tmp_path / "samples.yaml", "\n---\n".join(documents)))
    for kind, header in BUILTIN_HEADERS.items():
        first = kubectl.ok("get", kind, "-n", "samples").splitlines()[0]
        assert first.split() == header.split(), kind
    row = kubectl.ok("get", "resourceclaims", "-n", "samples", "--no-headers").split()
    assert row[:2] == ["sample", "pending"]
