"""The built-in kinds' Table columns: the headers the real API server prints for each kind the
embedded one serves, and cells computed from the objects as the real server's printers do."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import urllib3

from api import names
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.printers import BUILTIN_COLUMNS, pod_summary
from sharegpuctl.local.apiserver.resources import default_resources
from sharegpuctl.local.apiserver.tables import table

Obj = dict[str, Any]
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
HOUR_AGO = "2026-01-02T02:04:05Z"
R = names.RESOURCE_GROUP

#: (group, plural) -> the priority-0 headers (what ``kubectl get`` shows) and the wide ones.
EXPECTED: dict[tuple[str, str], tuple[list[str], list[str]]] = {
    ("", "pods"): (
        ["Name", "Ready", "Status", "Restarts", "Age"],
        ["IP", "Node", "Nominated Node", "Readiness Gates"],
    ),
    ("", "nodes"): (
        ["Name", "Status", "Roles", "Age", "Version"],
        ["Internal-IP", "External-IP", "OS-Image", "Kernel-Version", "Container-Runtime"],
    ),
    ("", "namespaces"): (["Name", "Status", "Age"], []),
    ("", "events"): (
        ["Last Seen", "Type", "Reason", "Object", "Message"],
        ["Subobject", "Source", "First Seen", "Count", "Name"],
    ),
    ("coordination.k8s.io", "leases"): (["Name", "Holder", "Age"], []),
    (R, "deviceclasses"): (["Name", "Age"], []),
    (R, "resourceclaims"): (["Name", "State", "Age"], []),
    (R, "resourceclaimtemplates"): (["Name", "Age"], []),
    (R, "resourceslices"): (["Name", "Node", "Driver", "Pool", "Age"], []),
    (R, "devicetaintrules"): (["Name", "Key", "Value", "Effect", "TimeAdded", "Age"], []),
    ("apiextensions.k8s.io", "customresourcedefinitions"): (
        ["Name", "Scope", "Versions", "Created At"],
        ["Group", "Kind", "ShortNames", "Established"],
    ),
}


def _table(plural: str, obj: Obj) -> Obj:
    [rt] = [rt for rt in default_resources() if rt.plural == plural]
    return table(rt, [obj], "1", None, now=NOW)


def _cells(plural: str, obj: Obj) -> list[Any]:
    cells: list[Any] = _table(plural, obj)["rows"][0]["cells"]
    return cells


def _meta(name: str = "x", **extra: Any) -> Obj:
    return {"name": name, "creationTimestamp": HOUR_AGO, **extra}


def test_every_listable_built_in_kind_has_the_real_servers_columns() -> None:
    served = {
        (rt.group, rt.plural)
        for rt in default_resources()
        if rt.crd is None and not rt.plural.endswith("reviews")
    }
    assert served == set(EXPECTED)
    assert set(BUILTIN_COLUMNS) == served
    for (_, plural), (shown, wide) in EXPECTED.items():
        columns = _table(plural, {"metadata": _meta()})["columnDefinitions"]
        assert [c["name"] for c in columns if c["priority"] == 0] == shown, plural
        assert [c["name"] for c in columns if c["priority"] == 1] == wide, plural


@pytest.mark.parametrize(
    ("status", "deleting", "state"),
    [
        ({}, False, "pending"),
        ({}, True, "deleted"),
        ({"allocation": {"devices": {}}}, False, "allocated"),
        ({"allocation": {}, "reservedFor": [{"name": "p"}]}, False, "allocated,reserved"),
        ({"allocation": {}, "reservedFor": [{"name": "p"}]}, True, "deleted,allocated,reserved"),
    ],
)
def test_claim_state_summarises_allocation_reservation_and_deletion(
    status: Obj, deleting: bool, state: str
) -> None:
    meta = _meta(**({"deletionTimestamp": HOUR_AGO} if deleting else {}))
    assert _cells("resourceclaims", {"metadata": meta, "status": status}) == ["x", state, "60m"]


def test_slice_rule_node_namespace_and_lease_cells() -> None:
    slice_ = {"metadata": _meta("s"), "spec": {"driver": "d", "pool": {"name": "p"}}}
    assert _cells("resourceslices", slice_) == ["s", "", "d", "p", "60m"]
    slice_["spec"]["nodeName"] = "n1"
    assert _cells("resourceslices", slice_)[1] == "n1"
    rule = {"metadata": _meta("r"), "spec": {"taint": {"key": "k", "effect": "NoSchedule"}}}
    assert _cells("devicetaintrules", rule) == ["r", "k", "", "NoSchedule", "", "60m"]
    rule["spec"]["taint"]["timeAdded"] = "2026-01-02T03:03:05Z"
    assert _cells("devicetaintrules", rule)[4] == "60s"
    node: Obj = {
        "metadata": _meta(
            "n", labels={"node-role.kubernetes.io/worker": "", "kubernetes.io/role": "gpu"}
        ),
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "nodeInfo": {
                "kubeletVersion": "v1.37.2",
                "kernelVersion": "6.1",
                "architecture": "amd64",
            },
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        },
    }
    assert _cells("nodes", node) == [
        "n", "NotReady,SchedulingDisabled", "gpu,worker", "60m", "v1.37.2",
        "10.0.0.1", "<none>", "<unknown>", "6.1 (amd64)", "<unknown>",
    ]  # fmt: skip
    assert _cells("nodes", {"metadata": {"name": "bare"}})[1:4] == [
        "Unknown",
        "<none>",
        "<unknown>",
    ]
    ns = {"metadata": _meta("team"), "status": {"phase": "Terminating"}}
    assert _cells("namespaces", ns) == ["team", "Terminating", "60m"]
    lease = {"metadata": _meta("l"), "spec": {"holderIdentity": "me"}}
    assert _cells("leases", lease) == ["l", "me", "60m"]


def test_event_cells_fall_back_from_last_to_first_seen_and_count_one() -> None:
    event: Obj = {
        "metadata": _meta("e.1"),
        "involvedObject": {"kind": "Pod", "name": "p", "fieldPath": "spec.containers{c}"},
        "reason": "Started",
        "type": "Normal",
        "message": " started \n",
        "eventTime": "2026-01-02T03:02:04.5Z",
        "reportingComponent": "kubelet",
        "reportingInstance": "node-1",
    }
    assert _cells("events", event) == [
        "2m", "Normal", "Started", "pod/p", "spec.containers{c}", "kubelet, node-1",
        "started", "2m", 1, "e.1",
    ]  # fmt: skip
    event.update(series={"count": 4, "lastObservedTime": "2026-01-02T03:04:00.000000Z"})
    event["involvedObject"] = {"kind": "Node"}
    cells = _cells("events", event)
    assert (cells[0], cells[3], cells[8]) == ("5s", "node", 4)


def test_crd_cells_list_served_versions_and_established() -> None:
    crd: Obj = {
        "metadata": _meta("widgets.example.com"),
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"kind": "Widget", "shortNames": ["wd", "wdg"]},
            "versions": [
                {"name": "v2", "served": True, "storage": True},
                {"name": "v1", "served": True, "storage": False},
                {"name": "v0", "served": False, "storage": False},
            ],
        },
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }
    assert _cells("customresourcedefinitions", crd) == [
        "widgets.example.com", "Namespaced", "v1,v2(storage)", HOUR_AGO,
        "example.com", "Widget", "wd,wdg", True,
    ]  # fmt: skip
    crd["status"] = {}
    assert _cells("customresourcedefinitions", crd)[-1] is False


def _container(name: str, state: Obj, ready: bool = False, restarts: int = 0) -> Obj:
    return {"name": name, "state": state, "ready": ready, "restartCount": restarts}


def test_pod_ready_status_and_restarts() -> None:
    pod: Obj = {
        "metadata": _meta("p"),
        "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n1"},
        "status": {"phase": "Pending"},
    }
    assert _cells("pods", pod) == [
        "p",
        "0/2",
        "Pending",
        "0",
        "60m",
        "<none>",
        "n1",
        "<none>",
        "<none>",
    ]
    last = {"terminated": {"finishedAt": "2026-01-02T03:00:05Z", "exitCode": 1}}
    pod["status"] = {
        "phase": "Running",
        "podIPs": [{"ip": "10.1.0.5"}],
        "containerStatuses": [
            _container("a", {"running": {}}, ready=True, restarts=2) | {"lastState": last},
            _container("b", {"waiting": {"reason": "CrashLoopBackOff"}}, restarts=1),
        ],
    }
    cells = _cells("pods", pod)
    assert cells[1:4] == ["1/2", "CrashLoopBackOff", "3 (4m ago)"]
    assert cells[5] == "10.1.0.5"
    pod["metadata"]["deletionTimestamp"] = HOUR_AGO
    assert _cells("pods", pod)[2] == "Terminating"


def test_pod_init_containers_sidecars_and_completion() -> None:
    pod: Obj = {
        "metadata": _meta("p"),
        "spec": {
            "initContainers": [{"name": "i"}, {"name": "side", "restartPolicy": "Always"}],
            "containers": [{"name": "a"}],
        },
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [_container("i", {"waiting": {}})],
        },
    }
    summary = pod_summary(pod)
    assert (summary.ready, summary.total, summary.reason) == (0, 2, "Init:0/2")
    pod["status"]["initContainerStatuses"] = [
        _container("i", {"terminated": {"exitCode": 2}}),
    ]
    assert pod_summary(pod).reason == "Init:ExitCode:2"
    pod["status"] = {
        "phase": "Succeeded",
        "initContainerStatuses": [
            _container("i", {"terminated": {"exitCode": 0}}),
            _container("side", {"running": {}}, ready=True) | {"started": True},
        ],
        "containerStatuses": [
            _container("a", {"terminated": {"exitCode": 0, "reason": "Completed"}})
        ],
    }
    row = _table("pods", pod)["rows"][0]
    assert row["cells"][1:3] == ["1/2", "Completed"]
    assert row["conditions"] == [
        {
            "type": "Completed",
            "status": "True",
            "reason": "Succeeded",
            "message": "The pod has completed successfully.",
        }
    ]
    pod["status"]["containerStatuses"].append(_container("b", {"running": {}}, ready=True))
    assert pod_summary(pod).reason == "NotReady"
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert pod_summary(pod).reason == "Running"


def test_the_server_answers_built_in_tables(apiserver: KubeAPIServer) -> None:
    apiserver.store.create(
        "resourceclaims",
        {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {}}},
    )
    resp = urllib3.request(
        "GET",
        f"{apiserver.url}/apis/{names.RESOURCE_GROUP_VERSION}/namespaces/default/resourceclaims",
        headers={"Accept": TABLE},
    )
    answer = json.loads(resp.data)
    assert [c["name"] for c in answer["columnDefinitions"]] == ["Name", "State", "Age"]
    assert answer["rows"][0]["cells"][:2] == ["c", "pending"]
