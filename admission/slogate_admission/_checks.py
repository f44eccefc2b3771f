"""Argument checks shared by the formulas: a nonsense quantity is a caller bug, said loudly."""

from __future__ import annotations

import math


def require_positive(name: str, value: float) -> float:
    """Return ``value`` if it is a finite number > 0, else raise ValueError naming it."""
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def require_non_negative(name: str, value: float) -> float:
    """Return ``value`` if it is a finite number >= 0, else raise ValueError naming it."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def require_fraction(name: str, value: float, *, allow_zero: bool = True) -> float:
    """Return ``value`` if it lies in [0, 1) (or (0, 1) without ``allow_zero``)."""
    low_ok = value >= 0 if allow_zero else value > 0
    if not math.isfinite(value) or not low_ok or value >= 1:
        bounds = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must lie in {bounds}, got {value!r}")
    return value
