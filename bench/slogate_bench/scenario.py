"""What a simulation is asked (workload, server, gate, load) and what it answers.

Plain frozen structures and the closed-form capacity; the event loop that uses them
is ``slogate_bench.simulator``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from slogate_admission.derivation import decode_curve, prefill_curve
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_admission.service import DecodeCurve, PrefillCurve, server_seconds_per_request

GateKind = Literal["none", "slogate", "count-cap"]
GATES: tuple[GateKind, ...] = ("none", "slogate", "count-cap")
ServiceMode = Literal["profile", "exponential"]

DEFAULT_CLIENT_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class TokenLengths:
    """Token counts drawn uniformly from the integers ``low``..``high`` (fixed when equal)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"token lengths need 1 <= low <= high, got {self.low}..{self.high}")

    @classmethod
    def fixed(cls, tokens: int) -> TokenLengths:
        """Always ``tokens``."""
        return cls(tokens, tokens)

    @property
    def mean(self) -> float:
        """The distribution's mean."""
        return (self.low + self.high) / 2

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` samples."""
        if self.low == self.high:
            return [self.low] * count
        values: list[int] = rng.integers(self.low, self.high + 1, size=count).tolist()
        return values


@dataclass(frozen=True, slots=True)
class SampledLengths:
    """Token counts drawn with replacement from given samples: a load-generator preset's own
    draws, so a simulation sees the very distribution the benchmark sent."""

    samples: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.samples or min(self.samples) < 1:
            raise ValueError("sampled lengths need at least one sample, every one >= 1")

    @property
    def low(self) -> int:
        """The smallest sample."""
        return min(self.samples)

    @property
    def high(self) -> int:
        """The largest sample."""
        return max(self.samples)

    @property
    def mean(self) -> float:
        """The samples' mean."""
        return sum(self.samples) / len(self.samples)

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` samples, with replacement."""
        values: list[int] = rng.choice(np.asarray(self.samples), size=count).tolist()
        return values


Lengths = TokenLengths | SampledLengths


@dataclass(frozen=True, slots=True)
class Workload:
    """What the clients send, and how patient they are."""

    prompt_tokens: Lengths
    output_tokens: Lengths
    """max_tokens, generated in full."""
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S
    """A client leaves if its first token has not come by then; ``math.inf``: never."""
    service: ServiceMode = "profile"
    exponential_mean_s: float = 1.0
    """Mean server-seconds per request in the ``exponential`` service mode."""

    def __post_init__(self) -> None:
        if not self.client_timeout_s > 0:
            raise ValueError(f"client timeout must be > 0, got {self.client_timeout_s}")
        if not (math.isfinite(self.exponential_mean_s) and self.exponential_mean_s > 0):
            raise ValueError(f"exponential mean must be a finite number > 0, got {self.exponential_mean_s}")


@dataclass(frozen=True, slots=True)
class ServerModel:
    """The llama-server being simulated: its slots and calibrated speed curves."""

    slots: int
    prefill: PrefillCurve
    decode: DecodeCurve

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")

    @classmethod
    def from_profile(cls, profile: CalibrationProfile) -> ServerModel:
        """The server a calibration profile measured."""
        return cls(profile.server.slots, prefill_curve(profile), decode_curve(profile))


@dataclass(frozen=True, slots=True)
class CountCap:
    """The fixed-number gate: ``concurrency`` forwarded at most, ``queue`` waiting in front."""

    concurrency: int
    queue: int

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.queue < 0:
            raise ValueError(f"count cap needs concurrency >= 1 and queue >= 0, got {self}")


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """One run."""

    server: ServerModel
    workload: Workload
    arrival_rate_rps: float
    duration_s: float
    ttft_slo_s: float
    """Goodput counts requests completed with TTFT within this."""
    gate: GateKind = "none"
    thresholds: Thresholds | None = None
    """Required by the ``slogate`` gate."""
    count_cap: CountCap | None = None
    """Required by the ``count-cap`` gate."""
    seed: int = 0
    capacity_rps: float = math.nan
    """μ, reported back with the result (see ``capacity_rps``); informational."""

    def __post_init__(self) -> None:
        for name in ("arrival_rate_rps", "duration_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not self.ttft_slo_s > 0:
            raise ValueError(f"ttft_slo_s must be > 0, got {self.ttft_slo_s!r}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {', '.join(GATES)}, got {self.gate!r}")
        if self.gate == "slogate" and self.thresholds is None:
            raise ValueError("the slogate gate needs thresholds")
        if self.gate == "count-cap" and self.count_cap is None:
            raise ValueError("the count-cap gate needs a CountCap")
        if self.gate == "slogate" and self.workload.service == "exponential":
            raise ValueError("the slogate gate predicts from token counts: use the profile service mode")
        if self.workload.service == "profile":
            longest = self.workload.prompt_tokens.high + self.workload.output_tokens.high
            if self.thresholds is not None and longest > self.thresholds.per_request_max_tokens:
                raise ValueError(
                    f"prompt + output tokens reach {longest}, beyond one slot's "
                    f"{self.thresholds.per_request_max_tokens}: llama-server would refuse them"
                )


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What one run measured. ``offered`` = admitted + rejected + left while waiting at the gate."""

    gate: GateKind
    arrival_rate_rps: float
    capacity_rps: float
    duration_s: float
    offered: int
    """Arrivals in [0, duration_s]."""
    admitted: int
    """Forwarded to llama-server (at once or after waiting at the gate)."""
    deferred: int
    """Arrivals the gate first deferred (slogate), or queued in front (count-cap)."""
    rejected: int
    """429s, at arrival or when a deferral ran out."""
    timed_out: int
    """Clients that left before their first token, wherever they waited."""
    completed: int
    completed_within_slo: int
    throughput_rps: float
    """Completions inside [0, duration_s], per second: at most the capacity."""
    goodput_rps: float
    """Completed with TTFT within the SLO, per second of the arrival window."""
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    """TTFT quantiles over requests whose first token came (None if none did)."""
    mean_time_in_system_s: float | None
    """Arrival to leaving (completion, timeout, or rejection after a deferral), averaged over
    the requests not rejected on the spot."""
    mean_in_system: float
    """Time-average number of such requests inside, over [0, duration_s] (Little's L)."""
    entered: int
    """Arrivals not rejected on the spot: L = λ · W holds with λ = entered / duration_s."""
    utilization: float
    """Fraction of [0, duration_s] the server was computing (prefill or decode)."""

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-ready values."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- capacity


