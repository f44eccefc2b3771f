"""The simulated fleet's test fixtures: the canned SmolLM2 server, a chat mix, a 2 s TTFT SLO
and the thresholds derived for it (shared by the fleet and autoscaled-fleet simulator tests)."""

from __future__ import annotations

from datetime import UTC, datetime

from canned_profiles import smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_sim.capacity import ServerModel
from slogate_sim.lengths import TokenLengths
from slogate_sim.workloads import Workload

SLO_S = 2.0
SERVER = ServerModel.from_profile(smollm2_profile())
CHAT = Workload(TokenLengths(100, 400), TokenLengths(32, 128))


def thresholds() -> Thresholds:
    policy = Policy.model_validate({"slo": {"ttftSeconds": SLO_S}})
    return derive_thresholds(policy, smollm2_profile(), derived_at=datetime(2026, 1, 1, tzinfo=UTC))
