"""The gate's books by tenant, shown: the ``slogate_tenant_*`` series and /state's ``tenants``.

The books are the core's (``slogate_admission.tenant_shares``: one account per tracked
tenant, and ``_other`` for the rest); who a request's tenant is, the proxy says
(``proxy.InferenceProxy.tenant_of``). Both views read the accounts at the moment they are
asked, so a tenant whose account was given to a newcomer simply has no series any more, and
there are never more label values than accounts (at most ``maxTracked`` + 1). Without a
tenant policy neither exists: no series, ``tenants: null``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from slogate_admission.tenant_shares import Account, TenantShares
from slogate_sidecar.gate import Gate

__all__ = ["COUNTERS", "GAUGES", "TENANT_LABEL", "TENANT_SERIES", "TenantMetrics", "tenants_state"]

TENANT_LABEL = "tenant"
"""The account's name: a tenant's own, or ``_other`` for the shared account."""

COUNTERS: dict[str, tuple[str, Callable[[Account], int]]] = {
    "slogate_tenant_admitted_requests": (
        "Requests of the tenant admitted (at arrival or after a deferral).",
        lambda a: a.admitted_requests,
    ),
    "slogate_tenant_admitted_prompt_tokens": (
        "Prompt tokens of the same requests.",
        lambda a: a.admitted_prompt_tokens,
    ),
    "slogate_tenant_refused_requests": (
        "Requests of the tenant refused (at arrival, by the zero-token pre-check, or when a deferral ran out).",
        lambda a: a.refused_requests,
    ),
    "slogate_tenant_refused_prompt_tokens": (
        "Prompt tokens of the same requests (as the gate knew them when it refused).",
        lambda a: a.refused_prompt_tokens,
    ),
    "slogate_tenant_share_refusals": (
        "Refusals of the tenant naming tenant_share: it would have held more than its fair share.",
        lambda a: a.share_refusals,
    ),
}
"""Counter name (exported with ``_total``) -> help and the account's count."""

GAUGES: tuple[str, ...] = (
    "slogate_tenant_served_tokens",
    "slogate_tenant_held_prompt_tokens",
    "slogate_tenant_weight",
)
_GAUGE_HELP = dict(
    zip(
        GAUGES,
        (
            "The tenant's decaying served-token counter: n_in + outputWeight x n_out per admission "
            "(n_out corrected to llama-server's count at the end), halving every halfLifeSeconds.",
            "Prompt tokens the tenant holds, over its classes: admitted before their first token, or deferred.",
            "The tenant's weight (the policy's, else 1).",
        ),
        strict=True,
    )
)

TENANT_SERIES = tuple(f"{name}_total" for name in COUNTERS) + GAUGES
"""Every series name as exported (docs/metrics.md, the chart's dashboard)."""


class TenantMetrics:
    """A Prometheus collector of the ``slogate_tenant_*`` series, read from the books when scraped."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def register(self, registry: CollectorRegistry) -> TenantMetrics:
        """Add the series to ``registry`` (the sidecar's own); returns self."""
        registry.register(self)
        return self

    def collect(self) -> Iterator[Metric]:
        """One sample per tracked account and series; nothing without a tenant policy."""
        tenants = self.gate.machine.tenants
        if tenants is None:
            return
        accounts = tenants.tracked()
        for name, (help_text, count) in COUNTERS.items():
            counter = CounterMetricFamily(name, help_text, labels=(TENANT_LABEL,))
            for account in accounts:
                counter.add_metric((account.name,), count(account))
            yield counter
        now = self.gate.clock()  # the clock the gate decides with: the counters decay on it
        values: dict[str, Callable[[Account], float]] = {
            "slogate_tenant_served_tokens": lambda a: tenants.served_tokens(a, now),
            "slogate_tenant_held_prompt_tokens": lambda a: sum(a.held.values()),
            "slogate_tenant_weight": lambda a: a.weight,
        }
        for name in GAUGES:
            gauge = GaugeMetricFamily(name, _GAUGE_HELP[name], labels=(TENANT_LABEL,))
            for account in accounts:
                gauge.add_metric((account.name,), values[name](account))
            yield gauge

    def describe(self) -> Iterator[Metric]:
        """The names alone, so a second collector of the same series is refused without
        reading the books."""
        for name, (help_text, _) in COUNTERS.items():
            yield CounterMetricFamily(name, help_text, labels=(TENANT_LABEL,))
        for name in GAUGES:
            yield GaugeMetricFamily(name, _GAUGE_HELP[name], labels=(TENANT_LABEL,))


def tenants_state(tenants: TenantShares | None, class_names: list[str], now: float) -> dict[str, Any] | None:
    """/state's ``tenants``: the policy in force, Σ active weight per class, every account's
    books; None without a tenant policy."""
    if tenants is None:
        return None
    policy = tenants.policy
    return {
        "header": policy.header,
        "maxTracked": policy.max_tracked,
        "outputWeight": policy.output_weight,
        "halfLifeSeconds": policy.half_life_seconds,
        "activeWeight": {name: tenants.active_weight(name) for name in class_names},
        "accounts": {a.name: _account(tenants, a, now) for a in tenants.tracked()},
    }


def _account(tenants: TenantShares, account: Account, now: float) -> dict[str, Any]:
    return {
        "weight": account.weight,
        "listed": account.listed,
        "heldPromptTokens": dict(account.held),
        "requestsInside": account.requests_inside,
        "servedTokens": tenants.served_tokens(account, now),
        "admittedRequests": account.admitted_requests,
        "admittedPromptTokens": account.admitted_prompt_tokens,
        "refusedRequests": account.refused_requests,
        "refusedPromptTokens": account.refused_prompt_tokens,
        "shareRefusals": account.share_refusals,
    }
