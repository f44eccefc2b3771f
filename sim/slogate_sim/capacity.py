"""Capacity μ: the one definition the benchmark, the simulator, the demo and the soak use.

μ is what the server completes per second when it is never idle, for a given workload:

    μ = 1 / E[server seconds per request], at the concurrency cap B,

the expectation over the workload's requests (``CAPACITY_DRAWS`` of them, drawn as the
load generator draws them), each request costing ``server_seconds_per_request``: its
prefill alone on the cores, plus its n_out tokens at 1/B of each batched decode step.
It is the mean of the *costs*, not the cost of the mean request: prefill is not linear in
the prompt. For a workload of fixed lengths it is that one request's rate, so at the
reference request (the policy's reference prompt and output) it is the derivation's own
``Thresholds.throughput_rps`` (the operator reports it). In the simulator's
exponential service mode (slots serving in parallel) it is slots / the mean service time:
one slot, the M/M/1 check's μ.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from slogate_admission.derivation import decode_curve, prefill_curve
from slogate_admission.schema import CalibrationProfile
from slogate_admission.service import DecodeCurve, PrefillCurve, server_seconds_per_request
from slogate_sim.workloads import Workload

CAPACITY_DRAWS = 2000
"""Requests the expectation is taken over (seed 1): enough for the chat mix's μ to ±0.5%."""
MU_DEFINITION = (
    "μ = 1 / E[server seconds per request] over the workload's requests, at the concurrency cap B; a request "
    "costs T_prefill(n_in) + n_out / (B · r_decode(B)): its prefill alone on the cores, then 1/B of each batched "
    "decode step that makes its tokens. It is the mean of the costs, not the cost of the mean request (prefill is "
    "not linear in the prompt). For one fixed request it is that request's rate: at the policy's reference request "
    "it is the derived `throughputRps` the operator reports."
)
"""μ in words, as docs/benchmarks.md states it (``report``)."""


@dataclass(frozen=True, slots=True)
class ServerModel:
    """A llama-server's slots and calibrated speed curves."""

    slots: int
    """Parallel sequences (-np)."""
    prefill: PrefillCurve
    """Seconds to prefill n tokens, alone on the cores."""
    decode: DecodeCurve
    """Seconds per token per stream at B streams."""

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")

    @classmethod
    def from_profile(cls, profile: CalibrationProfile) -> ServerModel:
        """The server a calibration profile measured."""
        return cls(profile.server.slots, prefill_curve(profile), decode_curve(profile))


def capacity_rps(server: ServerModel, workload: Workload, streams: int) -> float:
    """μ of ``workload`` on ``server`` with ``streams`` decoding at once (the concurrency cap)."""
    if workload.service == "exponential":  # each slot serves one request at a time, in parallel
        return server.slots / workload.exponential_mean_s
    seconds = [
        server_seconds_per_request(server.prefill, server.decode, n_in, n_out, streams)
        for n_in, n_out in workload.draws(CAPACITY_DRAWS)
    ]
    return 1.0 / statistics.fmean(seconds)
