"""Generate the deployment files derived from the API models.

``python -m api.crd`` rewrites

- ``deploy/crds/gpus.resource.sharegpu.dev.yaml``: the ``gpus.resource.sharegpu.dev``
  CustomResourceDefinition, from :mod:`api.gpu` (``deploy/helm/sync-crds.sh`` copies it into the
  chart);
- ``deploy/crds/gpuquotas.resource.sharegpu.dev.yaml``: the ``GpuQuota`` CRD, from
  :mod:`api.gpuquota` (copied into the chart the same way);
- the ``deviceClasses.gpu.config`` subtree of the chart's ``values.schema.json``: the
  ``GpuConfig`` JSON Schema of :mod:`api.schema` (itself generated from :mod:`api.gpuconfig`), so
  ``helm install`` rejects a DeviceClass config the driver would refuse; the rest of the file is
  left as it is.

``python -m api.crd --check`` exits 1 when any committed file differs from the models.

The CRD's pydantic JSON schema is turned into a *structural* OpenAPI v3 schema as the API server
requires: ``$ref`` inlined, ``Optional`` unions reduced to their type, titles and defaults dropped,
int-or-string fields written as ``anyOf: [integer, string]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from api.gpu import GpuSpec, GpuStatus
from api.gpuconfig import GPU_CONFIG_KIND, SECTION_STRATEGY
from api.gpuquota import GpuQuotaSpec, GpuQuotaStatus
from api.names import (
    API_GROUP,
    API_VERSION,
    GPU_CATEGORY,
    GPU_CRD_NAME,
    GPU_KIND,
    GPU_PLURAL,
    GPU_QUOTA_CRD_NAME,
    GPU_QUOTA_KIND,
    GPU_QUOTA_PLURAL,
    GPU_QUOTA_SHORT_NAME,
    GPU_SHORT_NAME,
    GROUP_VERSION,
)
from api.schema import SCHEMAS
from api.schema import generate as generate_json_schema

_REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where the generated manifest lives, relative to the repository root.
CRD_PATH = _REPO_ROOT / "deploy" / "crds" / f"{GPU_CRD_NAME}.yaml"
#: Where the generated GpuQuota CRD lives (beside :data:`CRD_PATH`).
QUOTA_CRD_PATH = _REPO_ROOT / "deploy" / "crds" / f"{GPU_QUOTA_CRD_NAME}.yaml"
#: The chart's values schema, whose ``deviceClasses.gpu.config`` subtree is generated.
VALUES_SCHEMA_PATH = _REPO_ROOT / "deploy" / "helm" / "sharegpu" / "values.schema.json"
#: Keys from the top of the values schema to the generated subtree.
CONFIG_VALUES_PATH = ("deviceClasses", "gpu", "config")

_DROPPED_KEYS = frozenset({"title", "default"})
#: The only ``anyOf`` a structural schema allows beside ``x-kubernetes-int-or-string: true``
#: (integer first: the API server compares the list exactly and rejects another order).
INT_OR_STRING_ANY_OF: list[dict[str, str]] = [{"type": "integer"}, {"type": "string"}]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref`` and reduce ``anyOf: [X, null]`` to ``X``, recursively."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node and node.get("x-kubernetes-int-or-string"):
        return {
            k: [dict(o) for o in INT_OR_STRING_ANY_OF] if k == "anyOf" else v
            for k, v in node.items()
            if k not in _DROPPED_KEYS
        }
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express union {node['anyOf']!r} in a structural schema")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _structural({**options[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = _structural(value, defs)
    if out.get("type") == "object" and isinstance(out.get("additionalProperties"), bool):
        del out["additionalProperties"]  # extra="forbid"; a map's value schema is kept
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a model's JSON (camelCase) shape."""
    schema = model.model_json_schema(by_alias=True)
    result: dict[str, Any] = _structural(schema, schema.get("$defs", {}))
    return result


def _column(name: str, type_: str, json_path: str) -> dict[str, Any]:
    return {"name": name, "type": type_, "jsonPath": json_path}


#: The last printer column of every CRD of the group.
_AGE_COLUMN = _column("Age", "date", ".metadata.creationTimestamp")


