"""Fit T_prefill(n) = a + b·n + c·n² to measured prefill times.

Model choice: on CPU attention cost grows with the prompt, so the prefill *rate*
falls with length (about 330 tok/s short, 290 at 1,600 tokens here): an affine fit
is fine on short prompts and too optimistic on long ones. We fit both and keep the
quadratic only when it is physically sensible (c > 0) and cuts the fit error by a
fifth or more; otherwise the simpler affine model wins.

Least squares is on *relative* residuals (each row divided by its measured time):
prompt times span two orders of magnitude, and a plain fit would let the longest
prompts decide everything while short-prompt predictions drift by 100%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from slogate_admission.schema import PrefillFit, PrefillPoint

QUADRATIC_MIN_IMPROVEMENT = 0.8
"""Keep the quadratic term only if its RMS relative error is <= 80% of the affine one."""


def _lstsq_relative(columns: list[np.ndarray], seconds: np.ndarray) -> np.ndarray:
    design = np.column_stack(columns) / seconds[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    return np.asarray(coef, dtype=float)


def _rms_relative(coefs: tuple[float, float, float], n: np.ndarray, seconds: np.ndarray) -> float:
    a, b, c = coefs
    predicted = a + b * n + c * n * n
    return float(math.sqrt(np.mean(((predicted - seconds) / seconds) ** 2)))


def _affine(n: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float]:
    a, b = _lstsq_relative([np.ones_like(n), n], seconds)
    if a < 0:  # a negative fixed cost is noise: refit through the origin
        (b,) = _lstsq_relative([n], seconds)
        a = 0.0
    return float(a), float(b), 0.0


def _quadratic(n: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float] | None:
    a, b, c = _lstsq_relative([np.ones_like(n), n, n * n], seconds)
    if a < 0:
        b, c = _lstsq_relative([n, n * n], seconds)
        a = 0.0
    if c <= 0 or b <= 0:
        return None
    return float(a), float(b), float(c)


def fit_prefill(points: Sequence[PrefillPoint]) -> PrefillFit:
    """Fit the prefill curve; needs at least three distinct prompt lengths."""
    if len({p.prompt_tokens for p in points}) < 3:
        raise ValueError("a prefill fit needs at least 3 distinct prompt lengths")
    n = np.array([p.prompt_tokens for p in points], dtype=float)
    seconds = np.array([p.seconds for p in points], dtype=float)
    affine = _affine(n, seconds)
    if affine[1] <= 0:
        raise ValueError("prefill times do not grow with prompt length: the measurement is broken")
    affine_err = _rms_relative(affine, n, seconds)
    quadratic = _quadratic(n, seconds) if len(points) >= 4 else None
    if quadratic is not None:
        quad_err = _rms_relative(quadratic, n, seconds)
        if quad_err <= QUADRATIC_MIN_IMPROVEMENT * affine_err:
            a, b, c = quadratic
            return PrefillFit(
                form="quadratic",
                intercept_s=a,
                linear_s=b,
                quadratic_s=c,
                rms_relative_error=quad_err,
                points=tuple(points),
            )
    a, b, _ = affine
    return PrefillFit(
        form="affine",
        intercept_s=a,
        linear_s=b,
        rms_relative_error=affine_err,
        points=tuple(points),
    )
