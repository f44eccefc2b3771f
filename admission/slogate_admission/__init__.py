"""slogate's admission core: the math of admission control, pure and typed.

No I/O, no global state, no clock of its own (callers pass ``now``). Every formula
of admission-control-math.txt lives in one of the modules below, its docstring
stating it:

- ``queueing``: Little's law, utilization, M/M/1, Pollaczek-Khinchine.
- ``service``: T(r) = T_prefill(n_in) + n_out · t_decode, t_decode(B) = t_1 · f(B).
- ``kv``: KV bytes per token, per-request reservation, the KV gate.
- ``ttft``: queue wait, predicted TTFT, the token budget.
- ``retry``: Retry-After, retry amplification λ / (1 − p), retry budgets.
- ``output_tokens``: conservative n_out (max_tokens, route quantile, default).
- ``schema``: Policy, CalibrationProfile, Thresholds (pydantic, shared on the wire).
- ``derivation``: Policy + CalibrationProfile -> Thresholds.
- ``decision``: the O(1) per-arrival decision.
- ``whatif``: the formulas as an operator's calculator.
- ``scale_up``: the autoscaler's scale-up window that buys pods only for demand that lasts.
"""

from slogate_admission.decision import (
    ClassLimits,
    Decision,
    GateConfig,
    LiveState,
    Outcome,
    Reason,
    Request,
    decide,
)
from slogate_admission.derivation import DerivationError, derive_thresholds
from slogate_admission.schema import SLO, CalibrationProfile, Policy, Thresholds

__all__ = [
    "SLO",
    "CalibrationProfile",
    "ClassLimits",
    "Decision",
    "DerivationError",
    "GateConfig",
    "LiveState",
    "Outcome",
    "Policy",
    "Reason",
    "Request",
    "Thresholds",
    "decide",
    "derive_thresholds",
]
