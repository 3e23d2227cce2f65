"""What ``sharegpu`` says about the mistakes users make: what, where, and how to fix it.

Every input is written as a user would write it (YAML text, not dicts dumped by a library).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from api.names import DEFAULT_DRIVER_NAME
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.nvml import NvmlBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import REJECTION_KINDS
from sharegpuctl.cli import main
from sharegpuctl.cli.common import default_device_class
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.paths import DOCS_DIR

CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: share
spec:
  devices:
    requests:
    - name: gpu
{request}"""
#: A port nothing listens on: connections are refused at once.
UNREACHABLE = "https://127.0.0.1:1"
KUBECONFIG = f"""\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{UNREACHABLE}"}}
users:
- name: u
  user: {{token: t}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"""


def share_claim(cores: str, memory: str) -> str:
    """The claim with one consumable-capacity request of ``cores`` and ``memory`` (YAML scalars,
    as written)."""
    request = f"""\
      exactly:
        deviceClassName: gpu.sharegpu.dev
        capacity:
          requests:
            cores: {cores}
            memory: {memory}
"""
    return CLAIM.format(request=request)


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def validate(capsys: pytest.CaptureFixture[str], *paths: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["validate", *(a for p in paths for a in ("-f", p)), "-o", "json"])
    return code, list(json.loads(capsys.readouterr().out)["findings"])


def messages(findings: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(f["severity"], f["path"], f["message"]) for f in findings]


# --- validate -----------------------------------------------------------------------------------


def test_quantities_say_how_to_write_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim_text = share_claim('"30%"', "10GB")
    code, found = validate(capsys, write(tmp_path / "c.yaml", claim_text))
    where = "spec.devices.requests[0].exactly.capacity.requests["
    assert code == 1
    assert messages(found) == [
        (
            "error",
            f"{where}cores]",
            '"30%" is not a Kubernetes quantity: write 30 without "%"; cores are a number from '
            "1 to 100 (percent of a GPU), memory is bytes such as 10Gi",
        ),
        (
            "error",
            f"{where}memory]",
            '"10GB" is not a Kubernetes quantity: use 10G (10^9 bytes) or 10Gi (2^30 bytes)',
        ),
    ]


def test_memory_misspelled_is_not_memory_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim_text = share_claim("30", "10gi")
    code, found = validate(capsys, write(tmp_path / "c.yaml", claim_text))
    assert code == 1
    assert [(s, m) for s, _, m in messages(found)] == [
        ("error", '"10gi" is not a Kubernetes quantity: use 10G (10^9 bytes) or 10Gi (2^30 bytes)')
    ]


def test_v1beta1_request_in_v1_says_to_use_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = """\
      deviceClassName: gpu.sharegpu.dev
      count: 1
"""
    code, found = validate(capsys, write(tmp_path / "c.yaml", CLAIM.format(request=request)))
    assert code == 1
    assert messages(found) == [
        (
            "error",
            "spec.devices.requests[0]",
            "deviceClassName, count: in resource.k8s.io/v1, put deviceClassName, count, "
            "selectors and capacity under `exactly:`",
        )
    ]


@pytest.mark.parametrize("key", ["exact", "Exactly"])
def test_misspelled_exactly_gets_a_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    request = f"""\
      {key}:
        deviceClassName: gpu.sharegpu.dev
"""
    code, found = validate(capsys, write(tmp_path / "c.yaml", CLAIM.format(request=request)))
    assert code == 1
    assert messages(found) == [
        (
            "error",
            "spec.devices.requests[0]",
            f"{key!r} is not a field of a request; did you mean 'exactly'? "
            "(fields: name, exactly, firstAvailable)",
        )
    ]


