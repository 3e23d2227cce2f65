"""Kubernetes' named-format library (base environment since 1.31): ``format.named(name)``,
``format.dns1123Label()``, ... and ``<format>.validate(s)``.

``validate`` returns ``optional.none()`` for a valid string, otherwise ``optional.of`` the list
of the messages Kubernetes' validators give (apimachinery's ``util/validation`` and
``api/validate/content``, kube-openapi's ``strfmt``, Go's ``url.ParseRequestURI``), word for
word: a rule's message is part of what an expression can read. Invariant: :data:`FORMATS`
holds exactly the names Kubernetes' ``ConstantFormats`` declares, and each
:class:`NamedFormat` is immutable, so the values are shared.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any

from .errors import CelEvalError
from .optional import NONE, OptionalValue
from .strformat import go_quote
from .urls import UrlError, parse_url
from .values import no_overload

__all__ = ["FORMATS", "NamedFormat", "format_named", "validate"]

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = _DNS1123_LABEL + "(\\." + _DNS1123_LABEL + ")*"
_DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_LABEL_KEY = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(" + _LABEL_KEY + ")?"
_UUID = re.compile("[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.I)
_BASE64 = re.compile(
    r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})"
)
_FULL_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery's ``RegexError`` (its odd ``', '`` before each ``or`` included)."""
    if not examples:
        return f"{message} (regex used for validation is '{pattern}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _matches(pattern: str, value: str) -> bool:
    """Go's ``regexp.MustCompile("^" + pattern + "$").MatchString``: the whole string."""
    return re.fullmatch(pattern, value) is not None


def _max_len_error(length: int, unit: str) -> str:
    # util/validation says "characters", api/validate/content "bytes".
    return f"must be no more than {length} {unit}"


def _byte_len(value: str) -> int:
    return len(value.encode("utf-8"))


def is_dns1123_label(value: str) -> list[str]:
    """apimachinery ``IsDNS1123Label``."""
    errors = []
    if _byte_len(value) > 63:
        errors.append(_max_len_error(63, "characters"))
    if not _matches(_DNS1123_LABEL, value):
        if _matches(_DNS1123_SUBDOMAIN, value):
            errors.append("must not contain dots")
        else:
            errors.append(
                _regex_error(
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                    "characters or '-', and must start and end with an alphanumeric character",
                    _DNS1123_LABEL,
                    "my-name",
                    "123-abc",
                )
            )
    return errors


def is_dns1123_subdomain(value: str, unit: str = "characters") -> list[str]:
    """apimachinery ``IsDNS1123Subdomain`` (``unit``: its length message's wording)."""
    errors = []
    if _byte_len(value) > 253:
        errors.append(_max_len_error(253, unit))
    if not _matches(_DNS1123_SUBDOMAIN, value):
        errors.append(
            _regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character",
                _DNS1123_SUBDOMAIN,
                "example.com",
            )
        )
    return errors


def is_dns1035_label(value: str) -> list[str]:
    """apimachinery ``IsDNS1035Label``."""
    errors = []
    if _byte_len(value) > 63:
        errors.append(_max_len_error(63, "characters"))
    if not _matches(_DNS1035_LABEL, value):
        errors.append(
            _regex_error(
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character",
                _DNS1035_LABEL,
                "my-name",
                "abc-123",
            )
        )
    return errors


_LABEL_KEY_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)


