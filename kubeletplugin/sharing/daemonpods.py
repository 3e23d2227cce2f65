"""MPS control daemons as pods: one pod per claim and GPU, created by the plugin through the API,
so a daemon survives plugin restarts, OOM kills and rollouts (kubelet restarts it; its state is
read from the pod's status, never from a pid).

:func:`daemon_pod` completes the chart's Pod manifest with what depends on the node and GPU: a
name that is a function of node, claim and GPU alone and embeds the node's name
(:func:`pod_name`, the scheme the chart's ``-mps-pods`` ValidatingAdmissionPolicy requires of
every pod a node's plugin creates, so no node can squat another node's daemon name), labels
(:data:`LABEL_DAEMON`, :data:`LABEL_GPU`, :data:`LABEL_NODE`, hashed), a required node affinity
on this node, the daemon's host directories and environment, and a ``postStart`` hook that sets
the share's limits as defaults after every (re)start, before the pod is ready. Invariant: a pod
of that name is this node's daemon only when its labels, node annotation and affinity are those
:func:`daemon_pod` writes (:func:`foreign_reason`); any other is never adopted, read as running
or deleted."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import yaml

from kubeletplugin.sharing.daemons import DaemonError, DaemonPhase, DaemonSpec
from kubeletplugin.sharing.mps import DEFAULTS_ENV
from kubeletplugin.sharing.mpspaths import MpsPaths, short_id
from sharegpu.kube.rest import KubeApiError, KubeRest

log = logging.getLogger(__name__)

#: The container of the template that runs ``nvidia-cuda-mps-control -f``.
DAEMON_CONTAINER: Final = "mps-control-daemon"
LABEL_DAEMON: Final = "mps.sharegpu.dev/daemon"
LABEL_GPU: Final = "mps.sharegpu.dev/gpu"
LABEL_NODE: Final = "mps.sharegpu.dev/node"
ANNOTATION_UUID: Final = "mps.sharegpu.dev/gpu-uuid"
ANNOTATION_CLAIM: Final = "mps.sharegpu.dev/claim-uid"
ANNOTATION_NODE: Final = "mps.sharegpu.dev/node-name"
#: A pod name is a DNS subdomain: at most 253 characters.
MAX_POD_NAME: Final = 253
#: The longest template name (the chart truncates its own to this): it leaves room for a node
#: name of ``MAX_POD_NAME - MAX_TEMPLATE_NAME - 2 - DAEMON_ID_LENGTH`` (198) characters.
MAX_TEMPLATE_NAME: Final = 41
#: The daemon container's postStart hook: once the daemon answers (at most 30 s), run the
#: ``set_default_*`` commands of its environment.
SET_DEFAULTS_SCRIPT: Final = (
    f'for i in $(seq 150); do printf "%s" "${DEFAULTS_ENV}" | nvidia-cuda-mps-control '
    "&& exit 0; sleep 0.2; done; exit 1"
)
#: Seconds :meth:`PodLauncher.remove` waits for a deleted pod to be gone.
REMOVE_TIMEOUT_S: Final = 60.0
DELETE_GRACE_S: Final = 10


class PodApi(Protocol):
    """The four pod calls a :class:`PodLauncher` makes (a fake stands in for it in tests)."""

    def create(self, namespace: str, pod: Mapping[str, Any]) -> None: ...

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when there is none."""
        ...

    def delete(self, namespace: str, name: str, grace_seconds: int) -> None:
        """Delete the pod; deleting a pod that is gone succeeds."""
        ...

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...


class KubePodApi:
    """:class:`PodApi` over the API server."""

    def __init__(self, rest: KubeRest) -> None:
        self.rest = rest

    def create(self, namespace: str, pod: Mapping[str, Any]) -> None:
        try:
            self.rest.request("POST", _pods(namespace), body=dict(pod), expected=(409,))
        except KubeApiError as exc:
            if exc.status != 409:  # created meanwhile: launch is idempotent
                raise

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.rest.get(f"{_pods(namespace)}/{name}", expected=(404,))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, namespace: str, name: str, grace_seconds: int) -> None:
        try:
            self.rest.request(
                "DELETE",
                f"{_pods(namespace)}/{name}",
                body={"gracePeriodSeconds": grace_seconds},
                expected=(404,),
            )
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        items, _ = self.rest.list_all(_pods(namespace), [("labelSelector", label_selector)])
        return items


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


class TemplateError(ValueError):
    """A daemon pod template that cannot be used; the message names the file and the problem."""