def capacity_rps(server: ServerModel, workload: Workload, streams: int) -> float:
    """μ: the core's work-conserving rate for the workload's mean request at ``streams``.

    1 / ``server_seconds_per_request`` at the rounded mean prompt and output lengths; in
    the exponential mode, 1 / the mean service time.
    """
    if workload.service == "exponential":
        return 1.0 / workload.exponential_mean_s
    seconds = server_seconds_per_request(
        server.prefill,
        server.decode,
        round(workload.prompt_tokens.mean),
        round(workload.output_tokens.mean),
        streams,
    )
    return 1.0 / seconds


def config_for_load(
    server: ServerModel,
    workload: Workload,
    *,
    load: float,
    duration_s: float,
    ttft_slo_s: float,
    gate: GateKind,
    thresholds: Thresholds | None = None,
    count_cap: CountCap | None = None,
    seed: int = 0,
) -> SimulationConfig:
    """A run at ``load`` x μ, μ taken at the derived concurrency cap (the slots without thresholds).

    The same λ for every gate, so gates are compared on the same offered traffic (and,
    with the same seed, on the very same arrivals).
    """
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a finite number > 0, got {load!r}")
    streams = thresholds.concurrency_cap if thresholds is not None else server.slots
    mu = capacity_rps(server, workload, streams)
    return SimulationConfig(
        server=server,
        workload=workload,
        arrival_rate_rps=load * mu,
        duration_s=duration_s,
        ttft_slo_s=ttft_slo_s,
        gate=gate,
        thresholds=thresholds,
        count_cap=count_cap,
        seed=seed,
        capacity_rps=mu,
    )


def mm1_config(arrival_rate_rps: float, service_rate_rps: float, duration_s: float, seed: int = 0) -> SimulationConfig:
    """The validation run: Exp(1/μ) service, one slot, no gate, patient clients: M/M/1."""
    server = ServerModel(slots=1, prefill=PrefillCurve(0.0, 1.0), decode=DecodeCurve((1.0,)))
    workload = Workload(
        prompt_tokens=TokenLengths.fixed(1),
        output_tokens=TokenLengths.fixed(1),
        client_timeout_s=math.inf,
        service="exponential",
        exponential_mean_s=1.0 / service_rate_rps,
    )
    return SimulationConfig(
        server=server,
        workload=workload,
        arrival_rate_rps=arrival_rate_rps,
        duration_s=duration_s,
        ttft_slo_s=math.inf,  # every completion counts (here TTFT = time in system)
        gate="none",
        seed=seed,
        capacity_rps=service_rate_rps,
    )
