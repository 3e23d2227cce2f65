"""``sharegpu validate`` on manifests that used to pass silently and fail later.

Empty input is an error; near-miss names, opaque configs no driver reads, memory larger than
every known GPU and capacity requests that Kubernetes 1.34/1.35 drops are warnings (each may be
intended: a class defined only in the cluster, a GPU model this project does not know, a gate
enabled by hand), and manifests without those problems stay quiet.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharegpuctl.cli import main
from sharegpuctl.cli.common import chart_device_class_names
from sharegpuctl.cli.crosschecks import ComparisonBudget, edit_distance, near_miss
from tests.allocator import helpers as allocator_helpers
from tests.paths import REPO_ROOT

Obj = dict[str, Any]
DRIVER = "gpu.sharegpu.dev"
GPU_CONFIG = {
    "apiVersion": "resource.sharegpu.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS"},
}


def claim(name: str, *requests: Obj, config: list[Obj] | None = None, kind: str = "") -> Obj:
    devices: Obj = {"requests": list(requests)}
    if config is not None:
        devices["config"] = config
    spec: Obj = {"devices": devices}
    if kind == "ResourceClaimTemplate":
        spec = {"spec": spec}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind or "ResourceClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def exactly(name: str = "gpu", cls: str = DRIVER, **extra: Any) -> Obj:
    return {"name": name, "exactly": {"deviceClassName": cls, **extra}}


def share(memory: str, cores: str = "30") -> Obj:
    return {"capacity": {"requests": {"cores": cores, "memory": memory}}}


def opaque(driver: str, requests: list[str] | None = None) -> Obj:
    entry: Obj = {"opaque": {"driver": driver, "parameters": GPU_CONFIG}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def device_class(name: str, driver: str = DRIVER, config: list[Obj] | None = None) -> Obj:
    """A DeviceClass selecting every device of ``driver``."""
    return allocator_helpers.device_class(name, [f"device.driver == {driver!r}"], config)


def pod(name: str, **claim_source: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", **claim_source}],
        },
    }


def validate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *docs: Obj, extra: tuple[str, ...] = ()
) -> tuple[int, list[tuple[str, str, str, str]]]:
    """Exit code and ``(name, severity, path, message)`` of every finding."""
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    code = main(["validate", "-f", str(f), *extra, "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    return code, [(x["name"], x["severity"], x["path"], x["message"]) for x in report["findings"]]


# --- a. empty input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [("empty.yaml", ""), ("comments.yaml", "# a comment\n# another\n"), ("dashes.yaml", "---\n")],
)
def test_a_file_without_objects_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str
) -> None:
    f = tmp_path / name
    f.write_text(text)
    assert main(["validate", "-f", str(f)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"sharegpu validate: error: no Kubernetes objects found in {f}: the file is empty or "
        "holds only comments\n"
    )


def test_a_directory_without_objects_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("kind: Pod\n")
    assert main(["validate", "-f", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"sharegpu validate: error: no Kubernetes objects found in {tmp_path}: the directory "
        "has no *.yaml, *.yml or *.json file\n"
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "empty.yaml").write_text("# only a comment\n")
    assert main(["validate", "-f", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"sharegpu validate: error: no Kubernetes objects found in {tmp_path}: its files are "
        "empty or hold only comments\n"
    )


def test_empty_standard_input_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("# nothing\n"))
    assert main(["validate", "-f", "-"]) == 1
    assert capsys.readouterr().err == (
        "sharegpu validate: error: no Kubernetes objects found in -: standard input is empty "
        "or holds only comments\n"
    )


def test_each_named_path_needs_objects_and_empty_lists_are_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every -f must hold an object; an empty List (``kubectl get ... -o yaml`` of nothing)
    is one, with no items."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(claim("c", exactly())))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["validate", "-f", str(good), "-f", str(empty)]) == 1
    assert f"no Kubernetes objects found in {empty}" in capsys.readouterr().err
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "empty.yaml").write_text("")
    (tmp_path / "d" / "good.yaml").write_text(good.read_text())
    assert main(["validate", "-f", str(tmp_path / "d"), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["objects"] == 1
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    assert main(["validate", "-f", str(empty), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["objects"] == 0


# --- b. opaque configs no driver reads ------------------------------------------------------


@pytest.mark.parametrize("misspelled", ["gpu.sharegpu.com", "gpu.sharegpu.de", "gpu-sharegpu.dev"])
def test_misspelled_driver_in_opaque_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], misspelled: str
) -> None:
    code, found = validate(
        capsys,
        tmp_path,
        claim("c", exactly(), config=[opaque(misspelled)]),
        device_class("mine", config=[opaque(misspelled)]),
    )
    message = f"config for driver {misspelled!r}, which {DRIVER} ignores; did you mean {DRIVER!r}?"
    assert (code, found) == (
        0,
        [
            ("c", "warning", "spec.devices.config[0].opaque.driver", message),
            ("mine", "warning", "spec.config[0].opaque.driver", message),
        ],
    )


def test_config_for_this_driver_on_requests_of_another_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, found = validate(
        capsys,
        tmp_path,
        device_class("nvidia", driver="gpu.nvidia.com"),
        claim("c", exactly(cls="nvidia"), config=[opaque(DRIVER)]),
    )
    assert (code, found) == (
        0,
        [
            (
                "c",
                "warning",
                "spec.devices.config[0].opaque.driver",
                f"config for {DRIVER}, but no request it applies to (request 'gpu' (DeviceClass "
                f"'nvidia')) uses a DeviceClass known to be {DRIVER}'s (named like the driver, "
                "or defined in the checked files with a selector that names it): unless that "
                f"class selects {DRIVER} devices, no driver reads this config",
            )
        ],
    )


def test_config_for_another_driver_on_requests_of_this_driver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own = device_class("fast-gpus")  # ours through its selector
    c = claim(
        "c",
        exactly("a"),
        exactly("b", cls="fast-gpus"),
        config=[opaque("gpu.nvidia.com", ["a", "b"])],
    )
    code, found = validate(capsys, tmp_path, own, c)
    assert (code, found) == (
        0,
        [
            (
                "c",
                "warning",
                "spec.devices.config[0].opaque.driver",
                "config for driver 'gpu.nvidia.com' applies only to requests 'a' (DeviceClass "
                f"'{DRIVER}'), 'b' (DeviceClass 'fast-gpus'), allocated from {DRIVER} devices: "
                f"gpu.nvidia.com never sees it and {DRIVER} ignores other drivers' configs",
            )
        ],
    )


def test_configs_that_a_driver_reads_stay_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Precision: each config below applies to at least one request of its own driver."""
    c = claim(
        "mixed",
        exactly("mine"),
        exactly("theirs", cls="nvidia"),
        {
            "name": "either",
            "firstAvailable": [
                {"name": "ours", "deviceClassName": DRIVER},
                {"name": "other", "deviceClassName": "nvidia"},
            ],
        },
        config=[
            opaque(DRIVER, ["mine"]),
            opaque("gpu.nvidia.com", ["theirs"]),
            opaque(DRIVER),  # all requests, "mine" among them
            opaque("gpu.nvidia.com"),  # all requests, "theirs" among them
            opaque("gpu.nvidia.com", ["either"]),  # covers either/other
            opaque(DRIVER, ["either/ours"]),
        ],
    )
    template = claim("t", exactly(), config=[opaque(DRIVER)], kind="ResourceClaimTemplate")
    code, found = validate(capsys, tmp_path, device_class("nvidia", "gpu.nvidia.com"), c, template)
    assert (code, found) == (0, [])


