"""Measure the two ways the gate can learn n_in: estimate vs llama-server's tokenizer.

For each chat prompt built from the calibration corpus (every sample, alone and in
multi-turn conversations), against the real llama-server:
- cost: the estimate (characters x p95 tokens/char) timed in-process; the exact count
  (/apply-template + /tokenize over loopback) timed end to end;
- error: both against the prompt_tokens llama-server's own usage reports for the
  same messages (with the prompt cache off).

Run: .venv/bin/python -m slogate_bench.runs.prompt_counting  (starts its own llama-server)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import aiohttp

from slogate_calibration.corpus import SAMPLES
from slogate_calibration.runtime import LlamaServer, locate
from slogate_llama.routes import Route
from slogate_sidecar.prompt_tokens import count_prompt_tokens, estimate_prompt_tokens
from slogate_sidecar.requests import parse_request


def conversations() -> list[list[dict[str, str]]]:
    """Each sample alone, plus 3-turn chats mixing samples."""
    single = [[{"role": "user", "content": s}] for s in SAMPLES]
    multi = [
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": SAMPLES[i]},
            {"role": "assistant", "content": SAMPLES[(i + 1) % len(SAMPLES)]},
            {"role": "user", "content": SAMPLES[(i + 2) % len(SAMPLES)]},
        ]
        for i in range(len(SAMPLES))
    ]
    return single + multi


async def measure(tokens_per_char: float) -> dict[str, float]:
    """Cost and relative error of both methods over the conversations."""
    log = Path(".slogate/prompt-counting-llama.log")
    log.parent.mkdir(exist_ok=True)
    est_err, cnt_err, est_us, cnt_ms = [], [], [], []
    with LlamaServer(locate(), log_path=log) as server:
        async with aiohttp.ClientSession() as session:
            for messages in conversations():
                body = json.dumps({"messages": messages, "max_tokens": 1, "cache_prompt": False}).encode()
                parsed = parse_request(Route.CHAT, body, max_body_bytes=1 << 20, max_output_tokens=1 << 20)
                t0 = time.perf_counter()
                estimate = estimate_prompt_tokens(parsed, tokens_per_char)
                est_us.append((time.perf_counter() - t0) * 1e6)
                t0 = time.perf_counter()
                counted = await count_prompt_tokens(session, server.url, parsed)
                cnt_ms.append((time.perf_counter() - t0) * 1e3)
                async with session.post(
                    server.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    actual = (await r.json())["usage"]["prompt_tokens"]
                est_err.append((estimate - actual) / actual)
                cnt_err.append((counted - actual) / actual)
    return {
        "prompts": len(est_err),
        "estimate_cost_us_median": statistics.median(est_us),
        "tokenize_cost_ms_median": statistics.median(cnt_ms),
        "estimate_error_median": statistics.median(est_err),
        "estimate_error_min": min(est_err),
        "estimate_error_max": max(est_err),
        "estimate_underestimates": sum(1 for e in est_err if e < 0),
        "tokenize_error_max_abs": max(abs(e) for e in cnt_err),
    }


def main() -> None:
    profile = Path(".slogate/profiles")
    tpc = 0.5
    for path in sorted(profile.glob("*.json")) if profile.exists() else []:
        tpc = json.loads(path.read_text()).get("tokensPerChar", {}).get("p95", tpc)
    print(json.dumps(asyncio.run(measure(tpc)) | {"tokens_per_char_p95": tpc}, indent=2))


if __name__ == "__main__":
    main()
