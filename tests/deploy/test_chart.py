"""The Helm chart: lint, render with several value sets, validate every rendered object.

Every rendered document is validated strictly (unknown fields are errors) against the schemas of
Kubernetes 1.34 and 1.36. Kinds without a Kubernetes schema fail, except this project's GPU CRD
kind and cert-manager's kinds when cert-manager is enabled. The DeviceClass field
``extendedResourceName`` is part of the resource.k8s.io/v1 schema from 1.34 on (alpha there, behind
the DRAExtendedResource gate; beta in 1.36), so it is checked against both versions.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from api.names import DEFAULT_DRIVER_NAME
from kubeletplugin.devices.mock import default_gpu, load_mock_config
from kubeletplugin.devices.slices import consumable_device, desired_slices, partition_devices
from kubeletplugin.devices.table import node_devices
from sharegpu.cel import compile_selector, device_activation
from sharegpuctl.cli.common import (
    chart_device_class_names,
    chart_installed_class_names,
    chart_installed_classes,
    default_device_class,
)
from tests.deploy.helpers import (
    CERT_MANAGER_GROUPS,
    CHART_DIR,
    KUBERNETES_VERSIONS,
    OWN_GROUPS,
    REPO_ROOT,
    api_group,
    by_kind,
    load_documents,
    render_chart,
    run_helm,
    validation_errors,
)

pytestmark = pytest.mark.helm

NAMESPACE = "sharegpu-system"
H100_MOCK = default_gpu("node-a", 0, 1)
RELEASE = "sharegpu"

#: Value sets the chart must render cleanly with: name -> helm --set arguments.
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "cert-manager": ["controller.webhook.certManager.enabled=true"],
    "cert-manager-issuer": [
        "controller.webhook.certManager.enabled=true",
        "controller.webhook.certManager.issuerRef.name=cluster-ca",
        "controller.webhook.certManager.issuerRef.kind=ClusterIssuer",
    ],
    "partitions": ["kubeletPlugin.sharingMode=partitions"],
    "dynamic-mig": ["kubeletPlugin.sharingMode=partitions", "kubeletPlugin.mig=dynamic"],
    "exclusive": ["kubeletPlugin.sharingMode=exclusive"],
    "extended-resource": ["deviceClasses.extendedResource.enabled=true"],
    "mock-backend": [
        "kubeletPlugin.deviceBackend=mock",
        "kubeletPlugin.mock.gpus=4",
        "kubeletPlugin.mock.config=- productName: NVIDIA A100-SXM4-40GB",
    ],
    "class-config": ["deviceClasses.gpu.config.sharing.strategy=MPS"],
    "limits-library": ["kubeletPlugin.enforcement.limitsLibrary=/opt/hami/libvgpu.so"],
    "health-noexecute": [
        "kubeletPlugin.health.taintEffect=NoExecute",
        "kubeletPlugin.health.ignoreXids=13\\,31",
    ],
    "health-off": ["kubeletPlugin.health.enabled=false"],
    "mps-off": ["kubeletPlugin.mps.enabled=false"],
    "no-webhook": ["controller.webhook.enabled=false", "metricsService.enabled=false"],
}


def render(helm: str, set_args: list[str]) -> list[dict[str, Any]]:
    """The chart's documents for the given ``--set`` arguments; fails the test on helm errors."""
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE]
    for item in set_args:
        args += ["--set-string" if "mock.config" in item else "--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return load_documents(result.stdout)


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    return {name: render(helm, set_args) for name, set_args in VARIANTS.items()}


def containers(docs: list[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    for doc in by_kind(docs, kind):
        yield from doc["spec"]["template"]["spec"]["containers"]


#: Value sets also linted (every variant is rendered and validated).
LINT_VARIANTS = ("default", "cert-manager", "partitions", "extended-resource", "mock-backend")


@pytest.mark.parametrize("variant", LINT_VARIANTS)
def test_helm_lint_passes(helm: str, variant: str) -> None:
    args = ["lint", "--strict", str(CHART_DIR), "--namespace", NAMESPACE]
    for item in VARIANTS[variant]:
        args += ["--set-string" if "mock.config" in item else "--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_documents_validate_strictly(
    rendered: dict[str, list[dict[str, Any]]], variant: str, version: str
) -> None:
    allowed = OWN_GROUPS | (CERT_MANAGER_GROUPS if "cert-manager" in variant else frozenset())
    docs = rendered[variant]
    assert docs, "the chart rendered nothing"
    errors = [err for doc in docs for err in validation_errors(doc, version, allowed)]
    assert errors == []


def null_paths(node: Any, path: str = "") -> Iterator[str]:
    """Paths of null values (an empty key left by a template) in a document."""
    if node is None:
        yield path or "<root>"
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from null_paths(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from null_paths(value, f"{path}[{i}]")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_documents_have_no_empty_keys(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    empty = [f"{d['kind']}{p}" for d in rendered[variant] for p in null_paths(d)]
    assert empty == []


def test_cert_manager_kinds_only_when_enabled(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert not [d for d in rendered["default"] if d["apiVersion"].startswith("cert-manager.io")]
    assert {d["kind"] for d in rendered["cert-manager"] if "cert-manager" in d["apiVersion"]} == {
        "Issuer",
        "Certificate",
    }
    # With an existing issuer the chart creates no Issuer of its own.
    issuer_kinds = [d["kind"] for d in rendered["cert-manager-issuer"] if d["kind"] == "Issuer"]
    assert issuer_kinds == []
    cert = one(rendered["cert-manager-issuer"], "Certificate")
    assert cert["spec"]["issuerRef"] == {
        "name": "cluster-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_kubelet_plugin_daemonset(rendered: dict[str, list[dict[str, Any]]]) -> None:
    ds = one(rendered["default"], "DaemonSet")
    spec = ds["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"]
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins/gpu.sharegpu.dev",
        "/var/run/cdi",
        "/dev",
        "/nvidia-root",
        "/etc/cdi",
    } <= mounts
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/plugins_registry", "/var/run/cdi", "/dev", "/usr"} <= host_paths
    # The host's root is never mounted: only the driver root's usr/ directory, read-only.
    assert "/" not in host_paths
    assert "--sharing-mode=consumable" in container["args"]
    assert "--device-backend=nvml" in container["args"]
    assert "--driver-root=/nvidia-root" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--limits-library")]
    # Only the driver files copied by the init container are used; the host's driver root is
    # mounted into the init container alone.
    assert env["LD_LIBRARY_PATH"]["value"] == "/nvidia-root/usr/lib64"
    (init,) = pod["initContainers"]
    for name in ("libnvidia-ml.so.1", "libcuda.so.1", "nvidia-smi", "nvidia-cuda-mps-control"):
        assert name in init["args"][0]
    assert {m["mountPath"] for m in init["volumeMounts"]} == {
        "/host-driver-root/usr",
        "/nvidia-root",
    }
    assert all(m["readOnly"] for m in init["volumeMounts"] if m["mountPath"] != "/nvidia-root")
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    probe = container["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert probe["timeoutSeconds"] > 5  # the plugin's own check waits 5 s
    assert "/host-driver-root" not in mounts


def test_sharing_mode_and_mock_backend_reach_the_plugin(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (partitions,) = containers(rendered["partitions"], "DaemonSet")
    assert "--sharing-mode=partitions" in partitions["args"]
    assert "--mig=static" in partitions["args"]
    (dynamic_mig,) = containers(rendered["dynamic-mig"], "DaemonSet")
    assert {"--sharing-mode=partitions", "--mig=dynamic"} <= set(dynamic_mig["args"])
    (consumable,) = containers(rendered["default"], "DaemonSet")
    assert not [a for a in consumable["args"] if a.startswith("--mig")]
    (limits,) = containers(rendered["limits-library"], "DaemonSet")
    assert "--limits-library=/opt/hami/libvgpu.so" in limits["args"]
    (noexecute,) = containers(rendered["health-noexecute"], "DaemonSet")
    assert {"--health-taint-effect=NoExecute", "--health-ignore-xids=13,31"} <= set(
        noexecute["args"]
    )
    (health_off,) = containers(rendered["health-off"], "DaemonSet")
    assert "--disable-health" in health_off["args"]
    (mock,) = containers(rendered["mock-backend"], "DaemonSet")
    assert "--device-backend=mock" in mock["args"]
    assert "--mock-gpus=4" in mock["args"]
    assert "--mock-config=/etc/sharegpu/mock/gpus.yaml" in mock["args"]
    # The mock backend needs neither the host's /dev nor the driver installation.
    assert not {"/dev", "/nvidia-root"} & {m["mountPath"] for m in mock["volumeMounts"]}
    (mock_pod,) = [
        d["spec"]["template"]["spec"] for d in by_kind(rendered["mock-backend"], "DaemonSet")
    ]
    assert "initContainers" not in mock_pod
    (config_map,) = [
        d for d in by_kind(rendered["mock-backend"], "ConfigMap") if "gpus.yaml" in d["data"]
    ]
    assert "NVIDIA A100-SXM4-40GB" in config_map["data"]["gpus.yaml"]
    # MPS daemons are pods with the mock backend too, running the image's stand-in tool.
    assert "--mps-daemon-pod-template=/etc/sharegpu/mps/daemon-pod.yaml" in mock["args"]


def test_mock_mps_daemon_pods_run_the_stand_in_without_devices_or_privileges(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """With the mock backend the daemon pod installs and runs the stand-in
    ``nvidia-cuda-mps-control``; it mounts neither ``/dev`` nor the driver, is not privileged,
    and the policy allows it no host path but the MPS root."""
    (template,) = [
        d for d in by_kind(rendered["mock-backend"], "ConfigMap") if "daemon-pod.yaml" in d["data"]
    ]
    pod = yaml.safe_load(template["data"]["daemon-pod.yaml"])["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["sharegpu-mps-standin", "--install", "/nvidia-root"]
    (daemon,) = pod["containers"]
    assert daemon["command"] == ["tini", "--", "nvidia-cuda-mps-control", "-f"]
    assert "privileged" not in daemon["securityContext"]
    assert daemon["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert [v for v in pod["volumes"] if "hostPath" in v] == []
    (policy,) = [
        d
        for d in by_kind(rendered["mock-backend"], "ValidatingAdmissionPolicy")
        if d["metadata"]["name"].endswith("-mps-pods")
    ]
    (volumes,) = [v for v in policy["spec"]["variables"] if v["name"] == "onlyAllowedVolumes"]
    assert "v.hostPath.path in []" in volumes["expression"]


def test_controller_runs_unprivileged_with_probes(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = one(rendered["default"], "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--leader-elect=true" in container["args"]
    budget = one(rendered["default"], "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert f"--lease-namespace={NAMESPACE}" in container["args"]


def test_idle_share_values_become_the_controller_flags(helm: str) -> None:
    from controller.config import parse_config
    from controller.idle import IdlePolicy

    default = one(render_chart(helm), "Deployment")
    (container,) = default["spec"]["template"]["spec"]["containers"]
    assert parse_config(container["args"]).idle_policy == IdlePolicy(5, 3600)
    docs = render_chart(
        helm,
        "--set",
        "controller.idleShares.thresholdPercent=0",
        "--set",
        "controller.idleShares.periodSeconds=600",
    )
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--idle-period-seconds=600" in container["args"]
    assert parse_config(container["args"]).idle_policy is None


@pytest.mark.parametrize("variant", ["default", "no-webhook", "mock-backend"])
def test_servers_listen_on_the_pod_ip(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    """The daemons listen on 127.0.0.1 unless told otherwise; the chart gives every server
    the pod IP (where the probes, Prometheus and the Services reach it), never 0.0.0.0."""
    ports: dict[tuple[str, str], int] = {}
    for kind in ("DaemonSet", "Deployment"):
        for container in containers(rendered[variant], kind):
            env = {e["name"]: e for e in container["env"]}
            assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            for arg in container["args"]:
                flag, _, value = arg.partition("=")
                if flag.endswith("-address"):
                    host, _, port = value.rpartition(":")
                    assert host == "$(POD_IP)", arg
                    ports[(kind, flag)] = int(port)
            assert "0.0.0.0" not in " ".join(container["args"])
    expected = {("DaemonSet", "--metrics-address"), ("Deployment", "--metrics-address")}
    expected |= {("Deployment", "--api-address"), ("Deployment", "--probe-address")}
    if variant != "no-webhook":
        expected.add(("Deployment", "--webhook-address"))
    assert set(ports) == expected
    deployment = one(rendered[variant], "Deployment")
    (controller,) = deployment["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in controller["ports"]}
    assert named["api"] == ports[("Deployment", "--api-address")]
    assert named["probes"] == ports[("Deployment", "--probe-address")]
    for probe in ("livenessProbe", "readinessProbe"):  # off the JSON API's authenticated path
        assert controller[probe]["httpGet"]["port"] == "probes"


def rules_of(docs: list[dict[str, Any]], kind: str, name_suffix: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples granted by the role of that kind and name suffix."""
    (role,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def triples(group: str, resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources for v in verbs}


def test_rbac_grants_exactly_what_the_code_uses(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["default"]
    assert rules_of(docs, "ClusterRole", "kubelet-plugin") == (
        triples("resource.k8s.io", ["resourceclaims"], ["get"])
        | triples(
            "resource.k8s.io", ["resourceslices"], ["list", "watch", "create", "update", "delete"]
        )
        | triples("", ["nodes"], ["get"])
        # The Warning Event on the Node when the API server drops gated slice fields.
        | triples("", ["events"], ["create"])
        # Measured usage written into the claims' status.devices (tests/deploy/test_chart_usage.py
        # checks the driver rule's resourceNames).
        | triples("resource.k8s.io", ["resourceclaims/status"], ["update"])
        | triples("resource.k8s.io", ["resourceclaims/driver"], ["associated-node:update"])
    )
    assert rules_of(docs, "ClusterRole", "controller") == (
        triples(
            "resource.k8s.io",
            ["resourceslices", "resourceclaims", "deviceclasses", "devicetaintrules"],
            ["list", "watch"],
        )
        | triples("", ["pods"], ["list", "watch"])
        # ShareOvercommitted Events on the pods of an overcommitted share (create only).
        | triples("", ["events"], ["create"])
        | triples(
            "resource.sharegpu.dev",
            ["gpus"],
            ["get", "list", "watch", "create", "update", "delete"],
        )
        | triples("resource.sharegpu.dev", ["gpus/status"], ["update"])
        # GpuQuota: the webhook charges claims to a quota's status; the quota controller
        # recomputes it.
        | triples("resource.sharegpu.dev", ["gpuquotas"], ["get", "list", "watch"])
        | triples("resource.sharegpu.dev", ["gpuquotas/status"], ["update"])
        | triples("authentication.k8s.io", ["tokenreviews"], ["create"])
        | triples("authorization.k8s.io", ["subjectaccessreviews"], ["create"])
    )
    assert rules_of(docs, "Role", "leader-election") == triples(
        "coordination.k8s.io", ["leases"], ["get", "create", "update"]
    )
    # Nothing grants secrets, wildcard verbs or wildcard resources.
    for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert "secrets" not in rule["resources"]


def _verify_signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> None:
    key = issuer.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )


def test_self_signed_webhook_certificate_matches_the_ca_bundle(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["default"]
    (secret,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-tls")]
    webhook = one(docs, "ValidatingWebhookConfiguration")
    bundles = {w["clientConfig"]["caBundle"] for w in webhook["webhooks"]}
    assert bundles == {secret["data"]["ca.crt"]}
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    _verify_signed_by(serving, ca)
    service = next(
        d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-webhook")
    )
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in san.get_values_for_type(x509.DNSName)
    # The JSON API serves HTTPS with the same certificate, under its own Service's names.
    api = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-api"))
    assert f"{api['metadata']['name']}.{NAMESPACE}.svc" in san.get_values_for_type(x509.DNSName)
    assert serving.not_valid_after_utc > datetime.datetime.now(datetime.UTC)


def test_webhook_policy_and_cert_manager_injection(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    default = one(rendered["default"], "ValidatingWebhookConfiguration")
    assert {w["failurePolicy"] for w in default["webhooks"]} == {"Ignore"}
    resources = {r for w in default["webhooks"] for rule in w["rules"] for r in rule["resources"]}
    assert resources == {"resourceclaims", "resourceclaimtemplates", "deviceclasses"}
    # Each webhook is named after its resource's kind in lower case (not a plural cut short).
    kinds = {
        "resourceclaims": "ResourceClaim",
        "resourceclaimtemplates": "ResourceClaimTemplate",
        "deviceclasses": "DeviceClass",
    }
    for webhook in default["webhooks"]:
        [rule] = webhook["rules"]
        [resource] = rule["resources"]
        assert webhook["name"] == f"{kinds[resource].lower()}.gpu.sharegpu.dev"
    managed = one(rendered["cert-manager"], "ValidatingWebhookConfiguration")
    cert = one(rendered["cert-manager"], "Certificate")
    injected = managed["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert injected == f"{NAMESPACE}/{cert['metadata']['name']}"
    assert all("caBundle" not in w["clientConfig"] for w in managed["webhooks"])
    # cert-manager issues the serving certificate; the chart still holds the client CA.
    assert [s["metadata"]["name"] for s in by_kind(rendered["cert-manager"], "Secret")] == [
        "sharegpu-webhook-client"
    ]


def test_device_classes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    gpu, mig = by_kind(rendered["default"], "DeviceClass")
    assert gpu["metadata"]["name"] == "gpu.sharegpu.dev"
    assert mig["metadata"]["name"] == "mig.gpu.sharegpu.dev"
    # The CLI's stand-in for the chart's class (explain, demo) selects the same devices.
    cli_selectors = [s["cel"]["expression"] for s in default_device_class()["spec"]["selectors"]]
    chart_selectors = [s["cel"]["expression"] for s in gpu["spec"]["selectors"]]
    assert [e.replace('"', "'") for e in chart_selectors] == cli_selectors
    # The classes the CLI says the chart installs (its messages, explain's stand-ins) are the
    # ones it renders with its defaults, selector for selector; with every class enabled, the
    # names the CLI knows are all the chart's.
    rendered_classes = {d["metadata"]["name"]: d for d in (gpu, mig)}
    assert list(rendered_classes) == list(chart_installed_class_names())
    for stand_in in chart_installed_classes():
        chart_class = rendered_classes[stand_in["metadata"]["name"]]
        assert [
            s["cel"]["expression"].replace('"', "'") for s in chart_class["spec"]["selectors"]
        ] == [s["cel"]["expression"] for s in stand_in["spec"]["selectors"]]
    every = {d["metadata"]["name"] for d in by_kind(rendered["extended-resource"], "DeviceClass")}
    assert every == set(chart_device_class_names())
    classes = {
        d["metadata"]["name"]: d for d in by_kind(rendered["extended-resource"], "DeviceClass")
    }
    extended = classes["extended.gpu.sharegpu.dev"]
    assert extended["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    configured, _ = by_kind(rendered["class-config"], "DeviceClass")
    (config,) = configured["spec"]["config"]
    assert config["opaque"]["driver"] == "gpu.sharegpu.dev"
    assert config["opaque"]["parameters"] == {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS"},
    }


def mig_node_devices(tmp_path: Path) -> list[dict[str, Any]]:
    """The published devices of a mock node whose GPU 0 holds two MIG devices, next to GPU 1."""
    config = tmp_path / "gpus.yaml"
    config.write_text(
        "- migDevices: [{profile: 1g.10gb, gpuInstance: 9}, {profile: 3g.40gb, gpuInstance: 2}]\n"
        "- {}\n"
    )
    devices = node_devices(load_mock_config("node-a", config), "consumable")
    return [d for content in desired_slices(devices) for d in content.get("devices", [])]


def test_device_class_selectors_compile_and_select_whole_gpus(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    classes = {
        d["metadata"]["name"]: d for d in by_kind(rendered["extended-resource"], "DeviceClass")
    }
    gpu = H100_MOCK
    mig = [d for d in mig_node_devices(tmp_path) if "-mig-" in d["name"]]
    assert len(mig) == 2
    for name, devices, expected in [
        ("gpu.sharegpu.dev", [consumable_device(gpu)], ["gpu-0"]),
        ("gpu.sharegpu.dev", partition_devices(gpu), [d["name"] for d in partition_devices(gpu)]),
        ("extended.gpu.sharegpu.dev", [consumable_device(gpu)], ["gpu-0"]),
        ("extended.gpu.sharegpu.dev", partition_devices(gpu), ["gpu-0"]),
        # MIG devices only through the MIG class.
        ("gpu.sharegpu.dev", [consumable_device(gpu), *mig], ["gpu-0"]),
        ("extended.gpu.sharegpu.dev", [consumable_device(gpu), *mig], ["gpu-0"]),
        ("mig.gpu.sharegpu.dev", [consumable_device(gpu), *mig], [d["name"] for d in mig]),
    ]:
        programs = [
            compile_selector(s["cel"]["expression"]) for s in classes[name]["spec"]["selectors"]
        ]
        chosen = [
            d["name"]
            for d in devices
            if all(p.evaluate(device_activation(DEFAULT_DRIVER_NAME, d)) for p in programs)
        ]
        assert chosen == expected, name


def test_gpu_crd_is_rendered_with_keep_policy(rendered: dict[str, list[dict[str, Any]]]) -> None:
    crds = {
        d["metadata"]["name"]: d for d in by_kind(rendered["default"], "CustomResourceDefinition")
    }
    assert sorted(crds) == ["gpuquotas.resource.sharegpu.dev", "gpus.resource.sharegpu.dev"]
    for crd in crds.values():
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_chart_crd_copy_matches_the_generated_crd() -> None:
    generated = REPO_ROOT / "deploy" / "crds" / "gpus.resource.sharegpu.dev.yaml"
    copy = CHART_DIR / "files" / "gpus.resource.sharegpu.dev.yaml"
    assert generated.exists(), f"{generated} is missing: run `python -m api.crd`"
    assert copy.read_text() == generated.read_text(), (
        f"{copy} differs from {generated}: run `bash deploy/helm/sync-crds.sh`"
    )


@pytest.mark.parametrize(
    ("set_arg", "message"),
    [
        ("kubeletPlugin.sharingMode=shared", "/kubeletPlugin/sharingMode"),
        ("kubeletPlugin.deviceBackend=cuda", "/kubeletPlugin/deviceBackend"),
        ("kubeletPlugin.updateStrategy.rollingUpdate.maxSurge=1", "maxSurge"),
        ("controller.webhook.failurePolicy=Retry", "/controller/webhook/failurePolicy"),
        ("controller.leaderElection.enabled=false", "/controller/leaderElection/enabled"),
        ("controller.idleShares.thresholdPercent=101", "/controller/idleShares/thresholdPercent"),
        ("controller.idleShares.periodSeconds=0", "/controller/idleShares/periodSeconds"),
        ("controller.idleShares.periodSeconds=1h", "/controller/idleShares/periodSeconds"),
        ("kubeletPlugin.unknownKey=1", "unknownKey"),
        ("kubeletPlugin.mig=auto", "/kubeletPlugin/mig"),
        ("kubeletPlugin.nvidiaCdiKind=gpu", "/kubeletPlugin/nvidiaCdiKind"),
        # Dynamic MIG needs partitions mode (the default mode is consumable).
        ("kubeletPlugin.mig=dynamic", "/kubeletPlugin/sharingMode"),
        # MPS daemon pods need their pod policy: the plugin's pod-create Role without it would
        # let a compromised plugin start any pod.
        ("resourceSlicePolicy.enabled=false", "/resourceSlicePolicy/enabled"),
        # A metrics peer must name its namespaces: a pod label alone is one any tenant sets.
        ("networkPolicy.metricsFrom[0].namespaceSelector=null", "/networkPolicy/metricsFrom/0"),
        (
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels=null",
            "/networkPolicy/metricsFrom/0/namespaceSelector",
        ),
    ],
)
def test_values_schema_rejects_bad_values(helm: str, set_arg: str, message: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART_DIR), "--set", set_arg)
    assert result.returncode != 0
    assert message in result.stderr


def plugin_parser() -> argparse.ArgumentParser:
    """The kubelet plugin's flag parser."""
    from kubeletplugin.config import build_parser

    return build_parser()


def accepts(parser: argparse.ArgumentParser, args: list[str]) -> str:
    """'' when the parser accepts ``args``, else what argparse printed."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(args)
    except SystemExit:
        return err.getvalue().strip() or "rejected"
    return ""


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_flags_are_accepted_by_the_daemons(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    from controller.main import build_parser as controller_parser

    for container in containers(rendered[variant], "DaemonSet"):
        # tini (PID 1, or the child subreaper in the host PID namespace) reaps whatever the
        # plugin does not wait for.
        assert container["command"] == ["tini", "-s", "--", "sharegpu-kubeletplugin"]
        assert accepts(plugin_parser(), container["args"]) == ""
    for container in containers(rendered[variant], "Deployment"):
        assert container["command"] == ["sharegpu-controller"]
        assert accepts(controller_parser(), container["args"]) == ""


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_sharegpu_validate_accepts_every_rendered_document(
    rendered: dict[str, list[dict[str, Any]]], version: str, tmp_path: Path
) -> None:
    """`sharegpu validate` (schemas, GpuConfigs, CEL) on every variant; cert-manager's kinds are
    left out because no Kubernetes schema describes them."""
    files = []
    for variant, docs in sorted(rendered.items()):
        path = tmp_path / f"{variant}.yaml"
        kept = [d for d in docs if api_group(d) not in CERT_MANAGER_GROUPS]
        path.write_text(yaml.safe_dump_all(kept))
        files += ["-f", str(path)]
    result = subprocess.run(
        [sys.executable, "-m", "sharegpuctl", "validate", *files, "--kubernetes-version", version],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("kube_version", "accepted"), [("1.33.5", False), ("1.34.0", True)])
def test_chart_requires_kubernetes_1_34(helm: str, kube_version: str, accepted: bool) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART_DIR), "--kube-version", kube_version)
    assert (result.returncode == 0) == accepted, result.stderr


def run_driver_files_script(
    rendered: dict[str, list[dict[str, Any]]], host_root: Path, dest: Path
) -> subprocess.CompletedProcess[str]:
    """The init container's script, run here with its two directories moved under tmp_path."""
    (ds,) = by_kind(rendered["default"], "DaemonSet")
    (init,) = ds["spec"]["template"]["spec"]["initContainers"]
    assert init["command"] == ["sh", "-c"]
    script = init["args"][0].replace("/host-driver-root", str(host_root))
    script = script.replace("/nvidia-root", str(dest))
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)


def test_init_container_copies_only_the_driver_files(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    host = tmp_path / "host"
    libdir = host / "usr" / "lib" / "x86_64-linux-gnu"
    bindir = host / "usr" / "bin"
    libdir.mkdir(parents=True)
    bindir.mkdir(parents=True)
    (libdir / "libnvidia-ml.so.580.95.05").write_text("nvml")
    (libdir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.95.05")
    (libdir / "libcuda.so.1").write_text("cuda")
    (libdir / "libc.so.6").write_text("the host's glibc")
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        (bindir / tool).write_text(tool)
    dest = tmp_path / "nvidia-root"
    result = run_driver_files_script(rendered, host, dest)
    assert result.returncode == 0, result.stderr
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == [
        "usr/bin/nvidia-cuda-mps-control",
        "usr/bin/nvidia-cuda-mps-server",
        "usr/bin/nvidia-smi",
        "usr/lib64/libcuda.so.1",
        "usr/lib64/libnvidia-ml.so.1",
    ]
    assert (dest / "usr/lib64/libnvidia-ml.so.1").read_text() == "nvml"  # the file, not a link
    assert not (dest / "usr/lib64/libnvidia-ml.so.1").is_symlink()


def test_init_container_fails_clearly_without_nvml(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    result = run_driver_files_script(rendered, host, tmp_path / "nvidia-root")
    assert result.returncode == 1
    assert "libnvidia-ml.so.1 not found under the driver root /" in result.stderr
    assert "kubeletPlugin.driverRoot" in result.stderr


def _policy_ports(policy: dict[str, Any]) -> dict[str, list[Any]]:
    """Port name -> the ``from`` of the rule that opens it (absent ``from``: open to all)."""
    opened: dict[str, list[Any]] = {}
    for rule in policy["spec"].get("ingress") or []:
        for port in rule.get("ports") or []:
            opened[port["port"]] = rule.get("from", ["<everyone>"])
    return opened


@pytest.mark.parametrize("variant", ["default", "mock-backend", "cert-manager"])
def test_every_port_of_every_workload_has_a_network_policy(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    docs = rendered[variant]
    policies = by_kind(docs, "NetworkPolicy")
    for kind in ("Deployment", "DaemonSet"):
        for workload in by_kind(docs, kind):
            labels = workload["spec"]["template"]["metadata"]["labels"]
            (policy,) = [
                p
                for p in policies
                if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
            ]
            assert policy["spec"]["policyTypes"] == ["Ingress"]
            opened = _policy_ports(policy)
            for container in workload["spec"]["template"]["spec"]["containers"]:
                for port in container.get("ports") or []:
                    if port["name"] == "probes":  # closed to every pod: the kubelet's only
                        assert port["name"] not in opened
                        continue
                    assert port["name"] in opened, (workload["metadata"]["name"], port["name"])
            # Only the webhook is open to every source; everything else names its peers.
            for name, peers in opened.items():
                assert (peers == ["<everyone>"]) == (name == "webhook"), (name, peers)


def test_network_policies_close_ports_with_no_peers(helm: str) -> None:
    docs = render(helm, ["networkPolicy.metricsFrom=null", "networkPolicy.apiFrom=null"])
    for policy in by_kind(docs, "NetworkPolicy"):
        assert set(_policy_ports(policy)) <= {"webhook"}
    assert not by_kind(render(helm, ["networkPolicy.enabled=false"]), "NetworkPolicy")


def test_the_packaged_chart_renders_like_the_repository_and_defaults_to_its_version(
    helm: str, tmp_path: Path
) -> None:
    """The release path of docs/install.md: `helm package` makes sharegpu-<version>.tgz, which
    renders exactly as the chart directory does, with the image tag of that version."""
    from api.version import VERSION

    result = run_helm(helm, "package", str(CHART_DIR), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    package = tmp_path / f"sharegpu-{VERSION}.tgz"
    assert package.is_file()
    from_package = run_helm(helm, "template", RELEASE, str(package), "--namespace", NAMESPACE)
    from_directory = run_helm(helm, "template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE)
    assert from_package.returncode == 0, from_package.stderr
    strip = [d for d in load_documents(from_package.stdout) if d.get("kind") != "Secret"]
    same = [d for d in load_documents(from_directory.stdout) if d.get("kind") != "Secret"]
    # Secrets and the CA bundle hold a freshly generated certificate each time.
    webhook = "ValidatingWebhookConfiguration"
    assert [d for d in strip if d["kind"] != webhook] == [d for d in same if d["kind"] != webhook]
    images = {
        c["image"]
        for d in strip
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"sharegpu:{VERSION}"}


def test_default_share_cores_reach_the_plugin_in_consumable_mode_only(helm: str) -> None:
    def plugin_args(*set_args: str) -> list[str]:
        docs = render(helm, list(set_args))
        (ds,) = by_kind(docs, "DaemonSet")
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        return [a for a in container["args"] if a.startswith("--default-share-cores")]

    assert plugin_args() == ["--default-share-cores=100"]
    assert plugin_args("kubeletPlugin.defaultShareCores=10") == ["--default-share-cores=10"]
    assert plugin_args("kubeletPlugin.sharingMode=partitions") == []
    result = run_helm(
        helm, "template", RELEASE, str(CHART_DIR), "--set", "kubeletPlugin.defaultShareCores=0"
    )
    assert result.returncode != 0 and "defaultShareCores" in result.stderr


def test_the_nvidia_cdi_kind_reaches_the_plugin_on_real_gpus_only(helm: str) -> None:
    def plugin_args(*set_args: str) -> list[str]:
        docs = render(helm, list(set_args))
        (ds,) = by_kind(docs, "DaemonSet")
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        return [a for a in container["args"] if a.startswith("--nvidia-cdi-kind")]

    assert plugin_args() == ["--nvidia-cdi-kind=nvidia.com/gpu"]
    assert plugin_args("kubeletPlugin.nvidiaCdiKind=k8s.example.com/gpu") == [
        "--nvidia-cdi-kind=k8s.example.com/gpu"
    ]
    assert plugin_args("kubeletPlugin.deviceBackend=mock") == []


def test_the_api_servers_client_certificate_is_signed_by_the_ca_the_controller_trusts(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The webhook charges GpuQuotas only for reviews with a client certificate of this CA: the
    chart generates the pair for the API server and mounts only the CA into the controller."""
    docs = rendered["default"]
    (client,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-client")]
    ca = x509.load_pem_x509_certificate(base64.b64decode(client["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(client["data"]["tls.crt"]))
    _verify_signed_by(cert, ca)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.ExtendedKeyUsageOID.CLIENT_AUTH in list(usages)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [
        v
        for v in pod["volumes"]
        if v.get("secret", {}).get("secretName") == client["metadata"]["name"]
    ]
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the key
    (controller,) = pod["containers"]
    (mount,) = [m for m in controller["volumeMounts"] if m["name"] == volume["name"]]
    assert f"--webhook-client-ca-file={mount['mountPath']}/ca.crt" in controller["args"]


def test_a_stopping_controller_keeps_serving_while_its_endpoints_go(helm: str) -> None:
    """A controller pod asked to stop keeps serving for ``shutdownDelaySeconds`` (a preStop
    sleep) before its daemon gets SIGTERM: on a real cluster a webhook that stopped at once was
    dialled through kube-proxy for a moment, refused, and three claims with a bad GpuConfig were
    admitted unchecked under the default failure policy (tests/e2e/test_faults.py). The grace
    period leaves the daemon its own 30 s after the sleep; 0 turns both off."""
    pod = one(render(helm, []), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 10}}}
    assert pod["terminationGracePeriodSeconds"] == 40
    off = one(render(helm, ["controller.shutdownDelaySeconds=0"]), "Deployment")
    assert "lifecycle" not in off["spec"]["template"]["spec"]["containers"][0]
    assert "terminationGracePeriodSeconds" not in off["spec"]["template"]["spec"]


def test_an_existing_client_ca_and_allowed_names_reach_the_controller(helm: str) -> None:
    docs = render(
        helm,
        [
            "controller.webhook.clientAuth.existingSecret=apiserver-webhook-ca",
            "controller.webhook.clientAuth.allowedNames={kube-apiserver-webhook}",
        ],
    )
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-client")]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"key": "ca.crt", "path": "ca.crt"} in next(
        v["secret"]["items"]
        for v in pod["volumes"]
        if v.get("secret", {}).get("secretName") == "apiserver-webhook-ca"
    )
    assert "--webhook-client-name=kube-apiserver-webhook" in pod["containers"][0]["args"]


def test_the_json_api_serves_https_and_asks_for_its_audience(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (controller,) = containers(rendered["default"], "Deployment")
    args = controller["args"]
    assert "--api-token-audience=sharegpu.dev" in args
    assert "--api-tls-cert-file=/etc/sharegpu/tls/tls.crt" in args
    assert "--api-tls-key-file=/etc/sharegpu/tls/tls.key" in args
    (plain,) = containers(rendered["no-webhook"], "Deployment")  # no certificate: plain HTTP
    assert not [a for a in plain["args"] if a.startswith("--api-tls")]
