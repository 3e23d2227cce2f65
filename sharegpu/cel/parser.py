"""The CEL parser: cel-python's Lark grammar, extended with optional syntax, and literal decoding.

The grammar text is read from the installed ``celpy`` package (``celpy/cel.lark``, Apache-2.0,
Copyright 2020 Capital One Services, LLC) at run time and patched here with the forms it
lacks, as cel-spec's grammar (``doc/langdef.md``) and cel-go's ``parser/gen/CEL.g4`` define
them:

- optional field selection ``x.?f`` (tree ``member_dot_opt``) and index ``x[?k]``
  (``member_index_opt``);
- optional entries in list literals ``[?e]`` (``opt_elem``) and map literals ``{?k: v}``
  (``opt_key``), and a trailing comma in both;
- backtick-quoted field names ``x.`content-type``` and ``x.?`a.b``` (token ``ESC_IDENT``,
  cel-go's ``ESC_IDENTIFIER``: letters, digits, ``_ . - /`` and space; see :func:`field_name`);
- float literals as cel-go lexes them: a digit must follow the point (``1.`` is no literal,
  so ``42.charAt(2)`` is a method call on ``42``);
- string escapes ``\\?`` and backtick, ``\\X`` hex escapes, and ``\\U`` escapes in double-quoted
  strings, which cel-python's terminals leave out.

Invariant: every tree the parser returns comes from the patched grammar; a patch that no longer
applies to the installed grammar is an import-time :class:`RuntimeError`, never a silently
different language.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy
import lark

from .errors import CelCompileError

#: (old text, new text) replacements applied to cel-python's grammar, in order.
_PATCHES: tuple[tuple[str, str], ...] = (
    (
        "member         : member_dot | member_dot_arg | member_index | member_object | primary",
        "member         : member_dot | member_dot_opt | member_dot_arg | member_index"
        " | member_index_opt | member_object | primary\n"
        'member_dot_opt : member "." "?" (IDENT | ESC_IDENT)\n'
        'member_index_opt : member "[" "?" expr "]"',
    ),
    (
        'member_dot     : member "." IDENT',
        'member_dot     : member "." (IDENT | ESC_IDENT)\n'
        "ESC_IDENT      : /`[a-zA-Z0-9_.\\- \\/]+`/",
    ),
    (
        'list_lit       : "[" [exprlist] "]"',
        'list_lit       : "[" [_listelems [","]] "]"\n'
        '_listelems     : listelem | _listelems "," listelem\n'
        "listelem       : expr | opt_elem\n"
        'opt_elem       : "?" expr',
    ),
    (
        'map_lit        : "{" [mapinits] "}"',
        'map_lit        : "{" [_mapentries [","]] "}"\n'
        '_mapentries    : mapentry | _mapentries "," mapentry\n'
        'mapentry       : (expr | opt_key) ":" expr\n'
        'opt_key        : "?" expr',
    ),
    (
        # cel-go's NUM_FLOAT needs a digit after the point: ``42.charAt(2)`` is a call on 42.
        'FLOAT_LIT      : /-?/ DIGIT+ "." DIGIT* EXPONENT? | /-?/ DIGIT* "." DIGIT+ EXPONENT?',
        'FLOAT_LIT      : /-?/ DIGIT* "." DIGIT+ EXPONENT?',
    ),
)

#: String terminals: any backslash pair is lexed as an escape; :func:`string_literal` then
#: accepts only cel-spec's escapes (``\\[abfnrtv"'\\?`]``, ``\\[0-3][0-7][0-7]``, ``\\[xX]HH``,
#: ``\\uHHHH``, ``\\UHHHHHHHH``), so an invalid escape is a compile error naming it.
_STRING_TERMINALS = (
    'STRING_LIT     : /[rR]?"(?:\\\\.|[^"\\\\\\n\\r])*"/\n'
    "               | /[rR]?'(?:\\\\.|[^'\\\\\\n\\r])*'/\n\n"
    'MLSTRING_LIT   : /[rR]?"""(?:\\\\.|[^\\\\])*?"""/\n'
    "               | /[rR]?'''(?:\\\\.|[^\\\\])*?'''/\n"
)


def _grammar() -> str:
    text = (Path(celpy.__file__).parent / "cel.lark").read_text(encoding="utf-8")
    for old, new in _PATCHES:
        if old not in text:
            raise RuntimeError(f"cel-python's grammar changed: cannot patch {old!r}")
        text = text.replace(old, new)
    start = text.index("\nSTRING_LIT     :") + 1
    end = text.index("\nBYTES_LIT      :") + 1
    return text[:start] + _STRING_TERMINALS + "\n" + text[end:]


def _bool_literals(token: lark.Token) -> lark.Token:
    if token.value in ("true", "false"):
        return lark.Token("BOOL_LIT", token.value)
    return token


_LARK: lark.Lark | None = None


def _lark() -> lark.Lark:
    global _LARK
    if _LARK is None:
        _LARK = lark.Lark(
            _grammar(),
            parser="lalr",
            start="expr",
            g_regex_flags=re.M,
            lexer_callbacks={"IDENT": _bool_literals},
            propagate_positions=True,
            maybe_placeholders=False,
            priority="invert",
        )
    return _LARK


def parse(expression: str) -> lark.Tree[Any]:
    """The parse tree of ``expression``; :class:`CelCompileError` (``Syntax error: ...``, with
    line and column) when it does not parse."""
    parser = _lark()
    try:
        return parser.parse(expression)
    except lark.exceptions.UnexpectedInput as exc:
        found = getattr(exc, "token", None)
        if found is not None and str(found):
            detail = f"mismatched input {str(found)!r}"
        elif isinstance(exc, lark.exceptions.UnexpectedCharacters):
            where = exc.pos_in_stream or 0
            detail = f"token recognition error at: {expression[where : where + 1]!r}"
        else:
            detail = "unexpected end of input"
        raise CelCompileError(
            expression, f"Syntax error: {detail}", exc.line or 1, exc.column or 1
        ) from None
    except lark.exceptions.LarkError as exc:
        raise CelCompileError(expression, f"Syntax error: {exc}") from None


def field_name(token: lark.Token) -> str:
    """The field a selection names: an ``IDENT``, or an ``ESC_IDENT`` without its backticks."""
    text = str(token)
    return text[1:-1] if token.type == "ESC_IDENT" else text


# --- literals ---------------------------------------------------------------------------------

_SIMPLE_ESCAPES = {
    "a": 7,
    "b": 8,
    "f": 12,
    "n": 10,
    "r": 13,
    "t": 9,
    "v": 11,
    "\\": 92,
    "?": 63,
    '"': 34,
    "'": 39,
    "`": 96,
}


def _unquote(text: str) -> tuple[str, bool]:
    """The body of a string token without prefix and quotes, and whether it is raw."""
    raw = text[0] in "rR"
    if raw:
        text = text[1:]
    quote = 3 if text[:3] in ('"""', "'''") else 1
    return text[quote:-quote], raw


