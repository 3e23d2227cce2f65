"""``sharegpu demo``: the whole driver end to end, checked through its JSON report."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from api.quantity import quantity_int
from sharegpuctl.cli import main
from sharegpuctl.cli.demo import tables_of
from sharegpuctl.cli.output import render_table
from tests.paths import EXAMPLES_DIR

CDI_PREFIX = "k8s.gpu.sharegpu.dev/claim="
EXPECTED_CLAIMS = {
    "default/whole-gpu",
    "default/small-share",
    "default/large-share",
    "default/mps-share",
    "default/h100-with-70gi",
    "default/two-gpus-one-pcie-root",
    "default/h100-else-a100-else-any",
    "default/burstable-share",
}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """One demo run (``-o json``) shared by the tests of this module."""
    before = set(Path("/tmp").glob("sharegpu-demo-*"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["demo", "-o", "json"])
    data: dict[str, Any] = json.loads(out.getvalue())
    data["_exit"] = code
    data["_new_temp_dirs"] = sorted(set(Path("/tmp").glob("sharegpu-demo-*")) - before)
    return data


def by_claim(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["claim"]: c for c in report["claims"]}


def test_exit_code_slices_and_registration(report: dict[str, Any]) -> None:
    assert report["_exit"] == 0
    assert report["plugin"]["backend"] == "mock"
    assert report["plugin"]["sharingMode"] == "consumable"
    assert report["plugin"]["gpus"] == 8
    assert report["plugin"]["registeredVersion"] == "v1.DRAPlugin"
    assert report["slices"]["devices"] == 8
    names = [n for s in report["slices"]["items"] for n in s["deviceNames"]]
    assert names == [f"gpu-{i}" for i in range(8)]


def test_every_claim_allocated_and_prepared_with_cdi_ids(report: dict[str, Any]) -> None:
    claims = by_claim(report)
    assert set(claims) == EXPECTED_CLAIMS
    for name, c in claims.items():
        assert c["allocated"] and c["prepared"], name
        assert len(c["devices"]) == len(c["results"]), name
        for device in c["devices"]:
            ours = [i for i in device["cdiDeviceIDs"] if i.startswith(CDI_PREFIX)]
            assert len(ours) == 1, device
            assert c["uid"] in ours[0]
    assert [r["device"] for r in claims["default/two-gpus-one-pcie-root"]["results"]] == [
        "gpu-4",
        "gpu-5",
    ]
    assert claims["default/h100-else-a100-else-any"]["results"][0]["request"] == "gpu/h100"


def test_limits_equal_the_requested_shares(report: dict[str, Any]) -> None:
    claims = by_claim(report)
    for c in claims.values():
        for result, device in zip(c["results"], c["devices"], strict=True):
            limits = device["limits"]
            consumed = result["consumedCapacity"]
            assert device["device"] == result["device"]
            assert device["shareID"] == result["shareID"]
            assert limits["SHAREGPU_CORES"] == consumed["cores"]
            assert int(limits["SHAREGPU_MEMORY"]) == quantity_int(consumed["memory"])
            assert limits["SHAREGPU_SHARE_ID"] == result["shareID"]
            assert limits["SHAREGPU_GPU_UUID"] in limits["NVIDIA_VISIBLE_DEVICES"].split(",")
    # Both devices of the count-2 request name both GPUs, so the container sees both.
    pair = claims["default/two-gpus-one-pcie-root"]["devices"]
    uuids = ",".join(d["limits"]["SHAREGPU_GPU_UUID"] for d in pair)
    assert [d["limits"]["NVIDIA_VISIBLE_DEVICES"] for d in pair] == [uuids, uuids]
    small = claims["default/small-share"]["devices"][0]["limits"]
    assert small["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    small_uuid = small["SHAREGPU_GPU_UUID"]
    assert small["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{small_uuid}=10240M"
    large = claims["default/large-share"]["devices"][0]["limits"]
    assert large["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert large["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{large['SHAREGPU_GPU_UUID']}=20480M"
    # MPS overrides below the 40-core / 16Gi share.
    mps = claims["default/mps-share"]["devices"][0]["limits"]
    assert (mps["SHAREGPU_CORES"], mps["SHAREGPU_MEMORY"]) == ("40", str(16 * 2**30))
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{mps['SHAREGPU_GPU_UUID']}=12288M"
    # A share that takes the whole GPU is exclusive: no MPS limits.
    whole = claims["default/whole-gpu"]["devices"][0]["limits"]
    assert not [k for k in whole if k.startswith("CUDA_MPS_")]
    # The two fractional shares sit on one GPU with one MPS pipe directory.
    assert small["SHAREGPU_GPU_UUID"] == large["SHAREGPU_GPU_UUID"]
    assert small["CUDA_MPS_PIPE_DIRECTORY"] == large["CUDA_MPS_PIPE_DIRECTORY"]


def test_usage_table_sums_the_allocations(report: dict[str, Any]) -> None:
    cores: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    holders: dict[str, set[str]] = defaultdict(set)
    for c in report["claims"]:
        for r in c["results"]:
            cores[r["device"]] += int(r["consumedCapacity"]["cores"])
            memory[r["device"]] += quantity_int(r["consumedCapacity"]["memory"])
            holders[r["device"]].add(c["claim"])
    assert [g["index"] for g in report["usage"]] == list(range(8))
    for g in report["usage"]:
        device = f"gpu-{g['index']}"
        assert g["cores"]["allocated"] == cores[device]
        assert g["cores"]["allocated"] + g["cores"]["free"] == g["cores"]["capacity"] == 100
        used, free = quantity_int(g["memory"]["allocated"]), quantity_int(g["memory"]["free"])
        assert used == memory[device]
        assert used + free == quantity_int(g["memory"]["capacity"])
        assert set(g["claims"]) == holders[device]
    assert report["usage"][7]["claims"] == []


def test_everything_cleaned_up(report: dict[str, Any]) -> None:
    assert report["cleanup"] == {
        "unprepared": len(EXPECTED_CLAIMS),
        "cdiSpecsLeft": 0,
        "tempDirRemoved": True,
    }
    assert not Path(report["tempDir"]).exists()
    assert report["_new_temp_dirs"] == []


def test_human_tables(report: dict[str, Any]) -> None:
    text = "\n\n".join(render_table(t, "table") for t in tables_of(report))
    assert "Published ResourceSlices (node demo-node, consumable mode" in text
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in text
    assert "default/large-share, default/small-share" in text
    assert "CDI specs left after unprepare  0" in text


def test_examples_dir_prefers_the_environment_then_the_source_tree() -> None:
    from sharegpuctl.cli.demo import EXAMPLES_ENV, default_examples_dir

    source_tree = EXAMPLES_DIR
    assert default_examples_dir({}) == source_tree
    assert default_examples_dir({EXAMPLES_ENV: "/srv/examples"}) == Path("/srv/examples")
    assert default_examples_dir({EXAMPLES_ENV: ""}) == source_tree


# --- next steps, example directories, GpuConfig overrides ---------------------------------------

REPO_ROOT = EXAMPLES_DIR.parent


def test_next_steps_name_real_commands_and_files(report: dict[str, Any]) -> None:
    from sharegpuctl.cli import build_parser

    commands = [s["command"] for s in report["nextSteps"]]
    assert commands[0].startswith("sharegpu validate -f ")
    assert commands[1].startswith("sharegpu explain -f ")
    install = report["nextSteps"][-1]
    assert install["command"].startswith("helm install sharegpu deploy/helm/sharegpu ")
    assert "docs/install.md" in install["what"]
    assert (REPO_ROOT / "docs" / "install.md").is_file()
    assert (REPO_ROOT / "deploy" / "helm" / "sharegpu" / "Chart.yaml").is_file()
    # Every sharegpu command named parses as written (placeholders filled in).
    parser = build_parser()
    for command in commands:
        if command.startswith("sharegpu "):
            parser.parse_args(re.sub(r"<[^>]*>", "x.yaml", command).split()[1:])
    text = "\n\n".join(render_table(t, "text") for t in tables_of(report))
    last_row = [line for line in text.splitlines() if not line.startswith(" ")][-1]
    assert last_row.startswith("helm install sharegpu")


def test_the_report_fits_120_columns(report: dict[str, Any]) -> None:
    for fmt in ("text", "table"):
        text = "\n\n".join(render_table(t, fmt) for t in tables_of(report))
        widest = max(text.splitlines(), key=len)
        assert len(widest) <= 120, widest
    # nothing is lost by the wrapping: every claim's share appears (shortened) in its row
    for claim in report["claims"]:
        for device in claim.get("devices", []):
            assert f"{device['device']}   {device['shareID'][:8]}" in text
    assert "Next steps" in text


def test_rows_name_their_example_and_the_examples_not_run(report: dict[str, Any]) -> None:
    from sharegpuctl.cli.demo_inputs import DEMO_EXAMPLES

    for c in report["claims"]:
        assert c["example"] in DEMO_EXAMPLES, c
        assert Path(c["source"]).parent == EXAMPLES_DIR / c["example"]
    assert by_claim(report)["default/small-share"]["example"] == "two-pods-fractional-share"
    all_dirs = {p.name for p in EXAMPLES_DIR.iterdir() if p.is_dir()}
    skipped = {e["example"]: e["reason"] for e in report["skippedExamples"]}
    assert set(skipped) == all_dirs - set(DEMO_EXAMPLES)
    assert "partitions" in skipped["partitions"] and "consumable" in skipped["partitions"]
    assert "partitions" in skipped["admin-device-classes"]
    text = "\n\n".join(render_table(t, "text") for t in tables_of(report))
    assert "default/mps-share                mps-with-overrides" in text
    assert "Examples not run" in text


def test_override_rows_say_what_the_gpu_config_changed(report: dict[str, Any]) -> None:
    claims = by_claim(report)
    overridden = {name for name, c in claims.items() if c["overrides"]}
    assert overridden == {"default/mps-share", "default/burstable-share"}
    (note,) = claims["default/mps-share"]["overrides"]
    assert note["request"] == "gpu" and note["device"] == "gpu-2"
    assert (
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 (the share alone gives 40 cores)"
        in (note["override"])
    )
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=12Gi (the share alone gives 16Gi)" in note["override"]
    text = "\n\n".join(render_table(t, "text") for t in tables_of(report))
    assert "GpuConfig overrides" in text


# --- burstable and idle shares -------------------------------------------------------------------


def _text(report: dict[str, Any], running: bool = False) -> str:
    return "\n\n".join(render_table(t, "text") for t in tables_of(report, running=running))


def test_the_burstable_example_runs_with_its_device_class(report: dict[str, Any]) -> None:
    """The example's own DeviceClass (memory burst allowed) is created, so its claim is
    allocated with the request reserved and prepared with the limit enforced."""
    burstable = by_claim(report)["default/burstable-share"]
    assert burstable["example"] == "burstable-shares"
    (result,) = burstable["results"]
    assert result["consumedCapacity"] == {"cores": "25", "memory": "8Gi"}
    (device,) = burstable["devices"]
    assert (device["limits"]["SHAREGPU_CORES"], device["limits"]["SHAREGPU_MEMORY"]) == (
        "25",
        str(8 * 2**30),
    )
    assert device["limits"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert device["limits"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=32768M")
    assert "burstable-shares" not in {e["example"] for e in report["skippedExamples"]}


def test_burstable_section_shows_request_limit_and_the_gpus_overcommit(
    report: dict[str, Any],
) -> None:
    (row,) = report["burstable"]
    assert row["claim"] == "default/burstable-share" and row["device"] == "gpu-2"
    assert row["reserved"] == {"cores": "25", "memory": "8Gi"}
    assert row["limit"] == {"cores": 100, "memory": "32Gi"}
    assert row["problems"] == []
    # gpu-2 also holds mps-share (40 cores, 16Gi, no limit): limits 140 cores and 48Gi.
    gpu = report["usage"][2]
    assert gpu["claims"] == ["default/burstable-share", "default/mps-share"]
    assert (gpu["limitsSummary"], gpu["overcommit"]) == ("140/100 cores, 48Gi/79.1Gi", "1.40")
    assert (row["gpuLimits"], row["overcommit"]) == (gpu["limitsSummary"], gpu["overcommit"])
    assert all(g["overcommit"] is None for g in report["usage"] if g["index"] != 2)
    for running in (False, True):
        text = _text(report, running)
        assert "GPU usage" in text and "LIMITS" in text and "OVERCOMMIT" in text
        assert re.search(r"\n2 +65/100 +24Gi/79.1Gi +140/100 cores, 48Gi/79.1Gi +1.40 ", text)
        assert "Burstable shares" in text
        assert re.search(
            r"default/burstable-share +gpu-2 +cores=25, memory=8Gi +cores=100, memory=32Gi "
            r"+140/100 cores, 48Gi/79.1Gi +1.40",
            text,
        )


def test_idle_section_shows_a_busy_and_an_idle_share(report: dict[str, Any]) -> None:
    """The mock GPUs report a busy whole-gpu and an idle h100-with-70gi; the tracker, on the
    demo's clock moved one idle period ahead, reports the idle one on its GPU and in the
    metric, and the busy one as in use."""
    idle = report["idle"]
    assert idle["rule"] == "under 5% of their reserved cores and memory for 1h"
    assert idle["clockAdvancedSeconds"] == 3600
    busy, idle_share = idle["shares"]
    assert (busy["claim"], busy["state"], busy["idle"]) == ("default/whole-gpu", "busy", False)
    assert busy["usage"]["smUtilization"] == 75 and busy["usage"]["processes"] == 1
    assert (busy["condition"]["status"], busy["condition"]["reason"]) == ("False", "SharesInUse")
    assert busy["idleSeconds"] == []
    assert (idle_share["claim"], idle_share["state"]) == ("default/h100-with-70gi", "idle")
    assert idle_share["idle"] is True and idle_share["usage"]["smUtilization"] == 0
    condition = idle_share["condition"]
    assert (condition["status"], condition["reason"]) == ("True", "UsageBelowThreshold")
    assert "default/h100-with-70gi" in condition["message"]
    assert idle_share["idleSeconds"] == [3600.0]
    # MPS shares report no per-process SM time, so the demo measures whole-GPU shares only.
    assert busy["index"] == 0 and idle_share["index"] == 3
    for running in (False, True):
        text = _text(report, running)
        assert "Idle shares (simulated usage" in text and "3600 s ahead" in text
        assert re.search(r"\n0 +default/whole-gpu +\w+ +75%/100% +59.2Gi/79Gi +no +False", text)
        assert re.search(
            r"\n3 +default/h100-with-70gi +\w+ +0%/100% +256Mi/79Gi +yes \(3600 s\) "
            r"+True \(UsageBelowThreshold\)",
            text,
        )


def test_the_documented_demo_output_is_what_the_demo_prints(report: dict[str, Any]) -> None:
    """docs/development.md quotes the burstable and idle sections of the demo's output."""
    page = (REPO_ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    quoted = page.split("<!-- sharegpu demo output -->\n```text\n", 1)[1].split("```", 1)[0]
    assert "Burstable shares" in quoted and "Idle shares" in quoted
    assert quoted.strip() in _text(report)


def test_simulated_usage_skips_mps_shares_and_takes_two() -> None:
    from sharegpuctl.cli.demo_idle import simulated_shares, usage_file_text

    def claim(name: str, cores: int, mps: bool) -> dict[str, Any]:
        limits = {"SHAREGPU_GPU_UUID": f"GPU-{name}"}
        if mps:
            limits["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
        return {
            "claim": f"default/{name}",
            "uid": f"uid-{name}",
            "allocated": True,
            "prepared": True,
            "results": [
                {
                    "device": "gpu-0",
                    "shareID": None,
                    "consumedCapacity": {"cores": str(cores), "memory": "10Gi"},
                }
            ],
            "devices": [{"device": "gpu-0", "shareID": None, "limits": limits}],
        }

    claims = [claim("mps", 50, True), claim("a", 100, False), claim("b", 60, False)]
    claims.append(claim("c", 100, False))
    shares = simulated_shares(claims)
    assert [(s["claim"], s["state"], s["sm"]) for s in shares] == [
        ("default/a", "busy", 75),
        ("default/b", "idle", 0),
    ]
    assert shares[0]["memory"] == 10 * 2**30 * 3 // 4
    assert shares[1]["memory"] == 10 * 2**30 // 100  # 1 % of the share: under 256Mi
    assert usage_file_text(shares) == (
        "GPU-a:\n- claim: uid-a\n  memory: 8053063680\n  sm: 75\n"
        "GPU-b:\n- claim: uid-b\n  memory: 107374182\n  sm: 0\n"
    )
    assert simulated_shares(claims[:1]) == []


CLASS_CONFIG_MANIFESTS = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: capped.gpu.sharegpu.dev}
spec:
  selectors:
    - cel: {expression: "device.driver == 'gpu.sharegpu.dev'"}
  config:
    - opaque:
        driver: gpu.sharegpu.dev
        parameters:
          apiVersion: resource.sharegpu.dev/v1alpha1
          kind: GpuConfig
          sharing: {strategy: MPS, mps: {activeThreadPercentage: 30}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: class-capped}
spec:
  devices:
    requests:
      - name: gpu
        exactly:
          deviceClassName: capped.gpu.sharegpu.dev
          capacity: {requests: {cores: "50", memory: 8Gi}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: claim-wins}
spec:
  devices:
    requests:
      - name: gpu
        exactly:
          deviceClassName: capped.gpu.sharegpu.dev
          capacity: {requests: {cores: "50", memory: 8Gi}}
    config:
      - opaque:
          driver: gpu.sharegpu.dev
          parameters:
            apiVersion: resource.sharegpu.dev/v1alpha1
            kind: GpuConfig
            sharing: {strategy: MPS, mps: {activeThreadPercentage: 20}}
"""


def test_override_rows_follow_device_class_configs_as_the_plugin_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "classes.yaml").write_text(CLASS_CONFIG_MANIFESTS)
    code, out, _ = run_cli(["demo", "-f", str(tmp_path), "-o", "json"], capsys)
    assert code == 0
    claims = by_claim(json.loads(out))
    # The class's config alone applies; then the claim's entry wins over the class's.
    for name, percentage in (("default/class-capped", "30"), ("default/claim-wins", "20")):
        (device,) = claims[name]["devices"]
        assert device["limits"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percentage
        (note,) = claims[name]["overrides"]
        assert note["override"] == (
            f"strategy MPS; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percentage} "
            "(the share alone gives 50 cores)"
        )


# --- demo -f ------------------------------------------------------------------------------------

USER_MANIFESTS = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: my-share}
spec:
  spec:
    devices:
      requests:
        - name: gpu
          exactly:
            deviceClassName: gpu.sharegpu.dev
            capacity: {requests: {cores: "20", memory: 8Gi}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: too-many, namespace: ml}
spec:
  devices:
    requests:
      - name: gpus
        exactly: {deviceClassName: gpu.sharegpu.dev, count: 9}
---
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  containers: [{name: c, image: busybox, resources: {claims: [{name: gpu}]}}]
  resourceClaims:
    - {name: gpu, resourceClaimTemplateName: my-share}
    - {name: other, resourceClaimName: not-in-files}
"""


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_demo_on_the_users_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.yaml").write_text(USER_MANIFESTS)
    code, out, _ = run_cli(["demo", "-f", str(tmp_path), "-o", "json"], capsys)
    data = json.loads(out)
    assert code == 1  # one claim cannot be allocated, one is missing
    claims = by_claim(data)
    assert set(claims) == {"default/my-share", "default/too-many", "default/not-in-files"}
    share = claims["default/my-share"]
    assert share["prepared"] and share["usedBy"] == ["Pod/trainer"]
    assert share["example"] is None and share["source"] == str(tmp_path / "mine.yaml")
    limits = share["devices"][0]["limits"]
    assert (limits["SHAREGPU_CORES"], limits["SHAREGPU_MEMORY"]) == ("20", str(8 * 2**30))
    assert not claims["default/too-many"]["allocated"]
    assert "needs 9 device(s)" in claims["default/too-many"]["reason"]
    missing = claims["default/not-in-files"]
    assert not missing["allocated"]
    assert "Pod/trainer uses ResourceClaim not-in-files" in missing["reason"]
    assert data["skippedExamples"] == []
    assert data["cleanup"] == {"unprepared": 1, "cdiSpecsLeft": 0, "tempDirRemoved": True}
    text = "\n\n".join(render_table(t, "text") for t in tables_of(data))
    assert f"claims of {tmp_path}" in text
    # Its one share is MPS, which reports no per-process SM time: nothing is judged idle.
    assert data["idle"]["shares"] == [] and "Idle shares" not in text
    assert data["burstable"] == [] and "Burstable shares" not in text


def test_demo_on_a_workload_example_with_its_device_classes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(
        ["demo", "-f", str(EXAMPLES_DIR / "admin-device-classes"), "-o", "json"], capsys
    )
    claims = by_claim(json.loads(out))
    assert code == 1
    # The example's own class selects whole H100s; its quarter class needs partitions mode.
    assert claims["default/h100-gpu"]["prepared"]
    assert claims["default/h100-gpu"]["usedBy"] == ["Pod/h100-gpu"]
    assert "mps-quarter.gpu.sharegpu.dev" in claims["default/quarter-gpu"]["reason"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\n"
            "spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: x, count: y}}]}}\n",
            "ResourceClaim/c: spec.devices.requests[0].exactly.count: schema",
        ),
        ("kind: ResourceClaim\nmetadata: [1]\n", "ResourceClaim has no metadata.name"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", "no ResourceClaim or"),
        ("kind: ResourceClaim\nmetadata: {name: [\n", "invalid YAML"),
    ],
)
def test_bad_input_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, out, err = run_cli(["demo", "-f", str(path)], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("sharegpu demo: error: ")
    assert message in err and "Traceback" not in err


def test_duplicate_claims_and_missing_files_fail_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec: {}\n"
    (tmp_path / "a.yaml").write_text(claim)
    (tmp_path / "b.yaml").write_text(claim)
    code, _, err = run_cli(["demo", "-f", str(tmp_path)], capsys)
    assert code == 1 and "ResourceClaim/c appears twice" in err and err.count("\n") == 1
    code, _, err = run_cli(["demo", "-f", str(tmp_path / "none.yaml")], capsys)
    assert code == 1 and "none.yaml" in err and err.count("\n") == 1


POD_WITH_TWO_CLAIMS = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: any-gpu}
spec:
  devices:
    requests:
      - {name: gpu, exactly: {deviceClassName: gpu.sharegpu.dev}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: gpu-zero}
