"""Errors of the CEL environment: compile errors carry the expression and the position."""

from __future__ import annotations


class CelError(Exception):
    """Base class of every CEL error raised by :mod:`sharegpu.cel`."""


class CelCompileError(CelError):
    """An expression that does not parse or does not type-check.

    ``line`` and ``column`` are 1-based positions in ``expression`` (``None`` when unknown).
    """

    def __init__(
        self, expression: str, message: str, line: int | None = None, column: int | None = None
    ) -> None:
        self.expression = expression
        self.message = message
        self.line = line
        self.column = column
        super().__init__(self.describe())

    def describe(self) -> str:
        """``<line>:<column>: <message>`` followed by the offending line and a caret."""
        if self.line is None:
            return f"{self.message} in {self.expression!r}"
        lines = self.expression.splitlines() or [""]
        source = lines[self.line - 1] if 0 < self.line <= len(lines) else self.expression
        caret = " " * max((self.column or 1) - 1, 0) + "^"
        return f"{self.line}:{self.column}: {self.message}\n | {source}\n | {caret}"


class CelCostError(CelCompileError):
    """A selector whose estimated cost is above Kubernetes' limit (the API server refuses it
    when it is created or changed; the scheduler still runs a stored one, within its runtime
    limit)."""


class CelEvalError(CelError):
    """A runtime error (missing key, no such overload, overflow, ...).

    In CEL these are values: ``true || <error>`` is ``true``. The compiled program raises
    them; the logical operators catch and absorb them as the specification requires.
    """

    def __init__(self, message: str, missing_key: str | None = None) -> None:
        self.message = message
        #: The map key or field whose absence caused the error (``no such key``), if any.
        self.missing_key = missing_key
        super().__init__(message)
