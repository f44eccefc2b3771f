"""A load run's results: each request's fate as its client saw it (``Result``), a run's
(``Run``) with the numbers every table shows, and the outcome columns each row adds up by.

Written by the live load generator (``live.load``), read by every run and report: the one schema
of a measured run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from slogate_bench.live.balancer import tries_of, upstreams_of

Outcome = Literal["ok", "rejected", "refused", "timeout", "error"]
"""refused: slogate's 400 for a request that can never meet its SLO (own prefill beyond it, or
beyond a slot's context): an instant, deliberate no that no retry can change; not an error."""
REJECTION_STATUSES = frozenset({429, 503})
"""Load shedding: slogate's 429 (and 503 when it cannot decide), the count cap's 503."""
NEVER_FITS_CODE = b'"slogate_request_too_large"'
"""The error code of slogate's 400 for a request no wait can serve within its SLO."""


@dataclass(frozen=True, slots=True)
class Result:
    """One request's fate, seen from the client (after all its attempts)."""

    outcome: Outcome
    status: int
    ttft_s: float | None
    """Client-side time to the first generated token (None unless it came)."""
    total_s: float
    retry_after_s: float | None = None
    """The last rejection's Retry-After, if it had one."""
    attempts: int = 1
    rejection_latencies_s: tuple[float, ...] = ()
    """Per rejected attempt: the time from sending it to its 429/503."""
    retry_delays_s: tuple[float, ...] = ()
    """The delays the client waited before each retry."""
    class_name: str | None = None
    prompt_tokens: int = 0
    max_tokens: int = 0
    predicted_ttft_s: float | None = None
    """slogate's median TTFT prediction for it (its ``X-Slogate-Predicted-Ttft``), if it said one."""
    lag_s: float = 0.0
    """How late the generator sent the first attempt against the schedule (its own overload)."""
    upstreams: str | None = None
    """The balancer's ``TRIED_HEADER`` on the last attempt's answer: the pods nginx tried, in order
    (None: no balancer, or no answer's headers came before the client gave up)."""
    tenant: str | None = None
    """The tenant it was sent for (``Arrival.tenant``)."""

    @property
    def tries(self) -> int:
        """Pods the balancer tried for the last attempt (0: unknown, no ``TRIED_HEADER`` seen)."""
        return tries_of(self.upstreams)

    @property
    def answered_by(self) -> str | None:
        """The pod (``host:port``) whose answer the client got: the last one nginx tried."""
        tried = upstreams_of(self.upstreams)
        return tried[-1] if tried else None


