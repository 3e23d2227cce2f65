"""The ``kubernetes.URL`` CEL type (``k8s.io/apiserver/pkg/cel/library/urls.go``).

Kubernetes accepts what Go's ``url.ParseRequestURI`` accepts (an absolute URI or an absolute
path, no fragment handling) and then keeps ``url.Parse``'s view of it. This module follows
those two Go parsers for the parts the CEL accessors expose: scheme (lower-cased), host
(with port, IPv6 in brackets), path (percent-decoded, re-escaped on demand) and raw query.

Invariant: a :class:`URL` only exists for a string ``isURL`` accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import CelEvalError

_UNRESERVED = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~")
_HOST_EXTRA = frozenset("!$&'()*+,;=:[]<>\"")
_USERINFO_EXTRA = frozenset("-._:~!$&'()*+,;=%@")
_PATH_KEEP = frozenset("$&+,/:;=@")
_ENCODED_PATH_OK = frozenset("!$&'()*+,;=:@[]")


class UrlError(ValueError):
    """A string Go's URL parser rejects; the message is Go's."""


def _should_escape_path(ch: str) -> bool:
    return not (ch in _UNRESERVED or ch in _PATH_KEEP)


def _should_escape_host(ch: str) -> bool:
    return not (ch in _UNRESERVED or ch in _HOST_EXTRA)


def _unescape(s: str, escape_check: Callable[[str], bool] | None = None) -> str:
    raw = bytearray()
    i = 0
    data = s.encode("utf-8", "surrogatepass")
    while i < len(data):
        c = data[i]
        if c == 0x25:  # '%'
            chunk = data[i : i + 3].decode("latin-1")
            if len(chunk) < 3 or not all(x in "0123456789abcdefABCDEF" for x in chunk[1:]):
                raise UrlError(f'invalid URL escape "{chunk}"')
            raw.append(int(chunk[1:], 16))
            i += 3
            continue
        if escape_check is not None and c < 0x80 and escape_check(chr(c)):
            raise UrlError(f'invalid character "{chr(c)}" in host name')
        raw.append(c)
        i += 1
    return raw.decode("utf-8", "surrogateescape")


def _escape_path(s: str) -> str:
    out = []
    for byte in s.encode("utf-8", "surrogateescape"):
        ch = chr(byte)
        out.append(f"%{byte:02X}" if byte >= 0x80 or _should_escape_path(ch) else ch)
    return "".join(out)


def _valid_encoded_path(s: str) -> bool:
    for ch in s:
        if ch in _ENCODED_PATH_OK or ch == "%":
            continue
        if ord(ch) >= 0x80 or _should_escape_path(ch):
            return False
    return True


def _valid_optional_port(port: str) -> bool:
    if port == "":
        return True
    return port[0] == ":" and all("0" <= c <= "9" for c in port[1:])


def _parse_host(host: str) -> str:
    if host.startswith("["):
        end = host.rfind("]")
        if end < 0:
            raise UrlError("missing ']' in host")
        colon_port = host[end + 1 :]
        if not _valid_optional_port(colon_port):
            raise UrlError(f'invalid port "{colon_port}" after host')
    else:
        colon = host.rfind(":")
        if colon != -1 and not _valid_optional_port(host[colon:]):
            raise UrlError(f'invalid port "{host[colon:]}" after host')
    return _unescape(host, _should_escape_host)


def _scheme(raw: str) -> tuple[str, str]:
    for i, ch in enumerate(raw):
        if ch.isascii() and ch.isalpha():
            continue
        if ch.isascii() and (ch.isdigit() or ch in "+-."):
            if i == 0:
                return "", raw
            continue
        if ch == ":":
            if i == 0:
                raise UrlError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


@dataclass(frozen=True)
class URL:
    """A parsed URL: the components the CEL accessors read."""

    text: str
    scheme: str = ""
    host: str = ""
    path: str = ""
    raw_path: str = ""
    raw_query: str = ""
    opaque: str = ""

    cel_type_name = "URL"

    @classmethod
    def parse(cls, text: str) -> URL:
        """Kubernetes' ``url()``; :class:`CelEvalError` with its message when invalid."""
        try:
            _parse(text, via_request=True)
            return _parse(text, via_request=False)
        except UrlError as exc:
            raise CelEvalError(
                f"URL parse error during conversion from string: parse {_quote(text)}: {exc}"
            ) from None

    def __str__(self) -> str:
        return self.text

    def hostname(self) -> str:
        """The host without port and without IPv6 brackets."""
        return _split_host_port(self.host)[0]

    def port(self) -> str:
        """The port digits, or ``''``."""
        return _split_host_port(self.host)[1]

    def escaped_path(self) -> str:
        """The path as written when that is a valid encoding of it, else re-escaped."""
        if self.raw_path and _valid_encoded_path(self.raw_path):
            try:
                if _unescape(self.raw_path) == self.path:
                    return self.raw_path
            except UrlError:
                pass
        if self.path == "*":
            return "*"
        return _escape_path(self.path)

    def query(self) -> dict[str, list[str]]:
        """Go's ``url.Query()``: ``&``-separated pairs, ``+`` as space; bad pairs skipped."""
        result: dict[str, list[str]] = {}
        for pair in self.raw_query.split("&"):
            if not pair or ";" in pair:
                continue
            key, _, value = pair.partition("=")
            try:
                k = _unescape(key.replace("+", " "))
                v = _unescape(value.replace("+", " "))
            except UrlError:
                continue
            result.setdefault(k, []).append(v)
        return result


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _split_host_port(host_port: str) -> tuple[str, str]:
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon != -1 and _valid_optional_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def parse_url(raw: str, via_request: bool) -> URL:
    """Go's ``url.ParseRequestURI`` (``via_request``) or ``url.Parse``; :class:`UrlError`."""
    return _parse(raw, via_request)


def _parse(raw: str, via_request: bool) -> URL:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise UrlError("net/url: invalid control character in URL")
    if raw == "" and via_request:
        raise UrlError("empty url")
    if raw == "*":
        return URL(raw, path="*")
    rest = raw
    if not via_request:
        rest, _, _fragment = rest.partition("#")
    scheme, rest = _scheme(rest)
    scheme = scheme.lower()
    raw_query = ""
    if rest.endswith("?") and rest.count("?") == 1:
        rest = rest[:-1]
    else:
        rest, _, raw_query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            return URL(raw, scheme=scheme, opaque=rest, raw_query=raw_query)
        if via_request:
            raise UrlError("invalid URI for request")
        if ":" in rest.partition("/")[0]:
            raise UrlError("first path segment in URL cannot contain colon")
    host = ""
    if (scheme or (not via_request and not rest.startswith("///"))) and rest.startswith("//"):
        authority, rest = rest[2:], ""
        slash = authority.find("/")
        if slash >= 0:
            authority, rest = authority[:slash], authority[slash:]
        at = authority.rfind("@")
        host = _parse_host(authority[at + 1 :] if at >= 0 else authority)
        if at >= 0 and not all(
            c in _USERINFO_EXTRA or (c.isascii() and c.isalnum()) for c in authority[:at]
        ):
            raise UrlError("net/url: invalid userinfo")
    path = _unescape(rest)
    raw_path = rest if _escape_path(path) != rest else ""
    return URL(raw, scheme=scheme, host=host, path=path, raw_path=raw_path, raw_query=raw_query)
