"""A Kubernetes control plane from the upstream binaries: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, in one work directory and in the run's sealed network
namespace (:mod:`tests.e2e.netns`): etcd on the namespace's loopback, the API server on the node
address, which the ``kubernetes`` Service's endpoints name. Every process, kubectl included, runs
inside that namespace; requests of the test process go through its threads there.

Certificates come from one CA made with ``trustme`` (serving certificate of the API server,
client certificates of the admin and of each component, named as Kubernetes' bootstrap RBAC
policy expects); the service-account signing key is an RSA key. Every process logs to
``<work>/logs/<name>.log`` and is stopped by its PID in :meth:`ControlPlane.stop`.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.e2e.netns import KUBERNETES_SERVICE_IP, NODE_IP, SERVICE_CIDR, SealedNetwork
from tests.e2e.processes import Process, Processes, StepFailed, failure, step, wait_until

#: DRA features sharegpu uses (on by default in 1.37; set so an older pin enables them too).
FEATURE_GATES: Final = (
    "DRAConsumableCapacity=true,DRAPartitionableDevices=true,"
    "DRADeviceTaints=true,DRAExtendedResource=true"
)
#: Served next to resource.k8s.io/v1 for clients that still speak v1beta2.
RUNTIME_CONFIG: Final = "resource.k8s.io/v1beta2=true"
#: Seconds a component may take to become ready on a busy 2-core machine.
READY_DEADLINE_S: Final = 240.0
#: Seconds one kubectl command may take.
KUBECTL_TIMEOUT_S: Final = 120.0
#: Seconds a kubectl given its own ``--timeout=<n>s`` may run beyond it.
KUBECTL_TIMEOUT_MARGIN_S: Final = 30.0


def kubectl_timeout(args: Sequence[str]) -> float:
    """How long kubectl with ``args`` may run: its own ``--timeout=<n>s`` (or ``<n>m``) and a
    margin when that is longer than :data:`KUBECTL_TIMEOUT_S`, else that."""
    for arg in args:
        match = re.fullmatch(r"--timeout=([0-9]+)([sm])", arg)
        if match:
            own = int(match[1]) * (60 if match[2] == "m" else 1)
            return max(KUBECTL_TIMEOUT_S, own + KUBECTL_TIMEOUT_MARGIN_S)
    return KUBECTL_TIMEOUT_S


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that need a fixed one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pki:
    """The CA and the certificates and keys of one control plane, written under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA(organization_name="sharegpu-e2e")
        self.ca_file = directory / "ca.crt"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = directory / "sa.key"
        self.sa_key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        self.sa_pub = directory / "sa.pub"
        self.sa_pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def issue(
        self, name: str, *hosts: str, user: str | None = None, group: str | None = None
    ) -> tuple[Path, Path]:
        """A certificate (serving for ``hosts``; client for ``user`` in ``group``) and its key."""
        leaf = self.ca.issue_cert(*(hosts or (name,)), common_name=user, organization_name=group)
        cert, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return cert, key


