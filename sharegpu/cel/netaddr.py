"""The ``net.IP`` and ``net.CIDR`` CEL types of Kubernetes (``library/ip.go``, ``cidr.go``).

Parsing follows Go's ``net/netip`` exactly, error texts included, because Kubernetes reports
them verbatim: IPv4 is four decimal octets without leading zeros, IPv6 the RFC 4291 text
forms (an embedded IPv4 tail included). On top of that Kubernetes refuses IPv6 zones and
IPv4-mapped IPv6 addresses. Printing is Go's: RFC 5952 for IPv6 (lower-case hex, the longest
run of two or more zero fields, the first on ties, shortened to ``::``).

Invariant: an :class:`IP` holds 4 or 16 bytes; a :class:`CIDR` holds an :class:`IP` and a
prefix length within its family's bit count. Equality is by value (a CIDR by address and
length, not masked first), as in Go.
"""

from __future__ import annotations

from .errors import CelEvalError


class AddressError(ValueError):
    """A string that is no IP address or prefix; the message is Go's."""


def _addr_error(text: str, msg: str, at: str | None = None) -> AddressError:
    suffix = f" (at {_go_quote(at)})" if at is not None else ""
    return AddressError(f"ParseAddr({_go_quote(text)}): {msg}{suffix}")


def _go_quote(s: str) -> str:
    """Go's ``strconv.Quote`` for the printable ASCII texts these errors carry."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _parse_ipv4_fields(text: str, part: str) -> bytes:
    fields: list[int] = []
    val = 0
    digits = 0
    for i, ch in enumerate(part):
        if "0" <= ch <= "9":
            if digits == 1 and val == 0:
                raise _addr_error(text, "IPv4 field has octet with leading zero")
            val = val * 10 + ord(ch) - 48
            digits += 1
            if val > 255:
                raise _addr_error(text, "IPv4 field has value >255")
        elif ch == ".":
            if i == 0 or i == len(part) - 1 or part[i - 1] == ".":
                raise _addr_error(text, "IPv4 field must have at least one digit", part[i:])
            if len(fields) == 3:
                raise _addr_error(text, "IPv4 address too long")
            fields.append(val)
            val = 0
            digits = 0
        else:
            raise _addr_error(text, "unexpected character", part[i:])
    if len(fields) < 3:
        raise _addr_error(text, "IPv4 address too short")
    fields.append(val)
    return bytes(fields)


def _hex_value(ch: str) -> int:
    if "0" <= ch <= "9":
        return ord(ch) - 48
    if "a" <= ch <= "f":
        return ord(ch) - 87
    if "A" <= ch <= "F":
        return ord(ch) - 55
    return -1


def _parse_ipv6(text: str) -> tuple[bytes, str]:
    s = text
    zone = ""
    pct = s.find("%")
    if pct != -1:
        s, zone = s[:pct], s[pct + 1 :]
        if zone == "":
            raise _addr_error(text, "zone must be a non-empty string")
    ip = bytearray(16)
    ellipsis = -1
    if s.startswith("::"):
        ellipsis = 0
        s = s[2:]
        if not s:
            return bytes(ip), zone
    i = 0
    while i < 16:
        off = 0
        acc = 0
        while off < len(s):
            digit = _hex_value(s[off])
            if digit < 0:
                break
            acc = (acc << 4) + digit
            if off > 3:
                raise _addr_error(
                    text, "each colon-separated field must have at most 4 hex digits", s
                )
            if acc > 0xFFFF:
                raise _addr_error(text, "IPv6 field has value >=2^16", s)
            off += 1
        if off == 0:
            raise _addr_error(text, "each colon-separated field must have at least one digit", s)
        if off < len(s) and s[off] == ".":
            if ellipsis < 0 and i != 12:
                raise _addr_error(
                    text, "embedded IPv4 address must replace the final 2 fields of the address", s
                )
            if i + 4 > 16:
                raise _addr_error(
                    text, "too many hex fields to fit an embedded IPv4 at the end of the address", s
                )
            ip[i : i + 4] = _parse_ipv4_fields(text, s)
            s = ""
            i += 4
            break
        ip[i] = acc >> 8
        ip[i + 1] = acc & 0xFF
        i += 2
        s = s[off:]
        if not s:
            break
        if s[0] != ":":
            raise _addr_error(text, "unexpected character, want colon", s)
        if len(s) == 1:
            raise _addr_error(text, "colon must be followed by more characters", s)
        s = s[1:]
        if s[0] == ":":
            if ellipsis >= 0:
                raise _addr_error(text, "multiple :: in address", s)
            ellipsis = i
            s = s[1:]
            if not s:
                break
    if s:
        raise _addr_error(text, "trailing garbage after address", s)
    if i < 16:
        if ellipsis < 0:
            raise _addr_error(text, "address string too short")
        n = 16 - i
        ip[ellipsis + n : 16] = ip[ellipsis:i]
        ip[ellipsis : ellipsis + n] = bytes(n)
    elif ellipsis >= 0:
        raise _addr_error(text, "the :: must expand to at least one field of zeros", s)
    return bytes(ip), zone


def parse_addr(text: str) -> tuple[bytes, str]:
    """Go's ``netip.ParseAddr``: the address bytes (4 or 16) and the IPv6 zone."""
    for ch in text:
        if ch == ".":
            return _parse_ipv4_fields(text, text), ""
        if ch == ":":
            return _parse_ipv6(text)
        if ch == "%":
            raise _addr_error(text, "missing IPv6 address")
    raise _addr_error(text, "unable to parse IP")


