"""``sharegpu explain``: allocations and the exact reasons a claim does not fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import names
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import allocate_many
from sharegpuctl.cli import main
from sharegpuctl.cli.common import default_device_class
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.paths import EXAMPLES_DIR

DRIVER = names.DEFAULT_DRIVER_NAME
NODE = "n1"
Obj = dict[str, Any]


def claim(name: str, *requests: Obj, constraints: list[Obj] | None = None) -> Obj:
    devices: Obj = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": devices},
    }


def request(
    name: str = "gpu", selectors: list[str] | None = None, capacity: dict[str, str] | None = None
) -> Obj:
    exactly: Obj = {"deviceClassName": DRIVER}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def write(path: Path, *docs: Obj) -> str:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return str(path)


def explain(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Obj]:
    code = main(["explain", *argv, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def node_slices(gpus: int = 8) -> list[Obj]:
    objects = resource_slice_objects(
        desired_slices(
            node_devices(MockBackend(NODE, gpus).discover(), names.SHARING_MODE_CONSUMABLE)
        ),
        DRIVER,
        NODE,
        None,
        1,
    )
    for i, obj in enumerate(objects):
        obj["metadata"] = {"name": f"{NODE}-slice-{i}"}
    return objects


def only_failure(report: Obj) -> Obj:
    [entry] = report["claims"]
    assert entry["allocated"] is False
    [attempt] = entry["nodes"]
    assert attempt["node"] == NODE
    return attempt  # type: ignore[no-any-return]


def test_fits_offline_on_the_mock_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(
        tmp_path / "c.yaml", claim("share", request(capacity={"cores": "30", "memory": "10Gi"}))
    )
    code, report = explain(capsys, "-f", f, "--node-name", NODE)
    assert code == 0
    [entry] = report["claims"]
    assert entry["allocated"] is True and entry["node"] == NODE
    [result] = entry["results"]
    assert result["device"] == "gpu-0" and result["pool"] == NODE
    assert result["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}
    assert result["shareID"]


def test_the_node_flags_default_share_cores_reaches_the_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two memory-only shares do not fit one GPU at the default 100 cores each; at 40 they do."""
    shares = [claim(n, request(capacity={"memory": "10Gi"})) for n in ("a", "b")]
    f = write(tmp_path / "c.yaml", *shares)
    code, report = explain(capsys, "-f", f, "--node-name", NODE, "--mock", "1")
    assert code == 1 and [c["allocated"] for c in report["claims"]] == [True, False]
    argv = ("-f", f, "--node-name", NODE, "--mock", "1", "--default-share-cores", "40")
    code, report = explain(capsys, *argv)
    assert code == 0
    assert [c["results"][0]["consumedCapacity"]["cores"] for c in report["claims"]] == ["40"] * 2
    assert main(["explain", *argv[:-1], "0"]) == 2
    assert "--default-share-cores 0: must be 1 to 100" in capsys.readouterr().err


def test_the_node_flags_share_limit_reaches_the_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tiny shares are charged the GPU's smallest share: 4 shares at most with a limit of 4."""
    shares = [claim(f"s{i}", request(capacity={"cores": "1", "memory": "1Gi"})) for i in range(5)]
    f = write(tmp_path / "c.yaml", *shares)
    argv = ("-f", f, "--node-name", NODE, "--mock", "1", "--max-shares-per-gpu", "4")
    code, report = explain(capsys, *argv)
    assert code == 1 and [c["allocated"] for c in report["claims"]] == [True] * 4 + [False]
    assert report["claims"][0]["results"][0]["consumedCapacity"]["cores"] == "25"
    assert main(["explain", *argv[:-1], "61"]) == 2
    assert "--max-shares-per-gpu 61: must be 0 to 60" in capsys.readouterr().err


def test_mistyped_attribute_is_invalid_and_not_allocated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admission webhook's checks run first: the webhook would refuse this claim."""
    expr = "device.attributes['gpu.sharegpu.dev'].prodName.contains('H100')"
    f = write(tmp_path / "c.yaml", claim("typo", request(selectors=[expr])))
    code, report = explain(capsys, "-f", f, "--node-name", NODE)
    assert code == 1
    assert report["valid"] is False
    assert report["claims"] == [
        {
            "claim": "default/typo",
            "allocated": False,
            "error": "not allocated: the files have errors",
        }
    ]
    [finding] = report["findings"]
    assert finding["path"] == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert finding["severity"] == "error"
    assert "no attribute 'prodName'; did you mean 'productName'?" in finding["message"]


