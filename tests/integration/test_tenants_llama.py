"""Tenant shares through the sidecar, in front of the real llama-server: the noisy neighbour, short.

Tenant B sends one request at a time (so it never holds queued tokens when its next one
arrives: the share rule can never refuse it) while tenant A sends a burst of long prompts at
once. With ``spec.tenants``, B being active caps A at half of the class's queue budget, so
some of A's burst is refused for ``tenant_share`` and none of B's; without it, the sidecar
keeps no tenant books and refuses nothing for a share. Counts and orderings only.

A's prompts are sized from the session's calibration (``PROMPT_SHARE`` of the TTFT budget
each), never fixed: one fits, and two are past half the queue budget, on any machine.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from slogate_admission.derivation import derive_thresholds, longest_admitted_prompt
from slogate_admission.schema import CalibrationProfile, Policy
from slogate_bench.live.fronts import SlogateFront
from slogate_bench.live.load import request_with_retries, run_arrivals
from slogate_bench.reports.tenants import LIGHT, NOISY
from slogate_bench.results import Result
from slogate_bench.runs.demo import wait_until_idle
from slogate_bench.runs.noisy_neighbour import gate_tallies, policies
from slogate_calibration.runtime import LlamaServer
from slogate_sim.workloads import Arrival

TIMEOUT_S = 120.0
"""Clients' patience: generous, a slow machine must not turn an admitted request into a timeout."""
BURST = 16
"""A's requests, sent 10 ms apart."""
PROMPT_SHARE = 0.4
"""Each of A's prompts, at the calibration's margin, takes this share of the TTFT budget: one is
admitted on an idle server, and two queued (0.8 of the budget in tokens) exceed A's half."""
LIGHT_REQUESTS = 4


def burst(prompt_tokens: int) -> list[Arrival]:
    return [Arrival(0.01 * i, 1000 + 1000 * i, prompt_tokens, 8, None, tenant=NOISY) for i in range(BURST)]


def light(i: int) -> Arrival:
    return Arrival(0.0, 30_000 + 500 * i, 48, 8, None, tenant=LIGHT)


async def one_by_one(url: str, first: int, n: int) -> list[Result]:
    """B's requests, each sent once the one before has ended."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        return [await request_with_retries(session, url, light(first + i), timeout_s=TIMEOUT_S) for i in range(n)]


async def noisy_neighbour(
    server: LlamaServer, policy: Policy, profile: CalibrationProfile, work_dir: Path
) -> tuple[list[Result], list[Result], dict[str, Any]]:
    """B once (it is then active), then A's burst beside B's others: both tenants' results and the
    sidecar's own counts."""
    await wait_until_idle(server.url)
    thresholds = derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
    prompt_tokens = longest_admitted_prompt(thresholds, share=PROMPT_SHARE)
    assert prompt_tokens >= 4, f"the calibrated server prefills only {prompt_tokens} tokens in the share"
    async with SlogateFront(thresholds).in_front_of(server.url, work_dir) as gate:
        light_results = await one_by_one(gate.url, 0, 1)
        noisy_run, later = await asyncio.gather(
            run_arrivals(gate.url, burst(prompt_tokens), 1.0, timeout_s=TIMEOUT_S),
            one_by_one(gate.url, 1, LIGHT_REQUESTS - 1),
        )
        books = gate_tallies(await gate.metrics())
    return noisy_run.results, light_results + later, books


async def test_with_tenants_the_noisy_tenant_is_held_to_its_share_and_the_light_one_never(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    _, with_tenants = policies()
    noisy, light_results, books = await noisy_neighbour(llama_server, with_tenants, calibrated_profile, tmp_path)
    assert [r.tenant for r in noisy] == [NOISY] * BURST
    assert [r.tenant for r in light_results] == [LIGHT] * LIGHT_REQUESTS
    assert all(r.outcome in {"ok", "rejected"} for r in noisy + light_results), [r.outcome for r in noisy]
    a, b = books["tenants"][NOISY], books["tenants"][LIGHT]
    assert a["share_refusals"] > 0
    assert b["share_refusals"] == 0
    # The sidecar counted every refusal the clients saw, and admitted the rest.
    assert a["refused"] == sum(r.outcome == "rejected" for r in noisy) >= a["share_refusals"]
    assert a["admitted"] == sum(r.outcome == "ok" for r in noisy) >= 1
    assert b["refused"] + b["admitted"] == LIGHT_REQUESTS
    assert "tenant_share" in books["reject_reasons"]


async def test_without_tenants_no_share_is_kept_or_refused(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    without, _ = policies()
    noisy, light_results, books = await noisy_neighbour(llama_server, without, calibrated_profile, tmp_path)
    assert len(noisy) == BURST
    assert len(light_results) == LIGHT_REQUESTS
    assert books["tenants"] == {}
    assert "tenant_share" not in books["reject_reasons"]
    assert any(r.outcome == "rejected" for r in noisy)  # the burst is still more than the SLO allows
