"""Service demand of one LLM request, and how decode slows as streams are added.

Spec: "LLM twist 1" (T(r) = T_prefill(n_in) + n_out · t_decode) and "CPU SLM serving"
(t_decode(B) ≈ t_1 · f(B), f growing once memory bandwidth saturates). The curves
come from calibration: measured on the actual model, quantization and hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from slogate_admission._checks import require_non_negative, require_positive


@dataclass(frozen=True, slots=True)
class PrefillCurve:
    """T_prefill(n) = intercept + linear · n + quadratic · n² seconds for an n-token prompt.

    Affine when ``quadratic_s`` is 0. On CPU attention cost grows with the prompt,
    so the rate n / T_prefill(n) visibly falls with length: the quadratic term
    captures that without pretending the rate is one number.
    """

    intercept_s: float
    """Fixed cost per prompt (scheduling, first batch), seconds; >= 0."""
    linear_s: float
    """Seconds per prompt token at short lengths; > 0."""
    quadratic_s: float = 0.0
    """Seconds per token², the attention growth; >= 0."""

    def __post_init__(self) -> None:
        require_non_negative("intercept_s", self.intercept_s)
        require_positive("linear_s", self.linear_s)
        require_non_negative("quadratic_s", self.quadratic_s)

    def seconds(self, prompt_tokens: float) -> float:
        """T_prefill(n) in seconds; 0 for an empty prompt (nothing to prefill)."""
        require_non_negative("prompt_tokens", prompt_tokens)
        if prompt_tokens == 0:
            return 0.0
        n = prompt_tokens
        return self.intercept_s + self.linear_s * n + self.quadratic_s * n * n

    def tokens_per_second(self, prompt_tokens: float) -> float:
        """The prefill rate n / T_prefill(n) at one prompt length (tokens/s)."""
        require_positive("prompt_tokens", prompt_tokens)
        return prompt_tokens / self.seconds(prompt_tokens)


@dataclass(frozen=True, slots=True)
class DecodeCurve:
    """Per-stream decode speed measured at B = 1 .. N concurrent streams.

    t_decode(B) = 1 / tokens_per_s(B) = t_1 · f(B), with f(B) = tokens_per_s(1) / tokens_per_s(B).
    Beyond the measured range f is extended along its last segment (never flatter):
    underestimating the slowdown would admit streams that miss their per-token SLO.
    """

    per_stream_tokens_per_s: tuple[float, ...]
    """Index B-1 holds the measured per-stream tokens/s with B streams decoding."""

    def __post_init__(self) -> None:
        if not self.per_stream_tokens_per_s:
            raise ValueError("a decode curve needs at least the B=1 measurement")
        for b, tps in enumerate(self.per_stream_tokens_per_s, start=1):
            require_positive(f"per-stream tokens/s at B={b}", tps)

    @property
    def max_measured_streams(self) -> int:
        """The largest B that was measured."""
        return len(self.per_stream_tokens_per_s)

    @property
    def t1_s(self) -> float:
        """t_1: seconds per token for a lone stream."""
        return 1.0 / self.per_stream_tokens_per_s[0]

    def slowdown(self, streams: int) -> float:
        """f(B) = t_decode(B) / t_1, >= the measured value; f(1) = 1 by construction."""
        require_positive("streams", streams)
        measured = self.per_stream_tokens_per_s
        if streams <= len(measured):
            return measured[0] / measured[streams - 1]
        last = measured[0] / measured[-1]
        if len(measured) == 1:
            # One point gives no slope: assume aggregate throughput stays flat, so
            # per-stream time grows linearly with B (f(B) = B): pessimistic, safe.
            return float(streams)
        prev = measured[0] / measured[-2]
        slope = max(last - prev, 0.0)
        return last + slope * (streams - len(measured))

    def seconds_per_token(self, streams: int) -> float:
        """t_decode(B) = t_1 · f(B): seconds per output token of each of B streams."""
        return self.t1_s * self.slowdown(streams)

    def aggregate_tokens_per_s(self, streams: int) -> float:
        """B / t_decode(B): tokens/s summed over all B streams."""
        return streams / self.seconds_per_token(streams)

    def max_streams_within(self, tpot_slo_s: float, limit: int) -> int:
        """Largest B <= limit with t_decode(B) <= the per-token SLO (0 if even B=1 misses).

        f is non-decreasing on real hardware, but measurements are noisy: the first
        B that misses ends the search, so a lucky higher-B point never re-admits.
        """
        require_positive("tpot_slo_s", tpot_slo_s)
        streams = 0
        for b in range(1, limit + 1):
            if self.seconds_per_token(b) > tpot_slo_s:
                break
            streams = b
        return streams


def service_demand_s(
    prefill: PrefillCurve,
    decode: DecodeCurve,
    prompt_tokens: int,
    output_tokens: int,
    streams: int = 1,
) -> float:
    """T(r) ≈ T_prefill(n_in) + n_out · t_decode(B), seconds of service for one request."""
    require_non_negative("output_tokens", output_tokens)
    return prefill.seconds(prompt_tokens) + output_tokens * decode.seconds_per_token(streams)


def server_seconds_per_request(
    prefill: PrefillCurve,
    decode: DecodeCurve,
    prompt_tokens: int,
    output_tokens: int,
    streams: int,
) -> float:
    """Server time one request costs when B streams share the cores: 1 / μ.

    T_prefill(n_in) + n_out · t_decode(B) / B. On a CPU server prefill and decode
    run on the same cores, so a request's prefill is exclusive, while each batched
    decode step produces one token for each of B streams: a request owns 1/B of the
    steps that make its n_out tokens. Work-conserving, so μ = 1 / this.
    """
    require_positive("streams", streams)
    return prefill.seconds(prompt_tokens) + output_tokens / decode.aggregate_tokens_per_s(streams)


def resident_streams_within_tpot(decode: DecodeCurve, resident_streams: int, tpot_slo_s: float) -> bool:
    """Admitting one more stream keeps every resident stream within the per-token SLO.

    Decode on CPU is bandwidth-bound: a new stream slows all of them to
    t_decode(B + 1), so the check is on B + 1 for everyone, not the newcomer alone.
    """
    require_non_negative("resident_streams", resident_streams)
    return decode.seconds_per_token(resident_streams + 1) <= tpot_slo_s
