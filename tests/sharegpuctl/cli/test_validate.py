"""``sharegpu validate``: schema, GpuConfig, CEL, names, half shares, pods; output, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharegpuctl.cli import main

Obj = dict[str, Any]
DRIVER = "gpu.sharegpu.dev"


def claim(name: str, exactly: Obj, config: list[Obj] | None = None) -> Obj:
    devices: Obj = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, **exactly}}]
    }
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def gpu_config(sharing: Obj) -> list[Obj]:
    return [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.sharegpu.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": sharing,
                },
            },
        }
    ]


def selector(expr: str) -> Obj:
    return {"selectors": [{"cel": {"expression": expr}}]}


def run_validate(
    capsys: pytest.CaptureFixture[str], *paths: Path, extra: tuple[str, ...] = ()
) -> tuple[int, Obj]:
    argv = ["validate", *(a for p in paths for a in ("-f", str(p))), *extra, "-o", "json"]
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def write(path: Path, *docs: Obj) -> Path:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return path


def findings(report: Obj) -> list[tuple[str, str, str, str]]:
    return [(f["name"], f["severity"], f["path"], f["message"]) for f in report["findings"]]


def test_valid_objects_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(
        tmp_path / "ok.yaml",
        claim("share", {"capacity": {"requests": {"cores": "30", "memory": "10Gi"}}}),
        claim("mps", {}, gpu_config({"strategy": "MPS", "mps": {"activeThreadPercentage": 20}})),
    )
    code, report = run_validate(capsys, f)
    assert code == 0
    assert report == {
        "kubernetesVersion": "1.37",
        "objects": 2,
        "errors": 0,
        "warnings": 0,
        "findings": [],
    }


def test_each_kind_of_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema_bad = claim("schema", {"bogus": 1})
    config_bad = claim("config", {}, gpu_config({"strategy": "Sometimes"}))
    cel_bad = claim("cel", selector("device.attributes['gpu.sharegpu.dev'].index =="))
    name_bad = claim("name", selector("device.attributes['gpu.sharegpu.dev'].prodName == 'x'"))
    cap_bad = claim("cap", {"capacity": {"requests": {"memmory": "1Gi"}}})
    half = claim("half", {"capacity": {"requests": {"memory": "10Gi"}}})
    f = write(tmp_path / "bad.yaml", schema_bad, config_bad, cel_bad, name_bad, cap_bad, half)
    code, report = run_validate(capsys, f)
    assert code == 1
    got = findings(report)
    by_name = {name: (sev, path, msg) for name, sev, path, msg in got}
    assert by_name["schema"] == (
        "error",
        "spec.devices.requests[0].exactly",
        "'bogus' is not a field of `exactly` (fields: deviceClassName, selectors, "
        "allocationMode, count, adminAccess, tolerations, capacity)",
    )
    sev, path, msg = by_name["config"]
    assert (sev, path) == ("error", "spec.devices.config[0].opaque.parameters")
    assert "sharing.strategy" in msg and "Sometimes" in msg
    sev, path, msg = by_name["cel"]
    assert (sev, path) == ("error", "spec.devices.requests[0].exactly.selectors[0].cel.expression")
    assert msg.startswith("CEL compile error: ")
    assert by_name["name"][2].startswith(
        "gpu.sharegpu.dev publishes no attribute 'prodName'; did you mean 'productName'?"
    )
    assert by_name["cap"][0] == "error"
    assert "no capacity 'memmory'; did you mean 'memory'?" in by_name["cap"][2]
    assert by_name["half"] == (
        "warning",
        "spec.devices.requests[0].exactly.capacity.requests",
        "memory requested without cores: the scheduler reserves the GPU's default cores (all "
        "100 unless the node's plugin runs with --default-share-cores), so no other share may "
        "fit on that GPU; request cores too",
    )
    assert report["errors"] == 5 and report["warnings"] == 1


def test_warnings_alone_exit_zero_and_text_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "half.yaml", claim("half", {"capacity": {"requests": {"cores": "30"}}}))
    assert main(["validate", "-f", str(f), "-o", "text"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"{f}: ResourceClaim/half: spec.devices.requests[0].exactly.capacity.requests: warning: "
        "cores requested without memory: the scheduler reserves the whole GPU's memory, so no "
        "other share may fit on that GPU; request memory too"
    )
    assert lines[-1] == "1 object(s) checked against Kubernetes 1.37: 0 error(s), 1 warning(s)"


def test_pods_templates_lists_and_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
        },
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {
            "spec": claim("x", selector("device.attributes['gpu.sharegpu.dev'].nope"))["spec"]
        },
    }
    other_driver = claim("other", selector("device.attributes['other.example.com'].x == "))
    nested = tmp_path / "deep" / "er"
    nested.mkdir(parents=True)
    write(nested / "pod.yaml", pod)
    (nested / "list.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [template, other_driver]})
    )
    (nested / "notes.txt").write_text("not a manifest")
    code, report = run_validate(capsys, tmp_path)
    assert code == 1
    assert report["objects"] == 3
    got = {(f["kind"], f["name"], f["path"]): f["message"] for f in report["findings"]}
    assert got[("Pod", "p", "spec.containers[0].resources.claims[0].name")] == (
        "claim 'gpus' is not defined in spec.resourceClaims (defined: gpu)"
    )
    path = "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert got[("ResourceClaimTemplate", "t", path)].startswith(
        "gpu.sharegpu.dev publishes no attribute 'nope'"
    )
    path = "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert got[("ResourceClaim", "other", path)].startswith("CEL compile error: ")


def test_kubernetes_version_and_unknown_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crd_object = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    own = {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 500}},
    }
    f = write(tmp_path / "x.yaml", crd_object, own)
    code, report = run_validate(capsys, f, extra=("--kubernetes-version", "1.34"))
    assert code == 1
    assert report["kubernetesVersion"] == "1.34"
    msgs = [(x["kind"], x["message"]) for x in report["findings"]]
    assert ("Widget", "Kubernetes 1.34 has no schema for example.com/v1 Widget") in msgs
    assert [k for k, m in msgs if k == "GpuConfig" and "activeThreadPercentage" in m]
    assert main(["validate", "-f", str(f), "--kubernetes-version", "0.1"]) == 2
    assert "--kubernetes-version 0.1: not supported" in capsys.readouterr().err


def test_missing_file_and_bad_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-f", str(tmp_path / "nope.yaml")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: b\n  c: d\n")
    assert main(["validate", "-f", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith(f"{bad}: line 2, column 4: error: invalid YAML")
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    "expr",
    [
        "cidr('10.0.0.0/8').containsIP(ip(device.attributes['net.example.com'].address))",
        "device.attributes['gpu.sharegpu.dev'].?productName.orValue('') == 'H100'",
    ],
    ids=["another-driver", "this-driver"],
)
def test_kubernetes_cel_library_and_optional_syntax_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], expr: str
) -> None:
    """Kubernetes' CEL libraries (IP, CIDR) and optional syntax compile here: no finding."""
    code, report = run_validate(capsys, write(tmp_path / "c.yaml", claim("c", selector(expr))))
    assert (code, findings(report)) == (0, [])