def is_qualified_name(value: str) -> list[str]:
    """apimachinery ``content.IsLabelKey``: an optional DNS subdomain prefix and ``/``, then
    a name of at most 63 bytes."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a valid label key "
            + _regex_error(_LABEL_KEY_MESSAGE, _LABEL_KEY, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + m for m in is_dns1123_subdomain(prefix, "bytes")]
    if not name:
        errors.append("name part must be non-empty")
    elif _byte_len(name) > 63:
        errors.append("name part " + _max_len_error(63, "bytes"))
    if not _matches(_LABEL_KEY, name):
        errors.append(
            "name part "
            + _regex_error(_LABEL_KEY_MESSAGE, _LABEL_KEY, "MyName", "my.name", "123-abc")
        )
    return errors


def is_label_value(value: str) -> list[str]:
    """apimachinery ``content.IsLabelValue``."""
    errors = []
    if _byte_len(value) > 63:
        errors.append(_max_len_error(63, "bytes"))
    if not _matches(_LABEL_VALUE, value):
        errors.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                _LABEL_VALUE,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errors


def _mask_trailing_dash(name: str) -> str:
    """apimachinery ``maskTrailingDash`` for generateName prefixes: a trailing ``-`` makes
    the last two characters ``a`` (Go's ``name[:len(name)-2] + "a"``, bytes)."""
    if name.endswith("-"):
        raw = name.encode("utf-8")
        if len(raw) < 2:
            # Go slices name[:-1] here and panics; Kubernetes' CEL reports the panic as an
            # evaluation error, which the caller turns into one.
            raise ValueError("slice bounds out of range [:-1]")
        return raw[:-2].decode("utf-8", "replace") + "a"
    return name


def _prefixed(check: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    return lambda value: check(_mask_trailing_dash(value))


def _is_uri(value: str) -> list[str]:
    try:
        parse_url(value, via_request=True)
    except UrlError as exc:
        # Go's url.Error: parse "<the string, %q-quoted>": <reason>
        return [f"parse {go_quote(value)}: {exc}"]
    return []


def _is_uuid(value: str) -> list[str]:
    return [] if _UUID.fullmatch(value) else ["does not match the UUID format"]


def _is_byte(value: str) -> list[str]:
    return [] if _BASE64.fullmatch(value) else ["invalid base64"]


def _is_full_date(text: str) -> bool:
    """Go's ``time.Parse("2006-01-02", text)`` succeeds."""
    match = _FULL_DATE.fullmatch(text)
    if match is None:
        return False
    try:
        date(*(int(part) for part in match.groups()))
    except ValueError:
        return False
    return True


def _is_date(value: str) -> list[str]:
    return [] if _is_full_date(value) else ["invalid date"]


def _is_datetime(value: str) -> list[str]:
    """kube-openapi ``strfmt.IsDateTime``: a full date, ``t``, then a time of day with an
    offset, compared field by field as strings."""
    parts = value.lower().split("t")
    valid = len(value) >= 4 and len(parts) >= 2 and _is_full_date(parts[0])
    if valid:
        match = _TIME.fullmatch(parts[1])
        valid = (
            match is not None
            and match.group(1) <= "23"
            and match.group(2) <= "59"
            and match.group(3) <= "59"
        )
    return [] if valid else ["invalid datetime"]


@dataclass(frozen=True)
class NamedFormat:
    """One of Kubernetes' named formats: a CEL value of type ``kubernetes.NamedFormat``."""

    name: str
    check: Callable[[str], list[str]]

    cel_type_name = "kubernetes.NamedFormat"

    def __repr__(self) -> str:
        return f"format.{self.name}()"


FORMATS: dict[str, NamedFormat] = {
    name: NamedFormat(name, check)
    for name, check in (
        ("dns1123Label", is_dns1123_label),
        ("dns1123Subdomain", is_dns1123_subdomain),
        ("dns1035Label", is_dns1035_label),
        ("qualifiedName", is_qualified_name),
        ("dns1123LabelPrefix", _prefixed(is_dns1123_label)),
        ("dns1123SubdomainPrefix", _prefixed(is_dns1123_subdomain)),
        ("dns1035LabelPrefix", _prefixed(is_dns1035_label)),
        ("labelValue", is_label_value),
        ("uri", _is_uri),
        ("uuid", _is_uuid),
        ("byte", _is_byte),
        ("date", _is_date),
        ("datetime", _is_datetime),
    )
}


def format_named(name: Any) -> OptionalValue:
    """``format.named(name)``: the format, or ``optional.none()`` for an unknown name."""
    if not isinstance(name, str):
        raise no_overload("format.named", name)
    found = FORMATS.get(name)
    return NONE if found is None else OptionalValue(found)


def validate(fmt: Any, value: Any) -> OptionalValue:
    """``<format>.validate(value)``: ``optional.none()`` when valid, else the messages."""
    if not isinstance(fmt, NamedFormat) or not isinstance(value, str):
        raise no_overload("validate", fmt, value)
    try:
        messages = fmt.check(value)
    except ValueError as exc:
        raise CelEvalError(f"runtime error: {exc}") from None
    return OptionalValue(messages) if messages else NONE