def test_gpuconfig_field_and_kind_get_a_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = """\
      exactly:
        deviceClassName: gpu.sharegpu.dev
    config:
    - opaque:
        driver: gpu.sharegpu.dev
        parameters:
          apiVersion: resource.sharegpu.dev/v1alpha1
          kind: GPUConfig
          sharing:
            stratgy: MPS
"""
    code, found = validate(capsys, write(tmp_path / "c.yaml", CLAIM.format(request=request)))
    assert code == 1
    assert [m for _, _, m in messages(found)] == [
        'kind: must be GpuConfig (got "GPUConfig") (names are case-sensitive)',
        "sharing.stratgy: unknown field; did you mean strategy? "
        "(fields here: strategy, timeSlicing, mps, limits, burstLimit, burstPolicy)",
    ]


@pytest.mark.parametrize("kind", ["GPUConfig", "GpuConfg"])
def test_standalone_gpuconfig_with_a_wrong_kind_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    text = f"apiVersion: resource.sharegpu.dev/v1alpha1\nkind: {kind}\nsharing:\n  strategy: MPS\n"
    code, found = validate(capsys, write(tmp_path / "config.yaml", text))
    assert code == 1
    assert messages(found) == [
        (
            "error",
            "kind",
            f"resource.sharegpu.dev has no kind {kind!r}; did you mean 'GpuConfig'? "
            "(kinds are case-sensitive) (kinds: GpuConfig, GPU, GpuQuota)",
        )
    ]


def test_capacity_compared_with_a_string_suggests_compare_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = """\
      exactly:
        deviceClassName: gpu.sharegpu.dev
        selectors:
        - cel:
            expression: device.capacity['gpu.sharegpu.dev'].memory >= '70Gi'
"""
    code, found = validate(capsys, write(tmp_path / "c.yaml", CLAIM.format(request=request)))
    assert code == 1
    [(severity, path, message)] = messages(found)
    assert (severity, path) == (
        "error",
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
    )
    assert message.endswith(
        "compare them with compareTo: "
        "device.capacity['gpu.sharegpu.dev'].memory.compareTo(quantity('70Gi')) >= 0"
    )


def test_yaml_errors_point_at_the_line_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quote = write(
        tmp_path / "quote.yaml", 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: "x\n'
    )
    tab = write(tmp_path / "tab.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n\tname: x\n")
    scalar = write(tmp_path / "scalar.yaml", "apiVersion: v1\nkind: Namespace\n---\nfoo\n")
    code, found = validate(capsys, quote, tab, scalar)
    assert code == 1
    assert [(f["file"], f["path"], f["message"]) for f in found] == [
        (
            quote,
            "line 4, column 9",
            "invalid YAML: a quoted scalar that starts here is not closed (found unexpected end "
            "of stream at line 5, column 1)",
        ),
        (
            tab,
            "line 4, column 1",
            "invalid YAML: found character that cannot start any token (a tab: indent YAML "
            "with spaces)",
        ),
        (
            scalar,
            "line 4",
            "document 2 is a string, not an object: a manifest is a mapping with apiVersion, "
            "kind and metadata",
        ),
    ]


