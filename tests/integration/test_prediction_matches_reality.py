"""The derived thresholds against the real llama-server: does the model order reality?

A probe waits behind 0, Q and 3Q queued prompt tokens (Q a third of the token budget the
SLO leaves it). The model predicts waits 0 < Q/R < 3Q/R; the measured probe TTFTs must
come in the same order. Orderings, not durations: this machine is shared and noisy (CI
measured the probe's wait 10-40% above Q/R while the burst ahead decodes alongside it;
that bias is what the sidecar's TTFT correction learns). How close predictions come in
seconds is a benchmark number (docs/benchmarks.md, "prediction"), not a test.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from datetime import UTC, datetime

import aiohttp
import pytest

from slogate_admission.derivation import derive_thresholds, prefill_curve
from slogate_admission.schema import CalibrationProfile, Policy
from slogate_calibration.runtime import LlamaServer

SLO_TTFT = 2.0
PROBE_TOKENS = 64
OUTPUT_TOKENS = 16


def prompt(rng: random.Random, n: int) -> list[int]:
    start = rng.randrange(1000, 40000)
    return list(range(start, start + n))


async def stream_ttft(session: aiohttp.ClientSession, url: str, tokens: list[int]) -> float:
    """Seconds from sending to the first streamed token (the client's TTFT)."""
    body = {
        "prompt": tokens,
        "n_predict": OUTPUT_TOKENS,
        "stream": True,
        "cache_prompt": False,
        "ignore_eos": True,
    }
    sent = time.monotonic()
    first: float | None = None
    async with session.post(url + "/completion", json=body) as response:
        assert response.status == 200
        async for line in response.content:
            if first is None and line.startswith(b"data: ") and json.loads(line[6:]).get("content"):
                first = time.monotonic() - sent
    assert first is not None
    return first


def fresh_connections() -> aiohttp.ClientSession:
    """llama-server closes a connection after a streamed response: never reuse one."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


@pytest.fixture
def profile(calibrated_profile: CalibrationProfile) -> CalibrationProfile:
    return calibrated_profile


async def probe_ttfts(url: str, rng: random.Random, ahead_tokens: int, trials: int = 3) -> list[float]:
    """The probe's TTFT behind a burst of three prompts totalling ``ahead_tokens``."""
    ttfts: list[float] = []
    async with fresh_connections() as session:
        for _ in range(trials):
            burst = [prompt(rng, ahead_tokens // 3) for _ in range(3)] if ahead_tokens else []
            ahead = [asyncio.create_task(stream_ttft(session, url, p)) for p in burst]
            await asyncio.sleep(0.05)  # the probe arrives just behind the burst
            ttfts.append(await stream_ttft(session, url, prompt(rng, PROBE_TOKENS)))
            await asyncio.gather(*ahead)
    return ttfts


async def test_probe_waits_in_the_order_the_model_predicts(
    llama_server: LlamaServer, profile: CalibrationProfile
) -> None:
    thresholds = derive_thresholds(
        Policy.model_validate({"slo": {"ttftSeconds": SLO_TTFT}}), profile, derived_at=datetime.now(UTC)
    )
    own = prefill_curve(profile).seconds(PROBE_TOKENS)
    rate = thresholds.prefill_tokens_per_second
    third = int((SLO_TTFT - own) * rate) // 3 // 3 * 3  # Q: a third of the budget, split in three prompts
    rng = random.Random(5)
    levels = [0, third, 3 * third]
    medians = [statistics.median(await probe_ttfts(llama_server.url, rng, tokens)) for tokens in levels]
    predicted = [own + tokens / rate for tokens in levels]
    print(f"queued {levels} tokens at {rate:.0f} tok/s: predicted TTFT {[round(p, 2) for p in predicted]}, "
          f"measured medians {[round(m, 2) for m in medians]}")  # fmt: skip
    assert medians[0] < medians[1] < medians[2]
