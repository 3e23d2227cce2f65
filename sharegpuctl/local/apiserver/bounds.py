"""The bounds the in-process API server puts on what a client sends, as kube-apiserver does.

- :data:`MAX_BODY_BYTES`: a request body larger than kube-apiserver's default
  ``--max-request-bytes``-derived limit (3 MiB) is refused 413 before it is read;
- :func:`load_yaml`: a YAML body is parsed with the safe loader and without aliases (an alias
  is how a kilobyte of YAML expands to gigabytes), each refused 400 naming the alias;
- :data:`MAX_OBJECT_BYTES`: an object whose JSON encoding is larger than etcd's default request
  limit (1.5 MiB) is never stored (413), whether it came whole or grew by a patch.

Every refusal is an :class:`~.errors.ApiError` whose message names the limit.
"""

from __future__ import annotations

import json
from typing import Any, Final

import yaml

from sharegpuctl.local.apiserver.errors import ApiError

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml: the same rules in pure Python
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

MIB: Final = 1024 * 1024
#: Largest request body read (kube-apiserver's default for JSON and YAML bodies: 3 MiB).
MAX_BODY_BYTES: Final = 3 * MIB
#: Largest object stored, JSON-encoded (etcd's default ``--max-request-bytes``: 1.5 MiB).
MAX_OBJECT_BYTES: Final = 3 * MIB // 2


def body_too_large(length: int, limit: int = MAX_BODY_BYTES) -> ApiError:
    """The 413 for a body of ``length`` bytes, worded like kube-apiserver's."""
    return ApiError(
        413,
        f"Request entity too large: limit is {limit} bytes (the body has {length})",
        reason="RequestEntityTooLarge",
    )


def load_yaml(raw: bytes) -> Any:
    """The one YAML document of a request body, parsed by the safe loader once a linear pass
    over its events found no alias (raises yaml.YAMLError naming the alias and its line)."""
    for event in yaml.parse(raw, Loader=_SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            raise yaml.YAMLError(
                f"line {line}: found alias *{event.anchor}: YAML aliases are not accepted by "
                "this server (send the object as JSON, or write the aliased value out)"
            )
    return yaml.load(raw, Loader=_SafeLoader)


def check_object_size(obj: Any, what: str, limit: int = MAX_OBJECT_BYTES) -> None:
    """413 when ``obj`` encodes to more than ``limit`` bytes of JSON."""
    size = len(json.dumps(obj, separators=(",", ":")))
    if size > limit:
        raise ApiError(
            413,
            f"{what} is too large to store: its JSON is {size} bytes, the limit is {limit} "
            "bytes (etcd's default request limit)",
            reason="RequestEntityTooLarge",
        )
