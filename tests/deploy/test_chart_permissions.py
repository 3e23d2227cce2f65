"""Every write the plugin's RBAC grants, in every combination of the values that add or remove
a grant or its policy, is either narrowed by the ValidatingAdmissionPolicy that guards it or not
granted at all; a combination that would leave a write unguarded is refused by the schema.

A write is a verb other than get, list and watch. Each one is in :data:`GUARDED` (the policy that
narrows it to the plugin's node, matched by its name suffix) or in :data:`NARROW_BY_DESIGN` (with
the reason); a write in neither fails the test, so a new grant needs its policy or a reason.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.helpers import CHART_DIR, load_documents, run_helm

pytestmark = pytest.mark.helm

NAMESPACE = "gpu-operators"
PLUGIN_SA = "sharegpu-kubelet-plugin"
READ_VERBS = frozenset({"get", "list", "watch"})

#: (API group, resource, verb) -> the name suffix of the policy that narrows it to one node.
GUARDED: dict[tuple[str, str, str], str] = {
    ("resource.k8s.io", "resourceslices", "create"): "-resourceslices",
    ("resource.k8s.io", "resourceslices", "update"): "-resourceslices",
    ("resource.k8s.io", "resourceslices", "delete"): "-resourceslices",
    ("resource.k8s.io", "resourceclaims/status", "update"): "-claim-status",
    ("", "pods", "create"): "-mps-pods",
    ("", "pods", "delete"): "-mps-pods",
}
#: Writes no policy narrows, and why that is enough.
NARROW_BY_DESIGN: dict[tuple[str, str, str], str] = {
    # The API server's own authorizer checks it against the node of the token (KEP-5538).
    ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"): "node-bound verb",
    # One Warning Event on its Node; an Event changes nothing a scheduler or kubelet reads.
    ("", "events", "create"): "events only inform",
}
#: Policy operation of each verb.
OPERATIONS = {"create": "CREATE", "update": "UPDATE", "delete": "DELETE"}

#: The values that add or remove a plugin grant or its policy, and their settings.
AXES: dict[str, tuple[str, ...]] = {
    "kubeletPlugin.enabled": ("true", "false"),
    "resourceSlicePolicy.enabled": ("true", "false"),
    "kubeletPlugin.deviceBackend": ("nvml", "mock"),
    "kubeletPlugin.mps.enabled": ("true", "false"),
    "kubeletPlugin.usage.enabled": ("true", "false"),
    "kubeletPlugin.usage.writeInterval": ("30", "0"),
}


def helm_template(helm: str, *sets: str) -> subprocess.CompletedProcess[str]:
    """``helm template`` of release sharegpu in :data:`NAMESPACE`, ``--set`` each of ``sets``."""
    args = [a for item in sets for a in ("--set", item)]
    return run_helm(helm, "template", "sharegpu", str(CHART_DIR), "--namespace", NAMESPACE, *args)


def combinations() -> Iterator[dict[str, str]]:
    for values in itertools.product(*AXES.values()):
        yield dict(zip(AXES, values, strict=True))


def plugin_writes(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every write granted to the plugin's ServiceAccount."""
    roles = {
        (d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")
    }
    writes: set[tuple[str, str, str]] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount" and s.get("name") == PLUGIN_SA
            for s in binding.get("subjects", [])
        ):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group, resource, verb in itertools.product(
                rule.get("apiGroups", []), rule.get("resources", []), rule.get("verbs", [])
            ):
                if verb not in READ_VERBS:
                    writes.add((group, resource, verb))
    return writes


def guards(policy: dict[str, Any], bindings: set[str], write: tuple[str, str, str]) -> bool:
    """Whether ``policy`` is bound with Deny, is about the plugin's ServiceAccount and matches
    the write's resource and operation."""
    group, resource, verb = write
    spec = policy["spec"]
    if policy["metadata"]["name"] not in bindings:
        return False
    conditions = " ".join(c["expression"] for c in spec.get("matchConditions", []))
    if f"system:serviceaccount:{NAMESPACE}:{PLUGIN_SA}" not in conditions:
        return False
    return any(
        group in rule["apiGroups"]
        and resource in rule["resources"]
        and OPERATIONS[verb] in rule["operations"]
        for rule in spec["matchConstraints"]["resourceRules"]
    )