def test_memory_larger_than_any_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(
        tmp_path / "c.yaml", claim("big", request(capacity={"cores": "50", "memory": "96Gi"}))
    )
    code, report = explain(capsys, "-f", f, "--node-name", NODE)
    assert code == 1
    [req] = only_failure(report)["requests"]
    assert req["summary"] == "needs 1 device(s), 0 of 8 eligible (8 capacity-policy)"
    # The mock H100 has 81032Mi usable, and one share may have at most 79Gi (256Mi steps):
    # no share of it can ever hold 96Gi, so this is the request policy, not a shortage.
    assert req["reasons"] == [
        {
            "kind": "capacity-policy",
            "reason": "capacity memory: requested 96Gi, but one share of the device may have "
            "at most 79Gi (validRange min 256Mi, max 79Gi, step 256Mi); request at most 79Gi",
            "devices": [f"gpu-{i}" for i in range(8)],
        }
    ]
    assert {r["kind"] for r in req["rejections"]} == {"capacity-policy"}
    details = req["rejections"][0]["details"]
    assert details == {
        "capacity": "memory",
        "requested": "96Gi",
        "available": "81032Mi",
        "shortBy": "17272Mi",
    }


def test_full_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slices = node_slices(2)
    holders = [
        claim("big-a", request(capacity={"cores": "80", "memory": "60Gi"})),
        claim("big-b", request(capacity={"cores": "80", "memory": "60Gi"})),
    ]
    outcomes = allocate_many(holders, slices, [default_device_class()], node=NODE)
    for holder, outcome in zip(holders, outcomes, strict=True):
        assert outcome.allocation is not None
        holder["status"] = {"allocation": outcome.allocation}
    slices_file = write(tmp_path / "slices.yaml", *slices)
    allocated = write(tmp_path / "allocated.yaml", *holders)
    wanted = write(
        tmp_path / "c.yaml", claim("late", request(capacity={"cores": "30", "memory": "10Gi"}))
    )
    code, report = explain(capsys, "-f", wanted, "--slices", slices_file, "--allocated", allocated)
    assert code == 1
    assert report["nodes"] == [NODE]
    [req] = only_failure(report)["requests"]
    assert req["summary"] == "needs 1 device(s), 0 of 2 eligible (2 capacity-short)"
    assert req["reasons"] == [
        {
            "kind": "capacity-short",
            "reason": "capacity cores: requested 30, available 20 (short 10)",
            "devices": ["gpu-0", "gpu-1"],
        }
    ]
    # With one holder fewer the claim fits on the GPU that was freed.
    write(tmp_path / "allocated.yaml", holders[0])
    code, report = explain(capsys, "-f", wanted, "--slices", slices_file, "--allocated", allocated)
    assert code == 0
    assert report["claims"][0]["results"][0]["device"] == "gpu-1"


def test_unsatisfiable_match_attribute(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = "device.attributes['gpu.sharegpu.dev'].index == {}"
    c = claim(
        "apart",
        request("a", selectors=[index.format(0)]),
        request("b", selectors=[index.format(7)]),
        constraints=[{"requests": ["a", "b"], "matchAttribute": names.ATTR_PCIE_ROOT}],
    )
    code, report = explain(capsys, "-f", write(tmp_path / "c.yaml", c), "--node-name", NODE)
    assert code == 1
    reqs = {r["request"]: r for r in only_failure(report)["requests"]}
    assert reqs["a"]["reasons"] == [
        {
            "kind": "constraint",
            "reason": "matchAttribute resource.kubernetes.io/pcieRoot: device has pci0000:00, "
            "but no eligible device of request b has that value",
            "devices": ["gpu-0"],
        },
        {
            "kind": "selector-false",
            "reason": f"request selector #0 is false: {index.format(0)}",
            "devices": [f"gpu-{i}" for i in range(1, 8)],
        },
    ]
    assert reqs["b"]["reasons"][1] == {
        "kind": "constraint",
        "reason": "matchAttribute resource.kubernetes.io/pcieRoot: device has pci0000:80, "
        "but no eligible device of request a has that value",
        "devices": ["gpu-7"],
    }


def test_template_and_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tmpl"},
        "spec": {"spec": claim("x", request(capacity={"cores": "10", "memory": "200Gi"}))["spec"]},
    }
    big = claim("big", request(capacity={"cores": "50", "memory": "96Gi"}))
    f = write(tmp_path / "c.yaml", big, template)
    assert main(["explain", "-f", f, "--node-name", NODE, "-o", "text"]) == 1
    out = capsys.readouterr().out
    assert "default/big: cannot be allocated on node n1" in out
    assert "capacity memory: requested 96Gi, but one share of the device may have" in out
    assert "default/tmpl: cannot be allocated on node n1" in out