def _is_4in6(raw: bytes) -> bool:
    return len(raw) == 16 and raw[:12] == b"\x00" * 10 + b"\xff\xff"


def _format(raw: bytes) -> str:
    if len(raw) == 4:
        return ".".join(str(b) for b in raw)
    if _is_4in6(raw):
        return "::ffff:" + ".".join(str(b) for b in raw[12:])
    groups = [raw[i] << 8 | raw[i + 1] for i in range(0, 16, 2)]
    best_start, best_len, start = -1, 0, -1
    for i, g in enumerate([*groups, 1]):
        if g == 0 and i < 8:
            if start < 0:
                start = i
        elif start >= 0:
            if i - start > best_len:
                best_start, best_len = start, i - start
            start = -1
    if best_len < 2:
        return ":".join(f"{g:x}" for g in groups)
    head = ":".join(f"{g:x}" for g in groups[:best_start])
    tail = ":".join(f"{g:x}" for g in groups[best_start + best_len :])
    return f"{head}::{tail}"


class IP:
    """A Kubernetes ``net.IP`` value (no zone, never IPv4-mapped IPv6)."""

    __slots__ = ("raw",)
    cel_type_name = "net.IP"

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    @classmethod
    def parse(cls, text: str) -> IP:
        """Kubernetes' ``ip()``; :class:`CelEvalError` with Kubernetes' message when invalid."""
        try:
            return cls(_checked_addr(text))
        except AddressError as exc:
            raise CelEvalError(str(exc)) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IP) and self.raw == other.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"ip({str(self)!r})"

    def __str__(self) -> str:
        return _format(self.raw)

    @property
    def family(self) -> int:
        """4 or 6."""
        return 4 if len(self.raw) == 4 else 6

    def is_unspecified(self) -> bool:
        """``0.0.0.0`` or ``::``."""
        return not any(self.raw)

    def is_loopback(self) -> bool:
        """``127.0.0.0/8`` or ``::1``."""
        if len(self.raw) == 4:
            return self.raw[0] == 127
        return self.raw == bytes(15) + b"\x01"

    def is_link_local_multicast(self) -> bool:
        """``224.0.0.0/24`` or ``ff02::/16``."""
        if len(self.raw) == 4:
            return self.raw[:3] == b"\xe0\x00\x00"
        return self.raw[0] == 0xFF and self.raw[1] & 0x0F == 0x02

    def is_link_local_unicast(self) -> bool:
        """``169.254.0.0/16`` or ``fe80::/10``."""
        if len(self.raw) == 4:
            return self.raw[:2] == b"\xa9\xfe"
        return self.raw[0] == 0xFE and self.raw[1] & 0xC0 == 0x80

    def is_global_unicast(self) -> bool:
        """Go's ``IsGlobalUnicast``: not unspecified, loopback, multicast, link-local or the
        IPv4 broadcast address (private ranges count as global, as in Go)."""
        if len(self.raw) == 4 and self.raw == b"\xff\xff\xff\xff":
            return False
        multicast = (
            self.raw[0] >= 0xE0 and self.raw[0] < 0xF0
            if len(self.raw) == 4
            else (self.raw[0] == 0xFF)
        )
        return not (
            self.is_unspecified() or self.is_loopback() or multicast or self.is_link_local_unicast()
        )


def _checked_addr(text: str) -> bytes:
    """Kubernetes' ``parseIPAddr``: Go's parser, then no zone and no IPv4-mapped IPv6."""
    try:
        raw, zone = parse_addr(text)
    except AddressError as exc:
        raise AddressError(
            f"IP Address {_go_quote(text)} parse error during conversion from string: {exc}"
        ) from None
    if zone:
        raise AddressError(f"IP address {_go_quote(text)} with zone value is not allowed")
    if _is_4in6(raw):
        raise AddressError(f"IPv4-mapped IPv6 address {_go_quote(text)} is not allowed")
    return raw


