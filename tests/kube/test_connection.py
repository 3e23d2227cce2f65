"""sharegpu.kube.connection: the official client's connection code without the rest of the
``kubernetes`` package, and ApiConnection, the daemons' client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharegpu.kube.connection import ApiConnection, official
from sharegpu.kube.rest import (
    KubeConfigError,
    KubeRest,
    load_api_client,
    load_connection,
    resource_path,
)
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.paths import REPO_ROOT

NODES = resource_path("", "v1", "nodes")

#: In a fresh interpreter: load a kubeconfig through the light path and through the whole
#: package, and report what was loaded and what each produced.
PROBE = r"""
import json, sys
from sharegpu.kube.connection import official
from sharegpu.kube.rest import load_api_client, load_connection

def settings(configuration, pool):
    return {
        "host": configuration.host,
        "token": configuration.api_key.get("BearerToken"),
        "verify_ssl": configuration.verify_ssl,
        "tls_server_name": configuration.tls_server_name,
        "has_hook": configuration.refresh_api_key_hook is not None,
        "pool": {k: str(v) for k, v in sorted(pool.connection_pool_kw.items())},
    }

connection = load_connection(sys.argv[1], {})
light = {
    "full": official().full,
    "kubernetes_modules": sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes"),
    "pydantic": "pydantic" in sys.modules,
    "settings": settings(connection.configuration, connection.rest_client.pool_manager),
}
api = load_api_client(sys.argv[1], {})
full = settings(api.configuration, api.rest_client.pool_manager)
import kubernetes.client
print(json.dumps({"light": light, "full": full, "models": hasattr(kubernetes.client, "V1Node")}))
"""


def write_kubeconfig(path: Path) -> str:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://10.0.0.1:6443",
                            "insecure-skip-tls-verify": True,
                            "tls-server-name": "kubernetes.default",
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def test_the_light_load_gives_the_official_settings_without_the_package(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, write_kubeconfig(tmp_path / "kubeconfig")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    light = report["light"]
    assert light["full"] is False
    # Nothing of the package stays registered, and the generated models were never loaded.
    assert light["kubernetes_modules"] == []
    assert light["pydantic"] is False
    assert light["settings"] == report["full"]
    assert light["settings"]["host"] == "https://10.0.0.1:6443"
    assert light["settings"]["token"] == "Bearer secret-token"
    assert light["settings"]["pool"]["server_hostname"] == "kubernetes.default"
    assert light["settings"]["has_hook"] is True
    # A later import of the package runs it as usual.
    assert report["models"] is True


#: In a fresh interpreter, without a kubeconfig: the in-cluster loader only.
INCLUSTER_PROBE = r"""
import json, sys
from sharegpu.kube.rest import KubeConfigError, load_connection
try:
    load_connection(None, {})
except KubeConfigError as exc:
    error = str(exc)
loaded = {m.split(".")[0] for m in sys.modules}
print(json.dumps({"error": error, "oauth": sorted(loaded & {"requests", "oauthlib", "yaml"})}))
"""


def test_the_in_cluster_path_loads_no_kubeconfig_code() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    done = subprocess.run(
        [sys.executable, "-c", INCLUSTER_PROBE],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    assert report["error"].startswith("no --kubeconfig, no $KUBECONFIG, and not running in a")
    assert report["oauth"] == []


def test_with_the_package_loaded_its_own_modules_are_used() -> None:
    import kubernetes.client

    assert official().configuration is kubernetes.client.Configuration
    assert official().full is True


def test_requests_through_a_connection(apiserver: KubeAPIServer, tmp_path: Path) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with load_connection(kubeconfig, {}) as connection:
        assert isinstance(connection, ApiConnection)
        rest = KubeRest(connection)
        rest.request("POST", NODES, body={"metadata": {"name": "n1"}})
        items, _ = rest.list_all(NODES)
        assert [i["metadata"]["name"] for i in items] == ["n1"]
        pools = connection.rest_client.pool_manager.pools
        assert len(pools) == 1
    assert len(pools) == 0  # closing the connection closes its pool


def test_both_loaders_name_the_source_of_a_bad_kubeconfig(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("clusters: [")
    for load in (load_api_client, load_connection):
        with pytest.raises(KubeConfigError, match=rf"^cannot use kubeconfig {broken} \(from"):
            load(str(broken), {})