def test_a_bad_file_does_not_hide_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim_text = share_claim("30", "10GB")
    write(tmp_path / "a-bad.yaml", "kind: ConfigMap\ndata:\n  a: [1, 2\n  b: c\n")
    write(tmp_path / "b-claim.yaml", claim_text)
    code = main(["validate", "-f", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines == [
        f"{tmp_path / 'a-bad.yaml'}: line 4, column 4: error: invalid YAML: did not find "
        "expected ',' or ']' (in a flow sequence that starts at line 3, column 6)",
        f"{tmp_path / 'b-claim.yaml'}: ResourceClaim/share: spec.devices.requests[0].exactly"
        '.capacity.requests[memory]: error: "10GB" is not a Kubernetes '
        "quantity: use 10G (10^9 bytes) or 10Gi (2^30 bytes)",
        "1 object(s) checked against Kubernetes 1.37: 2 error(s), 0 warning(s)",
    ]


# --- explain ------------------------------------------------------------------------------------


def test_cores_above_the_gpu_is_refused_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """explain runs validate's checks first: the same line, and no allocation."""
    claim_text = share_claim("200", "10Gi")
    f = write(tmp_path / "c.yaml", claim_text)
    code = main(["explain", "-f", f, "--mock", "2", "--node-name", "n1"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines == [
        f"{f}: ResourceClaim/share: spec.devices.requests[0].exactly.capacity.requests[cores]: "
        "error: cores must be between 1 and 100 (got 200)",
        "not allocated: 1 error(s) against Kubernetes 1.37 (the checks of sharegpu validate)",
    ]
    assert main(["validate", "-f", f]) == 1
    assert capsys.readouterr().out.splitlines()[0] == lines[0]


def test_troubleshooting_lists_exactly_the_reason_labels_of_explain() -> None:
    text = (DOCS_DIR / "troubleshooting.md").read_text()
    table = text.split("Rejection reasons and what to do", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    documented = [label for row in rows for label in re.findall(r"`([a-z-]+)`", row.split("|")[1])]
    assert sorted(documented) == sorted(REJECTION_KINDS)


@pytest.mark.parametrize("there", ["none", "other.example.com"])
def test_missing_device_class_in_the_cluster_is_not_replaced(
    apiserver: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], there: str
) -> None:
    """kube-scheduler leaves the pod Pending: explain must not allocate with a built-in class."""
    slices = resource_slice_objects(
        desired_slices(node_devices(MockBackend("n1", 1).discover(), "consumable")),
        DEFAULT_DRIVER_NAME,
        "n1",
        None,
        1,
    )
    for i, obj in enumerate(slices):
        obj["metadata"] = {"name": f"n1-slice-{i}"}
        apiserver.store.create("resourceslices", obj)
    if there != "none":
        other = default_device_class()
        other["metadata"]["name"] = there
        apiserver.store.create("deviceclasses", other)
    request = """\
      exactly:
        deviceClassName: gpu.sharegpu.dev
"""
    f = write(tmp_path / "c.yaml", CLAIM.format(request=request))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    code = main(["explain", "-f", f, "--kubeconfig", kubeconfig, "--node", "n1", "-o", "json"])
    [entry] = json.loads(capsys.readouterr().out)["claims"]
    assert code == 1
    assert entry["allocated"] is False
    assert entry["error"].startswith(
        f"DeviceClass gpu.sharegpu.dev does not exist in the cluster of {kubeconfig} "
        f"(DeviceClasses there: {there}); kube-scheduler leaves the pod Pending"
    )


# --- the API server and the GPUs ------------------------------------------------------------


def test_unreachable_api_server_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write(tmp_path / "kubeconfig", KUBECONFIG)
    claim = write(
        tmp_path / "c.yaml", CLAIM.format(request="      exactly: {deviceClassName: x}\n")
    )
    for argv in (["status"], ["explain", "-f", claim]):
        assert main([*argv, "--kubeconfig", kubeconfig]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"cannot reach the API server {UNREACHABLE}: " in err
        assert "Connection refused" in err
        assert "HTTPSConnectionPool" not in err and "object at 0x" not in err


def test_status_falls_back_to_the_home_kubeconfig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / ".kube" / "config", KUBECONFIG)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert main(["status"]) == 1
    assert f"cannot reach the API server {UNREACHABLE}" in capsys.readouterr().err


def test_no_nvml_suggests_mock(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_gpu(self: NvmlBackend) -> None:
        raise DiscoveryError(
            "cannot initialise NVML: the NVML library (libnvidia-ml.so.1) was not found"
        )

    monkeypatch.setattr(NvmlBackend, "discover", no_gpu)
    assert main(["devices"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "sharegpu devices: error: cannot initialise NVML: the NVML library (libnvidia-ml.so.1) "
        "was not found; without an NVIDIA GPU here, use --device-backend mock --mock-gpus N for N "
        "mock H100-like GPUs (or --device-backend mock --mock-config FILE)"
    )