def test_live_cluster_counts_allocated_claims(
    apiserver: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for s in node_slices(1):
        apiserver.store.create("resourceslices", s)
    apiserver.store.create("deviceclasses", default_device_class())
    holder = claim("holder", request(capacity={"cores": "90", "memory": "10Gi"}))
    [outcome] = allocate_many([holder], node_slices(1), [default_device_class()], node=NODE)
    assert outcome.allocation is not None
    holder["status"] = {"allocation": outcome.allocation}
    created = apiserver.store.create("resourceclaims", holder)
    created["status"] = holder["status"]
    apiserver.store.update_status("resourceclaims", created)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    wanted = claim("wanted", request(capacity={"cores": "20", "memory": "1Gi"}))
    f = write(tmp_path / "c.yaml", wanted)
    code, report = explain(capsys, "-f", f, "--kubeconfig", kubeconfig)
    assert code == 1
    [req] = only_failure(report)["requests"]
    assert req["reasons"][0]["reason"] == "capacity cores: requested 20, available 10 (short 10)"
    # Explaining the holder itself does not count its own allocation.
    code, report = explain(
        capsys, "-f", write(tmp_path / "h.yaml", holder), "--kubeconfig", kubeconfig
    )
    assert code == 0


def test_expected_failures_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", str(tmp_path / "missing.yaml")]) == 1
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"sharegpu explain: error: {tmp_path / 'missing.yaml'}: no such file or directory"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    assert main(["explain", "-f", str(bad)]) == 1
    assert "invalid YAML" in capsys.readouterr().err
    empty = write(tmp_path / "empty.yaml", default_device_class())
    assert main(["explain", "-f", empty]) == 1
    assert "no ResourceClaim or ResourceClaimTemplate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["explain"])
    assert exit_info.value.code == 2


def test_first_node_that_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slices = node_slices(1)
    other = resource_slice_objects(
        desired_slices(
            node_devices(MockBackend("n2", 1).discover(), names.SHARING_MODE_CONSUMABLE)
        ),
        DRIVER,
        "n2",
        None,
        1,
    )
    other[0]["metadata"] = {"name": "n2-slice-0"}
    big = claim("big", request(capacity={"cores": "70", "memory": "40Gi"}))
    second = claim("second", request(capacity={"cores": "70", "memory": "40Gi"}))
    third = claim("third", request(capacity={"cores": "70", "memory": "40Gi"}))
    f = write(tmp_path / "c.yaml", big, second, third)
    code, report = explain(capsys, "-f", f, "--slices", write(tmp_path / "s.yaml", *slices, *other))
    assert code == 1
    assert report["nodes"] == ["n1", "n2"]
    placed = [(c["claim"], c.get("node")) for c in report["claims"]]
    assert placed == [("default/big", "n1"), ("default/second", "n2"), ("default/third", None)]
    attempts = report["claims"][2]["nodes"]
    assert [a["node"] for a in attempts] == ["n1", "n2"]
    for attempt in attempts:
        [req] = attempt["requests"]
        assert req["reasons"][0]["reason"] == (
            "capacity cores: requested 70, available 30 (short 40)"
        )


def _mock_node_slices(node: str, backend: MockBackend) -> list[Obj]:
    slices = resource_slice_objects(
        desired_slices(node_devices(backend.discover(), names.SHARING_MODE_CONSUMABLE)),
        DRIVER,
        node,
        None,
        1,
    )
    for i, s in enumerate(slices):
        s["metadata"] = {"name": f"{node}-slice-{i}"}
    return slices


def test_node_flag_leaves_the_slices_of_other_nodes_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slices dumped from a cluster hold every node's: with ``--node`` (the node a pod is pinned
    to, the only one kube-scheduler tries) a claim that fits on another node only is explained
    as not fitting, with the reason of that node."""
    pairs = tmp_path / "pairs.yaml"
    pairs.write_text("".join(f"- {{nvlinkDomain: pair-{i // 2}}}\n" for i in range(8)))
    slices = write(
        tmp_path / "s.yaml",
        *_mock_node_slices(NODE, MockBackend(NODE, config_file=pairs)),
        # The mock's default GPUs: all eight in one NVSwitch domain.
        *_mock_node_slices("n2", MockBackend("n2")),
    )
    nvlink = f"{DRIVER}/{names.ATTR_NVLINK_DOMAIN}"
    four = claim(
        "four",
        {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 4}},
        constraints=[{"requests": ["gpus"], "matchAttribute": nvlink}],
    )
    f = write(tmp_path / "c.yaml", four)

    code, report = explain(capsys, "-f", f, "--slices", slices)
    assert code == 0 and report["nodes"] == [NODE, "n2"]
    [entry] = report["claims"]
    assert entry["allocated"] and entry["node"] == "n2", entry

    code, report = explain(capsys, "-f", f, "--slices", slices, "--node", NODE)
    assert code == 1 and report["nodes"] == [NODE]
    [entry] = report["claims"]
    assert not entry["allocated"], entry
    assert [a["node"] for a in entry["nodes"]] == [NODE]
    assert (
        f"matchAttribute {nvlink}: 4 devices must share one value, at most 2 eligible do"
    ) in json.dumps(entry), entry


def _two_plain_gpus() -> Obj:
    devices = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(2)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "plain"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_claims_of_one_pod_are_allocated_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Either GPU suits ``any``, only gpu-0 suits ``first``: claim by claim ``any`` takes
    gpu-0 and ``first`` is left without; as one pod's claims both are allocated."""
    first = f"device.attributes['{DRIVER}'].index == 0"
    claims = [claim("any", request()), claim("first", request(selectors=[first]))]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "any"},
                {"name": "b", "resourceClaimName": "first"},
            ],
        },
    }
    slices = write(tmp_path / "slices.yaml", _two_plain_gpus())
    alone = write(tmp_path / "alone.yaml", *claims)
    code, report = explain(capsys, "-f", alone, "--slices", slices)
    assert code != 0
    assert [e["allocated"] for e in report["claims"]] == [True, False]
    together = write(tmp_path / "pod.yaml", *claims, pod)
    code, report = explain(capsys, "-f", together, "--slices", slices)
    assert code == 0
    entries = {e["claim"]: e for e in report["claims"]}
    assert [r["device"] for r in entries["default/any"]["results"]] == ["gpu-1"]
    assert [r["device"] for r in entries["default/first"]["results"]] == ["gpu-0"]
    assert entries["default/first"]["pod"] == "Pod/trainer"
    assert entries["default/first"]["allocatedWith"] == ["default/any"]


