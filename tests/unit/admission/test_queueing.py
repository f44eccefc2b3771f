"""Table tests for the queueing laws, with the spec's own numbers."""

import math

import pytest

from slogate_admission.queueing import (
    erlang_b,
    little_l_max,
    littles_law_number_in_system,
    mm1_number_in_system,
    mm1_time_in_system,
    pollaczek_khinchine_wait,
    service_time_cv2,
    utilization,
)


def test_little_l_max_spec_example() -> None:
    # "A server that completes 10 req/s with a 2 s SLO should hold at most 20."
    assert little_l_max(10, 2) == 20


@pytest.mark.parametrize(("lam", "w", "expected"), [(10, 2, 20), (0, 5, 0), (2.5, 0.4, 1.0)])
def test_littles_law(lam: float, w: float, expected: float) -> None:
    assert littles_law_number_in_system(lam, w) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("lam", "mu", "w_expected"),
    [(5, 10, 0.2), (9, 10, 1.0), (9.9, 10, 10.0)],  # spec: 200 ms, 1 s, 10 s
)
def test_mm1_time_in_system_spec(lam: float, mu: float, w_expected: float) -> None:
    assert mm1_time_in_system(lam, mu) == pytest.approx(w_expected)


def test_mm1_penalty_is_fifty_fold() -> None:
    # "a 50x latency penalty for serving 2x the traffic of the half-loaded case"
    assert mm1_time_in_system(9.9, 10) / mm1_time_in_system(5, 10) == pytest.approx(50)


@pytest.mark.parametrize(("rho", "expected"), [(0.5, 1.0), (0.9, 9.0), (0.0, 0.0)])
def test_mm1_number_in_system(rho: float, expected: float) -> None:
    assert mm1_number_in_system(rho) == pytest.approx(expected)


def test_unstable_queue_has_no_finite_mean() -> None:
    assert mm1_time_in_system(10, 10) == math.inf
    assert mm1_time_in_system(15, 10) == math.inf
    assert mm1_number_in_system(1.0) == math.inf
    assert pollaczek_khinchine_wait(2, 0.5, 1) == math.inf


def test_littles_law_agrees_with_mm1() -> None:
    lam, mu = 7.0, 10.0
    assert littles_law_number_in_system(lam, mm1_time_in_system(lam, mu)) == pytest.approx(
        mm1_number_in_system(utilization(lam, mu))
    )


def test_pk_with_exponential_service_is_mm1_wait() -> None:
    lam, mu = 8.0, 10.0
    assert pollaczek_khinchine_wait(lam, 1 / mu, 1.0) == pytest.approx(mm1_time_in_system(lam, mu) - 1 / mu)


def test_pk_deterministic_service_halves_the_wait() -> None:
    # M/D/1 (C_v^2 = 0) waits half as long as M/M/1 (C_v^2 = 1).
    assert pollaczek_khinchine_wait(5, 0.1, 0) * 2 == pytest.approx(pollaczek_khinchine_wait(5, 0.1, 1))


def test_pk_grows_with_variance() -> None:
    waits = [pollaczek_khinchine_wait(5, 0.1, cv2) for cv2 in (0, 1, 4, 25)]
    assert waits == sorted(waits)
    assert waits[3] / waits[1] == pytest.approx(13)  # (1 + 25) / (1 + 1)


def test_cv2() -> None:
    assert service_time_cv2(2.0, 2.0) == 1.0
    assert service_time_cv2(2.0, 0.0) == 0.0


@pytest.mark.parametrize(
    ("call", "args"),
    [
        (utilization, (1, 0)),
        (utilization, (-1, 1)),
        (little_l_max, (1, 0)),
        (mm1_time_in_system, (1, -1)),
        (mm1_number_in_system, (-0.1,)),
        (pollaczek_khinchine_wait, (1, 0, 1)),
        (littles_law_number_in_system, (math.nan, 1)),
        (erlang_b, (-1, 1.0)),
        (erlang_b, (2, -1.0)),
    ],
)
def test_nonsense_is_refused(call, args) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="must be"):
        call(*args)


def test_erlang_b_against_its_closed_form_and_tables() -> None:
    # One server: a / (1 + a). Two: a² / 2 / (1 + a + a² / 2).
    for a in (0.1, 1.0, 7.5):
        assert erlang_b(1, a) == pytest.approx(a / (1 + a))
        assert erlang_b(2, a) == pytest.approx(a * a / 2 / (1 + a + a * a / 2))
    # Published table values (e.g. any Erlang B table): B(10, 5) = 0.01838, B(4, 3) = 0.2061.
    assert erlang_b(10, 5.0) == pytest.approx(0.018385, abs=5e-6)
    assert erlang_b(4, 3.0) == pytest.approx(0.20611, abs=5e-5)
    assert erlang_b(0, 2.0) == 1.0
    assert erlang_b(5, 0.0) == 0.0
    # Pooling: one loss system of N·C servers blocks less than N of C at a/N each.
    assert erlang_b(40, 30.0) < erlang_b(4, 3.0)
    # A thousand servers: the recursion stays finite and in [0, 1].
    assert 0.0 < erlang_b(1000, 1000.0) < 0.05
