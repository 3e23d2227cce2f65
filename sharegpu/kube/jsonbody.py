"""Decoding JSON bodies from Kubernetes (API answers, watch events, AdmissionReviews), and
encoding request bodies byte for byte as Go's ``encoding/json`` writes them.

:func:`encode` matters where the API server compares bytes: an opaque config's ``parameters``
(a ``runtime.RawExtension``) keeps the bytes a client sent, and a status update must send a
claim's immutable ``status.allocation`` back unchanged, byte for byte. An answer carries those
bytes as Go wrote them (compact, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped, other
characters as UTF-8), so a body encoded the same way round-trips them exactly; Python's default
(``", "`` separators, ASCII escapes) changes them and the API server refuses the update
(``status.allocation: field cannot be modified once set``).

The API server accepts objects nested up to 10,000 levels (Go's ``encoding/json`` limit);
Python's decoder stops at its recursion limit (about 1,000), so one claim whose *foreign* opaque
config is nested 5,000 deep would break every list, watch and review that carries it.

:func:`decode` keeps the common path as fast as ``json.loads``. Only when that fails for depth
does it decode again on a helper thread with a stack and recursion limit sized for
:data:`MAX_DEPTH`, and then prunes every value nested deeper than :data:`KEPT_DEPTH` to
:data:`PRUNED` (iteratively). Invariants: the result is nested at most ``KEPT_DEPTH`` levels,
so no later recursive walk in sharegpu can fail on it; nothing sharegpu reads lies that deep
(a ResourceClaim's own fields end within about 12 levels; only opaque parameters of other
drivers go deeper, and those are never read); objects decoded this way are read, never written
back. A body nested deeper than ``MAX_DEPTH`` cannot come from an API server and is a
``ValueError``.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, Final

#: The deepest nesting the API server decodes (Go encoding/json's maxNestingDepth).
MAX_DEPTH: Final = 10_000
#: Values nested deeper than this are replaced by :data:`PRUNED` on the slow path.
KEPT_DEPTH: Final = 64
PRUNED: Final = "<pruned: nested deeper than 64 levels>"
#: Stack of the helper thread: the C decoder needs a few hundred bytes per level.
_DEEP_STACK_BYTES: Final = 64 * 1024 * 1024
#: The recursion limit while the helper decodes (levels count about once each, plus margin).
_DEEP_RECURSION_LIMIT: Final = 2 * MAX_DEPTH + 1_000
_deep_lock = threading.Lock()


class NestingError(ValueError):
    """A JSON body nested deeper than :data:`MAX_DEPTH`."""


#: What Go's encoder escapes inside strings besides what JSON requires (HTML-safe output). None
#: of these characters can occur outside a string in JSON, so replacing them in the encoded text
#: only touches strings.
_GO_ESCAPES: Final = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def encode(obj: Any) -> bytes:
    """``obj`` as UTF-8 JSON bytes, written as Go's ``encoding/json`` writes them; raises
    ``TypeError`` or ``ValueError`` for what JSON cannot hold."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.translate(_GO_ESCAPES).encode()


def decode(data: bytes | str) -> Any:
    """``json.loads(data)``, except that bodies nested deeper than Python's recursion limit are
    decoded as described in the module docstring. Raises ``ValueError`` for text that is no
    JSON and :class:`NestingError` beyond :data:`MAX_DEPTH`."""
    try:
        return json.loads(data)
    except RecursionError:
        return _prune(_decode_deep(data))


def _decode_deep(data: bytes | str) -> Any:
    """Decode on a thread with a large stack; the recursion limit is raised only meanwhile
    (serialised, so concurrent deep decodes cannot lower it under each other)."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = json.loads(data)
        except RecursionError:
            result["error"] = NestingError(
                f"the JSON body is nested deeper than {MAX_DEPTH} levels"
            )
        except ValueError as exc:
            result["error"] = exc

    with _deep_lock:
        previous_limit = sys.getrecursionlimit()
        previous_stack = threading.stack_size()
        sys.setrecursionlimit(max(previous_limit, _DEEP_RECURSION_LIMIT))
        try:
            # The stack size applies when a thread starts: start the worker inside the window.
            # (A thread another caller starts meanwhile gets the same large, lazily committed
            # stack; nothing else changes for it.)
            threading.stack_size(_DEEP_STACK_BYTES)
            try:
                worker = threading.Thread(target=run, name="json-deep-decode", daemon=True)
                worker.start()
            finally:
                threading.stack_size(previous_stack)
            worker.join()
        finally:
            sys.setrecursionlimit(previous_limit)
    if "error" in result:
        raise result["error"]
    return result["value"]


def _prune(value: Any) -> Any:
    """``value`` with everything nested deeper than :data:`KEPT_DEPTH` replaced by
    :data:`PRUNED`, rebuilt without recursion."""
    if not isinstance(value, dict | list):
        return value
    root: Any = {} if isinstance(value, dict) else []
    # (source container, copy being built, depth of the container)
    stack: list[tuple[Any, Any, int]] = [(value, root, 1)]
    while stack:
        source, target, depth = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, child in items:
            if isinstance(child, dict | list):
                if depth >= KEPT_DEPTH:
                    copied: Any = PRUNED
                else:
                    copied = {} if isinstance(child, dict) else []
                    stack.append((child, copied, depth + 1))
            else:
                copied = child
            if isinstance(target, dict):
                target[key] = copied
            else:
                target.append(copied)
    return root
