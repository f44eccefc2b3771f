"""The admin API's door: who may replace the thresholds, and what a refused push leaves behind.

A real sidecar in-process (fake upstream behind it). Every refusal must leave the very
same thresholds object in force; the comparison must not depend on where the token
differs or on its length.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from sidecar_harness import TOKEN, RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_admission.schema import Thresholds
from slogate_sidecar import admin

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PATH = "/slogate/v1/thresholds"


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[RunningSidecar]:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile())) as running,
    ):
        yield running


def another(thresholds: Thresholds) -> Thresholds:
    """Valid thresholds that differ from these (so an applied push is visible)."""
    return thresholds.model_copy(update={"calibration_id": thresholds.calibration_id + "-new"})


async def put(gate: RunningSidecar, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any], Any]:
    async with gate.session.put(gate.admin_url + PATH, data=body, headers=headers) as response:
        return response.status, await response.json(), response.headers


async def updates(gate: RunningSidecar, result: str) -> float:
    async with gate.session.get(gate.admin_url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(f'slogate_threshold_updates_total{{result="{result}"}}'):
                return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize(
    ("case", "authorization"),
    [
        ("no header", None),
        ("empty", ""),
        ("scheme only", "Bearer"),
        ("scheme and space", "Bearer "),
        ("wrong token, same length", "Bearer " + "x" * len(TOKEN)),
        ("one character off", "Bearer " + TOKEN[:-1] + chr(ord(TOKEN[-1]) + 1)),
        ("a prefix of the token", "Bearer " + TOKEN[:-1]),
        ("the token and more", "Bearer " + TOKEN + "x"),
        ("much longer", "Bearer " + TOKEN * 100),
        ("another scheme", "Basic " + TOKEN),
        ("lower-case scheme", "bearer " + TOKEN),
        ("token without scheme", TOKEN),
        ("non-ASCII", "Bearer " + "é" * len(TOKEN)),
    ],
)
async def test_a_push_without_the_right_token_is_401_and_changes_nothing(
    gate: RunningSidecar, case: str, authorization: str | None
) -> None:
    before = gate.sidecar.gate.thresholds
    assert before is not None
    headers = {} if authorization is None else {"Authorization": authorization}
    status, body, response_headers = await put(gate, another(before).model_dump_json(by_alias=True).encode(), headers)
    assert status == 401, case
    assert body["error"]["type"] == "authentication_error"
    assert response_headers["WWW-Authenticate"].startswith("Bearer")
    assert gate.sidecar.gate.thresholds is before, case
    assert await updates(gate, "applied") == 1  # the boot file only


async def test_the_right_token_applies_and_a_replay_with_a_garbage_body_is_422(gate: RunningSidecar) -> None:
    before = gate.sidecar.gate.thresholds
    assert before is not None
    auth = {"Authorization": f"Bearer {TOKEN}"}
    pushed = another(before)
    status, body, _ = await put(gate, pushed.model_dump_json(by_alias=True).encode(), auth)
    assert (status, body["calibrationId"]) == (200, pushed.calibration_id)
    applied = gate.sidecar.gate.thresholds
    assert applied == pushed
    # The same authorized request replayed with garbage: refused, the pushed ones kept.
    for garbage in (b"", b"{", b"null", b"[]", b'{"calibrationId": 5}', b"\xff\xfe", b"{" * 5000,
                    pushed.model_dump_json(by_alias=True).replace('"lMax":', '"lMax": -1, "x":').encode()):  # fmt: skip
        status, body, _ = await put(gate, garbage, auth)
        assert status == 422, garbage[:40]
        assert body["error"]["message"].startswith("invalid thresholds: ")
        assert gate.sidecar.gate.thresholds is applied
    assert await updates(gate, "rejected") == 8
    assert await updates(gate, "applied") == 2  # boot file + the push


async def test_an_oversized_push_is_413_and_changes_nothing(gate: RunningSidecar) -> None:
    before = gate.sidecar.gate.thresholds
    padded = b'{"pad": "' + b"x" * (admin.MAX_THRESHOLDS_BYTES + 1) + b'"}'
    status, body, _ = await put(gate, padded, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 413
    assert body["error"]["code"] == "body_too_large"
    assert gate.sidecar.gate.thresholds is before


async def test_a_push_sent_in_small_pieces_is_read_whole(gate: RunningSidecar) -> None:
    """A valid document arriving in many TCP segments is applied, not judged on its first piece."""
    before = gate.sidecar.gate.thresholds
    assert before is not None
    document = another(before).model_dump_json(by_alias=True).encode()
    port = int(gate.admin_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"PUT {PATH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(document)}\r\n\r\n").encode()  # fmt: skip
    writer.write(head)
    for i in range(0, len(document), 64):
        writer.write(document[i : i + 64])
        await writer.drain()
        await asyncio.sleep(0.002)
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert gate.sidecar.gate.thresholds == another(before)


async def test_undecodable_bytes_in_the_header_are_401_not_a_crash(gate: RunningSidecar) -> None:
    before = gate.sidecar.gate.thresholds
    port = int(gate.admin_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"PUT {PATH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n".encode()
                 + b"Authorization: Bearer \xff\xfe\x80" + TOKEN.encode() + b"\r\n\r\n{}")  # fmt: skip
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert gate.sidecar.gate.thresholds is before


async def test_no_token_file_refuses_every_push(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile()), admin_token_file=None) as running,
    ):
        before = running.sidecar.gate.thresholds
        assert before is not None
        for token in (TOKEN, "", "anything"):
            status, _, _ = await put(running, another(before).model_dump_json(by_alias=True).encode(),
                                     {"Authorization": f"Bearer {token}"})  # fmt: skip
            assert status == 401
        assert running.sidecar.gate.thresholds is before


@pytest.mark.parametrize("content", [b"", b"  \n", None])
async def test_an_empty_or_missing_token_file_refuses_every_push(
    tmp_path: Path, content: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "rotated-token"
    if content is not None:
        token_file.write_bytes(content)
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(
            fake.url, tmp_path, thresholds_for(smollm2_profile()), admin_token_file=token_file
        ) as running,
    ):
        before = running.sidecar.gate.thresholds
        assert before is not None
        with caplog.at_level(logging.ERROR, "slogate.sidecar"):
            status, _, _ = await put(running, another(before).model_dump_json(by_alias=True).encode(),
                                     {"Authorization": "Bearer "})  # fmt: skip
        assert status == 401
        assert running.sidecar.gate.thresholds is before
        if content is None:
            assert any("admin token file" in r.message and "unreadable" in r.message for r in caplog.records)


async def test_a_rotated_token_takes_effect_without_a_restart(gate: RunningSidecar) -> None:
    before = gate.sidecar.gate.thresholds
    assert before is not None
    token_file = gate.sidecar.settings.admin_token_file
    assert token_file is not None
    token_file.write_text("rotated-token\n")
    document = another(before).model_dump_json(by_alias=True).encode()
    assert (await put(gate, document, {"Authorization": f"Bearer {TOKEN}"}))[0] == 401
    assert gate.sidecar.gate.thresholds is before
    assert (await put(gate, document, {"Authorization": "Bearer rotated-token"}))[0] == 200


async def test_the_comparison_is_on_equal_length_digests(gate: RunningSidecar, monkeypatch: pytest.MonkeyPatch) -> None:
    """compare_digest is constant-time only for inputs of equal length: whatever the offered
    token's length, what is compared are two SHA-256 digests, 32 bytes each."""
    compared: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(admin.hmac, "compare_digest", spy)
    for offered in ("", "x", TOKEN[:-1], TOKEN, TOKEN + "x", "y" * 4096):
        status, _, _ = await put(gate, b"{}", {"Authorization": f"Bearer {offered}"})
        assert status == (422 if offered == TOKEN else 401)
    assert len(compared) == 5  # "Bearer " with nothing after it is refused before comparing
    assert all(len(a) == len(b) == 32 for a, b in compared)
    assert (hashlib.sha256(TOKEN.encode()).digest(),) * 2 in compared