# --- c. names nothing defines -----------------------------------------------------------


def test_device_class_near_misses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, found = validate(
        capsys,
        tmp_path,
        device_class("team-a-gpus"),
        claim("typo", exactly(cls="gpu.sharegpu.dv")),
        claim("extended", exactly(cls="extended.gpu.sharegpu.de")),
        claim("own", exactly(cls="team-a-gpu")),
        claim("template", exactly(cls="gpu.sharegpu.dev2"), kind="ResourceClaimTemplate"),
    )
    where = "is not defined in the checked files or by the sharegpu chart; did you mean"
    assert code == 0
    assert [(n, s, p.rsplit(".", 1)[1], m) for n, s, p, m in found] == [
        (
            "typo",
            "warning",
            "deviceClassName",
            f"DeviceClass 'gpu.sharegpu.dv' {where} '{DRIVER}'?",
        ),
        (
            "extended",
            "warning",
            "deviceClassName",
            f"DeviceClass 'extended.gpu.sharegpu.de' {where} 'extended.{DRIVER}'?",
        ),
        ("own", "warning", "deviceClassName", f"DeviceClass 'team-a-gpu' {where} 'team-a-gpus'?"),
        (
            "template",
            "warning",
            "deviceClassName",
            f"DeviceClass 'gpu.sharegpu.dev2' {where} '{DRIVER}'?",
        ),
    ]
    assert found[3][2] == "spec.spec.devices.requests[0].exactly.deviceClassName"