def _decode(body: str, as_bytes: bool) -> list[int]:
    """Code points (strings) or octets (bytes) of a string body, with cel-go's escape rules:
    octal and hex escapes are code points in strings and octets in bytes; ``\\u``/``\\U`` must
    name a Unicode scalar value (no surrogates)."""
    out: list[int] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch != "\\":
            out.extend(ch.encode("utf-8", "surrogatepass") if as_bytes else [ord(ch)])
            i += 1
            continue
        if i + 1 >= n:
            raise ValueError("invalid escape at end of string")
        kind = body[i + 1]
        if kind in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[kind])
            i += 2
        elif kind in "xX":
            out.append(int(body[i + 2 : i + 4], 16))
            i += 4
        elif kind in "01234567":
            digits = body[i + 1 : i + 4]
            if not re.fullmatch(r"[0-3][0-7]{2}", digits):
                raise ValueError(f"invalid octal escape \\{digits}")
            out.append(int(digits, 8))
            i += 4
        elif kind in "uU":
            width = 4 if kind == "u" else 8
            digits = body[i + 2 : i + 2 + width]
            if not re.fullmatch(f"[0-9a-fA-F]{{{width}}}", digits):
                raise ValueError(f"invalid unicode escape \\{kind}{digits}")
            code = int(digits, 16)
            if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
                raise ValueError(f"invalid unicode code point \\{kind}{digits}")
            out.extend(chr(code).encode("utf-8") if as_bytes else [code])
            i += 2 + width
        else:
            raise ValueError(f"invalid escape sequence \\{kind}")
    return out


def string_literal(text: str) -> str:
    """The value of a ``STRING_LIT``/``MLSTRING_LIT`` token (``ValueError`` if invalid)."""
    body, raw = _unquote(text)
    if raw:
        return body
    return "".join(chr(c) for c in _decode(body, as_bytes=False))


def bytes_literal(text: str) -> bytes:
    """The value of a ``BYTES_LIT`` token (``ValueError`` if invalid)."""
    body, raw = _unquote(text[1:])
    if raw:
        return body.encode("utf-8")
    return bytes(_decode(body, as_bytes=True))
