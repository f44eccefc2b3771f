"""Every answer the sidecar makes itself: OpenAI-style errors, rejections, drain refusals, health.

A request the sidecar cannot read or parse is refused by raising ``bad_request.BadRequest``
instead (``app.json_errors`` answers it), wherever that is found."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from slogate_admission.decision import Decision, Reason
from slogate_admission.retry import retry_after_whole_s
from slogate_sidecar import gateway_headers


def error(
    status: int,
    message: str,
    *,
    kind: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> web.Response:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    body: dict[str, Any] = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    if extra:
        body.update(extra)
    return web.json_response(body, status=status, headers=headers)


def retry_after_header(seconds: float) -> str:
    """The Retry-After header's value (``retry.retry_after_whole_s``)."""
    return str(retry_after_whole_s(seconds))


def decision_details(decision: Decision) -> dict[str, Any]:
    """The numbers behind a decision, for the client and for logs."""
    return {
        "outcome": decision.outcome.value,
        "reasons": [r.value for r in decision.reasons],
        "neverFits": [r.value for r in decision.never_fits],
        "class": decision.class_name,
        "predictedTtftSeconds": round(decision.predicted_ttft_s, 4),
        "ttftBudgetSeconds": decision.ttft_budget_s,
        "queueWaitSeconds": round(decision.queue_wait_s, 4),
        "kvNeededTokens": decision.kv_needed_tokens,
        "kvFreeTokens": decision.kv_free_tokens,
        "streamsAfter": decision.streams_after,
        "concurrencyCap": decision.concurrency_cap,
        "retryAfterSeconds": None if decision.retry_after_s is None else round(decision.retry_after_s, 3),
    }


SHED = web.ResponseKey("slogate_shed", bool)
"""The key, in a response's own mapping, that marks a deliberate shed (the gate's refusal, a
drain's): its status is the overload status the sidecar was given, 429 by default, and its
Retry-After is the gate's (``offered_demand`` remembers it for the retries it will bring)."""


def shed(response: web.Response) -> web.Response:
    """Mark ``response`` as a deliberate shed (``SHED``), and say so in a gateway's words too."""
    response[SHED] = True
    response.headers.update(gateway_headers.shed_headers())
    return response


def rejection(decision: Decision, overload_status: int = 429) -> web.Response:
    """The overload status (429 unless set otherwise) with a computed Retry-After; 400 when no
    wait would ever help."""
    reasons = ", ".join(r.value for r in decision.reasons)
    details = {"slogate": decision_details(decision)}
    if not decision.fits_ever:
        return error(
            400,
            f"request can never be served within its limits ({', '.join(r.value for r in decision.never_fits)}): "
            f"{_never_fits_advice(decision)}",
            kind="invalid_request_error",
            code="slogate_request_too_large",
            extra=details,
        )
    retry = decision.retry_after_s or 0.0
    # Over its tenant's share alone, the server has room: for other tenants, not this one.
    why = (
        "tenant over its fair share of the queue"
        if decision.reasons == (Reason.TENANT_SHARE,)
        else "server at capacity"
    )
    return shed(
        error(
            overload_status,
            f"{why} ({reasons}); retry after {retry_after_header(retry)} s",
            kind="rate_limit_error",
            code="slogate_rejected",
            extra=details,
            headers={"Retry-After": retry_after_header(retry)},
        )
    )


def _never_fits_advice(decision: Decision) -> str:
    """What the client can change, for the limits an idle server would still refuse."""
    advice = []
    if Reason.TTFT in decision.never_fits:
        advice.append(
            f"even on an idle server its prompt's prefill misses class {decision.class_name!r}'s "
            f"{decision.ttft_budget_s:g} s TTFT budget; shorten the prompt, or send it in a class with a longer budget"
        )
    if Reason.KV in decision.never_fits:
        advice.append("prompt + max_tokens exceed what one request may hold; shorten the prompt or max_tokens")
    return "; ".join(advice) or "no wait helps"


def not_ready(reason: str) -> web.Response:
    """503: the gate cannot decide (no thresholds) or the upstream is down."""
    return error(503, reason, kind="server_error", code="slogate_unavailable", headers={"Retry-After": "1"})


DRAINING_RETRY_AFTER_S = 1
"""Retry-After of a draining sidecar's 429: another replica can serve the request now."""


def draining(overload_status: int = 429) -> web.Response:
    """The overload status (429 unless set otherwise) while the sidecar drains: nothing reached
    llama-server, so any replica may take it.

    The connection is closed after it: a balancer keeps no idle connection to a sidecar
    that is about to stop listening."""
    response = error(
        overload_status,
        "the slogate sidecar is draining (its pod is stopping or llama-server restarting); "
        "nothing was sent to llama-server: retry on another replica",
        kind="rate_limit_error",
        code="slogate_draining",
        headers={"Retry-After": str(DRAINING_RETRY_AFTER_S)},
        extra={"slogate": {"outcome": "draining", "retryAfterSeconds": DRAINING_RETRY_AFTER_S}},
    )
    response.force_close()
    return shed(response)