def load_pod_template(path: Path) -> dict[str, Any]:
    """The Pod manifest in ``path``, checked for what :func:`daemon_pod` relies on."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"MPS daemon pod template {path}: cannot read it: {exc}") from None
    problem = template_problem(doc)
    if problem:
        raise TemplateError(f"MPS daemon pod template {path}: {problem}")
    assert isinstance(doc, dict)
    return doc


def template_problem(doc: Any) -> str:
    """Why ``doc`` is no usable daemon pod template; empty when it is."""
    if not isinstance(doc, dict) or doc.get("kind") != "Pod" or doc.get("apiVersion") != "v1":
        return "not a v1 Pod manifest"
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_TEMPLATE_NAME:
        return f"metadata.name must be a name of 1 to {MAX_TEMPLATE_NAME} characters"
    containers = (doc.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not any(
        isinstance(c, dict) and c.get("name") == DAEMON_CONTAINER for c in containers
    ):
        return f"spec.containers has no container named {DAEMON_CONTAINER!r}"
    return ""


def pod_name(template: Mapping[str, Any], spec: DaemonSpec, node_name: str) -> str:
    """``<template name>-<node name>-<daemon id>``: stable, and no other node's daemon has it.
    The chart's policy checks exactly this shape against the node name of the creator's token
    (prefix, node, ``-`` and :data:`DAEMON_ID_LENGTH` hex digits, and nothing else), so the
    name of one node's daemon cannot be created by another node's plugin."""
    return f"{template['metadata']['name']}-{node_name}-{spec.id}"


def _pinned_nodes(pod: Mapping[str, Any]) -> list[Any]:
    terms = (
        (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    if len(terms) != 1 or not isinstance(terms[0], Mapping):
        return []
    fields = terms[0].get("matchFields") or []
    if terms[0].get("matchExpressions") or len(fields) != 1 or not isinstance(fields[0], Mapping):
        return []
    field = fields[0]
    if field.get("key") != "metadata.name" or field.get("operator") != "In":
        return []
    values = field.get("values")
    return list(values) if isinstance(values, list) else []


def foreign_reason(pod: Mapping[str, Any], spec: DaemonSpec, node_name: str) -> str:
    """Why ``pod`` (found under the daemon's name) is not this node's daemon ``spec``; empty
    when its labels, node annotation, node affinity and node name are :func:`daemon_pod`'s."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    wanted = {LABEL_DAEMON: spec.id, LABEL_NODE: short_id(node_name)}
    if spec.uuid:
        wanted[LABEL_GPU] = short_id(spec.uuid)
    for key, value in wanted.items():
        if labels.get(key) != value:
            return f"its label {key} is {labels.get(key)!r}, not {value!r}"
    if annotations.get(ANNOTATION_NODE) != node_name:
        return f"its annotation {ANNOTATION_NODE} is {annotations.get(ANNOTATION_NODE)!r}"
    if _pinned_nodes(pod) != [node_name]:
        return "its node affinity does not pin it to this node"
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound not in (None, "", node_name):
        return f"it runs on node {bound!r}"
    return ""


def daemon_pod(
    template: Mapping[str, Any], spec: DaemonSpec, *, namespace: str, node_name: str
) -> dict[str, Any]:
    """The pod running claim ``spec.claim_uid``'s daemon of GPU ``spec.uuid`` on ``node_name``
    (see the module docstring); ``template`` is not modified."""
    pod: dict[str, Any] = copy.deepcopy(dict(template))
    meta = pod.setdefault("metadata", {})
    meta["name"] = pod_name(template, spec, node_name)
    meta["namespace"] = namespace
    meta.setdefault("labels", {}).update(
        {LABEL_DAEMON: spec.id, LABEL_GPU: short_id(spec.uuid), LABEL_NODE: short_id(node_name)}
    )
    meta.setdefault("annotations", {}).update(
        {ANNOTATION_UUID: spec.uuid, ANNOTATION_CLAIM: spec.claim_uid, ANNOTATION_NODE: node_name}
    )
    body = pod.setdefault("spec", {})
    body.pop("nodeName", None)
    body.setdefault("affinity", {})["nodeAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
            ]
        }
    }
    paths = spec.paths
    volumes = [("mps-pipe", paths.pipe, str(paths.pipe)), ("mps-shm", paths.shm, "/dev/shm")]
    volumes.append(("mps-log", paths.log, str(paths.log)))
    body.setdefault("volumes", []).extend(
        {"name": name, "hostPath": {"path": str(host), "type": "Directory"}}
        for name, host, _ in volumes
    )
    for container in body["containers"]:
        if container.get("name") != DAEMON_CONTAINER:
            continue
        container.setdefault("env", []).extend(
            {"name": k, "value": v} for k, v in sorted(spec.env.items())
        )
        container.setdefault("volumeMounts", []).extend(
            {"name": name, "mountPath": path} for name, _, path in volumes
        )
        container.setdefault("lifecycle", {})["postStart"] = {
            "exec": {"command": ["sh", "-c", SET_DEFAULTS_SCRIPT]}
        }
    return pod


