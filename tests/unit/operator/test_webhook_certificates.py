"""The injection webhook's certificates: a serving certificate its CA verifies for the names
the API server dials, and the CA bundle every replica shares (theirs kept, expired ones out)."""

from __future__ import annotations

import asyncio
import ssl
from datetime import UTC, datetime, timedelta

from cryptography import x509

from slogate_operator import certificates

NOW = datetime(2026, 12, 5, tzinfo=UTC)


def test_the_serving_certificate_verifies_against_its_ca_for_each_name() -> None:
    issued = certificates.issue(["127.0.0.1"], datetime.now(UTC))
    server = issued.ssl_context()

    async def handshake() -> str:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        listening = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
        port = listening.sockets[0].getsockname()[1]
        client = ssl.create_default_context(cadata=issued.ca_pem.decode())
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        text = (await reader.read()).decode()
        writer.close()
        listening.close()
        return text

    assert asyncio.run(handshake()) == "ok"
    names = x509.load_pem_x509_certificate(issued.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert [str(ip) for ip in names.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    service = certificates.issue(["hook.slogate-system.svc", "hook.slogate-system.svc.cluster.local"], NOW)
    dns = x509.load_pem_x509_certificate(service.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert dns.value.get_values_for_type(x509.DNSName) == ["hook.slogate-system.svc",
                                                           "hook.slogate-system.svc.cluster.local"]  # fmt: skip


def test_the_bundle_keeps_every_replicas_ca_drops_the_expired_and_caps_its_size() -> None:
    old = certificates.issue(["a"], NOW - certificates.LIFETIME - timedelta(days=1))  # expired by NOW
    replicas = [certificates.issue(["a"], NOW - timedelta(hours=h)) for h in range(12, 0, -1)]
    bundle = certificates.bundle_with(b"not a certificate", old.ca_pem, NOW - certificates.LIFETIME)
    for replica in replicas:
        bundle = certificates.bundle_with(bundle, replica.ca_pem, NOW)
    assert not certificates.trusts(bundle, old.ca_pem)  # expired
    kept = [certificates.trusts(bundle, r.ca_pem) for r in replicas]
    assert kept == [False] * 4 + [True] * certificates.BUNDLE_SIZE  # the newest eight
    again = certificates.bundle_with(bundle, replicas[-1].ca_pem, NOW)
    assert again == bundle  # adding a CA it holds changes nothing (its place first kept)
    assert certificates.trusts(certificates.bundle_with(bundle, replicas[0].ca_pem, NOW), replicas[0].ca_pem)
