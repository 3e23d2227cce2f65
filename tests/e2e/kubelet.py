"""A real node for the end-to-end run: containerd, a kubelet and kube-proxy from the cached
upstream binaries, registered with a :class:`~tests.e2e.controlplane.ControlPlane`, all in the
run's sealed network namespace (:mod:`tests.e2e.netns`) and under one short temporary directory.

What this machine needs (Debian 12, cgroup v1, a root that may not lower ``oom_score_adj``):
the kubelet with ``failCgroupV1: false`` and the cgroupfs driver under a cgroup root of its own;
containerd with ``restrict_oom_score_adj``, CDI on (spec directory: :attr:`RealNode.cdi_dir`),
its network namespaces under its state directory, a CNI bridge of its own (``bridge`` with
``host-local`` addresses of :data:`~tests.e2e.netns.POD_CIDR`, hairpin on, no masquerading);
kube-proxy in iptables mode, so Services' ClusterIPs work for pods and for the node's processes
(the API server reaching a webhook Service); images imported from OCI archives
(:mod:`tests.e2e.images`), never pulled.

The API server reaches the kubelet (``kubectl logs``, ``exec``) by the node's InternalIP
(:data:`~tests.e2e.netns.NODE_IP`, the kubelet's ``--node-ip``), where the kubelet listens with a
serving certificate of the run's CA, and accepts the API server's client certificate.

:meth:`RealNode.stop` undoes everything, also after a failed start: the node's pods deleted, the
kubelet and containerd stopped by their PIDs, leftover containers and shims killed, every mount
under the directory unmounted, the bridge and the cgroups removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import yaml

from tests.e2e import images
from tests.e2e.controlplane import FEATURE_GATES, ControlPlane, free_port, write_kubeconfig
from tests.e2e.driverimage import TINI
from tests.e2e.netns import NODE_IP, POD_CIDR
from tests.e2e.processes import Process, StepFailed, failure, wait_until

#: The node's name (its Hostname address; the API server dials its InternalIP).
NODE_NAME: Final = "e2e-node"
#: The pod sandbox image, imported from an OCI archive (never pulled).
PAUSE_IMAGE: Final = "localhost/sharegpu-e2e/pause:1"
#: A busybox image for workloads (:meth:`RealNode.import_busybox`).
BUSYBOX_IMAGE: Final = "localhost/sharegpu-e2e/busybox:1"
#: Debian packages the node needs beside the upstream binaries, and a file each installs.
PACKAGES: Final = {
    "runc": Path("/usr/sbin/runc"),
    "containernetworking-plugins": Path("/usr/lib/cni/bridge"),
    "busybox-static": images.BUSYBOX,
    "tini": TINI,
    "iptables": Path("/usr/sbin/iptables"),
}
CNI_BIN_DIR: Final = Path("/usr/lib/cni")
CGROUP_FS: Final = Path("/sys/fs/cgroup")
#: The device-plugin registration socket: the kubelet creates it at this fixed path whatever its
#: root directory, and leaves it behind.
DEVICE_PLUGIN_SOCKET: Final = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
NODE_BINARIES: Final = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "kube-proxy")


def missing_node_prerequisites() -> list[str]:
    """What a real node needs and this machine lacks (after trying apt-get for the packages)."""
    absent = [pkg for pkg, path in PACKAGES.items() if not path.exists()]
    if absent and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *absent]
        if subprocess.run(install, env=env, capture_output=True, timeout=600).returncode:
            # Package lists missing or stale (a fresh machine): update them once and retry.
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
            subprocess.run(install, env=env, capture_output=True, timeout=600)
        absent = [pkg for pkg, path in PACKAGES.items() if not path.exists()]
    missing = [f"{PACKAGES[p]} missing (apt-get install {p})" for p in absent]
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").exists():
        missing.append(f"no cgroup hierarchy under {CGROUP_FS}")
    if shutil.which("ip") is None:
        missing.append("no ip (iproute2) on PATH")
    return missing


def _cgroup_dirs(name: str) -> list[Path]:
    """``name`` (a top-level cgroup) in every mounted hierarchy."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS / name]
    return [
        p / name
        for p in sorted(CGROUP_FS.iterdir())
        if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists()
    ]