@dataclass(slots=True)
class Run:
    """All results of one load run."""

    duration_s: float
    results: list[Result] = field(default_factory=list)
    client_cpu_s: float = 0.0
    """The load generator's CPU seconds over the run (time.process_time(): the whole process,
    so anything else served in-process, a proxy for instance, is counted too)."""
    wall_s: float = 0.0
    """From the first arrival to the last request's end."""

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)

    def for_class(self, class_name: str | None) -> Run:
        """The same run restricted to one class (CPU not apportioned: kept whole)."""
        return Run(
            self.duration_s, [r for r in self.results if r.class_name == class_name], self.client_cpu_s, self.wall_s
        )

    def within(self, slo_s: float) -> list[Result]:
        """Completed requests whose first token met the SLO."""
        return [r for r in self.results if r.outcome == "ok" and r.ttft_s is not None and r.ttft_s <= slo_s]

    def goodput(self, slo_s: float) -> float:
        """Requests completed within the TTFT SLO, per second of offered load."""
        return len(self.within(slo_s)) / self.duration_s

    def ttft_quantile(self, q: float) -> float | None:
        values = sorted(r.ttft_s for r in self.results if r.outcome == "ok" and r.ttft_s is not None)
        if not values:
            return None
        return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]

    def time_in_system_mean(self) -> float | None:
        """Mean seconds from sending to the last token, over completed requests (Little's W,
        censored: requests whose clients gave up are not in it)."""
        values = [r.total_s for r in self.results if r.outcome == "ok"]
        return statistics.fmean(values) if values else None

    def rejection_latency_median(self) -> float | None:
        """Median time from sending an attempt to its 429/503, over every rejected attempt."""
        values = [s for r in self.results for s in r.rejection_latencies_s]
        return statistics.median(values) if values else None

    @property
    def arrivals(self) -> int:
        """Attempts that reached the server: first attempts plus retries."""
        return sum(r.attempts for r in self.results)

    @property
    def retries(self) -> int:
        return self.arrivals - len(self.results)

    def offered_rate(self) -> float:
        """λ: requests (first attempts) per second."""
        return len(self.results) / self.duration_s

    def effective_rate(self) -> float:
        """λ_eff: attempts (retries included) per second."""
        return self.arrivals / self.duration_s

    def rejection_probability(self) -> float:
        """p: the fraction of attempts answered 429/503."""
        rejected = sum(len(r.rejection_latencies_s) for r in self.results)
        return rejected / self.arrivals if self.arrivals else 0.0

    def predicted_effective_rate(self, max_attempts: int | None = None) -> float:
        """λ / (1 − p) for unbounded retries; λ (1 − p^N) / (1 − p) with N attempts at most."""
        p = self.rejection_probability()
        if max_attempts is not None:
            return self.offered_rate() * (max_attempts if p == 1.0 else (1 - p**max_attempts) / (1 - p))
        return math.inf if p == 1.0 else self.offered_rate() / (1 - p)

    def client_cpu_per_request_s(self) -> float:
        """The generator's CPU seconds per attempt sent."""
        return self.client_cpu_s / self.arrivals if self.arrivals else 0.0

    def client_cpu_share(self) -> float:
        """The generator's CPU as a fraction of one core over the run's wall time."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def max_lag_s(self) -> float:
        return max((r.lag_s for r in self.results), default=0.0)

    def summary(self, slo_s: float) -> dict[str, float | int | None]:
        """The numbers a benchmark table shows, by name."""
        return {
            "requests": len(self.results),
            "arrivals": self.arrivals,
            "ok": self.count("ok"),
            "within_slo": len(self.within(slo_s)),
            "rejected": self.count("rejected"),
            "refused": self.count("refused"),
            "timeout": self.count("timeout"),
            "error": self.count("error"),
            "goodput_rps": self.goodput(slo_s),
            "ttft_p50_s": self.ttft_quantile(0.5),
            "ttft_p99_s": self.ttft_quantile(0.99),
            "time_in_system_mean_s": self.time_in_system_mean(),
            "rejection_latency_p50_s": self.rejection_latency_median(),
            "offered_rps": self.offered_rate(),
            "effective_rps": self.effective_rate(),
            "rejection_probability": self.rejection_probability(),
            "client_cpu_per_request_s": self.client_cpu_per_request_s(),
            "client_cpu_share": self.client_cpu_share(),
            "max_lag_s": self.max_lag_s(),
        }


OUTCOME_COLUMNS = ("within SLO", "served late", "rejected", "refused", "timed out", "errors")
"""What became of the requests sent, one column per fate: every results table shows them all,
so each row adds up to its `sent`."""


def outcome_counts(run: Mapping[str, Any]) -> list[int]:
    """A run's counts (``Run.summary``, or a published row of it) in OUTCOME_COLUMNS order;
    ValueError unless they add up to its requests sent."""
    counts = [
        run["within_slo"],
        run["ok"] - run["within_slo"],  # completed, first token after the SLO
        run["rejected"],
        run.get("refused", 0),  # runs older than slogate's 400 have none
        run["timeout"],
        run["error"],
    ]
    if sum(counts) != run["requests"]:
        label = " ".join(str(run[k]) for k in ("scenario", "workload", "retry") if k in run) or "a run"
        at = f" at {run['load']:g}x" if "load" in run else ""
        raise ValueError(f"{label}{at}: {' + '.join(map(str, counts))} != {run['requests']} sent")
    return counts