def _crd(
    *,
    name: str,
    kind: str,
    plural: str,
    short_name: str,
    scope: str,
    columns: list[dict[str, Any]],
    description: str,
    spec: type[BaseModel],
    status: type[BaseModel],
    spec_required: bool,
) -> dict[str, Any]:
    """A CustomResourceDefinition of this group: one served and stored version with a status
    subresource, ``columns`` then Age as printer columns, and the models' structural schemas."""
    root: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(spec),
            "status": openapi_schema(status),
        },
    }
    if spec_required:
        root["required"] = ["spec"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": API_GROUP,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "listKind": f"{kind}List",
                "shortNames": [short_name],
                "categories": [GPU_CATEGORY],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [*columns, _AGE_COLUMN],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition of ``GPU`` objects."""
    return _crd(
        name=GPU_CRD_NAME,
        kind=GPU_KIND,
        plural=GPU_PLURAL,
        short_name=GPU_SHORT_NAME,
        scope="Cluster",
        columns=[
            _column("Node", "string", ".spec.node"),
            _column("Model", "string", ".spec.model"),
            _column("Health", "string", ".status.health"),
            _column("Cores", "string", ".status.coresSummary"),
            _column("Memory", "string", ".status.memorySummary"),
            _column("Claims", "integer", ".status.claimCount"),
            _column("Limits", "string", ".status.limitsSummary"),
            _column("Overcommit", "string", ".status.overcommit"),
        ],
        description="One physical GPU: its hardware and current usage.",
        spec=GpuSpec,
        status=GpuStatus,
        spec_required=False,
    )


def quota_crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition of ``GpuQuota`` objects (namespaced, status subresource,
    used/hard printer columns)."""
    return _crd(
        name=GPU_QUOTA_CRD_NAME,
        kind=GPU_QUOTA_KIND,
        plural=GPU_QUOTA_PLURAL,
        short_name=GPU_QUOTA_SHORT_NAME,
        scope="Namespaced",
        columns=[
            _column("Cores", "string", ".status.coresSummary"),
            _column("Memory", "string", ".status.memorySummary"),
            _column("Devices", "string", ".status.devicesSummary"),
            _column("Limits", "string", ".status.limitsSummary"),
        ],
        description="Limits on the GPU cores, memory and devices that the ResourceClaims of "
        "one namespace may use (used/hard).",
        spec=GpuQuotaSpec,
        status=GpuQuotaStatus,
        spec_required=True,
    )


def render() -> str:
    """The manifest file's text."""
    header = "# Generated by `python -m api.crd` from api/gpu.py. Do not edit.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


def render_quota() -> str:
    """The GpuQuota manifest file's text."""
    header = "# Generated by `python -m api.crd` from api/gpuquota.py. Do not edit.\n"
    return header + yaml.safe_dump(quota_crd_manifest(), sort_keys=False, width=100)


#: Keys of the GpuConfig JSON Schema the values schema leaves out: identifiers, titles, and the
#: 2020-12 ``$defs`` (inlined, so the subtree is valid in the chart's draft-07 schema too).
_VALUES_DROPPED_KEYS = frozenset({"$schema", "$id", "$defs", "title"})
#: GpuConfig fields the chart's DeviceClass template writes itself (optional in the value).
_TEMPLATE_FIELDS = ("apiVersion", "kind")


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    """``node`` with every ``$ref`` replaced by its definition and titles dropped, recursively."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return _inline({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _VALUES_DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _inline(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _inline(value, defs)
    return out


def config_values_schema() -> dict[str, Any]:
    """JSON Schema of the chart value ``deviceClasses.gpu.config``.

    It is the GpuConfig schema of :func:`api.schema.generate` with ``$ref`` inlined, titles
    dropped, and ``apiVersion`` and ``kind`` optional (the template writes them; a pasted whole
    GpuConfig may carry them, with exactly this group version and kind). The rule of
    :class:`api.gpuconfig.Sharing` that a section (``mps``, ``timeSlicing``, ``limits``) is only
    allowed with its own strategy is added as ``dependencies``, so every config the schema
    accepts is one :func:`api.gpuconfig.parse_gpu_config` accepts, except for quantity strings,
    whose syntax the schema does not check.
    """
    (name,) = [n for n, model in SCHEMAS.items() if model.__name__ == "GpuConfig"]
    full = generate_json_schema(name)
    schema: dict[str, Any] = _inline(full, full.get("$defs", {}))
    schema["properties"]["apiVersion"] = {"const": GROUP_VERSION}
    schema["properties"]["kind"] = {"const": GPU_CONFIG_KIND}
    schema["required"] = [r for r in schema.get("required", []) if r not in _TEMPLATE_FIELDS]
    if not schema["required"]:
        del schema["required"]
    sharing = schema["properties"]["sharing"]
    sharing["dependencies"] = {
        section: {"required": ["strategy"], "properties": {"strategy": {"const": strategy}}}
        for section, strategy in SECTION_STRATEGY.items()
    }
    schema["description"] = (
        "GpuConfig applied to every claim of the class (sharing; apiVersion and kind may be "
        "left out: the chart adds them). Checked against the GpuConfig schema."
    )
    return schema


def render_values_schema(current: str) -> str:
    """The text of the chart's values schema ``current`` with its ``deviceClasses.gpu.config``
    subtree replaced by :func:`config_values_schema` (key order of the rest kept, two-space
    indent, final newline). Idempotent: applying it to its own output changes nothing."""
    values: dict[str, Any] = json.loads(current)
    node = values
    for key in CONFIG_VALUES_PATH[:-1]:
        node = node["properties"][key]
    node["properties"][CONFIG_VALUES_PATH[-1]] = config_values_schema()
    return json.dumps(values, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the committed CRD manifest and values schema."""
    parser = argparse.ArgumentParser(prog="python -m api.crd", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--output", type=Path, default=CRD_PATH, help="manifest path")
    parser.add_argument(
        "--quota-output", type=Path, default=QUOTA_CRD_PATH, help="GpuQuota manifest path"
    )
    parser.add_argument(
        "--values-schema", type=Path, default=VALUES_SCHEMA_PATH, help="chart values schema path"
    )
    args = parser.parse_args(argv)
    current_values = args.values_schema.read_text()
    outputs = (
        (args.output, render()),
        (args.quota_output, render_quota()),
        (args.values_schema, render_values_schema(current_values)),
    )
    if args.check:
        stale = [path for path, text in outputs if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run `python -m api.crd`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
