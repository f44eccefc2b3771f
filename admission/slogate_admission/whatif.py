"""`slogate what-if`: the spec's formulas applied to whatever inputs an operator has.

Pure: takes numbers, returns a JSON-ready dict. Each output key appears only when
its inputs are present; ``missing`` names the inputs that would unlock the rest.
Prefill here is the spec's single-rate model, own prefill = n_in / rate, so the
worked example can be checked by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slogate_admission.kv import kv_bytes_per_token, kv_gate, kv_request_bytes
from slogate_admission.queueing import (
    little_l_max,
    mm1_number_in_system,
    mm1_time_in_system,
    utilization,
)
from slogate_admission.retry import effective_arrival_rate, retry_after_s, retry_amplification
from slogate_admission.ttft import max_queued_tokens, predicted_ttft_s, queue_wait_s, ttft_admits

JSONValue = float | int | bool | str | list[str] | None


@dataclass(frozen=True, slots=True)
class WhatIfInputs:
    """Every input is optional; names follow the CLI flags."""

    prefill_tps: float | None = None
    ttft_slo: float | None = None
    prompt_tokens: int | None = None
    queued_tokens: float | None = None
    max_tokens: int | None = None
    kv_bytes_per_token: float | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_bytes_per_elem: float | None = None
    kv_free_bytes: float | None = None
    in_flight: int | None = None
    concurrency_cap: int | None = None
    arrival_rate: float | None = None
    service_rate: float | None = None
    w_max: float | None = None
    reject_fraction: float | None = None


def _finite(value: float) -> float | None:
    """JSON has no infinity: an unstable queue's mean is reported as null."""
    return value if math.isfinite(value) else None


@dataclass(slots=True)
class _Report:
    """What the sections have computed so far."""

    values: dict[str, JSONValue] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)
    checked: bool = False
    """At least one admission predicate could be evaluated."""
    max_queued: float | None = None

    def lacks(self, **inputs: object) -> bool:
        """Record the absent inputs; True if any is absent."""
        absent = {name for name, value in inputs.items() if value is None}
        self.missing |= absent
        return bool(absent)


def _ttft_section(i: WhatIfInputs, r: _Report) -> None:
    """Spec "A worked example": own prefill, queue wait, predicted TTFT, token budget."""
    n, rate, queued, slo = i.prompt_tokens, i.prefill_tps, i.queued_tokens, i.ttft_slo
    r.lacks(prefill_tps=rate, prompt_tokens=n, queued_tokens=queued, ttft_slo=slo)
    if rate is None:
        return
    own = None if n is None else n / rate
    if own is not None:
        r.values["own_prefill_s"] = own
    if queued is not None:
        r.values["queue_wait_s"] = queue_wait_s(queued, rate)
        if own is not None:
            r.values["predicted_ttft_s"] = predicted_ttft_s(queued, rate, own)
    if own is None or slo is None:
        return
    r.max_queued = max_queued_tokens(slo, own, rate)
    r.values["max_queued_tokens"] = r.max_queued
    if queued is not None:
        r.checked = True
        if not ttft_admits(queued, r.max_queued):
            r.reasons.append("ttft")


def _kv_section(i: WhatIfInputs, r: _Report) -> None:
    """Spec "LLM twist 2": bytes per token, the request's reservation, the KV gate."""
    per_token = i.kv_bytes_per_token
    if per_token is None:
        geometry = (i.layers, i.kv_heads, i.head_dim, i.kv_bytes_per_elem)
        if None in geometry:
            r.missing.add("kv_bytes_per_token")
            return
        layers, heads, dim, elem = (g for g in geometry if g is not None)
        per_token = kv_bytes_per_token(int(layers), int(heads), int(dim), elem)
    r.values["kv_bytes_per_token"] = per_token
    n, out, free = i.prompt_tokens, i.max_tokens, i.kv_free_bytes
    r.lacks(prompt_tokens=n, max_tokens=out, kv_free_bytes=free)
    if n is None or out is None:
        return
    needed = kv_request_bytes(n, out, per_token)
    r.values["kv_needed_bytes"] = needed
    if free is not None:
        r.checked = True
        if not kv_gate(free, needed):
            r.reasons.append("kv")


def _concurrency_section(i: WhatIfInputs, r: _Report) -> None:
    """The hard concurrency cap: admitting makes in_flight + 1 streams."""
    if r.lacks(in_flight=i.in_flight, concurrency_cap=i.concurrency_cap):
        return
    r.checked = True
    if (i.in_flight or 0) + 1 > (i.concurrency_cap or 0):
        r.reasons.append("concurrency")


def _verdict_section(i: WhatIfInputs, r: _Report) -> None:
    """admit = every evaluable predicate holds; Retry-After when it does not."""
    if not r.checked:
        return
    r.values["admit"] = not r.reasons
    r.values["reasons"] = list(r.reasons)
    if i.queued_tokens is None or i.prefill_tps is None:
        return
    # Rejected on TTFT: until the queue drains to this request's budget. Rejected on
    # capacity only: the spec's rough queued / throughput. Admitted: 0.
    admissible = r.max_queued if "ttft" in r.reasons and r.max_queued is not None else 0.0
    r.values["retry_after_s"] = retry_after_s(i.queued_tokens, admissible, i.prefill_tps) if r.reasons else 0.0


def _queueing_section(i: WhatIfInputs, r: _Report) -> None:
    """Spec "Little's law" and "Why the queue explodes"."""
    lam, mu = i.arrival_rate, i.service_rate
    if not r.lacks(arrival_rate=lam, service_rate=mu) and lam is not None and mu is not None:
        rho = utilization(lam, mu)
        r.values["utilization"] = rho
        r.values["mm1_time_in_system_s"] = _finite(mm1_time_in_system(lam, mu))
        r.values["mm1_number_in_system"] = _finite(mm1_number_in_system(rho))
        r.values["stable"] = rho < 1
    # L_max uses what the server sustains: the service rate when known, else arrivals.
    throughput = mu if mu is not None else lam
    if not r.lacks(w_max=i.w_max) and i.w_max is not None and throughput is not None:
        r.values["l_max"] = little_l_max(throughput, i.w_max)


def _retry_section(i: WhatIfInputs, r: _Report) -> None:
    """Spec "Retry amplification": λ_eff = λ / (1 − p)."""
    p = i.reject_fraction
    if r.lacks(reject_fraction=p) or p is None:
        return
    r.values["effective_arrival_multiplier"] = retry_amplification(p)
    if i.arrival_rate is not None:
        r.values["effective_arrival_rate"] = effective_arrival_rate(i.arrival_rate, p)


SECTIONS = (
    _ttft_section,
    _kv_section,
    _concurrency_section,
    _verdict_section,
    _queueing_section,
    _retry_section,
)


def what_if(i: WhatIfInputs) -> dict[str, JSONValue]:
    """Evaluate every formula the inputs allow (see module doc)."""
    report = _Report()
    for section in SECTIONS:
        section(i, report)
    report.values["missing"] = sorted(report.missing)
    return report.values
