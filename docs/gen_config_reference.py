"""Generate docs/configuration.md from the code: flags, GpuConfig, device attributes, chart values.

Sources, so the reference cannot drift from what runs:

- command-line flags: the ``argparse`` parsers of ``sharegpu-kubeletplugin``
  (``kubeletplugin.config.build_parser``), ``sharegpu-controller``
  (``controller.config.build_parser``) and ``sharegpu`` (``sharegpuctl.cli.build_parser``, with its
  subcommands);
- ``GpuConfig``: the JSON Schema generated from the pydantic models (``api.schema``);
- the ``GPU`` object: the pydantic models of ``api.gpu``;
- device attributes and capacities: the devices the plugin publishes for its default mock GPU, per
  sharing mode (``kubeletplugin.devices.slices``);
- Helm values: ``deploy/helm/sharegpu/values.schema.json`` with defaults from ``values.yaml``.

Usage: ``python docs/gen_config_reference.py`` rewrites the file; ``--check`` exits 1 when the
committed file differs (tests/docs/test_docs.py runs the check).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
OUTPUT = REPO_ROOT / "docs" / "configuration.md"
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "sharegpu"

#: Environment variables the parsers read for their defaults; cleared while building them so the
#: output does not depend on the machine that generates it.
#: reStructuredText roles such as :mod:`x` in docstrings and help texts.
_ROLE = re.compile(r":[a-z]+:`([^`]+)`")

_ENV_DEFAULTS = ("DRIVER_NAME", "NODE_NAME", "KUBECONFIG", "POD_NAMESPACE", "POD_NAME")


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell, with reStructuredText markup made Markdown."""
    prose = _ROLE.sub(r"`\1`", str(text)).replace("``", "`")
    return " ".join(prose.split()).replace("|", "\\|")