def test_cel_nested_deeper_than_checked_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kubernetes accepts a selector nested deeper than the parser here follows: it is reported
    as not checked, never refused."""
    expr = "(" * 60 + "device.driver == 'x'" + ")" * 60
    code, report = run_validate(capsys, write(tmp_path / "c.yaml", claim("c", selector(expr))))
    [(name, severity, path, message)] = findings(report)
    assert (code, name, severity) == (0, "c", "warning")
    assert path == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert message.startswith("not checked: the selector is nested deeper")


def _claim_pod(name: str, claim_name: str, pod_user: int | None, **users: int) -> Obj:
    containers: list[Obj] = [
        {"name": c, "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
        for c in ("main", "helper")
    ]
    for c in containers:
        if c["name"] in users:
            c["securityContext"] = {"runAsUser": users[c["name"]]}
    spec: Obj = {
        "containers": [*containers, {"name": "log", "image": "busybox"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
    }
    if pod_user is not None:
        spec["securityContext"] = {"runAsUser": pod_user}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


QUEUED = "MPS serves one UID at a time per claim"


def test_pods_sharing_a_claim_as_different_uids_are_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    share = claim("share", {"capacity": {"requests": {"cores": "30", "memory": "10Gi"}}})
    f = write(
        tmp_path / "pods.yaml",
        share,
        _claim_pod("a", "share", 1000),
        _claim_pod("b", "share", None, main=1001),  # helper: the image's user, unknown
        _claim_pod("c", "other", 1000, helper=1002),  # one pod, two UIDs on its own claim
    )
    code, report = run_validate(capsys, f)
    assert code == 0
    warned = {
        (f["name"], f["path"]): f["message"] for f in report["findings"] if QUEUED in f["message"]
    }
    assert set(warned) == {
        ("a", "spec.resourceClaims[0]"),
        ("b", "spec.resourceClaims[0]"),
        ("c", "spec.resourceClaims[0]"),
    }
    assert (
        "ResourceClaim 'share' run as UIDs 1000, 1001:" in warned[("a", "spec.resourceClaims[0]")]
    )
    assert "UIDs 1000, 1002" in warned[("c", "spec.resourceClaims[0]")]


def test_one_uid_unknown_uids_or_a_claim_configured_off_mps_are_not_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sliced = claim("ts", {}, gpu_config({"strategy": "TimeSlicing"}))
    f = write(
        tmp_path / "pods.yaml",
        sliced,
        _claim_pod("a", "same", 1000),
        _claim_pod("b", "same", None, main=1000),
        _claim_pod("c", "ts", 1000),
        _claim_pod("d", "ts", 1001),
    )
    _, report = run_validate(capsys, f)
    assert [f for f in report["findings"] if QUEUED in f["message"]] == []


def taint_rule(name: str, selector: Obj, taint: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": selector, "taint": taint},
    }


def test_device_taint_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = taint_rule(
        "drain",
        {"driver": DRIVER, "pool": "node-1", "device": "gpu-0"},
        {"key": "example.com/maintenance", "value": "swap", "effect": "NoExecute"},
    )
    code, report = run_validate(capsys, write(tmp_path / "good.yaml", good))
    assert code == 0 and findings(report) == []
    bad = taint_rule(
        "bad",
        {"driver": "Not A Driver", "device": "gpu-0"},
        {"key": "example.com/maintenance", "effect": "Sometimes"},
    )
    code, report = run_validate(capsys, write(tmp_path / "bad.yaml", bad))
    assert code == 1
    paths = {f[2] for f in findings(report)}
    assert paths == {"spec.deviceSelector.driver", "spec.taint.effect"}
    # Before 1.37 resource.k8s.io/v1 has no DeviceTaintRule.
    code, report = run_validate(
        capsys, write(tmp_path / "good.yaml", good), extra=("--kubernetes-version", "1.36")
    )
    assert code == 1
    assert "has no schema for resource.k8s.io/v1 DeviceTaintRule" in findings(report)[0][3]


def test_a_burst_limit_is_judged_against_the_device_class_in_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The DeviceClasses among the files decide what may burst; a class not among them (here
    the chart's) is left to the plugin, with a warning."""
    strict = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "strict.gpu.sharegpu.dev"},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }
    limit = gpu_config({"strategy": "MPS", "burstLimit": {"memory": "20Gi"}})
    asks = {"capacity": {"requests": {"cores": "30", "memory": "10Gi"}}}
    refused = claim("refused", {**asks, "deviceClassName": "strict.gpu.sharegpu.dev"}, limit)
    unknown = claim("unknown", asks, limit)
    code, report = run_validate(capsys, write(tmp_path / "c.yaml", strict, refused, unknown))
    assert code == 1
    assert findings(report) == [
        (
            "refused",
            "error",
            "spec.devices.config[0].opaque.parameters",
            "sharing.burstLimit.memory: memory burst is not allowed by DeviceClass "
            '"strict.gpu.sharegpu.dev" (it sets no sharing.burstPolicy.memory, which defaults '
            "to Denied; an admin allows it with sharing.burstPolicy.memory: Allowed in the "
            "class's config)",
        ),
        (
            "unknown",
            "warning",
            "spec.devices.config[0].opaque.parameters",
            f"sharing.burstLimit: DeviceClass '{DRIVER}' is not known here, so whether it "
            "allows the burst of request 'gpu' is checked when the claim is prepared",
        ),
    ]
