"""The ``status.allocation`` kube-scheduler writes for one claim of a finished search:
results in pick order (with the device's binding conditions, DRADeviceBindingConditions being
on by default from 1.36), the configs as 1.37 writes them (:func:`_configs`), the node
selector."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .capacity import format_amount
from .requests import Alternative
from .search import Search


def build_allocation(search: Search, ci: int, share_ids: Callable[[], str]) -> dict[str, Any]:
    """The allocation of claim ``ci`` of a successful ``search``."""
    results = []
    for pick in search.picks:
        if pick.ci != ci:
            continue
        result: dict[str, Any] = {
            "request": pick.alt.full_name,
            "driver": pick.cand.id.driver,
            "pool": pick.cand.id.pool,
            "device": pick.cand.id.device,
        }
        if pick.alt.admin_access:
            result["adminAccess"] = True
        if pick.alt.tolerations:
            result["tolerations"] = [dict(t) for t in pick.alt.tolerations]
        for key in ("bindingConditions", "bindingFailureConditions"):
            if pick.cand.device.get(key):
                result[key] = list(pick.cand.device[key])
        if pick.consumed is not None:
            result["shareID"] = share_ids()
            result["consumedCapacity"] = {k: format_amount(v) for k, v in pick.consumed.items()}
        results.append(result)
    devices: dict[str, Any] = {"results": results}
    config = _configs(search, ci)
    if config:
        devices["config"] = config
    allocation: dict[str, Any] = {"devices": devices}
    node_selector = _node_selector(search, ci)
    if node_selector is not None:
        allocation["nodeSelector"] = node_selector
    return allocation


def _configs(search: Search, ci: int) -> list[dict[str, Any]]:
    """The configs of claim ``ci``, as kube-scheduler 1.37 writes them.

    Class configs once per class, listing the requests (or selected subrequests) using it;
    then each claim config once: without ``requests`` as it is, else when it names one of the
    claim's requests or a selected subrequest (a config for an unselected subrequest is left
    out). Last, an entry whose ``requests`` cover every request of the claim (by its name or
    its selected subrequest's) has them cleared: empty means all requests.
    """
    plan = search.plans[ci]
    chosen = [search.selected[(ci, ri)] for ri in range(len(plan.requests))]
    out: list[dict[str, Any]] = []
    class_entries: dict[str, list[dict[str, Any]]] = {}
    for alt in chosen:
        if alt.class_name in class_entries:
            for entry in class_entries[alt.class_name]:
                entry["requests"].append(alt.full_name)
            continue
        device_class = search.owner.classes.get(alt.class_name) or {}
        entries = []
        for cfg in (device_class.get("spec") or {}).get("config") or []:
            entry = {"source": "FromClass", "requests": [alt.full_name]}
            entry.update({k: v for k, v in cfg.items() if k != "requests"})
            entries.append(entry)
        class_entries[alt.class_name] = entries
        out.extend(entries)
    claim_configs = ((plan.claim.get("spec") or {}).get("devices") or {}).get("config") or []
    for cfg in claim_configs:
        wanted = list(cfg.get("requests") or [])
        body = {k: v for k, v in cfg.items() if k != "requests"}
        if not wanted:
            out.append({"source": "FromClaim", **body})
        elif any(_named(alt, wanted) for alt in chosen):
            out.append({"source": "FromClaim", "requests": wanted, **body})
    for entry in out:
        if entry.get("requests") and all(_named(alt, entry["requests"]) for alt in chosen):
            del entry["requests"]
    return out


def _named(alt: Alternative, names: list[str]) -> bool:
    """Whether ``names`` names the request of ``alt`` or, for a subrequest, ``alt`` itself."""
    return alt.request in names or (alt.subrequest is not None and alt.full_name in names)


def _node_selector(search: Search, ci: int) -> dict[str, Any] | None:
    fields: list[Any] = []
    expressions: list[Any] = []
    for pick in search.picks:
        if pick.ci != ci:
            continue
        if pick.cand.node_name or pick.cand.device.get("bindsToNode"):
            return {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {
                                "key": "metadata.name",
                                "operator": "In",
                                "values": [search.owner.node],
                            }
                        ]
                    }
                ]
            }
        terms = (pick.cand.node_selector or {}).get("nodeSelectorTerms") or []
        if len(terms) == 1:
            for req in terms[0].get("matchFields") or []:
                if req not in fields:
                    fields.append(req)
            for req in terms[0].get("matchExpressions") or []:
                if req not in expressions:
                    expressions.append(req)
    if not fields and not expressions:
        return None
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}
