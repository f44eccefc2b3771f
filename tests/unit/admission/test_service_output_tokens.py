"""Service demand, the decode slowdown curve, and conservative n_out."""

import pytest

from slogate_admission.output_tokens import (
    OutputTokenEstimate,
    SlidingQuantile,
    estimate_output_tokens,
)
from slogate_admission.service import (
    DecodeCurve,
    PrefillCurve,
    resident_streams_within_tpot,
    server_seconds_per_request,
    service_demand_s,
)

# Measured on these machines (environment notes): 98, 69, 45 tok/s per stream at B = 1, 2, 4.
SMOLLM2 = DecodeCurve((98.0, 69.0, 57.0, 45.0))


def test_prefill_affine_and_quadratic() -> None:
    affine = PrefillCurve(0.05, 0.003)
    assert affine.seconds(0) == 0
    assert affine.seconds(1000) == pytest.approx(3.05)
    quad = PrefillCurve(0.0, 0.003, 1e-7)
    assert quad.seconds(1000) == pytest.approx(3.1)
    # The rate falls with length once the quadratic term is there.
    assert quad.tokens_per_second(1600) < quad.tokens_per_second(200)


def test_spec_worked_example_as_a_curve() -> None:
    assert PrefillCurve(0.0, 1 / 1200).seconds(800) == pytest.approx(0.6667, abs=1e-4)


def test_decode_slowdown() -> None:
    assert SMOLLM2.slowdown(1) == 1.0
    assert SMOLLM2.slowdown(2) == pytest.approx(98 / 69)
    assert SMOLLM2.seconds_per_token(4) == pytest.approx(1 / 45)
    assert SMOLLM2.aggregate_tokens_per_s(4) == pytest.approx(180)


def test_decode_extrapolates_never_flatter() -> None:
    f4, f3 = SMOLLM2.slowdown(4), SMOLLM2.slowdown(3)
    assert SMOLLM2.slowdown(6) == pytest.approx(f4 + 2 * (f4 - f3))
    assert DecodeCurve((50.0,)).slowdown(3) == 3.0


def test_max_streams_within_tpot() -> None:
    assert SMOLLM2.max_streams_within(1 / 60, 4) == 2  # 69 tok/s ok, 57 not
    assert SMOLLM2.max_streams_within(0.05, 4) == 4
    assert SMOLLM2.max_streams_within(0.001, 4) == 0
    # A noisy faster point after a miss does not re-admit.
    assert DecodeCurve((100.0, 40.0, 90.0)).max_streams_within(1 / 50, 3) == 1


def test_resident_check_is_on_b_plus_one() -> None:
    assert resident_streams_within_tpot(SMOLLM2, 1, 1 / 60)  # B+1 = 2: 69 tok/s
    assert not resident_streams_within_tpot(SMOLLM2, 2, 1 / 60)  # B+1 = 3: 57 tok/s


def test_server_seconds_share_decode_steps() -> None:
    prefill = PrefillCurve(0.0, 1 / 1200)
    # 4 streams at 45 tok/s each: 180 tok/s of decode; 90 tokens cost 0.5 s of server time.
    assert server_seconds_per_request(prefill, SMOLLM2, 600, 90, 4) == pytest.approx(0.5 + 0.5)
    # One stream: the request owns every step.
    assert server_seconds_per_request(prefill, SMOLLM2, 600, 98, 1) == pytest.approx(0.5 + 1.0)


def test_service_demand() -> None:
    prefill = PrefillCurve(0.0, 1 / 1200)
    decode = DecodeCurve((40.0,))
    # T(r) = 800/1200 + 100 / 40
    assert service_demand_s(prefill, decode, 800, 100) == pytest.approx(0.6667 + 2.5, abs=1e-3)


def test_curves_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="linear_s"):
        PrefillCurve(0.0, 0.0)
    with pytest.raises(ValueError, match="at least"):
        DecodeCurve(())
    with pytest.raises(ValueError, match="B=2"):
        DecodeCurve((10.0, -1.0))


def test_sliding_quantile_exact_nearest_rank() -> None:
    q = SlidingQuantile(window=100)
    assert q.quantile(0.95) is None
    for value in range(1, 101):
        q.observe(value)
    assert q.quantile(0.95) == 95
    assert q.quantile(0.5) == 50
    assert q.quantile(0.999) == 100


def test_sliding_quantile_forgets_old_samples() -> None:
    q = SlidingQuantile(window=10)
    for _ in range(10):
        q.observe(1000)
    for _ in range(10):
        q.observe(5)
    assert len(q) == 10
    assert q.quantile(0.95) == 5


@pytest.mark.parametrize(
    ("policy", "max_tokens", "learned", "expected"),
    [
        (OutputTokenEstimate.MAX_TOKENS, 512, None, 512),
        (OutputTokenEstimate.MAX_TOKENS, None, None, 256),
        (OutputTokenEstimate.ROUTE_QUANTILE, 512, 120.2, 121),
        (OutputTokenEstimate.ROUTE_QUANTILE, 100, 120.0, 100),
        (OutputTokenEstimate.ROUTE_QUANTILE, 512, None, 512),
        (OutputTokenEstimate.ROUTE_QUANTILE, None, 300.0, 300),
        (OutputTokenEstimate.DEFAULT, 512, None, 256),
        (OutputTokenEstimate.DEFAULT, 64, None, 64),
    ],
)
def test_estimate_output_tokens(
    policy: OutputTokenEstimate, max_tokens: int | None, learned: float | None, expected: int
) -> None:
    got = estimate_output_tokens(policy, max_tokens=max_tokens, default=256, route_quantile=learned)
    assert got == expected
