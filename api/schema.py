"""JSON Schemas generated from the API models; ``python -m api.schema`` rewrites the files.

The committed files under ``api/schemas/`` are what the docs and the admission webhook use; a test
checks that they equal what the models generate, so the models stay the single source.
Optional fields appear as plain optional properties (no ``null`` branches, no titles), which is
how a Kubernetes user reads them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from api.gpuconfig import GpuConfig

SCHEMA_DIR: Final = Path(__file__).parent / "schemas"

#: File name -> model it is generated from.
SCHEMAS: Final[dict[str, type[BaseModel]]] = {"gpuconfig.schema.json": GpuConfig}

_SCHEMA_IDS: Final = {"gpuconfig.schema.json": "https://sharegpu.dev/schemas/gpuconfig.schema.json"}


class _KubernetesStyle(GenerateJsonSchema):
    """Pydantic's generator without null branches, null defaults or generated titles."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if schema.get("default") is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def generate(name: str) -> dict[str, Any]:
    """The JSON Schema of file ``name`` (a key of :data:`SCHEMAS`)."""
    body = SCHEMAS[name].model_json_schema(by_alias=True, schema_generator=_KubernetesStyle)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": _SCHEMA_IDS[name]} | (
        body
    )


def render(name: str) -> str:
    """The file text of schema ``name``: stable key order, two-space indent, final newline."""
    return json.dumps(generate(name), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write every schema file (or, with ``--check``, report the ones that are out of date)."""
    parser = argparse.ArgumentParser(prog="python -m api.schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check, exit 1 if stale")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="output directory")
    args = parser.parse_args(argv)
    stale = []
    for name in SCHEMAS:
        path = args.dir / name
        text = render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print("out of date (run python -m api.schema): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