def pod_phase(pod: Mapping[str, Any] | None) -> DaemonPhase:
    """The daemon's phase from its pod: gone, being deleted, failed or with its daemon container
    exited or waiting after a crash is not running; running and ready is."""
    if pod is None:
        return DaemonPhase.ABSENT
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return DaemonPhase.FAILED
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return DaemonPhase.FAILED
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != DAEMON_CONTAINER:
            continue
        state = cs.get("state") or {}
        if "terminated" in state or ("waiting" in state and int(cs.get("restartCount", 0)) > 0):
            return DaemonPhase.FAILED
        if "running" in state and cs.get("ready") is True:
            return DaemonPhase.RUNNING
    return DaemonPhase.STARTING


class PodLauncher:
    """Runs each claim's daemon of a GPU as a pod in ``namespace`` on ``node_name`` (see the
    module doc)."""

    def __init__(
        self,
        api: PodApi,
        template: Mapping[str, Any],
        *,
        namespace: str,
        node_name: str,
        remove_timeout: float = REMOVE_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        problem = template_problem(template)
        if problem:
            raise TemplateError(f"MPS daemon pod template: {problem}")
        self.api = api
        self.template = template
        self.namespace = namespace
        self.node_name = node_name
        self.remove_timeout = remove_timeout
        self._sleep = sleep

    def _name(self, spec: DaemonSpec) -> str:
        return pod_name(self.template, spec, self.node_name)

    def _get(self, spec: DaemonSpec) -> dict[str, Any] | None:
        """This node's pod of daemon ``spec``, None when there is none; DaemonError when the
        pod of that name is not this node's (:func:`foreign_reason`)."""
        try:
            pod = self.api.get(self.namespace, self._name(spec))
        except KubeApiError as exc:
            raise DaemonError(f"cannot read {self.describe(spec)}: {exc}") from None
        if pod is not None and (reason := foreign_reason(pod, spec, self.node_name)):
            raise DaemonError(
                f"{self.describe(spec)} is not this node's MPS daemon ({reason}): it is never "
                "adopted or deleted; remove it to let this node start its daemon"
            )
        return pod

    def launch(self, spec: DaemonSpec) -> None:
        if len(self._name(spec)) > MAX_POD_NAME:
            raise DaemonError(
                f"the MPS daemon pod name {self._name(spec)!r} is longer than {MAX_POD_NAME} "
                f"characters: node name {self.node_name!r} is too long for it (shorten the "
                "chart's fullnameOverride, or run MPS without daemon pods)"
            )
        if self._get(spec) is not None:
            return
        pod = daemon_pod(self.template, spec, namespace=self.namespace, node_name=self.node_name)
        try:
            self.api.create(self.namespace, pod)
        except KubeApiError as exc:
            raise DaemonError(f"cannot create {self.describe(spec)}: {exc}") from None
        log.info(
            "created %s for the MPS daemon of claim %s on GPU %s",
            self.describe(spec),
            spec.claim_uid,
            spec.uuid,
        )

    def phase(self, spec: DaemonSpec) -> DaemonPhase:
        return pod_phase(self._get(spec))

    def remove(self, spec: DaemonSpec) -> None:
        name = self._name(spec)
        if self._get(spec) is None:
            return
        try:
            self.api.delete(self.namespace, name, DELETE_GRACE_S)
        except KubeApiError as exc:
            raise DaemonError(f"cannot delete {self.describe(spec)}: {exc}") from None
        deadline = time.monotonic() + self.remove_timeout
        delay = 0.1
        while self._get(spec) is not None:
            if time.monotonic() + delay > deadline:
                raise DaemonError(
                    f"{self.describe(spec)} is still there {self.remove_timeout:g}s after its "
                    "deletion"
                )
            self._sleep(delay)
            delay = min(delay * 2, 2.0)

    def present(self) -> list[str]:
        selector = f"{LABEL_NODE}={short_id(self.node_name)}"
        try:
            pods = self.api.list(self.namespace, selector)
        except KubeApiError as exc:
            raise DaemonError(f"cannot list the MPS daemon pods of this node: {exc}") from None
        ids = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            daemon = str((meta.get("labels") or {}).get(LABEL_DAEMON, ""))
            spec = DaemonSpec(MpsPaths(Path("/"), daemon))
            if daemon and meta.get("name") == self._name(spec):
                if reason := foreign_reason(pod, spec, self.node_name):
                    log.warning("ignoring pod %s/%s: %s", self.namespace, meta.get("name"), reason)
                    continue
                ids.add(daemon)
        return sorted(ids)

    def describe(self, spec: DaemonSpec) -> str:
        return f"pod {self.namespace}/{self._name(spec)}"


def pod_launcher_from_file(
    rest: KubeRest, template: Path, *, namespace: str, node_name: str
) -> PodLauncher:
    """The launcher of a plugin started with ``--mps-daemon-pod-template``; raises
    :class:`TemplateError` naming the file when it cannot be used."""
    return PodLauncher(
        KubePodApi(rest), load_pod_template(template), namespace=namespace, node_name=node_name
    )
