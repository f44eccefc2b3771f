"""Queueing laws that turn an SLO into a bound on how much work may be inside.

Spec: "Little's law", "Why the queue explodes" and "LLM twist 1" sections of
admission-control-math.txt. Every function is a closed form: no state, no clock.
Unstable systems (utilization >= 1) have no finite mean: the functions return
``math.inf`` rather than a misleading number.
"""

from __future__ import annotations

import math

from slogate_admission._checks import require_non_negative, require_positive


def littles_law_number_in_system(arrival_rate: float, time_in_system_s: float) -> float:
    """L = λ · W: mean number in any stable system (no distributional assumptions)."""
    require_non_negative("arrival_rate", arrival_rate)
    require_non_negative("time_in_system_s", time_in_system_s)
    return arrival_rate * time_in_system_s


def little_l_max(throughput_rps: float, w_max_s: float) -> float:
    """L_max = λ · W_max: the most requests that may be inside while time-in-system ≤ W_max.

    Little's law run backwards: latency is an outcome, but the number inside is
    ours to bound by refusing arrivals. 10 req/s with a 2 s SLO -> L_max = 20.
    """
    require_non_negative("throughput_rps", throughput_rps)
    require_positive("w_max_s", w_max_s)
    return throughput_rps * w_max_s


def utilization(arrival_rate: float, service_rate: float) -> float:
    """ρ = λ / μ. Admission control pins ρ on the flat part of the 1/(1-ρ) curve."""
    require_non_negative("arrival_rate", arrival_rate)
    require_positive("service_rate", service_rate)
    return arrival_rate / service_rate


def mm1_time_in_system(arrival_rate: float, service_rate: float) -> float:
    """M/M/1 mean time in system W = 1 / (μ − λ); ``inf`` when λ ≥ μ (unstable).

    μ = 10/s: ρ = 0.5 -> 200 ms, ρ = 0.9 -> 1 s, ρ = 0.99 -> 10 s.
    """
    rho = utilization(arrival_rate, service_rate)
    if rho >= 1:
        return math.inf
    return 1.0 / (service_rate - arrival_rate)


def mm1_number_in_system(rho: float) -> float:
    """M/M/1 mean number in system L = ρ / (1 − ρ); ``inf`` when ρ ≥ 1."""
    require_non_negative("rho", rho)
    if rho >= 1:
        return math.inf
    return rho / (1.0 - rho)


def service_time_cv2(mean_s: float, stddev_s: float) -> float:
    """Squared coefficient of variation C_v² = (σ / mean)² of the service time."""
    require_positive("mean_s", mean_s)
    require_non_negative("stddev_s", stddev_s)
    return (stddev_s / mean_s) ** 2


def pollaczek_khinchine_wait(arrival_rate: float, mean_service_s: float, cv2: float) -> float:
    """M/G/1 mean wait in queue (Pollaczek-Khinchine): W_q = ρ · E[S] · (1 + C_v²) / (2 (1 − ρ)).

    The (1 + C_v²) factor is why LLM queues are worse than their mean suggests:
    service times spanning 100x have C_v² >> 1. With C_v² = 1 (exponential) this
    is the M/M/1 wait ρ/(μ − λ). ``inf`` when ρ ≥ 1.
    """
    require_non_negative("arrival_rate", arrival_rate)
    require_positive("mean_service_s", mean_service_s)
    require_non_negative("cv2", cv2)
    rho = arrival_rate * mean_service_s
    if rho >= 1:
        return math.inf
    return rho * mean_service_s * (1.0 + cv2) / (2.0 * (1.0 - rho))


def erlang_b(servers: int, offered_erlangs: float) -> float:
    """Erlang B: the share of arrivals a loss system of ``servers`` (no waiting room) turns
    away under ``offered_erlangs`` = λ · E[S] of Poisson traffic (any service distribution).

    The recursion B(0) = 1, B(k) = a·B(k−1) / (k + a·B(k−1)) is exact and never overflows.
    A fleet of N pods of C slots, each capped at C with no queue: random routing splits
    Poisson arrivals into N streams of a/N, each pod blocking B(C, a/N); one gate over all
    pods blocks B(N·C, a), always less (pooling). 4 slots at 3 Erlangs: 20.6%.
    """
    if servers < 0:
        raise ValueError(f"servers must be >= 0, got {servers}")
    require_non_negative("offered_erlangs", offered_erlangs)
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered_erlangs * blocking / (k + offered_erlangs * blocking)
    return blocking
