"""``sharegpu devices`` and ``sharegpu explain`` with dynamic MIG (``--mig dynamic``) on mock
GPUs: the placement devices and counters published, and which placements fit a claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import names
from sharegpuctl.cli import main

DRIVER = names.DEFAULT_DRIVER_NAME
NODE = "n1"
MIG_CLASS = f"mig.{DRIVER}"
DYNAMIC = ("--mock", "1", "--node-name", NODE, "--sharing-mode", "partitions", "--mig", "dynamic")
Obj = dict[str, Any]


def profile_claim(name: str, profile: str) -> Obj:
    expression = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": MIG_CLASS,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def write(path: Path, *docs: Obj) -> str:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return str(path)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Obj]:
    code = main([*argv, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


# --- devices ---------------------------------------------------------------------------------


def test_devices_shows_placements_and_counters(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_json(capsys, "devices", "--mock", "2", *DYNAMIC[2:])
    assert code == 0 and report["migStrategy"] == "dynamic"
    gpu = report["gpus"][0]
    assert gpu["migMode"] == "Enabled"
    profiles = {p["name"]: p for p in gpu["migProfiles"]}
    assert list(profiles) == [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]
    assert profiles["3g.40gb"] == {
        "name": "3g.40gb",
        "id": 9,
        "sliceCount": 3,
        "instanceCount": 2,
        "memory": "40448Mi",
        "multiprocessors": 60,
        "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}],
    }
    slices = report["resourceSlices"]
    assert (slices["devices"], slices["counterSets"]) == (50, 2)
    counters = slices["sharedCounters"][0]
    assert counters["name"] == "gpu-0-counters"
    assert counters["counters"][names.COUNTER_COMPUTE_SLICES] == "7"
    assert counters["counters"][names.memory_slice_counter(7)] == "1"


def test_devices_table_lists_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", *DYNAMIC, "-o", "table"]) == 0
    out = capsys.readouterr().out
    assert "MIG profiles published as placement devices" in out
    assert "0:4 4:4" in out and "gpu-0-mig-3g-40gb-0, gpu-0-mig-3g-40gb-4" in out
    assert "Shared counters" in out and f"{names.COUNTER_COMPUTE_SLICES}=7" in out


def test_static_is_the_default_and_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_json(capsys, "devices", "--mock", "1", "--sharing-mode", "partitions")
    assert code == 0 and report["migStrategy"] == "static"
    assert report["gpus"][0]["migMode"] == "Disabled" and report["gpus"][0]["migProfiles"] == []
    assert report["resourceSlices"]["devices"] == 15


def test_dynamic_needs_partitions_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--mock", "1", "--mig", "dynamic"]) == 2
    err = capsys.readouterr().err
    assert "error: --mig dynamic needs --sharing-mode partitions, not consumable\n" in err
    assert "Traceback" not in err


# --- explain ---------------------------------------------------------------------------------


def test_explain_shows_which_placements_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write(
        tmp_path / "claims.yaml", profile_claim("big", "4g.40gb"), profile_claim("small", "1g.10gb")
    )
    code, report = run_json(capsys, "explain", "-f", claims, *DYNAMIC)
    assert code == 0
    big, small = report["claims"]
    assert big["results"][0]["device"] == "gpu-0-mig-4g-40gb-0"
    assert small["results"][0]["device"] == "gpu-0-mig-1g-10gb-4"
    (placements,) = small["placements"]
    assert placements["fit"] == [f"gpu-0-mig-1g-10gb-{k}" for k in (4, 5, 6)]
    reasons = {tuple(g["devices"]): g["reason"] for g in placements["reasons"]}
    for k in range(4):
        counter = names.memory_slice_counter(k)
        assert reasons[(f"gpu-0-mig-1g-10gb-{k}",)] == (
            f"counter gpu-0-counters/{counter}: needs 1, available 0 (short 1); "
            "held by gpu-0-mig-4g-40gb-0 (default/big)"
        )
    assert reasons[("gpu-0-mig-4g-40gb-0",)] == "already allocated to default/big"
    # the devices of the other profiles are no candidates: counted, not listed
    assert placements["otherDevices"] == 17


def test_explain_with_allocated_claims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    held = profile_claim("held", "4g.40gb")
    held["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "mig",
                        "driver": DRIVER,
                        "pool": NODE,
                        "device": "gpu-0-mig-4g-40gb-0",
                    }
                ]
            }
        }
    }
    allocated = write(tmp_path / "allocated.yaml", held)
    claims = write(tmp_path / "claims.yaml", profile_claim("small", "1g.10gb"))
    code, report = run_json(capsys, "explain", "-f", claims, "--allocated", allocated, *DYNAMIC)
    assert code == 0
    (small,) = report["claims"]
    assert small["placements"][0]["fit"] == [f"gpu-0-mig-1g-10gb-{k}" for k in (4, 5, 6)]
    assert "held by gpu-0-mig-4g-40gb-0 (default/held)" in json.dumps(small["placements"])
    assert main(["explain", "-f", claims, "--allocated", allocated, *DYNAMIC, "-o", "table"]) == 0
    out = capsys.readouterr().out
    assert "placements before this claim" in out
    assert "gpu-0-mig-1g-10gb-4, gpu-0-mig-1g-10gb-5, gpu-0-mig-1g-10gb-6  fit" in out


def test_explain_says_which_counter_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write(
        tmp_path / "claims.yaml",
        profile_claim("a", "3g.40gb"),
        profile_claim("b", "3g.40gb"),
        profile_claim("c", "1g.10gb"),
    )
    code, report = run_json(capsys, "explain", "-f", claims, *DYNAMIC)
    assert code == 1
    a, b, c = report["claims"]
    assert a["allocated"] and b["allocated"] and not c["allocated"]
    (attempt,) = c["nodes"]
    (request,) = attempt["requests"]
    reasons = {tuple(g["devices"]): g["reason"] for g in request["reasons"]}
    assert reasons[("gpu-0-mig-1g-10gb-0",)] == (
        f"counter gpu-0-counters/{names.memory_slice_counter(0)}: needs 1, available 0 "
        "(short 1); held by gpu-0-mig-3g-40gb-0 (default/a)"
    )
    assert reasons[("gpu-0-mig-1g-10gb-6",)].endswith("held by gpu-0-mig-3g-40gb-4 (default/b)")


def test_other_claims_show_no_placements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A claim for a whole GPU on a node without MIG: no placements section, classes as before."""
    body = profile_claim("plain", "x")
    body["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": DRIVER}
    claims = write(tmp_path / "claims.yaml", body)
    code, report = run_json(capsys, "explain", "-f", claims, "--mock", "1", "--node-name", NODE)
    assert code == 0
    assert "placements" not in report["claims"][0]


def test_mock_config_mixes_mig_and_partitioned_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --mock-config file says which GPUs are in MIG mode: an A100 in MIG mode publishes its
    placements, the H100 next to it its partitions."""
    config = tmp_path / "gpus.yaml"
    config.write_text(
        yaml.safe_dump(
            [
                {"productName": "NVIDIA A100-SXM4-40GB", "migMode": "Enabled"},
                {"productName": "NVIDIA H100 80GB HBM3", "migMode": "Disabled"},
            ]
        )
    )
    code, report = run_json(
        capsys,
        "devices",
        "--mock-config",
        str(config),
        *("--node-name", NODE, "--sharing-mode", "partitions", "--mig", "dynamic"),
    )
    assert code == 0
    names_ = [n for s in report["resourceSlices"]["slices"] for n in s["deviceNames"]]
    assert "gpu-0-mig-1g-5gb-0" in names_ and "gpu-0" not in names_
    assert "gpu-1" in names_ and "gpu-1-eighth-7" in names_
    assert len(names_) == 25 + 15