def test_quota_verdicts_name_the_quota_and_what_is_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --quota, explain says which claims of the quota's namespace the admission webhook
    would admit (in file order, usage 0) and which it would deny, with the webhook's text."""
    examples = EXAMPLES_DIR / "gpu-quota"
    code = main(
        [
            "explain",
            "-f",
            str(examples / "quota-claims.yaml"),
            "--quota",
            str(examples / "gpu-quota.yaml"),
            "--mock",
            "2",
            "--node-name",
            "n1",
            "-o",
            "json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 1  # a claim the quota denies is a finding, though the devices would fit
    assert all(c["allocated"] for c in data["claims"])
    assert data["quota"] == [
        {"claim": "gpu-quota-demo/share-a", "quota": "gpu-quota-demo/team-gpus", "admitted": True},
        {
            "claim": "gpu-quota-demo/share-b",
            "quota": "gpu-quota-demo/team-gpus",
            "admitted": False,
            "reason": "exceeded GpuQuota gpu-quota-demo/team-gpus: cores: used 60, asked 60, "
            "hard 100, 40 left",
        },
    ]


def test_a_quota_file_without_a_quota_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = tmp_path / "c.yaml"
    claim.write_text(yaml.safe_dump(default_device_class()))
    examples = EXAMPLES_DIR / "gpu-quota"
    code = main(
        ["explain", "-f", str(examples / "quota-claims.yaml"), "--quota", str(claim), "--mock", "1"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "expected one GpuQuota document, found 0" in err and "Traceback" not in err


def taint_rule(name: str, selector: Obj, effect: str = "NoSchedule") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "example.com/maintenance", "value": "swap", "effect": effect},
        },
    }


def test_device_taint_rule_of_the_files_keeps_the_device_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slices = write(tmp_path / "s.yaml", *node_slices(1))
    wanted = claim("wanted", request(capacity={"cores": "20", "memory": "1Gi"}))
    rule = taint_rule("drain-gpu-0", {"driver": DRIVER, "pool": NODE, "device": "gpu-0"})
    code, report = explain(
        capsys, "-f", write(tmp_path / "c.yaml", wanted, rule), "--slices", slices
    )
    assert code == 1
    [req] = only_failure(report)["requests"]
    [reason] = req["reasons"]
    assert reason["kind"] == "tainted"
    assert reason["reason"] == (
        "taint example.com/maintenance=swap:NoSchedule is not tolerated "
        "(from DeviceTaintRule drain-gpu-0)"
    )
    # A rule for another device, or with effect None, leaves gpu-0 usable.
    for other in (
        taint_rule("other", {"device": "gpu-1"}),
        taint_rule("note", {"device": "gpu-0"}, effect="None"),
    ):
        code, _ = explain(
            capsys, "-f", write(tmp_path / "c.yaml", wanted, other), "--slices", slices
        )
        assert code == 0


def test_device_taint_rule_in_the_slices_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rule = taint_rule("all", {})
    slices = write(tmp_path / "s.yaml", *node_slices(1), rule)
    wanted = claim("wanted", request(capacity={"cores": "20", "memory": "1Gi"}))
    code, report = explain(capsys, "-f", write(tmp_path / "c.yaml", wanted), "--slices", slices)
    assert code == 1
    [req] = only_failure(report)["requests"]
    assert "(from DeviceTaintRule all)" in req["reasons"][0]["reason"]


def test_malformed_device_taint_rule_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rule = taint_rule("bad", {"device": "gpu-0"}, effect="Sometimes")
    slices = write(tmp_path / "s.yaml", *node_slices(1), rule)
    wanted = claim("wanted", request(capacity={"cores": "20", "memory": "1Gi"}))
    code = main(["explain", "-f", write(tmp_path / "c.yaml", wanted), "--slices", slices])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "sharegpu explain: error: DeviceTaintRule bad: spec.taint.effect: Unsupported value: "
        "'Sometimes': supported values: None, NoSchedule, NoExecute"
    )