def is_ip(text: str) -> bool:
    """Kubernetes' ``isIP``."""
    try:
        _checked_addr(text)
    except AddressError:
        return False
    return True


def is_canonical_ip(text: str) -> bool:
    """Kubernetes' ``ip.isCanonical``: the text is how Go prints the address."""
    return str(IP.parse(text)) == text


def _mask(raw: bytes, bits: int) -> bytes:
    out = bytearray(raw)
    for i in range(len(out)):
        keep = max(0, min(8, bits - 8 * i))
        out[i] &= (0xFF << (8 - keep)) & 0xFF
    return bytes(out)


def _prefix_error(text: str, msg: str) -> AddressError:
    return AddressError(f"netip.ParsePrefix({_go_quote(text)}): {msg}")


def parse_prefix(text: str) -> tuple[bytes, int]:
    """Go's ``netip.ParsePrefix``: the address bytes and the prefix length."""
    slash = text.rfind("/")
    if slash < 0:
        raise _prefix_error(text, "no '/'")
    try:
        raw, zone = parse_addr(text[:slash])
    except AddressError as exc:
        raise _prefix_error(text, str(exc)) from None
    if zone:
        raise _prefix_error(text, "IPv6 zones cannot be present in a prefix")
    bits_text = text[slash + 1 :]
    bad_bits = "bad bits after slash: " + _go_quote(bits_text)
    if len(bits_text) > 1 and not "1" <= bits_text[0] <= "9":
        raise _prefix_error(text, bad_bits)
    if not bits_text or not all("0" <= c <= "9" for c in bits_text):
        raise _prefix_error(text, bad_bits)
    bits = int(bits_text)
    if not 0 <= bits <= 8 * len(raw):
        raise _prefix_error(text, "prefix length out of range")
    return raw, bits


class CIDR:
    """A Kubernetes ``net.CIDR`` value: an address (not necessarily masked) and a length."""

    __slots__ = ("bits", "ip")
    cel_type_name = "net.CIDR"

    def __init__(self, ip: IP, bits: int) -> None:
        self.ip = ip
        self.bits = bits

    @classmethod
    def parse(cls, text: str) -> CIDR:
        """Kubernetes' ``cidr()``; :class:`CelEvalError` with Kubernetes' message."""
        try:
            raw, bits = _checked_prefix(text)
        except AddressError as exc:
            raise CelEvalError(
                f"network address parse error during conversion from string: {exc}"
            ) from None
        return cls(IP(raw), bits)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDR) and self.ip == other.ip and self.bits == other.bits

    def __hash__(self) -> int:
        return hash((self.ip, self.bits))

    def __repr__(self) -> str:
        return f"cidr({str(self)!r})"

    def __str__(self) -> str:
        return f"{self.ip}/{self.bits}"

    def masked(self) -> CIDR:
        """The prefix with the host bits cleared."""
        return CIDR(IP(_mask(self.ip.raw, self.bits)), self.bits)

    def contains_ip(self, ip: IP) -> bool:
        """Whether ``ip`` (same family) lies in the prefix."""
        raw = ip.raw
        return len(raw) == len(self.ip.raw) and _mask(raw, self.bits) == _mask(
            self.ip.raw, self.bits
        )

    def contains_cidr(self, other: CIDR) -> bool:
        """Whether ``other`` overlaps this prefix and is no shorter (Kubernetes' rule)."""
        if len(other.ip.raw) != len(self.ip.raw):
            return False
        common = min(self.bits, other.bits)
        overlaps = _mask(self.ip.raw, common) == _mask(other.ip.raw, common)
        return overlaps and self.bits <= other.bits


def _checked_prefix(text: str) -> tuple[bytes, int]:
    """Kubernetes' ``parseCIDR``: Go's parser, then no IPv4-mapped IPv6 address."""
    try:
        raw, bits = parse_prefix(text)
    except AddressError as exc:
        raise AddressError(
            f"network address parse error during conversion from string: {exc}"
        ) from None
    if _is_4in6(raw):
        raise AddressError(f"IPv4-mapped IPv6 address {_go_quote(text)} is not allowed")
    return raw, bits


def is_cidr(text: str) -> bool:
    """Kubernetes' ``isCIDR``."""
    try:
        _checked_prefix(text)
    except AddressError:
        return False
    return True
