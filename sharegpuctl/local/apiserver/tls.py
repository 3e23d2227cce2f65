"""A throw-away serving certificate for the in-process API server.

kubectl sends a bearer token only over TLS, so a server that requires one must serve HTTPS.
:func:`self_signed` makes an ECDSA P-256 key and a certificate for ``127.0.0.1`` and
``localhost``, valid for a day, that is its own CA: clients trust exactly this certificate
(the kubeconfig's ``certificate-authority-data``). Nothing is written to disk here.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=1)


@dataclass(frozen=True)
class ServingCert:
    """A certificate (PEM) and its private key (PEM, unencrypted)."""

    cert_pem: bytes
    key_pem: bytes

    def server_context(self) -> ssl.SSLContext:
        """A TLS 1.2+ server context serving this certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.TemporaryDirectory(prefix="sharegpu-apiserver-tls-") as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_bytes(self.cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(self.key_pem)
            context.load_cert_chain(cert, key)
        return context


def self_signed(host: str) -> ServingCert:
    """A certificate for ``host`` (an IP address), ``127.0.0.1`` and ``localhost``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sharegpu-demo-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    addresses = {ipaddress.ip_address(host), ipaddress.ip_address("127.0.0.1")}
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    *(x509.IPAddress(a) for a in sorted(addresses, key=str)),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return ServingCert(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
