"""The chart's GpuQuota parts: the CRD (a copy of the generated file, kept on uninstall) and the
controller's rights on GpuQuotas."""

from __future__ import annotations

from typing import Any

import pytest

from api.crd import QUOTA_CRD_PATH, render_quota
from tests.deploy.helpers import CHART_DIR, by_kind, render_chart

pytestmark = pytest.mark.helm


@pytest.fixture(scope="module")
def docs(helm: str) -> list[dict[str, Any]]:
    return render_chart(helm)


def test_generated_quota_crd_is_current_and_copied_into_the_chart() -> None:
    assert QUOTA_CRD_PATH.read_text() == render_quota(), "run `python -m api.crd`"
    copy = CHART_DIR / "files" / QUOTA_CRD_PATH.name
    assert copy.read_text() == QUOTA_CRD_PATH.read_text(), "run `bash deploy/helm/sync-crds.sh`"


def test_quota_crd_is_rendered_with_printer_columns_and_keep_policy(
    docs: list[dict[str, Any]],
) -> None:
    (crd,) = [
        d
        for d in by_kind(docs, "CustomResourceDefinition")
        if d["metadata"]["name"] == "gpuquotas.resource.sharegpu.dev"
    ]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Cores"] == ".status.coresSummary"
    assert columns["Memory"] == ".status.memorySummary"
    assert columns["Devices"] == ".status.devicesSummary"
    assert version["subresources"] == {"status": {}}


def test_controller_may_read_quotas_and_write_their_status_only(
    docs: list[dict[str, Any]],
) -> None:
    (role,) = [
        d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"].endswith("controller")
    ]
    granted = {
        (resource, verb)
        for rule in role["rules"]
        if "resource.sharegpu.dev" in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if resource.startswith("gpuquotas")
    }
    assert granted == {
        ("gpuquotas", "get"),
        ("gpuquotas", "list"),
        ("gpuquotas", "watch"),
        ("gpuquotas/status", "update"),
    }
