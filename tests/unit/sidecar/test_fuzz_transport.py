"""Bad input below JSON: raw HTTP bytes, header and line limits, slow and stalled clients.

Spoken over a plain socket, so nothing a client library would refuse to send is out of
reach. The sidecar must answer a deliberate 4xx or close the connection, never 5xx,
never hang, and hold no ticket afterwards. Also its security posture: llama-server's
own endpoints are not reachable through it unless asked for.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canned_profiles import smollm2_profile
from fake_upstream import FakeUpstream, fake_upstream
from sidecar_harness import RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_sidecar.app import MAX_HEADERS, MAX_LINE_BYTES

READ_TIMEOUT = 0.5
HANG_GUARD_S = 30.0
"""Not a performance bound: an answer (or a close) that has not come in this long is a hang."""
BODY = b'{"prompt": [1, 2, 3], "n_predict": 2}'


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[tuple[RunningSidecar, FakeUpstream]]:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile()),
                            client_read_timeout_s=READ_TIMEOUT, max_body_bytes=64 * 1024) as running,
    ):  # fmt: skip
        yield running, fake


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def exchange(url: str, *parts: bytes, pause_s: float = 0.0) -> bytes:
    """Write the parts (pausing between them), then read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(url))
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            for part in parts:
                writer.write(part)
                await writer.drain()
                if pause_s:
                    await asyncio.sleep(pause_s)
            return await reader.read()
    except (ConnectionResetError, BrokenPipeError):
        return b""  # the server dropped us mid-send: also a deliberate end
    finally:
        writer.close()


def status_of(answer: bytes) -> int | None:
    if not answer.startswith(b"HTTP/1."):
        return None
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1]


def request(path: str, body: bytes = BODY, *, method: str = "POST", headers: bytes = b"") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n".encode()
            + headers + b"\r\n" + body)  # fmt: skip


async def test_the_raw_request_works(gate: tuple[RunningSidecar, FakeUpstream]) -> None:
    """The helper itself: a well-formed request is served (so refusals below mean something)."""
    running, fake = gate
    answer = await exchange(running.url, request("/completion"))
    assert status_of(answer) == 200
    assert fake.started == 1


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("header value too long", request("/completion", headers=b"X-A: " + b"a" * (MAX_LINE_BYTES + 10) + b"\r\n")),
        (
            "too many headers",
            request("/completion", headers=b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 5))),
        ),
        ("request line too long", request("/completion?" + "q" * (MAX_LINE_BYTES + 10))),
        ("header without colon", request("/completion", headers=b"no colon here\r\n")),
        ("NUL in a header", request("/completion", headers=b"X-A: a\x00b\r\n")),
        ("two content lengths", request("/completion", headers=b"Content-Length: 5\r\n")),
        ("negative content length", b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
        ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40),
        (
            "bad chunk size",
            b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        ),
        (
            "chunked and length",
            b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
        ),
        ("claims gzip, is not", request("/completion", headers=b"Content-Encoding: gzip\r\n")),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("absurd method", request("/completion", method="X" * 300)),
    ],
)
async def test_malformed_http_gets_a_4xx_or_a_close(
    gate: tuple[RunningSidecar, FakeUpstream], name: str, raw: bytes
) -> None:
    running, fake = gate
    answer = await exchange(running.url, raw)
    status = status_of(answer)
    assert status is None or 400 <= status < 500, (name, answer[:300])
    if status is not None:
        assert body_of(answer).strip(), name  # a body that says what was wrong
    assert fake.started == 0
    assert await running.wait_idle()


REQUEST_LINES = [b"POST /completion HTTP/1.1\r\n", b"POST /v1/chat/completions HTTP/1.0\r\n",
                 b"PUT /slogate/v1/thresholds HTTP/1.1\r\n", b"GET /readyz HTTP/1.1\r\n"]  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400) | st.builds(bytes.__add__, st.sampled_from(REQUEST_LINES), st.binary(max_size=300)))
