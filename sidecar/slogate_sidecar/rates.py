"""Live prefill and decode rates from llama-server's counters, and the TTFT prediction error.

Pure: no I/O, no clock of its own (callers pass a monotonic ``now`` in seconds).

llama-server's rate *gauges* are averaged since the previous scrape and reset by every
scrape, so two scrapers corrupt each other; the rates here come from *counter deltas*:

- prefill: Δ``prompt_tokens_total`` / Δ``prompt_seconds_total``;
- decode:  Δ``tokens_predicted_total`` / Δ``tokens_predicted_seconds_total``.

What the counters measure (llama-server's ``server_metrics``): a slot adds its prompt
tokens and its prompt-processing wall time when its prompt is done, and its generated
tokens and generation wall time when the request ends. Times of slots working in the same
batch are summed, so both ratios are *per-stream* speeds under the real mix of work: the
prefill ratio is the speed one prompt is processed at while batched with the rest (what a
request's own prefill takes), the decode ratio the token-weighted per-stream decode speed
of the requests that finished (aggregate throughput = that x the streams decoding).
Counters also move in lumps (one request at a time), which is why samples are weighted by
their tokens, not by wall time.

Rounding: llama-server prints six significant digits, so after days of uptime a counter
moves in steps of 100 (past 10^7) or 1,000 (past 10^8) while one scrape adds a few
hundred tokens; the seconds counters are rounded alike. Each end of a printed delta is
off by at most half its step (`rounding_step`), which bounds the error of Δtokens /
Δseconds (`_worst_rate_error`). An interval is a sample only once that bound is within
``max_rounding_error``; until then its baseline is kept and it grows, and errors never
add up, since a sample's two ends are printed values. A sample that needed longer than
``max_age_s`` to get there is not reported: the counters are too coarse for the traffic
and the caller's calibrated rate is used. docs/metrics.md gives the numbers.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from slogate_llama.counters import LlamaCounters, rounding_step

__all__ = ["RateEstimator", "RateSettings", "TtftErrorSummary", "TtftErrorTracker"]


@dataclass(frozen=True, slots=True)
class RateSettings:
    """How counter deltas become a smoothed rate."""

    min_tokens: int = 16
    """An interval with fewer tokens than this (or no measured seconds) is not a sample.
    The baseline is kept, so its tokens count in the next informative interval: at a high
    scrape rate nothing is lost, and a lone 3-token request never sets the rate alone."""
    prefill_half_life_tokens: float = 512.0
    """Prompt tokens at which a sample gets weight 1/2: weight = 1 - 2^(-tokens / this).
    A 3-token interval moves the estimate by 0.4 %, a 2,000-token one by 93 %."""
    decode_half_life_tokens: float = 256.0
    """Generated tokens at which a decode sample gets weight 1/2 (same formula). Lower
    than prefill's: a scrape interval sees fewer generated tokens than prompt tokens."""
    max_rounding_error: float = 0.02
    """Largest relative error six-digit rounding may put in one sample's rate. Each sample
    is then within this of the true rate of its interval, and so is the average (a convex
    combination of samples). 2 % needs ~51 steps of the token counter per sample: 510
    tokens past 10^6, 5,100 past 10^7, 51,000 past 10^8."""

    def __post_init__(self) -> None:
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {self.min_tokens}")
        if not 0 < self.max_rounding_error < 1:
            raise ValueError(f"max_rounding_error must be in (0, 1), got {self.max_rounding_error}")
        for name in ("prefill_half_life_tokens", "decode_half_life_tokens"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value}")


