"""The gateways' vocabulary: llm-d-router's request and response headers, beside slogate's own.

An inference gateway in front of the pods (llm-d-router v0.10, the Gateway API Inference
Extension's endpoint picker before it) names a request's objective, its fairness id and its
own TTFT SLO in headers of its own, and says why it dropped a request in another. The sidecar
reads those as aliases of its own and answers in both (docs/routing.md, "Headers"):

- class: slogate's class header first, then ``x-llm-d-inference-objective`` (the
  InferenceObjective's name, read as a class name: name your objectives after your classes),
  then the API key's class;
- tenant (with a tenant policy): the policy's header first, then
  ``x-llm-d-inference-fairness-id``, then the API key's tenant;
- a TTFT SLO of the request's own: ``x-llm-d-slo-ttft-ms`` (or the older ``x-slo-ttft-ms``),
  milliseconds; it may tighten the class's SLO, never loosen it (``decision.own_limits``);
- on a shed, ``x-llm-d-request-dropped-reason: rejected-saturated`` beside slogate's JSON
  reasons and Retry-After; on an admitted request, ``x-llm-d-flow-queue-duration-ms``, the
  time it waited at the gate (0 when admitted at once), beside ``X-Slogate-Predicted-Ttft``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from slogate_sidecar.bad_request import BadRequest

OBJECTIVE = "x-llm-d-inference-objective"
"""llm-d-router: the InferenceObjective (its priority) the request is sent under."""
FAIRNESS_ID = "x-llm-d-inference-fairness-id"
"""llm-d-router: who the request is from, for fair queuing between flows."""
SLO_TTFT_MS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
"""llm-d-router's per-request TTFT SLO, milliseconds; the older name still accepted."""
DROPPED_REASON = "x-llm-d-request-dropped-reason"
"""llm-d-router: why a request was not served (``rejected-saturated``: shed under load)."""
SATURATED = "rejected-saturated"
QUEUE_DURATION_MS = "x-llm-d-flow-queue-duration-ms"
"""llm-d-router: how long the request waited in a queue before it was dispatched."""


def objective(headers: Mapping[str, str]) -> str | None:
    """The objective's name as a class name (lower-cased, as slogate's class header is), or None."""
    named = headers.get(OBJECTIVE, "").strip()
    return named.lower() or None


def fairness_id(headers: Mapping[str, str]) -> str | None:
    """The fairness id, as sent, or None."""
    return headers.get(FAIRNESS_ID) or None


def ttft_slo_s(headers: Mapping[str, str]) -> float | None:
    """The request's own TTFT SLO in seconds, or None; BadRequest (400) for a value that is not a
    positive number of milliseconds (a gateway's SLO the gate cannot read must not pass unread)."""
    for name in SLO_TTFT_MS:
        text = headers.get(name)
        if text is None:
            continue
        try:
            ms = float(text)
        except ValueError:
            ms = math.nan
        if not (math.isfinite(ms) and ms > 0):
            raise BadRequest(f"{name} must be a positive number of milliseconds, got {text!r}", param=name)
        return ms / 1000
    return None


def shed_headers() -> dict[str, str]:
    """What a shed says in the gateway's words, beside its Retry-After."""
    return {DROPPED_REASON: SATURATED}


def admitted_headers(waited_s: float) -> dict[str, str]:
    """What an admitted request's answer says of its wait at the gate, in the gateway's words."""
    return {QUEUE_DURATION_MS: str(round(waited_s * 1000))}
