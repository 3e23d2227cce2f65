"""Kubernetes' IP, CIDR and URL libraries as CEL functions (Kubernetes 1.30+ for IP/CIDR).

Thin wrappers that check argument types (``no such overload`` otherwise) around
:mod:`sharegpu.cel.netaddr` and :mod:`sharegpu.cel.urls`, which hold the parsing rules.
"""

from __future__ import annotations

from typing import Any

from .netaddr import CIDR, IP, is_canonical_ip, is_cidr, is_ip
from .urls import URL, UrlError, parse_url
from .values import no_overload


def _string(op: str, value: Any) -> str:
    if not isinstance(value, str):
        raise no_overload(op, value)
    return value


def _ip(op: str, value: Any) -> IP:
    if not isinstance(value, IP):
        raise no_overload(op, value)
    return value


def _cidr(op: str, value: Any, *rest: Any) -> CIDR:
    if not isinstance(value, CIDR):
        raise no_overload(op, value, *rest)
    return value


def _url(op: str, value: Any) -> URL:
    if not isinstance(value, URL):
        raise no_overload(op, value)
    return value


def ip(text: Any) -> IP:
    """``ip('10.0.0.1')``."""
    return IP.parse(_string("ip", text))


def is_ip_(text: Any) -> bool:
    """``isIP(s)``."""
    return is_ip(_string("isIP", text))


def ip_is_canonical(text: Any) -> bool:
    """``ip.isCanonical(s)``: an error when ``s`` is no IP."""
    return is_canonical_ip(_string("ip.isCanonical", text))


def family(value: Any) -> int:
    """``ip.family()``: 4 or 6."""
    return _ip("family", value).family


def is_unspecified(value: Any) -> bool:
    """``ip.isUnspecified()``."""
    return _ip("isUnspecified", value).is_unspecified()


def is_loopback(value: Any) -> bool:
    """``ip.isLoopback()``."""
    return _ip("isLoopback", value).is_loopback()


def is_link_local_multicast(value: Any) -> bool:
    """``ip.isLinkLocalMulticast()``."""
    return _ip("isLinkLocalMulticast", value).is_link_local_multicast()


def is_link_local_unicast(value: Any) -> bool:
    """``ip.isLinkLocalUnicast()``."""
    return _ip("isLinkLocalUnicast", value).is_link_local_unicast()


def is_global_unicast(value: Any) -> bool:
    """``ip.isGlobalUnicast()``."""
    return _ip("isGlobalUnicast", value).is_global_unicast()


def cidr(text: Any) -> CIDR:
    """``cidr('10.0.0.0/8')``."""
    return CIDR.parse(_string("cidr", text))


def is_cidr_(text: Any) -> bool:
    """``isCIDR(s)``."""
    return is_cidr(_string("isCIDR", text))


def contains_ip(value: Any, other: Any) -> bool:
    """``cidr.containsIP(ip or string)``."""
    prefix = _cidr("containsIP", value, other)
    if isinstance(other, str):
        other = IP.parse(other)
    if not isinstance(other, IP):
        raise no_overload("containsIP", value, other)
    return prefix.contains_ip(other)


def contains_cidr(value: Any, other: Any) -> bool:
    """``cidr.containsCIDR(cidr or string)``."""
    prefix = _cidr("containsCIDR", value, other)
    if isinstance(other, str):
        other = CIDR.parse(other)
    if not isinstance(other, CIDR):
        raise no_overload("containsCIDR", value, other)
    return prefix.contains_cidr(other)


def cidr_ip(value: Any) -> IP:
    """``cidr.ip()``: the address as written (not masked)."""
    return _cidr("ip", value).ip


def masked(value: Any) -> CIDR:
    """``cidr.masked()``."""
    return _cidr("masked", value).masked()


def prefix_length(value: Any) -> int:
    """``cidr.prefixLength()``."""
    return _cidr("prefixLength", value).bits


def url(text: Any) -> URL:
    """``url('https://example.com/x')``."""
    return URL.parse(_string("url", text))


def is_url(text: Any) -> bool:
    """``isURL(s)``: what Go's ``url.ParseRequestURI`` accepts."""
    try:
        parse_url(_string("isURL", text), via_request=True)
    except UrlError:
        return False
    return True


def get_scheme(value: Any) -> str:
    """``url.getScheme()``."""
    return _url("getScheme", value).scheme


def get_host(value: Any) -> str:
    """``url.getHost()``: host and port, IPv6 in brackets."""
    return _url("getHost", value).host


def get_hostname(value: Any) -> str:
    """``url.getHostname()``."""
    return _url("getHostname", value).hostname()


def get_port(value: Any) -> str:
    """``url.getPort()``."""
    return _url("getPort", value).port()


def get_escaped_path(value: Any) -> str:
    """``url.getEscapedPath()``."""
    return _url("getEscapedPath", value).escaped_path()


def get_query(value: Any) -> dict[str, list[str]]:
    """``url.getQuery()``: each key's values in order."""
    return _url("getQuery", value).query()
