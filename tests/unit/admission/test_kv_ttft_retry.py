"""Table tests: KV, the TTFT predicate and the reject path, with the spec's worked example."""

import pytest

from slogate_admission.kv import kv_bytes_per_token, kv_gate, kv_request_bytes, kv_reserved_tokens
from slogate_admission.retry import (
    effective_arrival_rate,
    retry_after_s,
    retry_after_whole_s,
    retry_amplification,
    retry_budget_allows,
)
from slogate_admission.ttft import (
    max_queued_tokens,
    predicted_ttft_s,
    queue_wait_s,
    token_budget,
    ttft_admits,
)


@pytest.mark.parametrize(
    ("layers", "heads", "dim", "elem", "expected"),
    [
        (32, 8, 128, 2, 131_072),  # spec: "KV per token = 2 · 32 · 8 · 128 · 2 ≈ 131 KB"
        (30, 3, 64, 2, 23_040),  # SmolLM2-135M, f16 cache
        (30, 3, 64, 1, 11_520),  # q8_0-ish one byte per element
    ],
)
def test_kv_bytes_per_token(layers: int, heads: int, dim: int, elem: float, expected: float) -> None:
    assert kv_bytes_per_token(layers, heads, dim, elem) == expected


def test_spec_2048_token_request_is_268_mb() -> None:
    assert kv_request_bytes(2048, 0, 131_072) == pytest.approx(268e6, rel=0.005)


def test_spec_kv_gate_rejects_172_mb_into_150_mb() -> None:
    needed = kv_request_bytes(800, 512, 131_072)
    assert kv_reserved_tokens(800, 512) == 1312
    assert needed == pytest.approx(172e6, rel=0.005)
    assert not kv_gate(150e6, needed)
    assert kv_gate(needed, needed)


class TestWorkedExample:
    """Spec: 1,200 tok/s prefill, 2 s TTFT SLO, an 800-token prompt."""

    rate, slo, own = 1200.0, 2.0, 800 / 1200

    def test_own_prefill_and_budget(self) -> None:
        assert self.own == pytest.approx(0.67, abs=0.005)
        assert max_queued_tokens(self.slo, self.own, self.rate) == pytest.approx(1600)
        assert token_budget(self.slo, self.rate) == 2400

    def test_1100_queued_admits(self) -> None:
        assert queue_wait_s(1100, self.rate) == pytest.approx(0.92, abs=0.005)
        assert predicted_ttft_s(1100, self.rate, self.own) == pytest.approx(1.59, abs=0.01)
        assert ttft_admits(1100, max_queued_tokens(self.slo, self.own, self.rate))

    def test_2400_queued_rejects(self) -> None:
        assert queue_wait_s(2400, self.rate) == pytest.approx(2.0)
        assert predicted_ttft_s(2400, self.rate, self.own) == pytest.approx(2.67, abs=0.005)
        assert not ttft_admits(2400, max_queued_tokens(self.slo, self.own, self.rate))

    def test_retry_after_is_time_to_drain_to_budget(self) -> None:
        # 800 tokens over budget at 1,200 tok/s.
        assert retry_after_s(2400, 1600, self.rate) == pytest.approx(2 / 3)
        assert retry_after_s(1100, 1600, self.rate) == 0


def test_prompt_beyond_slo_can_never_fit() -> None:
    assert max_queued_tokens(2.0, 2.5, 1000) < 0
    assert not ttft_admits(0, max_queued_tokens(2.0, 2.5, 1000))


def test_retry_after_rough_form_is_queue_over_throughput() -> None:
    assert retry_after_s(3000, 0, 1500) == 2.0


@pytest.mark.parametrize(("p", "mult"), [(0.0, 1.0), (0.5, 2.0), (0.9, 10.0)])
def test_retry_amplification(p: float, mult: float) -> None:
    # spec: "Rejecting 50% of traffic that retries instantly doubles arrivals"
    assert retry_amplification(p) == pytest.approx(mult)
    assert effective_arrival_rate(15, p) == pytest.approx(15 * mult)


def test_amplification_is_the_geometric_series() -> None:
    p = 0.3
    assert retry_amplification(p) == pytest.approx(sum(p**k for k in range(200)))


def test_retry_amplification_refuses_total_rejection() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        retry_amplification(1.0)


def test_retry_budget_is_ten_percent() -> None:
    assert retry_budget_allows(0, 10)
    assert not retry_budget_allows(1, 10)
    assert retry_budget_allows(9, 100)
    assert not retry_budget_allows(10, 100)
    assert not retry_budget_allows(0, 5)


@pytest.mark.parametrize(("seconds", "header"), [(0.0, 1), (0.2, 1), (1.0, 1), (1.01, 2), (7.5, 8)])
def test_retry_after_is_whole_seconds_rounded_up_and_never_zero(seconds: float, header: int) -> None:
    assert retry_after_whole_s(seconds) == header
