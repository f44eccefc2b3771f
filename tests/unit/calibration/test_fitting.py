"""The prefill fit on synthetic data with known answers."""

import random

import pytest

from slogate_admission.schema import PrefillPoint
from slogate_calibration.fitting import fit_prefill

LENGTHS = (32, 64, 128, 256, 512, 1024, 1536, 2000)


def points(a: float, b: float, c: float, noise: float = 0.0, seed: int = 7) -> list[PrefillPoint]:
    rng = random.Random(seed)
    return [
        PrefillPoint(prompt_tokens=n, seconds=(a + b * n + c * n * n) * (1 + rng.uniform(-noise, noise)))
        for n in LENGTHS
        for _ in range(2)
    ]


def test_exact_affine_is_recovered() -> None:
    fit = fit_prefill(points(0.02, 0.003, 0.0))
    assert fit.form == "affine"
    assert fit.intercept_s == pytest.approx(0.02, rel=1e-6)
    assert fit.linear_s == pytest.approx(0.003, rel=1e-6)
    assert fit.rms_relative_error == pytest.approx(0, abs=1e-9)


def test_exact_quadratic_is_recovered() -> None:
    fit = fit_prefill(points(0.01, 0.0028, 2e-7))
    assert fit.form == "quadratic"
    assert fit.linear_s == pytest.approx(0.0028, rel=1e-6)
    assert fit.quadratic_s == pytest.approx(2e-7, rel=1e-5)


def test_noisy_quadratic_within_noise() -> None:
    fit = fit_prefill(points(0.01, 0.0028, 2e-7, noise=0.03))
    assert fit.form == "quadratic"
    assert fit.rms_relative_error < 0.03
    assert fit.quadratic_s == pytest.approx(2e-7, rel=0.35)


def test_negligible_curvature_stays_affine() -> None:
    # c so small it cannot beat the noise: the simpler model wins.
    fit = fit_prefill(points(0.01, 0.003, 1e-12, noise=0.02))
    assert fit.form == "affine"
    assert fit.quadratic_s == 0


def test_negative_intercept_is_clamped() -> None:
    fit = fit_prefill(points(-0.05, 0.003, 0.0))
    assert fit.intercept_s == 0
    assert fit.linear_s > 0


def test_too_few_lengths_refused() -> None:
    with pytest.raises(ValueError, match="3 distinct"):
        fit_prefill(
            [
                PrefillPoint(prompt_tokens=10, seconds=0.1),
                PrefillPoint(prompt_tokens=20, seconds=0.2),
            ]
        )


def test_flat_times_refused() -> None:
    flat = [PrefillPoint(prompt_tokens=n, seconds=0.5) for n in (10, 100, 1000)]
    with pytest.raises(ValueError, match="do not grow"):
        fit_prefill(flat)