spec:
  devices:
    requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.sharegpu.dev
          selectors: [{cel: {expression: "device.attributes['gpu.sharegpu.dev'].index == 0"}}]
---
apiVersion: v1
kind: Pod
metadata: {name: both}
spec:
  containers: [{name: c, image: busybox}]
  resourceClaims:
    - {name: a, resourceClaimName: any-gpu}
    - {name: b, resourceClaimName: gpu-zero}
"""


def test_demo_allocates_the_claims_of_one_pod_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whole-GPU claims: one after another ``any-gpu`` would take gpu-0, which ``gpu-zero``
    needs; allocated together as the pod's claims, both fit and are prepared."""
    (tmp_path / "pod.yaml").write_text(POD_WITH_TWO_CLAIMS)
    code, out, _ = run_cli(["demo", "-f", str(tmp_path), "-o", "json"], capsys)
    claims = by_claim(json.loads(out))
    assert code == 0, claims
    devices = {name: [r["device"] for r in c["results"]] for name, c in claims.items()}
    assert devices == {"default/any-gpu": ["gpu-1"], "default/gpu-zero": ["gpu-0"]}
    assert all(c["prepared"] for c in claims.values())


def test_demo_of_the_burstable_example_shows_the_share_and_its_enforced_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The embedded plugin enforces the burst limit (the request stays the reservation), and
    the demo says what the GpuConfig changed."""
    code, out, _ = run_cli(
        ["demo", "-f", str(EXAMPLES_DIR / "burstable-shares"), "-o", "json"], capsys
    )
    assert code == 0
    (device,) = by_claim(json.loads(out))["default/burstable-share"]["devices"]
    assert device["limits"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert device["limits"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=32768M")
    (note,) = by_claim(json.loads(out))["default/burstable-share"]["overrides"]
    assert note["override"] == (
        "strategy MPS; burstable to 100 cores and 32Gi (reserves 25 cores and 8Gi)"
    )
