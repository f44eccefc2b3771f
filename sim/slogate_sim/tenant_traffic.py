"""Traffic of several tenants: each its own Poisson arrivals, merged into one schedule.

Each tenant's schedule is ``workloads.schedule`` at its own rate with a seed of its own, so
a tenant's arrivals are the same whoever else is sending: "B alone" and "B beside A" send B
exactly the same requests, and a comparison between them is of the gate, not of the dice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from slogate_sim.workloads import Arrival, Workload, schedule

__all__ = ["tenant_schedule", "zipf_rates"]


def tenant_schedule(
    rates_rps: Mapping[str, float], duration_s: float, workload: Workload, *, seed: int = 1
) -> list[Arrival]:
    """Every tenant's Poisson arrivals at its rate for ``duration_s``, merged in time order.

    Tenant ``t``'s arrivals are drawn with a seed of its own (``hash_seed``), so they do not
    depend on who else sends. Prompt token ids stay the schedule's own, inside the model's
    vocabulary (an id past it is a 400 from llama-server); the benchmarks send
    ``cache_prompt: false``, so prompts that happen to share a prefix share no work."""
    merged: list[Arrival] = []
    for tenant, rate in sorted(rates_rps.items()):
        if rate > 0:
            own = schedule(rate, duration_s, workload, seed=hash_seed(seed, tenant))
            merged.extend(dataclasses.replace(a, tenant=tenant) for a in own)
    merged.sort(key=lambda a: (a.at_s, a.tenant or ""))
    return merged


def hash_seed(seed: int, tenant: str) -> int:
    """A stable per-tenant seed (Python's ``hash`` of a str changes between processes)."""
    value = seed
    for char in tenant:
        value = (value * 1_000_003 + ord(char)) % 2**31
    return value


def zipf_rates(total_rps: float, tenants: int, exponent: float = 1.0, prefix: str = "t") -> dict[str, float]:
    """``total_rps`` split over ``tenants`` by Zipf's law: tenant k (1-based) gets a share
    proportional to 1 / k^exponent. Names ``t001``, ``t002``, ... (the heaviest first)."""
    if tenants < 1 or total_rps <= 0 or exponent < 0:
        raise ValueError("need at least one tenant, a positive total rate and a non-negative exponent")
    weights = [1.0 / (k**exponent) for k in range(1, tenants + 1)]
    scale = total_rps / sum(weights)
    width = len(str(tenants))
    return {f"{prefix}{k:0{max(width, 3)}d}": w * scale for k, w in enumerate(weights, start=1)}
