"""The injection webhook's certificates: a serving certificate its CA verifies for the names
the API server dials, and the CA bundle every replica shares (theirs kept, expired ones out)."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from datetime import UTC, datetime, timedelta

import aiohttp
import kopf
from cryptography import x509

from api_cluster import Cluster
from api_server import WEBHOOK_CONFIGURATIONS
from ports import free_ports
from slogate_operator import certificates
from slogate_operator.client import KubeClient
from slogate_operator.context import Runtime
from slogate_operator.injector import Endpoint, ca_bundle_of
from slogate_operator.settings import OperatorSettings
from slogate_operator.webhook import Webhook

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


async def test_a_replica_renews_its_certificate_trusting_the_new_ca_before_serving_it(cluster: Cluster) -> None:
    """Rotation against the real API server: the renewed CA joins the configuration's bundle
    (the old one stays, for connections made meanwhile), then the server presents the new
    certificate."""
    (port,) = free_ports()
    settings = OperatorSettings(standalone=True, webhook_url=f"https://127.0.0.1:{port}", webhook_port=port,
                                webhook_address="127.0.0.1", webhook_settle_seconds=0.1)  # fmt: skip
    path = f"{WEBHOOK_CONFIGURATIONS}/{settings.webhook_configuration}"
    async with KubeClient(lambda: kopf.ConnectionInfo(server=cluster.url)) as client, aiohttp.ClientSession() as http:
        endpoint = Endpoint.of(settings)
        assert endpoint is not None
        hook = Webhook(Runtime(settings=settings, client=client, http=http), endpoint)
        await hook.start()
        try:
            first = hook.certificate
            assert certificates.trusts(ca_bundle_of(cluster.admin("GET", path)), first.ca_pem)
            hook.certificate = dataclasses.replace(first, issued=first.issued - certificates.RENEW_AFTER)
            await hook.check()
            renewed = hook.certificate
            assert renewed.ca_pem != first.ca_pem
            stored = ca_bundle_of(cluster.admin("GET", path))
            assert certificates.trusts(stored, renewed.ca_pem)
            assert certificates.trusts(stored, first.ca_pem)
            presented = ssl.create_default_context(cadata=renewed.ca_pem.decode())  # the new CA alone verifies it
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=presented)
            writer.close()
        finally:
            await hook.stop()