@FUZZ
@given(st.text(max_size=80))
async def test_any_authorization_header_but_the_token_is_refused(gate: RunningSidecar, value: str) -> None:
    before = gate.sidecar.gate.thresholds
    assert before is not None
    # What a client can put in a header: printable Latin-1, no CR/LF (those are header injection).
    offered = "".join(c if 0x20 <= ord(c) <= 0xFF and c != "\x7f" else "?" for c in value)
    status, _, _ = await put(gate, another(before).model_dump_json(by_alias=True).encode(),
                             {"Authorization": "Bearer " + offered})  # fmt: skip
    assert status == (200 if offered.strip() == TOKEN else 401)
    if status == 401:
        assert gate.sidecar.gate.thresholds is before


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=15,
)


@st.composite
def mutated_thresholds(draw: st.DrawFn) -> bytes:
    """A valid document with fields replaced, removed or added, or no document at all."""
    document: dict[str, Any] = json.loads(thresholds_for(smollm2_profile()).model_dump_json(by_alias=True))
    for key in draw(st.lists(st.sampled_from([*document, "unknownField"]), max_size=3)):
        if draw(st.booleans()):
            document[key] = draw(json_values)
        else:
            document.pop(key, None)
    return draw(st.just(json.dumps(document).encode()) | st.binary(max_size=200))


@FUZZ
@given(mutated_thresholds())
async def test_any_pushed_body_is_applied_whole_or_refused_whole(gate: RunningSidecar, body: bytes) -> None:
    before = gate.sidecar.gate.thresholds
    status, answer, _ = await put(gate, body, {"Authorization": f"Bearer {TOKEN}"})
    assert status in (200, 422), answer
    if status == 422:
        assert gate.sidecar.gate.thresholds is before
        assert answer["error"]["message"]
    else:
        assert gate.sidecar.gate.thresholds == Thresholds.model_validate_json(body)
        # Whatever was accepted, the gate still answers deliberately under it (hang guard: 30 s).
        async with (
            asyncio.timeout(30),
            gate.session.post(gate.url + "/completion", json={"prompt": [1, 2], "n_predict": 1}) as r,
        ):
            assert r.status in (200, 400, 429), await r.text()
        assert await gate.wait_idle()