def test_defined_and_unrelated_names_stay_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A class the cluster may define (far from every known name) is not flagged."""
    code, found = validate(
        capsys,
        tmp_path,
        device_class("team-a-gpus"),
        claim("chart", exactly(cls=DRIVER)),
        claim("extended", exactly(cls=f"extended.{DRIVER}")),
        claim("defined", exactly(cls="team-a-gpus")),
        claim("cluster", exactly(cls="nvidia-a100-80gb")),
        claim("foreign", exactly(cls="gpu.nvidia.com")),
    )
    assert (code, found) == (0, [])


def test_pod_claim_and_template_near_misses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template = claim("shared-gpu", exactly(), kind="ResourceClaimTemplate")
    code, found = validate(
        capsys,
        tmp_path,
        template,
        claim("big-claim", exactly()),
        pod("t-typo", resourceClaimTemplateName="shared-gpus"),
        pod("c-typo", resourceClaimName="big-clam"),
        pod("t-ok", resourceClaimTemplateName="shared-gpu"),
        pod("cluster", resourceClaimTemplateName="made-elsewhere"),
    )
    assert (code, found) == (
        0,
        [
            (
                "t-typo",
                "warning",
                "spec.resourceClaims[0].resourceClaimTemplateName",
                "ResourceClaimTemplate 'shared-gpus' is not defined in the checked files; did you "
                "mean 'shared-gpu'?",
            ),
            (
                "c-typo",
                "warning",
                "spec.resourceClaims[0].resourceClaimName",
                "ResourceClaim 'big-clam' is not defined in the checked files; did you mean "
                "'big-claim'?",
            ),
        ],
    )


def test_chart_class_names_are_the_charts_defaults() -> None:
    """The names the CLI knows match the chart's DeviceClass templates."""
    template = (REPO_ROOT / "deploy/helm/sharegpu/templates/deviceclasses.yaml").read_text()
    defaults = re.findall(r"name: \{\{ default (.+?) \$\w+\.name \}\}", template)
    assert defaults == [
        ".Values.driverName",
        '(printf "extended.%s" .Values.driverName)',
        '(printf "mig.%s" .Values.driverName)',
    ]
    assert chart_device_class_names(DRIVER) == (DRIVER, f"extended.{DRIVER}", f"mig.{DRIVER}")


def test_near_miss_rules() -> None:
    assert edit_distance("gpu.sharegpu.com", DRIVER, 3) == 3
    assert edit_distance("gpu.nvidia.com", DRIVER, 3) == 4  # beyond the bound: bound + 1
    assert edit_distance("abc", "abc", 0) == 0
    assert near_miss("gpu.sharegpu.dv", [DRIVER, "other"]) == DRIVER
    assert near_miss(DRIVER, [DRIVER]) is None  # known
    assert near_miss("a" * 300, ["a" * 299]) is None  # longer than any Kubernetes name
    assert near_miss("gpux", ["gpu", "gpuxyz"]) == "gpu"  # 1 edit for short names
    assert near_miss("gpxx", ["gpu"]) is None


@pytest.mark.timeout(60)
def test_near_miss_work_is_bounded() -> None:
    """Hundreds of distinct, nearly equal long names cost a bounded amount of work."""
    known = [f"x{'a' * 240}{i:04d}y" for i in range(400)]
    budget = ComparisonBudget()
    hints = [near_miss(f"z{'a' * 240}{i:04d}w", known, budget) for i in range(400)]
    assert budget.left >= 0
    assert hints[0] == known[0]  # found while the budget lasts
    assert hints[-1] is None  # no comparisons once it is spent


# --- d. memory larger than any known GPU ------------------------------------------------------


