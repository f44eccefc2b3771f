"""Capacity μ: one definition, and the simulated server, never idle, completes exactly that."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime

import pytest

from canned_profiles import smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.engine import simulate
from slogate_sim.fronts import Direct
from slogate_sim.lengths import TokenLengths
from slogate_sim.scenario import config_for_load
from slogate_sim.workloads import Workload, preset

SERVER = ServerModel.from_profile(smollm2_profile())
THRESHOLDS = derive_thresholds(
    Policy.model_validate({"slo": {"ttftSeconds": 2.0}}), smollm2_profile(), derived_at=datetime(2026, 1, 1, tzinfo=UTC)
)


def test_at_the_reference_request_it_is_the_derived_throughput() -> None:
    reference = Workload(
        TokenLengths.fixed(THRESHOLDS.reference_prompt_tokens), TokenLengths.fixed(THRESHOLDS.reference_output_tokens)
    )
    assert capacity_rps(SERVER, reference, THRESHOLDS.concurrency_cap) == pytest.approx(
        THRESHOLDS.throughput_rps, rel=1e-12
    )


@pytest.mark.parametrize("name", ["chat", "heavy_tail"])
def test_a_mixs_mu_is_what_the_server_completes_when_never_idle(name: str) -> None:
    # Patient clients at 2x: the queue never empties, so completions per second are μ itself.
    mix = dataclasses.replace(preset(name), client_timeout_s=math.inf)
    config = config_for_load(SERVER, mix, load=2.0, duration_s=4000.0, ttft_slo_s=2.0, front=Direct(),
                             concurrency=THRESHOLDS.concurrency_cap, seed=5)  # fmt: skip
    result = simulate(config)
    assert result.utilization > 0.99
    assert result.throughput_rps == pytest.approx(config.capacity_rps, rel=0.03)


def test_the_exponential_service_mode_is_its_slots_over_its_mean() -> None:
    workload = Workload(service="exponential", exponential_mean_s=0.25)
    assert capacity_rps(dataclasses.replace(SERVER, slots=1), workload, 4) == 4.0
    assert capacity_rps(dataclasses.replace(SERVER, slots=3), workload, 4) == 12.0
