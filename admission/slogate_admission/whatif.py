"""`slogate what-if`: the spec's formulas applied to whatever inputs an operator has.

Pure: takes numbers, returns a JSON-ready dict. Each output key appears only when
its inputs are present; ``missing`` names the inputs that would unlock the rest.
Prefill here is the spec's single-rate model, own prefill = n_in / rate, so the
worked example can be checked by hand.

A request that can never fit gets the sidecar's verdict for it (its 400,
``decision.never_fits``): ``admit`` false, ``fits_ever`` false, reason ``never_fits``
beside the failed predicates, and ``retry_after_s`` null, because no wait helps. Never
fits: its own prefill at the margin (``ttft_margin``, the gate's floor) exceeds the TTFT
SLO with nothing queued, or prompt + output exceed one slot's context (``slot_tokens``)
or the whole KV cache (``kv_capacity_bytes``).

With tenants (``tenant_shares``): give what the request's tenant holds of the class's queued
prompt tokens and the weights of the tenants active there; the token budget is the SLO
times the rate. Over its share the verdict says ``tenant_share``, and the Retry-After is
the later of the TTFT's and the tenant's own excess drained at its fair part of the rate.

With the cost order: give the aggregate decode rate at the cap, and c* and the slots held back
as a sidecar's /state shows them (``costs``); the answer prices the request (``cost_s``), says
whether it is ``costly`` and, admitted into one of the last slots, ``held_back``: deferred behind
cheaper requests for its deferral's bound, then given a slot still free (never refused for it).
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
from slogate_admission.tenant_shares import share_excess_tokens, share_retry_after_s
from slogate_admission.ttft import max_queued_tokens, predicted_ttft_s, queue_wait_s, ttft_admits

JSONValue = float | int | bool | str | list[str] | None


@dataclass(frozen=True, slots=True)
class WhatIfInputs:
    """Every input is optional; names follow the CLI flags."""

    prefill_tps: float | None = None
    slo_ttft: float | None = None
    prompt_tokens: int | None = None
    queued_tokens: float | None = None
    max_tokens: int | None = None
    kv_bytes_per_token: float | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_bytes_per_elem: float | None = None
    kv_free_bytes: float | None = None
    kv_capacity_bytes: float | None = None
    slot_tokens: int | None = None
    in_flight: int | None = None
    concurrency_cap: int | None = None
    arrival_rate: float | None = None
    service_rate: float | None = None
    w_max: float | None = None
    reject_fraction: float | None = None
    tenant_held_tokens: float | None = None
    tenant_weight: float = 1.0
    ttft_margin: float = 1.0
    """m: the gate admits when m · (queue wait + own prefill) is within the SLO. 1 is the median
    prediction (the spec's worked example); a gate's least is the thresholds' ``ttftMarginPrior``."""
    active_tenant_weight: float | None = None
    """Σ w of the tenants active in the class, this one's included."""
    decode_tps: float | None = None
    """Aggregate decode tokens/s at the concurrency cap (B · r_decode(B)): prices the output."""
    cost_boundary: float | None = None
    """c*, server-seconds, as a sidecar's /state shows it (``costs.boundarySeconds``): under the
    cost order a request costing more is costly."""
    reserve_slots: int | None = None
    """h, the slots the cost order holds back (``costs.reserveSlots``)."""


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
    never_fits: bool = False
    """A predicate fails however empty the server is: no retry helps."""
    max_queued: float | None = None
    share_retry_s: float = 0.0
    """Over its tenant's share: seconds until its own excess drains (else 0)."""

    def lacks(self, **inputs: object) -> bool:
        """Record the absent inputs; True if any is absent."""
        absent = {name for name, value in inputs.items() if value is None}
        self.missing |= absent
        return bool(absent)


def _ttft_section(i: WhatIfInputs, r: _Report) -> None:
    """Spec "A worked example": own prefill, queue wait, predicted TTFT, token budget."""
    n, rate, queued, slo = i.prompt_tokens, i.prefill_tps, i.queued_tokens, i.slo_ttft
    r.lacks(prefill_tps=rate, prompt_tokens=n, queued_tokens=queued, slo_ttft=slo)
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
    r.max_queued = max_queued_tokens(slo / i.ttft_margin, own, rate)
    r.values["max_queued_tokens"] = r.max_queued
    if r.max_queued < 0:
        # Not even an empty queue is shallow enough: never fits (decision.never_fits), known
        # without queued_tokens.
        r.checked, r.never_fits = True, True
        r.reasons.append("ttft")
    elif queued is not None:
        r.checked = True
        if not ttft_admits(queued, r.max_queued):
            r.reasons.append("ttft")


def _kv_section(i: WhatIfInputs, r: _Report) -> None:
    """Spec "LLM twist 2": bytes per token, the request's reservation, the KV gate."""
    n, out, free, capacity = i.prompt_tokens, i.max_tokens, i.kv_free_bytes, i.kv_capacity_bytes
    per_token = _kv_bytes_per_token(i, r)
    if per_token is not None:
        r.values["kv_bytes_per_token"] = per_token
    r.lacks(prompt_tokens=n, max_tokens=out, kv_free_bytes=free)
    if n is None or out is None:
        return
    # Each check is None when its inputs are absent, else whether it fails. One slot's
    # context bounds a request in tokens, so that one needs no per-token size.
    beyond_slot = None if i.slot_tokens is None else n + out > i.slot_tokens
    needed = None if per_token is None else kv_request_bytes(n, out, per_token)
    beyond_capacity = None if needed is None or capacity is None else needed > capacity
    short_now = None if needed is None or free is None else not kv_gate(free, needed)
    if needed is not None:
        r.values["kv_needed_bytes"] = needed
    checks = [c for c in (beyond_slot, beyond_capacity, short_now) if c is not None]
    r.checked = r.checked or bool(checks)
    r.never_fits = r.never_fits or bool(beyond_slot or beyond_capacity)
    if any(checks):
        r.reasons.append("kv")


def _kv_bytes_per_token(i: WhatIfInputs, r: _Report) -> float | None:
    """Given, or 2 · layers · kv_heads · head_dim · bytes; ``missing`` names what is absent."""
    if i.kv_bytes_per_token is not None:
        return i.kv_bytes_per_token
    geometry = {
        "layers": i.layers,
        "kv_heads": i.kv_heads,
        "head_dim": i.head_dim,
        "kv_bytes_per_elem": i.kv_bytes_per_elem,
    }
    absent = {name for name, value in geometry.items() if value is None}
    if absent:
        # Part of the geometry given: name the rest, not the per-token size it was meant to give.
        r.missing |= absent if len(absent) < len(geometry) else {"kv_bytes_per_token"}
        return None
    layers, heads, dim, elem = (g for g in geometry.values() if g is not None)
    return kv_bytes_per_token(int(layers), int(heads), int(dim), elem)


def _concurrency_section(i: WhatIfInputs, r: _Report) -> None:
    """The hard concurrency cap: admitting makes in_flight + 1 streams."""
    if r.lacks(in_flight=i.in_flight, concurrency_cap=i.concurrency_cap):
        return
    r.checked = True
    if (i.in_flight or 0) + 1 > (i.concurrency_cap or 0):
        r.reasons.append("concurrency")


def _tenant_section(i: WhatIfInputs, r: _Report) -> None:
    """Tenant shares: share = SLO · rate / m · w / Σ_active w; over it, ``tenant_share``."""
    held, active, rate, slo, n = (
        i.tenant_held_tokens,
        i.active_tenant_weight,
        i.prefill_tps,
        i.slo_ttft,
        i.prompt_tokens,
    )
    if held is None and active is None:
        return  # no tenants in this question
    absent = r.lacks(
        tenant_held_tokens=held, active_tenant_weight=active, prefill_tps=rate, slo_ttft=slo, prompt_tokens=n
    )
    if absent or held is None or active is None or rate is None or slo is None or n is None:
        return
    budget = slo * rate / i.ttft_margin  # the queue's depth in tokens, as the gate's share rule
    share = budget * i.tenant_weight / max(active, i.tenant_weight)
    excess = share_excess_tokens(held, n, i.tenant_weight, active, budget)
    r.values["tenant_share_tokens"] = share
    r.values["tenant_excess_tokens"] = max(excess, 0.0)
    r.checked = True
    if excess > 0:
        r.reasons.append("tenant_share")
        r.share_retry_s = share_retry_after_s(excess, rate, i.tenant_weight, active)


def _verdict_section(i: WhatIfInputs, r: _Report) -> None:
    """admit = every evaluable predicate holds; Retry-After when it does not."""
    if not r.checked:
        return
    r.values["admit"] = not r.reasons
    r.values["fits_ever"] = not r.never_fits
    r.values["reasons"] = [*r.reasons, "never_fits"] if r.never_fits else list(r.reasons)
    if r.never_fits:
        r.values["retry_after_s"] = None  # as the sidecar: a 400, no Retry-After
        return
    if i.queued_tokens is None or i.prefill_tps is None:
        return
    # Rejected on TTFT: until the queue drains to this request's budget. Rejected on
    # capacity only: the spec's rough queued / throughput. Admitted: 0.
    admissible = r.max_queued if "ttft" in r.reasons and r.max_queued is not None else 0.0
    ttft_retry = retry_after_s(i.queued_tokens, admissible, i.prefill_tps) if set(r.reasons) - {"tenant_share"} else 0.0
    r.values["retry_after_s"] = max(ttft_retry, r.share_retry_s) if r.reasons else 0.0


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


def _cost_section(i: WhatIfInputs, r: _Report) -> None:
    """The cost order (``cost_book``): cost = n_in / rate + n_out / decode rate at the cap; costly
    beyond c*; a costly request the gate would admit into one of the last h slots is held back
    (deferred behind cheaper ones for its deferral's bound, then given a slot still free)."""
    n, out, rate, decode = i.prompt_tokens, i.max_tokens, i.prefill_tps, i.decode_tps
    if i.cost_boundary is None and decode is None:
        return  # no cost in this question
    if r.lacks(prompt_tokens=n, max_tokens=out, prefill_tps=rate, decode_tps=decode):
        return
    assert n is not None
    assert out is not None
    assert rate is not None
    assert decode is not None
    cost = n / rate + out / decode
    r.values["cost_s"] = cost
    if r.lacks(cost_boundary=i.cost_boundary) or i.cost_boundary is None:
        return
    costly = cost >= i.cost_boundary
    r.values["costly"] = costly
    if not costly or r.values.get("admit") is not True:
        return
    if r.lacks(in_flight=i.in_flight, concurrency_cap=i.concurrency_cap, reserve_slots=i.reserve_slots):
        return
    assert i.in_flight is not None
    assert i.concurrency_cap is not None
    assert i.reserve_slots is not None
    r.values["held_back"] = i.in_flight + 1 > i.concurrency_cap - i.reserve_slots


SECTIONS = (
    _ttft_section,
    _kv_section,
    _concurrency_section,
    _tenant_section,
    _verdict_section,
    _cost_section,
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