def test_live_cluster_device_taint_rules(
    apiserver: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for s in node_slices(1):
        apiserver.store.create("resourceslices", s)
    apiserver.store.create("deviceclasses", default_device_class())
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    f = write(tmp_path / "c.yaml", claim("wanted", request(capacity={"cores": "20"})))
    code, _ = explain(capsys, "-f", f, "--kubeconfig", kubeconfig)
    assert code == 0
    apiserver.store.create("devicetaintrules", taint_rule("drain", {"pool": NODE}))
    code, report = explain(capsys, "-f", f, "--kubeconfig", kubeconfig)
    assert code == 1
    [req] = only_failure(report)["requests"]
    assert req["reasons"][0]["kind"] == "tainted"
    assert "(from DeviceTaintRule drain)" in req["reasons"][0]["reason"]


def test_explain_shows_a_burstable_share_and_why_the_plugin_would_refuse_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example's share reserves 25 cores and 8Gi and may use 100 and 32Gi; the same limit
    through the default class (no burstPolicy) is a memory burst the plugin would refuse."""
    code = main(
        ["explain", "-f", str(EXAMPLES_DIR / "burstable-shares"), "--node-name", NODE, "-o", "json"]
    )
    [entry] = json.loads(capsys.readouterr().out)["claims"]
    assert code == 0
    [result] = entry["results"]
    assert result["consumedCapacity"] == {"cores": "25", "memory": "8Gi"}
    assert result["burst"] == {"limit": {"cores": 100, "memory": "32Gi"}, "problems": []}

    bursting = claim("b", request(capacity={"cores": "25", "memory": "8Gi"}))
    bursting["spec"]["devices"]["config"] = [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.sharegpu.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "burstLimit": {"memory": "32Gi"}},
                },
            }
        }
    ]
    path = write(tmp_path / "b.yaml", bursting)
    main(["explain", "-f", path, "--node-name", NODE, "-o", "json"])
    [entry] = json.loads(capsys.readouterr().out)["claims"]
    assert entry["results"][0]["burst"]["problems"] == [
        "sharing.burstLimit.memory: memory burst is not allowed by the request's DeviceClass (it "
        "sets no sharing.burstPolicy.memory, which defaults to Denied; an admin allows it with "
        "sharing.burstPolicy.memory: Allowed in the class's config)"
    ]
