"""What keeps ``sharegpu demo --keep-running`` reacting to kubectl: the controllers a cluster
runs around the driver, each reduced to what the driver needs, in one level-triggered loop.

- the resourceclaim controller (kube-controller-manager): a pod's ``resourceClaims`` naming a
  template get a claim each, created through the API server (so admission judges it), named
  ``<pod>-<podClaim>-<random>`` and owned by the pod, with the
  ``resource.kubernetes.io/pod-claim-name`` annotation, recorded in
  ``pod.status.resourceClaimStatuses``; reservations of pods that no longer exist are dropped,
  and a claim allocated for pods that none holds any more is deallocated;
- the scheduler's DRA step: a pod without a node has its claims allocated together by
  :mod:`sharegpu.allocator` (the claims already allocated held), reserved for it
  (``status.reservedFor``) and is bound to the node (``Scheduled``); where they do not fit,
  ``FailedScheduling`` carries the reason per GPU that ``sharegpu explain`` gives;
- kubelet: a bound pod's claims are prepared through the plugin's real socket; the pod is then
  Running and ``kubectl logs`` prints the CDI devices and environment each container got. A claim
  that no pod and no startup step holds, or that was deleted, is unprepared.

Invariants: every write goes through the API server; events are written only when what they
say changes (a pod that cannot be scheduled gets one event per distinct reason); the loop runs
after any change of pods, claims, templates, slices or classes, and never raises (a refused
write or a failed gRPC call is logged in one line and the pass retried after :data:`RETRY_S`).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from api import names
from api.jsontypes import Obj
from kubeletplugin.prepare.cdi import spec_file_name
from sharegpu.allocator import Allocator, AllocatorInputError, ShareIdFactory
from sharegpu.kube.rest import KubeApiError, KubeRest
from sharegpuctl.cli.explain import describe
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.store import now_rfc3339
from sharegpuctl.local.kubelet import ClaimRef, RegisteredPlugin

log = logging.getLogger("sharegpu.demo")

RESOURCE_API: Final = f"/apis/{names.RESOURCE_GROUP_VERSION}"
#: The annotation kube-controller-manager puts on a claim it generates for a pod.
POD_CLAIM_NAME: Final = "resource.kubernetes.io/pod-claim-name"
#: Longest ``generateName`` of a generated claim (room for five random characters in 63).
MAX_GENERATE_BASE: Final = 57
#: How often the loop looks for changes when nothing woke it.
POLL_S: Final = 0.2
#: How long the loop waits before it retries a pass that failed.
RETRY_S: Final = 2.0
#: The resources whose changes make the loop run.
WATCHED: Final = (
    "pods",
    "resourceclaims",
    "resourceclaimtemplates",
    "resourceslices",
    "deviceclasses",
)
COMPONENT: Final = "sharegpu-demo"


def generate_name(pod: str, pod_claim: str) -> str:
    """The ``generateName`` of the claim generated for ``pod_claim`` of ``pod``, as the
    resourceclaim controller makes it (both parts cut to 28 characters when too long)."""
    base = f"{pod}-{pod_claim}-"
    if len(base) > MAX_GENERATE_BASE:
        base = f"{pod[:28]}-{pod_claim[:28]}"
    return base


def claim_for_pod(pod: Obj, pod_claim: str, template: Obj) -> Obj:
    """The ResourceClaim generated from ``template`` for ``pod_claim`` of ``pod``."""
    md = pod["metadata"]
    tmd = (template.get("spec") or {}).get("metadata") or {}
    return {
        "apiVersion": names.RESOURCE_GROUP_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": generate_name(md["name"], pod_claim),
            "namespace": md["namespace"],
            "labels": dict(tmd.get("labels") or {}),
            "annotations": {**(tmd.get("annotations") or {}), POD_CLAIM_NAME: pod_claim},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": md["name"],
                    "uid": md["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": (template.get("spec") or {}).get("spec") or {},
    }


def pod_claim_refs(pod: Mapping[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """``(pod claim name, resourceClaimName, resourceClaimTemplateName)`` per pod claim."""
    out = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
            out.append(
                (ref["name"], ref.get("resourceClaimName"), ref.get("resourceClaimTemplateName"))
            )
    return out


def cdi_env(cdi_dir: Path, driver: str, uid: str) -> dict[str, list[str]]:
    """CDI device ID -> the environment the container gets with it (the spec's common edits,
    then the device's), from the claim's CDI spec file."""
    path = cdi_dir / spec_file_name(driver, uid)
    spec = json.loads(path.read_text(encoding="utf-8"))
    common = [str(e) for e in (spec.get("containerEdits") or {}).get("env") or []]
    out: dict[str, list[str]] = {}
    for device in spec.get("devices") or []:
        env = [str(e) for e in (device.get("containerEdits") or {}).get("env") or []]
        out[f"{spec.get('kind', '')}={device['name']}"] = common + env
    return out


@dataclass
class PreparedClaim:
    """A claim the plugin prepared: its reference and, per request, the devices it got."""

    ref: ClaimRef
    #: (request names, device, share ID, CDI device IDs, environment)
    devices: list[tuple[tuple[str, ...], str, str | None, tuple[str, ...], list[str]]] = field(
        default_factory=list
    )


def _failed_reason(claim: Obj, outcome: Any, slices: Sequence[Obj]) -> str:
    """Why an allocation failed: the allocator's error (which names the claim), or the claim,
    its requests' summaries and the first per-GPU reason as explain words it."""
    if outcome.error:
        return str(outcome.error)
    reasons = [describe(r, slices) for rep in outcome.reports for r in rep.rejections]
    who = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
    return f"claim {who}: " + "; ".join([rep.summary for rep in outcome.reports] + reasons[:1])


#: Container resources every node has; any other (``nvidia.com/gpu``) is an extended resource.
NODE_RESOURCES: Final = ("cpu", "memory", "ephemeral-storage")


def extended_resources(pod: Mapping[str, Any]) -> list[str]:
    """The extended resources (``nvidia.com/gpu``) the pod's containers ask for, sorted."""
    found: set[str] = set()
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):
            for name in resources.get(part) or {}:
                if name not in NODE_RESOURCES and not str(name).startswith("hugepages-"):
                    found.add(str(name))
    return sorted(found)