def _check_start(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number or None, got {value}")


def _end_error(printed: float, whole: bool) -> float:
    """How far the true counter may be from its printed value: half a rounding step.

    A whole-number counter (tokens) printed with a step of 1 or less is exact.
    """
    step = rounding_step(printed)
    return 0.0 if whole and step <= 1.0 else step / 2


def _worst_rate_error(base: tuple[float, float], tokens: float, seconds: float) -> float:
    """Largest |printed rate / true rate - 1| the rounding of both counters allows.

    With b and a the largest relative errors of Δtokens and Δseconds, the true rate lies
    in [Δt(1 - b) / Δs(1 + a), Δt(1 + b) / Δs(1 - a)], so the printed rate is off by at most
    (a + b) / (1 - b) (the low end is the farther one). Infinite when an error reaches its
    whole delta. Callers pass positive deltas.
    """
    b = (_end_error(base[0], True) + _end_error(tokens, True)) / (tokens - base[0])
    a = (_end_error(base[1], False) + _end_error(seconds, False)) / (seconds - base[1])
    if b >= 1 or a >= 1:
        return math.inf
    return (a + b) / (1 - b)


class _CounterRate:
    """One token-weighted EWMA of Δtokens / Δseconds over a pair of printed counters."""

    __slots__ = (
        "_base",
        "_base_at",
        "_estimate",
        "_half_life",
        "_max_error",
        "_min_tokens",
        "_sampled_at",
        "_span_s",
        "samples",
    )

    def __init__(self, half_life_tokens: float, settings: RateSettings, start: float | None) -> None:
        self._half_life = half_life_tokens
        self._min_tokens = settings.min_tokens
        self._max_error = settings.max_rounding_error
        self._estimate = start
        self._sampled_at: float | None = None
        self._span_s = 0.0
        self._base: tuple[float, float] | None = None
        self._base_at = 0.0
        self.samples = 0

    def rebase(self, tokens: float, seconds: float, now: float) -> None:
        self._base, self._base_at = (tokens, seconds), now

    def advance(self, tokens: float, seconds: float, now: float) -> None:
        if self._base is None or (tokens, seconds) == self._base:
            # Nothing measurable since the baseline (idle, or moving within the rounding):
            # the interval starts now, so idle time never makes the next sample look old.
            self.rebase(tokens, seconds, now)
            return
        d_tokens = tokens - self._base[0]
        d_seconds = seconds - self._base[1]
        if d_tokens < self._min_tokens or d_seconds <= 0:
            return  # nothing measured yet: keep the baseline and accumulate
        rate = d_tokens / d_seconds
        if not math.isfinite(rate):
            return  # seconds too small to divide by: wait for more
        if _worst_rate_error(self._base, tokens, seconds) > self._max_error:
            return  # deltas still coarse against the rounding steps: accumulate
        if self._estimate is None:
            self._estimate = rate
        else:
            weight = 1.0 - math.pow(0.5, d_tokens / self._half_life)
            self._estimate += weight * (rate - self._estimate)
        self._sampled_at = now
        self._span_s = now - self._base_at
        self.rebase(tokens, seconds, now)
        self.samples += 1

    def age_s(self, now: float) -> float | None:
        return None if self._sampled_at is None else max(0.0, now - self._sampled_at)

    def value(self, now: float, max_age_s: float) -> float | None:
        age = self.age_s(now)
        if age is None or age > max_age_s or self._span_s > max_age_s:
            return None  # never measured, measured too long ago, or too slowly to be live
        return self._estimate


class RateEstimator:
    """Smoothed live prefill and decode rates with bounded staleness.

    Feed it every scrape with `observe`; ask `prefill_tokens_per_s(now, max_age_s)`. None
    means "no live measurement fresher than max_age_s" (the last sample is older, or took
    longer to gather because the rounded counters move too little): use the calibrated
    rate. Start values (from calibration) only seed the average; until a live sample
    arrives the getters return None all the same, because nothing live has been measured.
    """

    __slots__ = ("_decode", "_last", "_prefill", "restarts", "settings")

    def __init__(
        self,
        settings: RateSettings | None = None,
        *,
        prefill_start: float | None = None,
        decode_start: float | None = None,
    ) -> None:
        _check_start("prefill_start", prefill_start)
        _check_start("decode_start", decode_start)
        self.settings = settings or RateSettings()
        s = self.settings
        self._prefill = _CounterRate(s.prefill_half_life_tokens, s, prefill_start)
        self._decode = _CounterRate(s.decode_half_life_tokens, s, decode_start)
        self._last: LlamaCounters | None = None
        self.restarts = 0
        """Times a counter went backwards (llama-server restarted)."""

    def observe(self, counters: LlamaCounters, now: float) -> None:
        """Take one scrape's counters, read at monotonic time ``now``.

        A snapshot with a non-finite counter is ignored. A counter lower than in the
        previous snapshot means llama-server restarted: both baselines move to this
        snapshot, no sample is produced, and the estimates (and their ages) are kept.
        """
        values = (
            counters.prompt_tokens_total,
            counters.prompt_seconds_total,
            counters.tokens_predicted_total,
            counters.tokens_predicted_seconds_total,
        )
        if not all(math.isfinite(v) for v in values):
            return
        last = self._last
        self._last = counters
        if last is not None and (
            counters.prompt_tokens_total < last.prompt_tokens_total
            or counters.prompt_seconds_total < last.prompt_seconds_total
            or counters.tokens_predicted_total < last.tokens_predicted_total
            or counters.tokens_predicted_seconds_total < last.tokens_predicted_seconds_total
        ):
            self.restarts += 1
            self._prefill.rebase(counters.prompt_tokens_total, counters.prompt_seconds_total, now)
            self._decode.rebase(counters.tokens_predicted_total, counters.tokens_predicted_seconds_total, now)
            return
        self._prefill.advance(counters.prompt_tokens_total, counters.prompt_seconds_total, now)
        self._decode.advance(counters.tokens_predicted_total, counters.tokens_predicted_seconds_total, now)

    def prefill_tokens_per_s(self, now: float, max_age_s: float) -> float | None:
        """Live prefill tokens/s; None if never measured, or the last sample is older than
        max_age_s or took longer than max_age_s to gather."""
        return self._prefill.value(now, max_age_s)

    def decode_tokens_per_s(self, now: float, max_age_s: float) -> float | None:
        """Live per-stream decode tokens/s; None as for `prefill_tokens_per_s`."""
        return self._decode.value(now, max_age_s)

    def prefill_age_s(self, now: float) -> float | None:
        """Seconds since the last informative prefill sample; None if there was none."""
        return self._prefill.age_s(now)

    def decode_age_s(self, now: float) -> float | None:
        """Seconds since the last informative decode sample; None if there was none."""
        return self._decode.age_s(now)

    @property
    def prefill_samples(self) -> int:
        """Informative prefill intervals taken so far."""
        return self._prefill.samples

    @property
    def decode_samples(self) -> int:
        """Informative decode intervals taken so far."""
        return self._decode.samples


@dataclass(frozen=True, slots=True)
class TtftErrorSummary:
    """How well predicted TTFT matched reality, for the state endpoint and logs."""

    samples: int
    """Requests in the window (at most the tracker's window size)."""
    median_abs_relative_error: float | None
    """Median of |predicted - actual| / actual over the window; None when empty."""
    median_ratio: float | None
    """Median of actual / predicted: > 1 means the gate is optimistic."""
    met: int
    """Admitted requests whose first token came within their SLO (since start)."""
    missed: int
    """Admitted requests whose first token came later than their SLO (since start)."""


class TtftErrorTracker:
    """Predicted vs actual TTFT of admitted requests over a bounded window.

    `record` is O(1) (append to a deque); medians are computed on demand (O(n log n) over
    at most ``window`` entries), for the state endpoint and scrapes, never per request.
    """

    __slots__ = ("_window", "met", "missed")

    def __init__(self, window: int = 256) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._window: deque[tuple[float, float]] = deque(maxlen=window)
        self.met = 0
        self.missed = 0

    def record(self, predicted_ttft_s: float, actual_ttft_s: float, slo_s: float) -> None:
        """One admitted request's first token. Met means actual <= slo_s.

        A pair with a non-positive or non-finite time counts for met/missed but not in
        the error window (a ratio to zero is meaningless).
        """
        if actual_ttft_s <= slo_s:
            self.met += 1
        else:
            self.missed += 1
        if (
            math.isfinite(predicted_ttft_s)
            and math.isfinite(actual_ttft_s)
            and predicted_ttft_s > 0
            and actual_ttft_s > 0
        ):
            abs_rel = abs(predicted_ttft_s - actual_ttft_s) / actual_ttft_s
            self._window.append((abs_rel, actual_ttft_s / predicted_ttft_s))

    def __len__(self) -> int:
        return len(self._window)

    def median_abs_relative_error(self) -> float | None:
        """Median |predicted - actual| / actual over the window; None when empty."""
        if not self._window:
            return None
        return statistics.median(e for e, _ in self._window)

    def median_ratio(self) -> float | None:
        """Median actual / predicted over the window; None when empty."""
        if not self._window:
            return None
        return statistics.median(r for _, r in self._window)

    def summary(self) -> TtftErrorSummary:
        """Everything at once."""
        return TtftErrorSummary(
            samples=len(self._window),
            median_abs_relative_error=self.median_abs_relative_error(),
            median_ratio=self.median_ratio(),
            met=self.met,
            missed=self.missed,
        )