async def test_random_bytes_on_the_wire_never_get_a_5xx(gate: tuple[RunningSidecar, FakeUpstream], raw: bytes) -> None:
    running, _ = gate
    # Half-close after sending: an incomplete request is then ended by EOF, not by the timeout.
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(running.url))
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            writer.write(raw)
            await writer.drain()
            writer.write_eof()
            answer = await reader.read()
    except ConnectionResetError:
        answer = b""
    finally:
        writer.close()
    for status in (int(line.split(b" ", 2)[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.")):
        assert status < 500, answer[:300]
    assert await running.wait_idle()


async def test_a_body_that_stalls_mid_upload_gets_408_and_books_nothing(
    gate: tuple[RunningSidecar, FakeUpstream],
) -> None:
    running, fake = gate
    for path in ("/completion", "/v1/chat/completions", "/v1/completions"):
        head = request(path, b"x" * 200)[: -200 + 10]  # the headers announce 200 bytes; 10 come
        answer = await exchange(running.url, head, pause_s=0.0)
        assert status_of(answer) == 408, answer[:200]
        assert json.loads(body_of(answer))["error"]["code"] == "request_timeout"
    assert fake.started == 0
    assert await running.wait_idle()


async def test_a_stalled_push_to_the_admin_port_gets_408_and_changes_nothing(
    gate: tuple[RunningSidecar, FakeUpstream],
) -> None:
    running, _ = gate
    before = running.sidecar.gate.thresholds
    head = request(
        "/slogate/v1/thresholds", b"{" * 100, method="PUT", headers=b"Authorization: Bearer s3cret-admin-token\r\n"
    )
    answer = await exchange(running.admin_url, head[:-90])
    assert status_of(answer) == 408, answer[:200]
    assert running.sidecar.gate.thresholds is before


@pytest.mark.parametrize("port", ["proxy", "admin"])
async def test_headers_trickled_slowly_get_the_connection_closed(
    gate: tuple[RunningSidecar, FakeUpstream], port: str
) -> None:
    """Slowloris: a request line and headers that never finish. The server closes the
    connection after the read timeout, having sent no answer and booked nothing."""
    running, fake = gate
    url = running.url if port == "proxy" else running.admin_url
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(url))
    writer.write(b"POST /completion HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    closed = False
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            for _ in range(400):  # one header byte every 50 ms, for far longer than the timeout
                writer.write(b"X-Slow: a\r\n"[:1])
                await writer.drain()
                if reader.at_eof() or await _closed_within(reader, 0.05):
                    closed = True
                    break
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    finally:
        writer.close()
    assert closed
    assert fake.started == 0
    assert await running.wait_idle()


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except TimeoutError:
        return False


async def test_a_gzip_bomb_is_refused_at_the_body_limit(gate: tuple[RunningSidecar, FakeUpstream]) -> None:
    """64 MiB of zeros compressed to ~64 KiB: decompressed past --max-body-bytes, 413."""
    running, fake = gate
    bomb = gzip.compress(b'{"prompt": "' + b"0" * (64 << 20) + b'"}', compresslevel=9)
    answer = await exchange(running.url, request("/completion", bomb, headers=b"Content-Encoding: gzip\r\n"))
    assert status_of(answer) == 413, answer[:200]
    assert fake.started == 0
    assert await running.wait_idle()


async def test_a_gzipped_valid_body_is_served(gate: tuple[RunningSidecar, FakeUpstream]) -> None:
    running, fake = gate
    answer = await exchange(
        running.url, request("/completion", gzip.compress(BODY), headers=b"Content-Encoding: gzip\r\n")
    )
    assert status_of(answer) == 200, answer[:200]
    assert fake.started == 1


# llama-server's own endpoints (this build): none may be reachable through the client port.
UPSTREAM_ADMIN = [
    ("GET", "/slots"), ("POST", "/slots/0?action=erase"), ("GET", "/props"), ("POST", "/props"),
    ("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/apply-template"),
    ("POST", "/embedding"), ("POST", "/v1/embeddings"), ("POST", "/rerank"), ("POST", "/infill"),
    ("GET", "/lora-adapters"), ("POST", "/lora-adapters"), ("GET", "/v1/health"), ("GET", "/api/tags"),
]  # fmt: skip


async def test_upstream_admin_endpoints_are_not_exposed_by_default(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile())) as running,
    ):
        assert running.sidecar.settings.expose_upstream_admin is False  # the default
        for method, path in UPSTREAM_ADMIN:
            async with running.session.request(method, running.url + path, json={}) as response:
                assert response.status in (404, 405), (method, path)
                assert (await response.json())["error"]["message"]


async def test_upstream_admin_endpoints_pass_through_only_when_asked(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(
            fake.url, tmp_path, thresholds_for(smollm2_profile()), expose_upstream_admin=True
        ) as running,
    ):
        async with running.session.get(running.url + "/metrics") as response:
            assert response.status == 200
            assert "llamacpp:prompt_tokens_total" in await response.text()  # the fake upstream's, relayed
        async with running.session.post(running.url + "/tokenize", json={"content": "abcdefgh"}) as response:
            assert response.status == 200
            assert (await response.json())["tokens"] == [0, 1]
