"""Reading allocations from ResourceClaims, fetching them from an API server, and CDI versions."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from api.names import GROUP_VERSION
from kubeletplugin.prepare.cdi import cdi_device_name, minimum_cdi_version
from kubeletplugin.prepare.claims import ClaimError, KubeClaimGetter, extract_allocation
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    GI,
    NODE,
    FakeClaims,
    Node,
    claim,
    ref,
    result,
)

DEVICES = {"gpu-0", "gpu-1"}


def test_results_of_this_driver_and_pool_only() -> None:
    c = claim(
        "c",
        [
            result("a", "gpu-0"),
            result("b", "gpu-1", share={"cores": 25, "memory": 2 * GI}),
            result("c", "gpu-0", pool="other-node"),
            result("d", "nic-0", driver="net.example.com"),
        ],
    )
    alloc = extract_allocation(c, ref(c), DRIVER, NODE, DEVICES)
    assert [(r.request, r.device) for r in alloc.results] == [("a", "gpu-0"), ("b", "gpu-1")]
    assert alloc.results[0].share_id is None
    share = alloc.results[1]
    assert share.share_id == c["status"]["allocation"]["devices"]["results"][1]["shareID"]
    assert share.consumed_capacity == {"cores": "25", "memory": "2Gi"}


def test_config_order_class_first_then_claim_stored_order_kept() -> None:
    def cfg(source: str, n: int, driver: str = DRIVER) -> dict[str, Any]:
        parameters = {"apiVersion": GROUP_VERSION, "kind": "GpuConfig"} if n != 3 else n
        return {
            "source": source,
            "requests": [f"r{n}"],
            "opaque": {"driver": driver, "parameters": parameters},
        }

    c = claim(
        "c",
        [result("a", "gpu-0")],
        configs=[
            cfg("FromClaim", 1),
            cfg("FromClass", 2),
            cfg("FromClaim", 3),
            cfg("FromClass", 4, driver="other.example.com"),
            cfg("FromClass", 5),
        ],
    )
    alloc = extract_allocation(c, ref(c), DRIVER, NODE, DEVICES)
    # Decoded once: this driver's entries in precedence order (positions are the claim's), and
    # an invalid GpuConfig kept as a problem for the enforcer to refuse the devices it concerns.
    assert [(e.source, e.position, e.requests) for e in alloc.configs.entries] == [
        ("FromClass", 1, ("r2",)),
        ("FromClass", 4, ("r5",)),
        ("FromClaim", 0, ("r1",)),
    ]
    (problem,) = alloc.configs.problems
    assert (problem.position, problem.requests) == (2, ("r3",))
    assert problem.messages == ("(root): must be an object (got a number)",)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["metadata"].update(uid="other"), "was replaced: kubelet asked for UID"),
        (lambda c: c["status"].pop("allocation"), "is not allocated: status.allocation is unset"),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="gpu-7"),
            "was allocated device 'gpu-7', which node node-a does not publish",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].pop("request"),
            "results[0].request must be a non-empty string",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["config"].append(
                {"source": "FromSomewhere", "opaque": {"driver": DRIVER, "parameters": {}}}
            ),
            "config[0].source is 'FromSomewhere'; allowed: FromClass, FromClaim",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                shareID="x", consumedCapacity=["bad"]
            ),
            "results[0].consumedCapacity must map names to quantities",
        ),
    ],
)
def test_bad_claims_name_the_problem(mutate: Any, message: str) -> None:
    c = claim("bad", [result("a", "gpu-0")])
    r = ref(c)
    mutate(c)
    with pytest.raises(ClaimError) as info:
        extract_allocation(c, r, DRIVER, NODE, DEVICES)
    assert message in str(info.value)
    assert "ResourceClaim default/bad" in str(info.value)


def test_kube_claim_getter_against_the_api_server(
    apiserver: KubeAPIServer, kube_client: kubernetes.client.ApiClient
) -> None:
    c = claim("served", [result("a", "gpu-0", share={"cores": 10, "memory": GI})])
    apiserver.store.put("resourceclaims", c)
    getter = KubeClaimGetter(kube_client)
    got = getter.get_claim("default", "served")
    assert got["metadata"]["uid"] == c["metadata"]["uid"]
    # The raw JSON keeps the DRA fields the generated models may drop.
    assert got["status"]["allocation"]["devices"]["results"][0]["shareID"]
    with pytest.raises(ClaimError, match="ResourceClaim default/missing not found"):
        getter.get_claim("default", "missing")


def test_kube_claim_getter_reports_server_errors(
    apiserver: KubeAPIServer, kube_client: kubernetes.client.ApiClient
) -> None:
    apiserver.stop()
    with pytest.raises(ClaimError, match="cannot get ResourceClaim default/x"):
        KubeClaimGetter(kube_client, timeout_seconds=2).get_claim("default", "x")


def test_kube_claim_getter_keeps_the_servers_message(
    apiserver: KubeAPIServer, kube_client: kubernetes.client.ApiClient
) -> None:
    # An admin reading the per-claim error needs the API server's reason, e.g. the RBAC rule
    # that is missing, not only the status line.
    from sharegpuctl.local.apiserver import Fault

    message = (
        'resourceclaims.resource.k8s.io "x" is forbidden: User "system:serviceaccount:'
        'sharegpu:plugin" cannot get resource "resourceclaims"'
    )
    apiserver.faults.add(Fault("get", "resourceclaims", code=403, message=message))
    with pytest.raises(ClaimError) as info:
        KubeClaimGetter(kube_client).get_claim("default", "x")
    assert str(info.value) == (f"cannot get ResourceClaim default/x: HTTP 403 Forbidden: {message}")
    assert info.value.reason == "api_error"


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (
            {"kind": "a.com/b", "devices": [{"name": "dev", "containerEdits": {"env": ["A=1"]}}]},
            "0.3.0",
        ),
        ({"kind": "a.com/b", "devices": [{"name": "0dev", "containerEdits": {}}]}, "0.5.0"),
        (
            {
                "kind": "a.com/b",
                "devices": [{"name": "d", "containerEdits": {"mounts": [{"type": "bind"}]}}],
            },
            "0.4.0",
        ),
        (
            {
                "kind": "a.com/b",
                "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/x"}]},
                "devices": [{"name": "d", "containerEdits": {}}],
            },
            "0.5.0",
        ),
        ({"kind": "a.com/b.c", "devices": [{"name": "d"}]}, "0.6.0"),
        ({"kind": "a.com/b", "annotations": {"x": "y"}, "devices": [{"name": "d"}]}, "0.6.0"),
        (
            {
                "kind": "a.com/b",
                "devices": [{"name": "d", "containerEdits": {"additionalGids": [5]}}],
            },
            "0.7.0",
        ),
        (
            {
                "kind": "a.com/b",
                "devices": [{"name": "d", "containerEdits": {"netDevices": [{"name": "n"}]}}],
            },
            "1.1.0",
        ),
    ],
)
def test_minimum_cdi_version_from_content(spec: dict[str, Any], version: str) -> None:
    assert minimum_cdi_version(spec) == version


def test_cdi_device_names() -> None:
    uid = "0f0e0d0c-1111-4222-8333-444455556666"
    share = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeffff0000"
    assert cdi_device_name(uid, "gpu-0", None) == f"{uid}-gpu-0"
    assert cdi_device_name(uid, "gpu-0", share) == f"{uid}-gpu-0-{share}"
    with pytest.raises(ValueError, match="invalid CDI device name"):
        cdi_device_name(uid, "gpu 0", None)


class _RawClaims(http.server.ThreadingHTTPServer):
    """Serves fixed raw bodies by claim name: JSON no Python object could be dumped to."""

    bodies: dict[str, bytes]


class _RawHandler(http.server.BaseHTTPRequestHandler):
    server: _RawClaims

    def do_GET(self) -> None:
        body = self.server.bodies.get(self.path.rsplit("/", 1)[-1])
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        data = body if body is not None else b'{"kind":"Status","code":404,"reason":"NotFound"}'
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_foreign_config_nested_as_deep_as_kubernetes_allows_fails_no_claim(
    tmp_path: Path,
) -> None:
    """Another driver's opaque config nested 5,000 deep (the API server accepts 10,000): the
    claim that carries it and an innocent claim of the same call are both prepared."""
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    foreign = {"opaque": {"driver": "other.example.com", "parameters": "DEEP"}}
    carrier = claim("carrier", [result("a", "gpu-0", share={"cores": 10, "memory": GI})])
    carrier["status"]["allocation"]["devices"]["config"] = [foreign]
    innocent = claim("innocent", [result("a", "gpu-1", share={"cores": 10, "memory": GI})])
    server = _RawClaims(("127.0.0.1", 0), _RawHandler)
    server.bodies = {
        "carrier": json.dumps(carrier).replace('"DEEP"', deep).encode(),
        "innocent": json.dumps(innocent).encode(),
    }
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        configuration = kubernetes.client.Configuration(
            host=f"http://127.0.0.1:{server.server_port}"
        )
        getter = KubeClaimGetter(kubernetes.client.ApiClient(configuration), timeout_seconds=5)
        state = Node(tmp_path).state(getter)  # type: ignore[arg-type]
        outcomes = state.prepare([ref(carrier), ref(innocent)])
    finally:
        server.shutdown()
        server.server_close()
    assert {uid: o.error for uid, o in outcomes.items()} == {
        carrier["metadata"]["uid"]: "",
        innocent["metadata"]["uid"]: "",
    }


class _ExplodingClaims(FakeClaims):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if name == "bad":
            raise RecursionError("maximum recursion depth exceeded while decoding")
        return super().get_claim(namespace, name)


def test_whatever_fetching_one_claim_raises_fails_only_that_claim(tmp_path: Path) -> None:
    claims = _ExplodingClaims()
    good = claim("good", [result("a", "gpu-0", share={"cores": 10, "memory": GI})])
    bad = claim("bad", [result("a", "gpu-1", share={"cores": 10, "memory": GI})])
    claims.add(good, bad)
    outcomes = Node(tmp_path).state(claims).prepare([ref(bad), ref(good)])
    assert outcomes[good["metadata"]["uid"]].error == ""
    error = outcomes[bad["metadata"]["uid"]].error
    assert error.startswith("cannot get ResourceClaim default/bad") and "RecursionError" in error