class RealNode:
    """containerd and a kubelet registered with ``plane`` as :data:`NODE_NAME`."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        # Unix socket paths hold at most 107 bytes: a short directory under /tmp.
        self.root = Path(tempfile.mkdtemp(prefix="sg-node-", dir="/tmp"))
        suffix = self.root.name.rsplit("-", 1)[1].lower()
        self.cgroup_root = f"sg-e2e-{suffix}"
        self.bridge = f"sge2e{suffix[:8]}"
        self.subnet = POD_CIDR
        self.name = NODE_NAME
        self.containerd: Process | None = None
        self.kubelet: Process | None = None
        self.kube_proxy: Process | None = None
        #: The fixed kubelet directories that did not exist before this node's kubelet started.
        self._created = [
            p
            for p in (DEVICE_PLUGIN_SOCKET.parent.parent, DEVICE_PLUGIN_SOCKET.parent)
            if not p.exists()
        ]
        #: When the kubelet had made the device-plugin socket (its mtime then).
        self._socket_mtime: float | None = None

    # --- paths -------------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def registry_dir(self) -> Path:
        """Where the kubelet watches for plugin registration sockets."""
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """Where DRA plugins keep their sockets (``<kubelet root>/plugins``)."""
        return self.kubelet_dir / "plugins"

    @property
    def cdi_dir(self) -> Path:
        """The CDI spec directory containerd reads."""
        return self.root / "cdi"

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start containerd, import the pause image, start the kubelet and wait until the node is
        Ready; then remove the not-ready taint the kubelet registers with (this control plane
        runs no node lifecycle controller) and start kube-proxy."""
        for d in (self.cdi_dir, self.root / "cni", self.kubelet_dir):
            d.mkdir(parents=True, exist_ok=True)
        for cgroup in _cgroup_dirs(self.cgroup_root):
            cgroup.mkdir(exist_ok=True)
        self._write_cni_config()
        self._start_containerd()
        self.import_image(
            images.busybox_image(
                self.root / "pause.tar", [PAUSE_IMAGE], cmd=("sleep", "2147483647")
            ),
            "import the pause image",
        )
        self._start_kubelet()
        self._start_kube_proxy()

    def _write_cni_config(self) -> None:
        conf = {
            "cniVersion": "1.0.0",
            "name": "sharegpu-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    # The bridge is the pods' default gateway: Services' ClusterIPs are routed
                    # through the node, where kube-proxy's rules translate them.
                    "isDefaultGateway": True,
                    "ipMasq": False,
                    # A pod reaching itself through its Service (kube-proxy's hairpin).
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        conf_dir = self.root / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-sharegpu-e2e.conflist").write_text(json.dumps(conf, indent=2))

    def _containerd_config(self) -> str:
        d = self.root
        cri_runtime = 'plugins."io.containerd.cri.v1.runtime"'
        return f"""version = 3
root = "{d / "containerd" / "root"}"
state = "{d / "containerd" / "state"}"

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.socket}.ttrpc"

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[{cri_runtime}]
  enable_cdi = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

[{cri_runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri_runtime}.containerd.runtimes.runc.options]
  BinaryName = "{PACKAGES["runc"]}"
  SystemdCgroup = false

[{cri_runtime}.cni]
  bin_dirs = ["{CNI_BIN_DIR}"]
  conf_dir = "{d / "cni" / "net.d"}"
"""

    def _start_containerd(self) -> None:
        config = self.root / "containerd.toml"
        config.write_text(self._containerd_config())
        bin_dir = self.plane.bin
        self.containerd = self.plane.processes.start(
            "containerd",
            [str(bin_dir / "containerd"), f"--config={config}", "--log-level=info"],
            env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"},
        )
        wait_until(
            lambda: self.ctr("version", check=False).returncode == 0,
            "start containerd",
            f"containerd answering on {self.socket}",
            process=self.containerd,
            deadline_s=120,
        )

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd (namespace ``k8s.io``, the CRI's)."""
        argv = [str(self.plane.bin / "ctr"), f"--address={self.socket}", "-n", "k8s.io", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        if check and result.returncode != 0:
            log = self.containerd.log if self.containerd is not None else None
            raise StepFailed(
                failure("ctr", argv, f"exit code {result.returncode}: {result.stderr}", log)
            )
        return result

    def import_image(self, archive: Path, step_name: str) -> None:
        """Import an OCI archive into the CRI's image store."""
        argv = [str(self.plane.bin / "ctr"), f"--address={self.socket}", "-n", "k8s.io"]
        result = self.ctr("images", "import", "--no-unpack=false", str(archive), check=False)
        if result.returncode != 0:
            raise StepFailed(
                failure(
                    step_name,
                    [*argv, "images", "import", str(archive)],
                    result.stderr or result.stdout,
                    self.containerd.log if self.containerd else None,
                )
            )

    def import_busybox(self, names: Sequence[str], step_name: str) -> None:
        """Import the busybox image (:func:`images.busybox_image`) under ``names``."""
        archive = self.root / f"busybox-{len(list(self.root.glob('busybox-*.tar')))}.tar"
        self.import_image(images.busybox_image(archive, names), step_name)
        archive.unlink()

    def _start_kubelet(self) -> None:
        pki = self.plane.pki
        client = pki.issue("kubelet-client", user=f"system:node:{self.name}", group="system:nodes")
        serving = pki.issue("kubelet-serving", self.name, NODE_IP)
        kubeconfig = write_kubeconfig(
            self.root / "kubelet.kubeconfig", self.plane.server, pki.ca_file, cert=client
        )
        gates = dict(g.split("=") for g in FEATURE_GATES.split(","))
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "tlsCertFile": str(serving[0]),
            "tlsPrivateKeyFile": str(serving[1]),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki.ca_file)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # The run's own: a kubelet removes the log directories of pods it does not know, so
            # two runs on one machine sharing /var/log/pods lost each other's `kubectl logs`.
            "podLogsDir": str(self.root / "pod-logs"),
            "featureGates": {k: v == "true" for k, v in gates.items()},
            # A nearly full shared disk must not evict the test's pods.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
        }
        config_file = self.root / "kubelet.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.kubelet = self.plane.processes.start(
            "kubelet",
            [
                str(self.plane.bin / "kubelet"),
                f"--config={config_file}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_dir}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
                "--v=2",
            ],
        )
        wait_until(self.ready, "start the kubelet", f"node {self.name} Ready", process=self.kubelet)
        with contextlib.suppress(FileNotFoundError):
            self._socket_mtime = DEVICE_PLUGIN_SOCKET.stat().st_mtime
        self.plane.kubectl(
            "taint", "node", self.name, "node.kubernetes.io/not-ready:NoSchedule-", check=False
        )

    def _start_kube_proxy(self) -> None:
        """kube-proxy (iptables mode) with the client certificate of its bootstrap RBAC user;
        returns once it has programmed the ``kubernetes`` Service."""
        pki = self.plane.pki
        kubeconfig = write_kubeconfig(
            self.root / "kube-proxy.kubeconfig",
            self.plane.server,
            pki.ca_file,
            cert=pki.issue("kube-proxy", user="system:kube-proxy"),
        )
        self.kube_proxy = self.plane.processes.start(
            "kube-proxy",
            [
                str(self.plane.bin / "kube-proxy"),
                f"--kubeconfig={kubeconfig}",
                "--proxy-mode=iptables",
                f"--hostname-override={self.name}",
                f"--cluster-cidr={self.subnet}",
                f"--healthz-bind-address=127.0.0.1:{free_port()}",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                # Leave the namespace's conntrack settings as they are (no sysctl writes).
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                f"--feature-gates={FEATURE_GATES}",
                "--v=2",
            ],
        )

        def programmed() -> bool:
            rules = self.plane.run(["iptables-save", "-t", "nat"]).stdout
            return "default/kubernetes:https" in rules

        wait_until(
            programmed,
            "start kube-proxy",
            "the kubernetes Service in the nat table",
            process=self.kube_proxy,
        )

    def ready(self) -> bool:
        """Whether the API server has the node with condition Ready True."""
        code, node = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
        if code != 200:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        """Undo :meth:`start` (each part also when an earlier one failed)."""
        for action in (
            self._delete_pods,
            self._stop_kubelet,
            self._stop_kube_proxy,
            self._remove_containers,
            self._stop_containerd,
            self._kill_shims,
            self._unmount_all,
            self._remove_bridge,
            self._remove_cgroups,
            self._remove_device_plugin_socket,
        ):
            with contextlib.suppress(Exception):
                action()
        shutil.rmtree(self.root, ignore_errors=True)

    def _delete_pods(self) -> None:
        if self.kubelet is None or not self.kubelet.running():
            return
        self.plane.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={self.name}",
            "--wait=true",
            "--timeout=90s",
            check=False,
        )

    def _stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.plane.processes.stop(self.kubelet)

    def _stop_kube_proxy(self) -> None:
        if self.kube_proxy is not None:
            self.plane.processes.stop(self.kube_proxy)

    def _remove_containers(self) -> None:
        if self.containerd is None or not self.containerd.running():
            return
        ids = self.ctr("containers", "list", "--quiet", check=False).stdout.split()
        for cid in ids:
            self.ctr("tasks", "kill", "--signal=SIGKILL", cid, check=False)
        deadline = time.monotonic() + 30
        for cid in ids:
            while (
                self.ctr("tasks", "delete", "--force", cid, check=False).returncode != 0
                and "not found" not in self.ctr("tasks", "ps", cid, check=False).stderr
                and time.monotonic() < deadline
            ):
                time.sleep(0.5)
            self.ctr("containers", "delete", cid, check=False)

    def _stop_containerd(self) -> None:
        if self.containerd is not None:
            self.plane.processes.stop(self.containerd)

    def _kill_shims(self) -> None:
        """Kill the shims of this node's containerd (found by its socket on their command line)."""
        for pid in _pids_with_argument(str(self.socket)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _unmount_all(self) -> None:
        """Unmount every mount point under the node's directory, deepest first."""
        for _round in range(3):
            points = _mount_points_under(self.root)
            if not points:
                return
            for point in sorted(points, key=lambda p: len(p.parts), reverse=True):
                subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)

    def _remove_device_plugin_socket(self) -> None:
        """Remove the device-plugin socket if it is still the one this node's kubelet made (no
        kubelet of another run replaced it since), and the fixed directories it created."""
        with contextlib.suppress(FileNotFoundError):
            if DEVICE_PLUGIN_SOCKET.stat().st_mtime == self._socket_mtime:
                DEVICE_PLUGIN_SOCKET.unlink()
        for directory in reversed(self._created):
            with contextlib.suppress(OSError):
                directory.rmdir()

    def _remove_bridge(self) -> None:
        self.plane.run(["ip", "link", "delete", self.bridge])

    def _remove_cgroups(self) -> None:
        for top in _cgroup_dirs(self.cgroup_root):
            if not top.exists():
                continue
            for directory, _subdirs, _files in sorted(
                os.walk(top), key=lambda w: len(Path(w[0]).parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    Path(directory).rmdir()


def _pids_with_argument(argument: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in args:
            pids.append(int(proc.name))
    return pids


def _mount_points_under(root: Path) -> list[Path]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].encode().decode("unicode_escape"))
        if point == root or root in point.parents:
            points.append(point)
    return points


def node_pods(plane: ControlPlane, node: str, namespace: str) -> Sequence[dict[str, object]]:
    """The pods of ``namespace`` on ``node``."""
    out = plane.kubectl(
        "get", "pods", "-n", namespace, f"--field-selector=spec.nodeName={node}", "-o", "json"
    ).stdout
    return list(json.loads(out)["items"])


def wait_for_kubelet_plugin(
    plane: ControlPlane, node: RealNode, driver: str, step_name: str, process: Process
) -> None:
    """Wait until the kubelet plugin of ``driver`` (run as ``process``) has published a
    ResourceSlice and put its registration socket in the kubelet's registry."""

    def published() -> bool:
        code, body = plane.request(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver={driver}"
        )
        return code == 200 and bool(body.get("items"))

    def registered() -> bool:
        return any(node.registry_dir.glob(f"{driver}*-reg.sock"))

    wait_until(published, step_name, f"a ResourceSlice of {driver}", process=process)
    wait_until(registered, step_name, "its registration socket", process=process)