def unguarded(docs: list[dict[str, Any]]) -> list[str]:
    """The plugin's writes that no bound policy guards, or that are unknown to this test."""
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = {
        d["spec"]["policyName"]
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
        and d["spec"].get("validationActions") == ["Deny"]
    }
    problems = []
    for write in sorted(plugin_writes(docs)):
        if write in NARROW_BY_DESIGN:
            continue
        suffix = GUARDED.get(write)
        if suffix is None:
            problems.append(f"{write}: a write this test does not know; guard it or explain it")
        elif not any(
            p["metadata"]["name"].endswith(suffix) and guards(p, bindings, write) for p in policies
        ):
            problems.append(f"{write}: granted without its policy (*{suffix})")
    return problems


@pytest.mark.parametrize(
    "values", list(combinations()), ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items())
)
def test_every_plugin_write_is_guarded_or_refused(helm: str, values: dict[str, str]) -> None:
    result = helm_template(helm, *(f"{key}={value}" for key, value in values.items()))
    if result.returncode != 0:
        # Refused: only for the policies' switch, never for another reason.
        assert "/resourceSlicePolicy/enabled" in result.stderr, result.stderr
        return
    docs = load_documents(result.stdout)
    assert unguarded(docs) == []
    if values["kubeletPlugin.enabled"] == "true":
        assert plugin_writes(docs), "the plugin renders without any write: the test sees nothing"


def test_the_policies_switch_renders_where_no_plugin_runs(helm: str) -> None:
    """resourceSlicePolicy.enabled=false renders only without the plugin: there it removes
    nothing that guards a grant."""
    off = "resourceSlicePolicy.enabled=false"
    for extra in ([], ["kubeletPlugin.mps.enabled=false"], ["kubeletPlugin.usage.enabled=false"]):
        refused = helm_template(helm, off, *extra)
        assert refused.returncode != 0 and "/resourceSlicePolicy/enabled" in refused.stderr
    without = helm_template(helm, off, "kubeletPlugin.enabled=false")
    assert without.returncode == 0, without.stderr
    docs = load_documents(without.stdout)
    assert not [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert plugin_writes(docs) == set()


def test_the_check_sees_a_grant_without_its_policy(helm: str) -> None:
    """The check itself: dropping the claim status policy from a default rendering is caught."""
    docs = [
        d
        for d in load_documents(helm_template(helm).stdout)
        if not d["metadata"]["name"].endswith("-claim-status")
    ]
    assert unguarded(docs) == [
        "('resource.k8s.io', 'resourceclaims/status', 'update'): granted without its policy "
        "(*-claim-status)"
    ]


def test_without_claim_status_writes_the_plugin_writes_none(helm: str) -> None:
    """The plugin's --usage-write-interval and its grant follow one condition."""
    default = load_documents(helm_template(helm).stdout)
    assert ("resource.k8s.io", "resourceclaims/status", "update") in plugin_writes(default)
    assert "--usage-write-interval=30" in plugin_args(default)
    for sets in (["kubeletPlugin.usage.writeInterval=0"], ["kubeletPlugin.usage.enabled=false"]):
        docs = load_documents(helm_template(helm, *sets).stdout)
        assert all(w[1] != "resourceclaims/status" for w in plugin_writes(docs))
        assert plugin_writes(docs)  # the other grants are still seen
        written = [f for f in plugin_args(docs) if f.startswith("--usage-write-interval=")]
        assert written in ([], ["--usage-write-interval=0"])


def plugin_args(docs: list[dict[str, Any]]) -> list[str]:
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])
