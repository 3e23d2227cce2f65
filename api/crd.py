"""Generate the ``gpus.resource.sharegpu.dev`` CustomResourceDefinition from :mod:`api.gpu`.

``python -m api.crd`` rewrites ``deploy/crds/gpus.resource.sharegpu.dev.yaml``;
``python -m api.crd --check`` exits 1 when the committed file differs from the models.

The pydantic JSON schema is turned into a *structural* OpenAPI v3 schema as the API server
requires: ``$ref`` inlined, ``Optional`` unions reduced to their type, titles and defaults dropped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from api.gpu import GpuSpec, GpuStatus
from api.names import API_GROUP, API_VERSION, GPU_CRD_NAME, GPU_KIND, GPU_PLURAL

#: Where the generated manifest lives, relative to the repository root.
CRD_PATH = Path(__file__).resolve().parent.parent / "deploy" / "crds" / f"{GPU_CRD_NAME}.yaml"

_DROPPED_KEYS = frozenset({"title", "default"})


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
    if out.get("type") == "object" and "additionalProperties" in out:
        del out["additionalProperties"]
    return out


def openapi_schema(model: type[GpuSpec] | type[GpuStatus]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a model's JSON (camelCase) shape."""
    schema = model.model_json_schema(by_alias=True)
    result: dict[str, Any] = _structural(schema, schema.get("$defs", {}))
    return result


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition of ``GPU`` objects."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": GPU_CRD_NAME},
        "spec": {
            "group": API_GROUP,
            "scope": "Cluster",
            "names": {
                "plural": GPU_PLURAL,
                "singular": GPU_KIND.lower(),
                "kind": GPU_KIND,
                "listKind": f"{GPU_KIND}List",
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
                        {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
                        {"name": "Health", "type": "string", "jsonPath": ".status.health"},
                        {"name": "Cores", "type": "string", "jsonPath": ".status.coresSummary"},
                        {
                            "name": "Memory",
                            "type": "string",
                            "jsonPath": ".status.memorySummary",
                        },
                        {"name": "Claims", "type": "integer", "jsonPath": ".status.claimCount"},
                        {
                            "name": "Age",
                            "type": "date",
                            "jsonPath": ".metadata.creationTimestamp",
                        },
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "One physical GPU: its hardware and current usage.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": openapi_schema(GpuSpec),
                                "status": openapi_schema(GpuStatus),
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    """The manifest file's text."""
    header = "# Generated by `python -m api.crd` from api/gpu.py. Do not edit.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the committed CRD manifest."""
    parser = argparse.ArgumentParser(prog="python -m api.crd", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--output", type=Path, default=CRD_PATH, help="manifest path")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run `python -m api.crd`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