def test_memory_larger_than_every_known_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    too_big = {"name": "big", "deviceClassName": DRIVER, **share("100Gi")}
    fallback = {"name": "small", "deviceClassName": DRIVER, **share("40Gi")}
    code, found = validate(
        capsys,
        tmp_path,
        claim("big", exactly(**share("100Gi"))),
        claim("qualified", exactly(capacity={"requests": {f"{DRIVER}/memory": "80Gi"}})),
        claim("fits", exactly(**share("79Gi"))),
        claim("fallback", {"name": "gpu", "firstAvailable": [too_big, fallback]}),
        claim("no-fallback", {"name": "gpu", "firstAvailable": [too_big, too_big]}),
        claim("foreign", exactly(cls="nvidia", **share("100Gi"))),
    )
    assert code == 0
    by_claim = [(n, p) for n, s, p, m in found if "more than any GPU model" in m]
    assert by_claim == [
        ("big", "spec.devices.requests[0].exactly.capacity.requests[memory]"),
        ("qualified", f"spec.devices.requests[0].exactly.capacity.requests[{DRIVER}/memory]"),
        ("no-fallback", "spec.devices.requests[0].firstAvailable[0].capacity.requests[memory]"),
        ("no-fallback", "spec.devices.requests[0].firstAvailable[1].capacity.requests[memory]"),
    ]
    [message] = [m for n, s, p, m in found if n == "big"]
    assert message == (
        "memory 100Gi is more than any GPU model this driver knows grants: the largest, NVIDIA "
        "H100 80GB HBM3, grants at most 79Gi (capacity memory: request 100Gi rounds to 100Gi, "
        "which the request policy (validRange min 256Mi, max 79Gi, step 256Mi) does not "
        "allow); on nodes without a larger GPU the claim is never allocated (sharegpu explain "
        "shows why)"
    )


@pytest.mark.parametrize("memory", ["79Gi", "79.1Gi", "80Gi", "100Gi", "1Ti"])
def test_memory_rule_is_the_one_explain_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], memory: str
) -> None:
    """validate warns exactly when explain cannot allocate the request on a known GPU."""
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(claim("c", exactly(**share(memory)))))
    main(["validate", "-f", str(f), "-o", "json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    warned = any("more than any GPU model" in x["message"] for x in findings)
    main(["explain", "-f", str(f), "--mock", "1", "-o", "json"])
    [explained] = json.loads(capsys.readouterr().out)["claims"]
    assert warned == (not explained["allocated"])


# --- e. capacity requests on Kubernetes 1.34 and 1.35 ------------------------------------


@pytest.mark.parametrize(
    ("version", "gates", "warned"),
    [
        ("1.34", (), True),
        ("1.35", (), True),
        ("1.35", ("--feature-gates", "DRAConsumableCapacity=false"), True),
        ("1.34", ("--feature-gates", "DRAConsumableCapacity=true"), False),
        ("1.35", ("--feature-gates", "Other=false, DRAConsumableCapacity=true"), False),
        ("1.36", (), False),
        ("1.37", (), False),
    ],
)
def test_capacity_requests_need_the_consumable_capacity_gate(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    version: str,
    gates: tuple[str, ...],
    warned: bool,
) -> None:
    shared = claim(
        "shared",
        exactly(**share("10Gi")),
        {"name": "alt", "firstAvailable": [{"name": "s", "deviceClassName": "x", **share("1Gi")}]},
    )
    whole = claim("whole", exactly())
    extra = ("--kubernetes-version", version, *gates)
    code, found = validate(capsys, tmp_path, shared, whole, extra=extra)
    assert code == 0
    expected = [
        (
            "shared",
            "warning",
            path,
            f"Kubernetes {version} drops capacity requests unless the DRAConsumableCapacity "
            "feature gate is enabled (alpha and off by default in 1.34 and 1.35, beta and on by "
            "default from 1.36): the request would get a whole device; enable the gate on the "
            "API server and scheduler (then pass --feature-gates DRAConsumableCapacity=true "
            "here), or use sharegpu's partitions mode, which needs no capacity requests",
        )
        for path in (
            "spec.devices.requests[0].exactly.capacity",
            "spec.devices.requests[1].firstAvailable[0].capacity",
        )
    ]
    assert found == (expected if warned else [])


def test_malformed_feature_gates_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(claim("c", exactly())))
    assert main(["validate", "-f", str(f), "--feature-gates", "DRAConsumableCapacity"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "sharegpu validate: error: --feature-gates DRAConsumableCapacity: "
        "'DRAConsumableCapacity' is not NAME=true or NAME=false"
    )