def write_kubeconfig(
    path: Path,
    server: str,
    ca_file: Path,
    *,
    cert: tuple[Path, Path] | None = None,
    token: str | None = None,
) -> Path:
    """A kubeconfig for ``server`` with a client certificate or a bearer token."""
    user: dict[str, str] = {}
    if cert is not None:
        user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    if token is not None:
        user["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


#: The subject of the API server's webhook client certificate.
WEBHOOK_CLIENT_NAME = "e2e-apiserver-webhook-client"


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler of one run."""

    def __init__(
        self,
        bin_dir: Path,
        work: Path,
        extra_flags: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.bin = bin_dir
        self.work = work
        #: More flags of a component started by :meth:`start`, by its name (a bench raising the
        #: controller manager's client QPS); the tests set none.
        self.extra_flags = dict(extra_flags or {})
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.home = work / "home"
        self.home.mkdir(exist_ok=True)
        self.network = SealedNetwork()
        self.processes = Processes(work / "logs", wrap=self.network.argv)
        #: What each probe of the seal got (:meth:`SealedNetwork.prove_sealed`).
        self.seal: list[str] = []
        self.pki = Pki(work / "pki")
        self.api_port = 0
        self.server = ""
        self.admin_cert = self.pki.issue("admin", user="e2e-admin", group="system:masters")
        #: The client certificate the API server presents to admission webhooks (the
        #: controller charges GpuQuotas only for reviews that carry it; docs/install.md).
        self.webhook_client = self.pki.issue("webhook-client", user=WEBHOOK_CLIENT_NAME)
        self.admin_kubeconfig = work / "admin.kubeconfig"
        #: The API server's client certificate towards kubelets (logs, exec, port-forward).
        self.kubelet_client_cert = self.pki.issue(
            "apiserver-kubelet-client", user="kube-apiserver-kubelet-client", group="system:masters"
        )
        self.apiserver: Process | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start every component and wait until the API server is ready; fails the step with the
        log of the component that did not come up."""
        with step("create the sealed network namespace", "ip netns add " + self.network.name):
            self.network.create()
        with step("prove the seal", f"connect from {self.network.name}"):
            self.seal = self.network.prove_sealed()
        etcd_url = self._start_etcd()
        self._start_apiserver(etcd_url)
        self._start_component(
            "kube-controller-manager",
            "system:kube-controller-manager",
            [
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_file}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No kubelet sends heartbeats here: nodes are never tainted unreachable.
                "--controllers=*,-nodelifecycle",
                f"--feature-gates={FEATURE_GATES}",
            ],
        )
        self._start_component(
            "kube-scheduler",
            "system:kube-scheduler",
            [
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                f"--feature-gates={FEATURE_GATES}",
            ],
        )

    def stop(self) -> None:
        """Stop every process this control plane started, by PID, in reverse order; then remove
        the sealed network namespace."""
        try:
            self.processes.stop_all()
        finally:
            self.network.remove()

    def _start_etcd(self) -> str:
        name = "etcd"
        for _attempt in range(3):
            client, peer = free_port(), free_port()
            client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
            proc = self.processes.start(
                name,
                [
                    str(self.bin / "etcd"),
                    "--name=e2e",
                    f"--data-dir={self.work / 'etcd'}",
                    f"--listen-client-urls={client_url}",
                    f"--advertise-client-urls={client_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=e2e={peer_url}",
                    "--log-level=warn",
                    # Test data only: no fsync keeps a slow shared disk from stalling the run.
                    "--unsafe-no-fsync=true",
                ],
            )

            def healthy(url: str = client_url) -> bool:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                    return bool(json.load(resp).get("health") == "true")

            try:
                wait_until(
                    lambda: self.network.call(healthy),
                    "start etcd",
                    "etcd /health",
                    process=proc,
                    deadline_s=60,
                )
                return client_url
            except StepFailed:
                if "address already in use" not in _read(proc.log):
                    raise
                self.processes.stop(proc)
        raise StepFailed(failure("start etcd", name, "no free port pair after 3 attempts"))

    def _admission_config(self) -> Path:
        """The AdmissionConfiguration of docs/install.md: the validating webhook plugin's
        kubeconfig presents :attr:`webhook_client` to every webhook (user ``*``)."""
        kubeconfig = self.work / "webhook-admission.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "users": [
                        {
                            "name": "*",
                            "user": {
                                "client-certificate": str(self.webhook_client[0]),
                                "client-key": str(self.webhook_client[1]),
                            },
                        }
                    ],
                }
            )
        )
        config = self.work / "admission-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": [
                        {
                            "name": "ValidatingAdmissionWebhook",
                            "configuration": {
                                "apiVersion": "apiserver.config.k8s.io/v1",
                                "kind": "WebhookAdmissionConfiguration",
                                "kubeConfigFile": str(kubeconfig),
                            },
                        }
                    ],
                }
            )
        )
        return config

    def _start_apiserver(self, etcd_url: str) -> None:
        serving = self.pki.issue(
            "apiserver",
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            KUBERNETES_SERVICE_IP,
            NODE_IP,
        )
        for _attempt in range(3):
            self.api_port = free_port()
            self.server = f"https://{NODE_IP}:{self.api_port}"
            write_kubeconfig(
                self.admin_kubeconfig, self.server, self.pki.ca_file, cert=self.admin_cert
            )
            proc = self.apiserver = self.processes.start(
                "kube-apiserver",
                [
                    str(self.bin / "kube-apiserver"),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=0.0.0.0",
                    f"--advertise-address={NODE_IP}",
                    f"--secure-port={self.api_port}",
                    f"--cert-dir={self.work / 'apiserver-certs'}",
                    f"--tls-cert-file={serving[0]}",
                    f"--tls-private-key-file={serving[1]}",
                    f"--client-ca-file={self.pki.ca_file}",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    f"--admission-control-config-file={self._admission_config()}",
                    "--allow-privileged=true",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-account-key-file={self.pki.sa_pub}",
                    f"--service-account-signing-key-file={self.pki.sa_key}",
                    f"--feature-gates={FEATURE_GATES}",
                    f"--runtime-config={RUNTIME_CONFIG}",
                    # A kubelet of the run is reached by its InternalIP and proves itself with a
                    # certificate of the run's CA.
                    "--kubelet-preferred-address-types=InternalIP,Hostname",
                    f"--kubelet-certificate-authority={self.pki.ca_file}",
                    f"--kubelet-client-certificate={self.kubelet_client_cert[0]}",
                    f"--kubelet-client-key={self.kubelet_client_cert[1]}",
                ],
            )
            try:
                wait_until(
                    lambda: self.request("GET", "/readyz")[0] == 200,
                    "start kube-apiserver",
                    "kube-apiserver /readyz 200",
                    process=proc,
                    deadline_s=READY_DEADLINE_S,
                    interval_s=1.0,
                )
                return
            except StepFailed:
                if "address already in use" not in _read(proc.log):
                    raise
                self.processes.stop(proc)
        raise StepFailed(failure("start kube-apiserver", "kube-apiserver", "no free port"))

    def _start_component(self, name: str, user: str, flags: list[str]) -> None:
        if not os.access(self.bin / name, os.X_OK):
            return
        kubeconfig = write_kubeconfig(
            self.work / f"{name}.kubeconfig",
            self.server,
            self.pki.ca_file,
            cert=self.pki.issue(name, user=user),
        )
        extra = self.extra_flags.get(name, ())
        self.processes.start(
            name, [str(self.bin / name), f"--kubeconfig={kubeconfig}", *flags, *extra]
        )

    # --- clients -----------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """TLS to the API server as the admin (trusting only this run's CA)."""
        context = ssl.create_default_context(cafile=str(self.pki.ca_file))
        context.load_cert_chain(str(self.admin_cert[0]), str(self.admin_cert[1]))
        return context

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One request as the admin; returns the HTTP status and the decoded JSON body (or the
        text where it is no JSON). HTTP errors are returned, not raised. Sent from inside the
        sealed namespace."""
        return self.network.call(self._request, method, path, body, content_type)

    def _request(self, method: str, path: str, body: Any, content_type: str) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=60, context=self.ssl_context()) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        step_name: str = "kubectl",
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; with ``check`` a non-zero exit fails the step
        with the command, its output and the API server's log. It runs inside the sealed
        namespace with the run's kubeconfigs (under the work directory); with any other
        ``kubeconfig`` (an embedded API server on the machine's loopback) outside it."""
        argv = [
            str(self.bin / "kubectl"),
            f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            *args,
        ]
        inside = kubeconfig is None or self.work in kubeconfig.parents
        try:
            result = self.run(argv, kubectl_timeout(args), stdin=stdin, inside=inside)
        except subprocess.TimeoutExpired as exc:
            raise StepFailed(
                failure(
                    step_name,
                    argv,
                    f"no answer in {exc.timeout:g} s",
                    self.apiserver.log if self.apiserver is not None else None,
                )
            ) from None
        if check and result.returncode != 0:
            raise StepFailed(
                failure(
                    step_name,
                    result.args,
                    f"exit code {result.returncode}\n  stdout: {result.stdout.strip()}"
                    f"\n  stderr: {result.stderr.strip()}",
                    self.apiserver.log if self.apiserver is not None else None,
                )
            )
        return result

    def run(
        self,
        argv: Sequence[str],
        timeout_s: float = 120.0,
        *,
        stdin: str | None = None,
        inside: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (kubectl, helm, iptables-save) with this run's ``HOME``, inside the
        sealed namespace unless ``inside`` is False; the caller checks the exit code."""
        return subprocess.run(
            self.network.argv(argv) if inside else list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "HOME": str(self.home)},
            check=False,
        )

    def create_namespace(self, namespace: str) -> None:
        """Create ``namespace`` (if absent) and wait for its default ServiceAccount, without which
        the API server refuses pods."""
        self.kubectl("create", "namespace", namespace, check=False)
        wait_until(
            lambda: (
                self.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0
            ),
            f"create the namespace {namespace}",
            "its default ServiceAccount",
        )

    def check_running(self, step_name: str) -> None:
        """Fail the step when a component of the control plane has exited."""
        for process in self.processes.started:
            process.check_running(step_name)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