def _code(value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"`{_cell(value)}`"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# --- command-line flags ---


def _parser_or_none(load: Callable[[], argparse.ArgumentParser]) -> argparse.ArgumentParser | None:
    clean = {k: v for k, v in os.environ.items() if k not in _ENV_DEFAULTS}
    with mock.patch.dict(os.environ, clean, clear=True):
        try:
            return load()
        except (ImportError, AttributeError):
            return None


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        params = dict(vars(action), prog=prog)
        if action.choices is not None:
            params["choices"] = ", ".join(str(c) for c in action.choices)
        text = text % params
    return text


def _flag_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows: list[list[str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help is argparse.SUPPRESS:
            continue  # hidden from --help: test and benchmark settings, not configuration
        if action.option_strings:
            name = ", ".join(f"`{o}`" for o in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}` (positional)"
        default = action.default
        if default is argparse.SUPPRESS or (isinstance(default, bool) and action.nargs == 0):
            default = None
        choices = ", ".join(str(c) for c in action.choices) if action.choices else ""
        rows.append([name, _code(default), _cell(choices), _cell(_help(action, parser.prog))])
    return rows


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", p) for n, p in _subcommands(sub))


def _kubeletplugin_parser() -> argparse.ArgumentParser:
    from kubeletplugin.config import build_parser

    return build_parser()


def _controller_parser() -> argparse.ArgumentParser:
    from controller.config import build_parser

    return build_parser()


def _cli_parser() -> argparse.ArgumentParser:
    from sharegpuctl.cli import build_parser

    return build_parser()


def flags_section() -> list[str]:
    out = ["## Command-line flags", ""]
    header = ["Flag", "Default", "Allowed", "Meaning"]
    for title, load in (
        ("sharegpu-kubeletplugin", _kubeletplugin_parser),
        ("sharegpu-controller", _controller_parser),
        ("sharegpu", _cli_parser),
    ):
        parser = _parser_or_none(load)
        out += [f"### `{title}`", ""]
        if parser is None:
            out += ["(not available in this build)", ""]
            continue
        if parser.description:
            out += [_cell(parser.description), ""]
        rows = _flag_rows(parser)
        if rows:
            out += [*_table(header, rows), ""]
        for name, sub in _subcommands(parser):
            out += [f"#### `{title} {name}`", ""]
            if sub.description:
                out += [_cell(sub.description), ""]
            sub_rows = _flag_rows(sub)
            out += [*(_table(header, sub_rows) if sub_rows else ["(no flags)"]), ""]
    return out


# --- JSON schemas (GpuConfig, GPU, chart values) ---


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in node:
        target = defs[str(node["$ref"]).rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            node = {**_resolve(options[0], defs), **rest}
    return node


def _type_of(node: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    if "const" in node:
        return "string"
    if "anyOf" in node:
        return " or ".join(_type_of(_resolve(o, defs), defs) for o in node["anyOf"])
    kind = node.get("type", "object")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        items = _resolve(node.get("items", {}), defs)
        return f"list of {_type_of(items, defs)}"
    return str(kind)


def _allowed(node: Mapping[str, Any]) -> str:
    if "const" in node:
        return _code(node["const"])
    if "enum" in node:
        values = node["enum"]
        mixed = not all(isinstance(v, str) for v in values)
        return ", ".join(_code(json.dumps(v) if mixed else v) for v in values)
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None or high is not None:
        if low is not None and high is not None:
            return f"{low} to {high}"
        return f">= {low}" if low is not None else f"<= {high}"
    if "pattern" in node:
        return f"pattern `{_cell(node['pattern'])}`"
    return ""


def schema_rows(
    schema: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
    prefix: str = "",
    defs: Mapping[str, Any] | None = None,
) -> list[list[str]]:
    """One row per property (depth first): path, type, allowed values, default, description."""
    defs = defs if defs is not None else schema.get("$defs", {})
    rows: list[list[str]] = []
    required = set(schema.get("required", []))
    for name, raw in schema.get("properties", {}).items():
        node = _resolve(raw, defs)
        path = f"{prefix}{name}"
        default = (defaults or {}).get(name, node.get("default"))
        nested = node.get("properties")
        shown_default = (
            ""
            if nested
            else _code(json.dumps(default) if isinstance(default, list | dict) else default)
        )
        description = str(node.get("description", "")).replace("``", "`")
        if name in required:
            description = f"Required. {description}".strip()
        rows.append(
            [f"`{path}`", _type_of(node, defs), _allowed(node), shown_default, _cell(description)]
        )
        if nested:
            sub_defaults = default if isinstance(default, Mapping) else None
            rows += schema_rows(node, sub_defaults, f"{path}.", defs)
    return rows


def gpuconfig_section() -> list[str]:
    from api.schema import SCHEMA_DIR, SCHEMAS

    (name,) = [n for n, model in SCHEMAS.items() if model.__name__ == "GpuConfig"]
    schema = json.loads((SCHEMA_DIR / name).read_text())
    out = [
        "## `GpuConfig` (`resource.sharegpu.dev/v1alpha1`)",
        "",
        "Opaque parameters of a DeviceClass or ResourceClaim `config` entry with "
        "`driver: gpu.sharegpu.dev`. DeviceClass entries apply first, then the claim's; the "
        "last entry that applies to a request wins as a whole. JSON Schema: "
        f"[`api/schemas/{name}`](../api/schemas/{name}).",
        "",
    ]
    header = ["Field", "Type", "Allowed", "Default", "Meaning"]
    return [*out, *_table(header, schema_rows(schema)), ""]


def gpu_object_section() -> list[str]:
    from api.gpu import GpuSpec, GpuStatus

    out = [
        "## The `GPU` object (`gpus.resource.sharegpu.dev`, read-only)",
        "",
        "Written by the controller, one per physical GPU, named `<node>-gpu-<index>`.",
        "",
    ]
    header = ["Field", "Type", "Allowed", "Default", "Meaning"]
    for part, model in (("spec", GpuSpec), ("status", GpuStatus)):
        schema = model.model_json_schema(by_alias=True)
        out += [*_table(header, schema_rows(schema, prefix=f"{part}.")), ""]
    return out


# --- published devices ---


def _value_text(value: Mapping[str, Any]) -> tuple[str, str]:
    ((kind, raw),) = value.items()
    return kind, _code(raw)


def devices_section() -> list[str]:
    from api.names import DEFAULT_DRIVER_NAME, SHARING_MODES
    from kubeletplugin.devices.mock import default_gpu
    from kubeletplugin.devices.slices import consumable_device, exclusive_device, partition_devices

    devices_of: dict[str, Callable[[Any], list[dict[str, Any]]]] = {
        "consumable": lambda g: [consumable_device(g)],
        "partitions": partition_devices,
        "exclusive": lambda g: [exclusive_device(g)],
    }
    gpu = default_gpu("node-a", 0, 1)
    out = [
        "## Published devices",
        "",
        "What the plugin publishes per GPU, shown for its default mock GPU "
        f"({gpu.product_name}). Unqualified names live under the driver's domain: in CEL write "
        f"`device.attributes['{DEFAULT_DRIVER_NAME}'].<name>` and "
        f"`device.capacity['{DEFAULT_DRIVER_NAME}'].<name>`.",
        "",
    ]
    for mode in SHARING_MODES:
        devices = devices_of[mode](gpu)
        names = ", ".join(f"`{d['name']}`" for d in devices)
        out += [f"### `--sharing-mode={mode}`", "", f"Devices: {names}.", ""]
        first = devices[0]
        attribute_rows = []
        for name, value in first.get("attributes", {}).items():
            kind, text = _value_text(value)
            attribute_rows.append([f"`{name}`", kind, text])
        extra = {
            name: value
            for d in devices[1:]
            for name, value in d.get("attributes", {}).items()
            if name not in first.get("attributes", {})
        }
        for name, value in extra.items():
            kind, text = _value_text(value)
            attribute_rows.append([f"`{name}`", kind, text])
        out += [*_table(["Attribute", "Type", "Example"], attribute_rows), ""]
        capacity_rows = []
        for name, cap in first.get("capacity", {}).items():
            policy = cap.get("requestPolicy")
            capacity_rows.append(
                [f"`{name}`", _code(cap["value"]), _code(json.dumps(policy)) if policy else ""]
            )
        if capacity_rows:
            out += [*_table(["Capacity", "Value", "Request policy"], capacity_rows), ""]
        flags = []
        if first.get("allowMultipleAllocations"):
            flags.append("`allowMultipleAllocations: true` (shares)")
        if any("consumesCounters" in d for d in devices):
            flags.append("devices consume the counter set `gpu-<index>-counters` (cores, memory)")
        if flags:
            out += ["Also: " + "; ".join(flags) + ".", ""]
    return out


# --- Helm values ---


def values_section() -> list[str]:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    out = [
        "## Helm chart values (`deploy/helm/sharegpu`)",
        "",
        "Checked by the chart's `values.schema.json` on every install and upgrade.",
        "",
    ]
    header = ["Key", "Type", "Allowed", "Default", "Meaning"]
    return [*out, *_table(header, schema_rows(schema, defaults)), ""]


def render() -> str:
    sys.path.insert(0, str(REPO_ROOT))
    lines = [
        "# Configuration reference",
        "",
        "Generated by `python docs/gen_config_reference.py` from the code; do not edit by hand.",
        "",
        "- [Command-line flags](#command-line-flags)",
        "- [`GpuConfig`](#gpuconfig-resourcesharegpudevv1alpha1)",
        "- [Published devices](#published-devices)",
        "- [The `GPU` object](#the-gpu-object-gpusresourcesharegpudev-read-only)",
        "- [Helm chart values](#helm-chart-values-deployhelmsharegpu)",
        "",
    ]
    lines += flags_section()
    lines += gpuconfig_section()
    lines += devices_section()
    lines += gpu_object_section()
    lines += values_section()
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate docs/configuration.md.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python docs/gen_config_reference.py")
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
