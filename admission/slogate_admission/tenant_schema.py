"""Tenants on the wire: what the user says of them (``TenantsPolicy``) and what a gate enforces
(``TenantThresholds``, derived: the output weight measured unless the user set it).

The policy itself (each active tenant holds at most its weighted fair share of its class's
queued prompt tokens; decaying served-token counters order the deferral queue) is
``tenant_shares``; docs/tenants.md says it in words.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from slogate_admission.wire import Model, PositiveSeconds

__all__ = [
    "DEFAULT_HALF_LIFE_S",
    "DEFAULT_MAX_TRACKED",
    "DEFAULT_TENANT_HEADER",
    "MAX_LISTED_TENANTS",
    "OTHER_TENANTS",
    "TENANT_NAME_PATTERN",
    "TenantName",
    "TenantThresholds",
    "TenantsPolicy",
]

DEFAULT_TENANT_HEADER = "X-Slogate-Tenant"
DEFAULT_MAX_TRACKED = 64
"""Tenants with an account (and a metric label) of their own; the rest share one."""
DEFAULT_HALF_LIFE_S = 60.0
"""How fast served tokens are forgotten: a tenant served heavily a minute ago counts half."""
OTHER_TENANTS = "_other"
"""The shared account of every tenant beyond ``maxTracked``, and of requests naming none.
No tenant can be called this: names start with a letter or digit."""
TENANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$"
"""What a tenant's name may be: safe as a Prometheus label value and in a log line. A header
value that is not one is treated as naming no tenant."""
TenantName = Annotated[str, Field(pattern=TENANT_NAME_PATTERN)]
Weight = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")]
MaxTracked = Annotated[int, Field(ge=1, le=10_000)]
MAX_LISTED_TENANTS = 1000
"""At most this many tenants in ``weights``: 1,000 names of 128 characters are about 140 KB of
JSON, which fits beside the rest of the policy in `kubectl apply`'s last-applied annotation
(annotations: 256 KiB in total) and in the thresholds ConfigMap (1 MiB); 2,000 did not."""


def _check_listed(weights: dict[str, float], max_tracked: int) -> None:
    if len(weights) > max_tracked:
        raise ValueError(
            f"tenants.weights lists {len(weights)} tenants but maxTracked is {max_tracked}: "
            "every listed tenant needs an account of its own"
        )


class TenantsPolicy(Model):
    """Fair shares between the tenants of a class (``spec.tenants``)."""

    header: HeaderName = DEFAULT_TENANT_HEADER
    """The request header naming the tenant. Set it at the gateway from the caller's
    identity and drop what clients send: a client free to name itself takes a fresh share.
    A request without it is its API key's tenant (the sidecar's ``--api-key-tenants``),
    else the shared account."""
    weights: dict[TenantName, Weight] = Field(default_factory=dict, max_length=MAX_LISTED_TENANTS)
    """Tenant -> weight; an unlisted tenant weighs 1. Listed tenants always have their own
    account, so there are at most ``maxTracked`` of them (and at most ``MAX_LISTED_TENANTS``)."""
    max_tracked: MaxTracked = DEFAULT_MAX_TRACKED
    """Tenants with an account of their own, and so a metric label; every other tenant
    shares one account (``_other``, weight 1). Bounds memory and the metrics' cardinality
    whatever the clients send."""
    output_weight: Weight | None = None
    """What one output token counts in the served-token counters, a prompt token counting 1.
    Unset: measured, the server-seconds a decoded token costs over a prefilled one at the
    concurrency cap, R / (B · r_decode(B)): about 2 for SmolLM2-135M on two cores (373 tok/s
    prefill, 4 x 45 tok/s decode), the weight VTC (Sheng et al., OSDI 2024) took from API prices."""
    half_life_seconds: PositiveSeconds = DEFAULT_HALF_LIFE_S
    """The served-token counters halve every this many seconds, and a tenant counts as
    active (its share is held for it) this long after its last request."""

    @model_validator(mode="after")
    def _weights_fit(self) -> TenantsPolicy:
        _check_listed(self.weights, self.max_tracked)
        return self


class TenantThresholds(Model):
    """The tenant policy a gate enforces: the user's, with the output weight resolved (held to
    the same rules: a pushed document is validated whole before a gate loads it)."""

    header: HeaderName
    weights: dict[TenantName, Weight]
    max_tracked: MaxTracked
    output_weight: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    """A decoded token's weight in the served-token counters (a prompt token: 1)."""
    output_weight_measured: bool
    """True: derived from the calibration (the policy set none)."""
    half_life_seconds: PositiveSeconds

    @model_validator(mode="after")
    def _weights_fit(self) -> TenantThresholds:
        _check_listed(self.weights, self.max_tracked)
        return self