class DemoCluster:
    """The loop; :meth:`start` and :meth:`stop` (which unprepares nothing: see
    :meth:`unprepare_all`)."""

    def __init__(
        self,
        server: KubeAPIServer,
        rest: KubeRest,
        kubelet: RegisteredPlugin,
        cdi_dir: Path,
        node: str,
        driver: str,
        share_ids: ShareIdFactory,
        prepared: Iterable[PreparedClaim] = (),
    ) -> None:
        self.server = server
        self.rest = rest
        self.kubelet = kubelet
        self.cdi_dir = cdi_dir
        self.node = node
        self.driver = driver
        self.share_ids = share_ids
        #: claim uid -> the prepared claim (the startup step's claims included).
        self.prepared: dict[str, PreparedClaim] = {p.ref.uid: p for p in prepared}
        #: How many claims were unprepared (by the loop and by :meth:`unprepare_all`).
        self.unprepared = 0
        #: uids of claims this loop allocated for pods (deallocated when no pod holds them).
        self.allocated_for_pods: set[str] = set()
        #: (namespace, pod) -> container -> the text ``kubectl logs`` prints.
        self.logs: dict[tuple[str, str], dict[str, str]] = {}
        #: Pods that ran: pod, claim, device and share ID, in the order they started.
        self.shares: list[Obj] = []
        #: (pod uid, reason) -> the message last written in an event.
        self._said: dict[tuple[str, str], str] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: object = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.server.pod_logs = self.pod_logs
        self._thread = threading.Thread(target=self._run, name="sharegpu-demo-cluster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _fingerprint(self) -> object:
        store = self.server.store
        return tuple(
            tuple((o["metadata"]["uid"], o["metadata"]["resourceVersion"]) for o in items)
            for items in (store.list_refs(plural)[0] for plural in WATCHED)
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            seen = self._fingerprint()
            if seen != self._seen:
                try:
                    self.sync()
                    self._seen = seen
                except (KubeApiError, grpc.RpcError) as exc:  # e.g. a conflict: retried
                    log.warning("demo cluster: a step failed, retrying: %s", exc)
                    self._stop.wait(RETRY_S)
                except Exception:  # a defect: logged, the next change retries
                    log.exception("demo cluster: a sync failed")
                    self._seen = seen
            self._stop.wait(POLL_S)

    def pod_logs(self, namespace: str, name: str, container: str | None) -> str:
        """What ``kubectl logs`` prints: the devices and environment a container got."""
        by_container = self.logs.get((namespace, name))
        if not by_container:
            return (
                f"# pod {namespace}/{name} is not running yet: its containers got no devices "
                "(kubectl describe pod shows its events)\n"
            )
        if container is None:
            container = next(iter(by_container))
        return by_container.get(container, f"# container {container!r} is not in this pod\n")

    # ------------------------------------------------------------------ one pass

    def sync(self) -> None:
        """One pass of every controller over what the API server holds now."""
        store = self.server.store
        pods = store.list("pods")
        templates = {
            (t["metadata"]["namespace"], t["metadata"]["name"]): t
            for t in store.list("resourceclaimtemplates")
        }
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp"):
                self._generate_claims(pod, templates)
        pods = store.list("pods")
        claims = store.list("resourceclaims")
        self._release(pods, claims)
        claims = store.list("resourceclaims")
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get(
                "phase"
            ) in ("Running", "Succeeded", "Failed"):
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            if not node:
                self._schedule(pod, claims)
                claims = store.list("resourceclaims")
            elif node == self.node:
                self._run_pod(pod, claims)

    # ------------------------------------------------------------------ resourceclaim controller

    def _generate_claims(self, pod: Obj, templates: Mapping[tuple[str, str], Obj]) -> None:
        md = pod["metadata"]
        ns = md["namespace"]
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        known = {s.get("name") for s in statuses}
        changed = False
        for pod_claim, _name, template_name in pod_claim_refs(pod):
            if template_name is None or pod_claim in known:
                continue
            existing = self._owned_claim(md["uid"], pod_claim, ns)
            if existing is None:
                template = templates.get((ns, template_name))
                if template is None:
                    self._event(
                        pod,
                        "Warning",
                        "FailedResourceClaimCreation",
                        f"PodResourceClaim {pod_claim}: resourceclaimtemplate.resource.k8s.io "
                        f'"{template_name}" not found',
                    )
                    continue
                try:
                    existing = self.rest.request(
                        "POST",
                        f"{RESOURCE_API}/namespaces/{ns}/resourceclaims",
                        body=claim_for_pod(pod, pod_claim, template),
                    )
                except KubeApiError as exc:
                    self._event(
                        pod,
                        "Warning",
                        "FailedResourceClaimCreation",
                        f"PodResourceClaim {pod_claim}: create ResourceClaim: {exc}",
                    )
                    continue
            statuses.append({"name": pod_claim, "resourceClaimName": existing["metadata"]["name"]})
            changed = True
        if changed:
            self._pod_status(pod, {"resourceClaimStatuses": statuses})

    def _owned_claim(self, pod_uid: str, pod_claim: str, namespace: str) -> Obj | None:
        for claim in self.server.store.list("resourceclaims", namespace):
            md = claim["metadata"]
            owners = md.get("ownerReferences") or []
            if any(o.get("uid") == pod_uid for o in owners) and (
                (md.get("annotations") or {}).get(POD_CLAIM_NAME) == pod_claim
            ):
                return claim
        return None

    def _release(self, pods: Sequence[Obj], claims: Sequence[Obj]) -> None:
        """Drop reservations of pods that are gone; deallocate and unprepare claims no pod
        holds any more; unprepare claims that were deleted."""
        live = {p["metadata"]["uid"] for p in pods}
        named = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}
        self.logs = {k: v for k, v in self.logs.items() if k in named}
        self._said = {k: v for k, v in self._said.items() if k[0] in live}
        present = {c["metadata"]["uid"] for c in claims}
        for uid in [u for u in self.prepared if u not in present]:
            ref = self.prepared[uid].ref
            self._unprepare(uid)
            for pod in pods:
                if self._names_claim(pod, ref):
                    now = now_rfc3339()
                    message = f"ResourceClaim {ref.name} was deleted: its devices were unprepared"
                    terminated = {
                        "exitCode": 137,
                        "reason": "ResourceClaimDeleted",
                        "message": message,
                        "finishedAt": now,
                    }
                    statuses = [
                        {**c, "ready": False, "started": False, "state": {"terminated": terminated}}
                        for c in (pod.get("status") or {}).get("containerStatuses") or []
                    ]
                    self._pod_status(
                        pod,
                        {
                            "phase": "Failed",
                            "reason": "ResourceClaimDeleted",
                            "containerStatuses": statuses,
                        },
                        message=message,
                    )
                    self._event(pod, "Warning", "ResourceClaimDeleted", message)
        for claim in claims:
            md, status = claim["metadata"], dict(claim.get("status") or {})
            reserved = status.get("reservedFor") or []
            kept = [r for r in reserved if r.get("uid") in live]
            if len(kept) == len(reserved):
                continue
            status["reservedFor"] = kept
            if not kept and md["uid"] in self.allocated_for_pods:
                self._unprepare(md["uid"])
                status.pop("allocation", None)
                self.allocated_for_pods.discard(md["uid"])
            if not kept:
                status.pop("reservedFor")
            self._claim_status(claim, status)

    @staticmethod
    def _names_claim(pod: Obj, ref: ClaimRef) -> bool:
        """Whether ``pod`` runs on this node with the claim ``ref`` (by name, generated or not)."""
        if pod["metadata"]["namespace"] != ref.namespace or not (pod.get("spec") or {}).get(
            "nodeName"
        ):
            return False
        generated = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        return any(
            (name or generated.get(pod_claim)) == ref.name
            for pod_claim, name, _template in pod_claim_refs(pod)
        )

    # ------------------------------------------------------------------ scheduler

    def _pod_claims(self, pod: Obj, claims: Sequence[Obj]) -> tuple[list[Obj], str | None]:
        """The pod's claims, or why they cannot all be found yet."""
        ns = pod["metadata"]["namespace"]
        by_name = {c["metadata"]["name"]: c for c in claims if c["metadata"]["namespace"] == ns}
        generated = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        found = []
        for pod_claim, name, template in pod_claim_refs(pod):
            claim_name = name or generated.get(pod_claim)
            if claim_name is None:
                return [], f"waiting for the claim of resourceClaimTemplate {template!r} to be made"
            claim = by_name.get(claim_name)
            if claim is None:
                return [], f'resourceclaim "{claim_name}" not found'
            found.append(claim)
        return found, None

    def _schedule(self, pod: Obj, claims: Sequence[Obj]) -> None:
        extended = extended_resources(pod)
        if extended:
            self._event(
                pod,
                "Warning",
                "FailedScheduling",
                f"0/1 nodes are available: 1 Insufficient {', '.join(extended)}. The demo's node "
                "has no extended resources (a cluster serves them with the chart's "
                "extended-resource DeviceClass: `make local-cluster`).",
            )
            return
        mine, problem = self._pod_claims(pod, claims)
        if problem is not None:
            self._event(pod, "Warning", "FailedScheduling", f"0/1 nodes are available: {problem}.")
            return
        pending = [c for c in mine if not (c.get("status") or {}).get("allocation")]
        allocations: dict[str, Obj] = {}
        if pending:
            store = self.server.store
            held = [c for c in claims if (c.get("status") or {}).get("allocation")]
            slices = [
                s for s in store.list("resourceslices") if s["spec"].get("nodeName") == self.node
            ]
            try:
                allocator = Allocator(
                    slices, store.list("deviceclasses"), held, self.node, share_ids=self.share_ids
                )
                outcomes = allocator.allocate_pod(pending)
            except AllocatorInputError as exc:
                self._event(pod, "Warning", "FailedScheduling", f"0/1 nodes are available: {exc}.")
                return
            failed = [
                (c, o) for c, o in zip(pending, outcomes, strict=True) if o.allocation is None
            ]
            if failed:
                claim, outcome = failed[0]
                reason = _failed_reason(claim, outcome, slices)
                self._event(
                    pod,
                    "Warning",
                    "FailedScheduling",
                    f"0/1 nodes are available: 1 cannot allocate all claims ({reason}). Run "
                    "`sharegpu explain` for every GPU's reason.",
                )
                return
            allocations = {
                c["metadata"]["uid"]: o.allocation
                for c, o in zip(pending, outcomes, strict=True)
                if o.allocation is not None
            }
        md = pod["metadata"]
        entry = {"resource": "pods", "name": md["name"], "uid": md["uid"]}
        for claim in mine:
            status = dict(claim.get("status") or {})
            uid = claim["metadata"]["uid"]
            if uid in allocations:
                status["allocation"] = allocations[uid]
                self.allocated_for_pods.add(uid)
            reserved = list(status.get("reservedFor") or [])
            if all(r.get("uid") != md["uid"] for r in reserved):
                status["reservedFor"] = [*reserved, entry]
            self._claim_status(claim, status)
        bound = {**pod, "spec": {**pod["spec"], "nodeName": self.node}}
        self.rest.request(
            "PUT", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}", body=bound
        )
        self._event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {md['namespace']}/{md['name']} to {self.node}",
        )

    # ------------------------------------------------------------------ kubelet

    def _run_pod(self, pod: Obj, claims: Sequence[Obj]) -> None:
        mine, problem = self._pod_claims(pod, claims)
        if problem is not None:
            return
        md = pod["metadata"]
        for claim in mine:
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if all(r.get("uid") != md["uid"] for r in reserved):
                return  # the scheduler step has not reserved it yet
        todo = [c for c in mine if c["metadata"]["uid"] not in self.prepared]
        if todo:
            refs = [
                ClaimRef(
                    namespace=c["metadata"]["namespace"],
                    uid=c["metadata"]["uid"],
                    name=c["metadata"]["name"],
                )
                for c in todo
            ]
            results = self.kubelet.prepare(refs)
            for ref in refs:
                result = results.get(ref.uid)
                if result is None or result.error:
                    error = result.error if result is not None else "no answer for the claim"
                    self._event(
                        pod,
                        "Warning",
                        "FailedPrepareDynamicResources",
                        f"prepare dynamic resources: claim {ref.namespace}/{ref.name}: {error}",
                    )
                    return
                env = cdi_env(self.cdi_dir, self.driver, ref.uid)
                self.prepared[ref.uid] = PreparedClaim(
                    ref,
                    [
                        (
                            d.request_names,
                            d.device_name,
                            d.share_id,
                            d.cdi_device_ids,
                            [e for i in d.cdi_device_ids for e in env.get(i, [])],
                        )
                        for d in result.devices
                    ],
                )
        self.logs[(md["namespace"], md["name"])] = self._container_logs(pod, mine)
        now = now_rfc3339()
        containers = (pod.get("spec") or {}).get("containers") or []
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
        ]
        self._pod_status(
            pod,
            {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": now,
                "conditions": [
                    *conditions,
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                ],
                "containerStatuses": [
                    {
                        "name": c.get("name", ""),
                        "image": c.get("image", ""),
                        "imageID": "",
                        "containerID": f"sharegpu-demo://{uuid.uuid4().hex}",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in containers
                ],
            },
        )
        for c in mine:
            for d in self.prepared[c["metadata"]["uid"]].devices:
                self.shares.append(
                    {
                        "pod": f"{md['namespace']}/{md['name']}",
                        "claim": c["metadata"]["name"],
                        "device": d[1],
                        "shareID": d[2],
                    }
                )
        shares = "; ".join(
            f"{c['metadata']['name']}: "
            + ", ".join(
                f"{d[1]} share {d[2] or '-'}" for d in self.prepared[c["metadata"]["uid"]].devices
            )
            for c in mine
        )
        self._event(
            pod,
            "Normal",
            "Started",
            "Started (no process runs in the demo; `kubectl logs` prints the devices and "
            f"environment the containers got){': ' + shares if shares else ''}",
        )

    def _container_logs(self, pod: Obj, claims: Sequence[Obj]) -> dict[str, str]:
        """Per container: the claims and devices it names, then its CDI environment, sorted."""
        generated = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        by_name = {c["metadata"]["name"]: c for c in claims}
        claim_of = {
            pod_claim: by_name.get(name or generated.get(pod_claim) or "")
            for pod_claim, name, _t in pod_claim_refs(pod)
        }
        out: dict[str, str] = {}
        for container in (pod.get("spec") or {}).get("containers") or []:
            lines = [f"# sharegpu demo: no process runs; container {container.get('name')} got:"]
            env: dict[str, str] = {}
            for ref in (container.get("resources") or {}).get("claims") or []:
                claim = claim_of.get(ref.get("name"))
                if claim is None:
                    continue
                prepared = self.prepared.get(claim["metadata"]["uid"])
                for requests, device, share, cdi_ids, variables in (
                    prepared.devices if prepared else []
                ):
                    if ref.get("request") and ref["request"] not in requests:
                        continue
                    lines.append(
                        f"# claim {claim['metadata']['name']} ({ref.get('name')}), request "
                        f"{','.join(requests)}: device {device}, share {share or '-'}, "
                        f"CDI {' '.join(cdi_ids)}"
                    )
                    for item in variables:
                        key, _, value = item.partition("=")
                        env[key] = value
            if len(lines) == 1:
                lines.append("# no devices: the container names no claim")
            lines += [f"{k}={v}" for k, v in sorted(env.items())]
            out[str(container.get("name", ""))] = "\n".join(lines) + "\n"
        return out

    def _unprepare(self, uid: str) -> None:
        prepared = self.prepared.pop(uid, None)
        if prepared is None:
            return
        errors = self.kubelet.unprepare([prepared.ref])
        self.unprepared += 1
        if errors.get(uid):
            log.warning("demo cluster: unprepare %s failed: %s", prepared.ref.name, errors[uid])

    def pod_shares(self) -> list[Obj]:
        """The pods that ran and the share each got (see :attr:`shares`)."""
        return list(self.shares)

    def unprepare_all(self) -> int:
        """Unprepare every claim still prepared; returns how many were."""
        uids = list(self.prepared)
        for uid in uids:
            self._unprepare(uid)
        return len(uids)

    # ------------------------------------------------------------------ writes

    def _claim_status(self, claim: Obj, status: Obj) -> None:
        md = claim["metadata"]
        body = {**claim, "status": status}
        self.rest.request(
            "PUT",
            f"{RESOURCE_API}/namespaces/{md['namespace']}/resourceclaims/{md['name']}/status",
            body=body,
        )

    def _pod_status(self, pod: Obj, changes: Obj, message: str | None = None) -> None:
        md = pod["metadata"]
        current = self.server.store.get("pods", md["name"], md["namespace"])
        if current is None or current["metadata"]["uid"] != md["uid"]:
            return
        status = {**(current.get("status") or {}), **changes}
        if message is not None:
            status["message"] = message
        self.rest.request(
            "PUT",
            f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status",
            body={**current, "status": status},
        )

    def _event(self, pod: Obj, type_: str, reason: str, message: str) -> None:
        """Write an event about ``pod`` unless the last one of this reason said the same."""
        md = pod["metadata"]
        key = (md["uid"], reason)
        if self._said.get(key) == message:
            return
        self._said[key] = message
        now = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{md['name']}.", "namespace": md["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": md["name"],
                "namespace": md["namespace"],
                "uid": md["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.rest.request("POST", f"/api/v1/namespaces/{md['namespace']}/events", body=body)
        except KubeApiError as exc:
            log.warning("demo cluster: event %s for %s not written: %s", reason, md["name"], exc)
