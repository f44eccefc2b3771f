"""The injection webhook's TLS: a CA and a serving certificate per operator process, and the
CA bundle the API server trusts.

No cert-manager, and no Secret holding a CA key: each replica makes its own CA and serving
certificate when it starts (and again before the certificate's last third), keeps the keys
in memory only, and adds its CA to the bundle of the MutatingWebhookConfiguration
(``bundle_with``), which keeps every CA still valid up to ``BUNDLE_SIZE``. Two replicas
behind one Service are then both trusted; a replica that restarts puts its new CA beside the
old one, and the old one ages out. Whoever can read the cluster's Secrets cannot forge the
webhook: its key was never written anywhere.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LIFETIME = timedelta(days=365)
"""How long a serving certificate (and its CA) is valid."""
RENEW_AFTER = LIFETIME * 2 / 3
"""A replica issues itself a new pair this long after the last one (the old CA stays in the
bundle until it expires, so connections made meanwhile keep verifying)."""
BUNDLE_SIZE = 8
"""CAs kept in the bundle, newest first: every live replica's, with room for restarts."""
_CA_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
    data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
)  # fmt: skip
_BACKDATE = timedelta(minutes=5)
"""Certificates start a little in the past: clocks of the nodes and the API server differ."""


@dataclass(frozen=True, slots=True)
class ServingCertificate:
    """A CA and the serving certificate it signed, PEM; the key of the latter only."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    issued: datetime

    def ssl_context(self) -> ssl.SSLContext:
        """A server context with this certificate (TLS 1.2 at least, as the API server speaks)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        load(context, self)
        return context


def load(context: ssl.SSLContext, certificate: ServingCertificate) -> None:
    """Put ``certificate`` into ``context``: new handshakes use it, open connections keep theirs.

    ``load_cert_chain`` reads files only: the PEMs pass through a private temporary file
    that is removed at once (the root filesystem is read-only; /tmp is the pod's emptyDir).
    """
    fd, path = tempfile.mkstemp(prefix="slogate-webhook-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(certificate.key_pem + certificate.cert_pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


def issue(hosts: Sequence[str], now: datetime) -> ServingCertificate:
    """A new CA and a serving certificate for ``hosts`` (DNS names or IP addresses), from ``now``."""
    start, end = now - _BACKDATE, now + LIFETIME
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"slogate-webhook-ca-{now:%Y%m%d%H%M%S}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ServingCertificate(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        issued=now,
    )


def bundle_with(bundle: bytes, ca_pem: bytes, now: datetime) -> bytes:
    """``bundle`` with ``ca_pem`` in it, expired CAs out, at most BUNDLE_SIZE: this one first,
    then the newest.

    Anything in the bundle that does not parse is dropped: the API server would refuse
    every call with a bundle it cannot read.
    """
    try:
        found = x509.load_pem_x509_certificates(bundle) if bundle.strip() else []
    except ValueError:
        found = []
    mine = x509.load_pem_x509_certificate(ca_pem)
    kept = [c for c in found if c.not_valid_after_utc > now and c != mine]
    ordered = [mine, *sorted(kept, key=lambda c: c.not_valid_before_utc, reverse=True)]
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in ordered[:BUNDLE_SIZE])


def trusts(bundle: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca_pem`` is one of the bundle's CAs."""
    try:
        found = x509.load_pem_x509_certificates(bundle) if bundle.strip() else []
    except ValueError:
        return False
    return x509.load_pem_x509_certificate(ca_pem) in found
