"""The admin API: thresholds in, state out, /metrics, and the drain. Served on its own port.

PUT needs the bearer token from the token file (re-read on every call, so a rotated
Kubernetes Secret takes effect without a restart), compared in constant time: both
sides are hashed to 32 bytes first, so neither where they differ nor their lengths
show in the time taken. A push is validated whole and swapped in one assignment, or
refused with the last good thresholds kept.

GET /slogate/v1/drain is the preStop hook of the llama.cpp container. The kubelet's hook
sends only the headers written in the pod spec, so it carries a token derived from the admin
token (slogate_admission.drain_token: a pod-spec reader learns it, never the admin token);
with an admin token file the drain needs it (403 otherwise), without one it needs nothing (a
sidecar run by hand). It can do one thing only: stop admitting until
llama-server has restarted (or twice the drain deadline has passed without it stopping:
``drain.STRAY_HOOK_DEADLINES``), while every admitted stream runs to its end; it reads no
body and changes nothing else. The admin port is reachable by the operator and Prometheus
only (the chart's NetworkPolicy), and by the node's kubelet, whose traffic a
NetworkPolicy always admits.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from slogate_admission import drain_token
from slogate_admission.schema import Thresholds
from slogate_admission.ttft_error import TtftErrorModel
from slogate_admission.validation import validation_problems
from slogate_sidecar import responses
from slogate_sidecar.body import read_body
from slogate_sidecar.drain import DrainCause
from slogate_sidecar.state import Sidecar
from slogate_sidecar.tenants import tenants_state

log = logging.getLogger("slogate.sidecar")
MAX_THRESHOLDS_BYTES = 256 * 1024


def authorized(sidecar: Sidecar, request: web.Request) -> bool:
    """The request bears the token; False when no token file is configured or readable."""
    path = sidecar.settings.admin_token_file
    if path is None:
        return False
    try:
        expected = path.read_bytes().strip()
    except OSError:
        log.error("admin token file %s unreadable: refusing admin writes", path)
        return False
    given = request.headers.get("Authorization", "")
    if not expected or not given.startswith("Bearer "):
        return False
    # aiohttp keeps undecodable header bytes as surrogates: encode them back, never fail.
    offered = given[7:].strip().encode("utf-8", "surrogateescape")
    # compare_digest takes time independent of where the bytes differ, but returns at
    # once when the lengths differ: equal-length digests hide the token's length too.
    return hmac.compare_digest(hashlib.sha256(offered).digest(), hashlib.sha256(expected).digest())


async def put_thresholds(sidecar: Sidecar, request: web.Request) -> web.Response:
    """Replace the thresholds atomically: 200, or 401 / 408 / 413 / 422 with nothing changed."""
    if not authorized(sidecar, request):
        return responses.error(
            401,
            "missing or wrong bearer token",
            kind="authentication_error",
            headers={"WWW-Authenticate": 'Bearer realm="slogate"'},
        )
    raw = await read_body(
        request,
        timeout_s=sidecar.settings.client_read_timeout_s,
        max_bytes=MAX_THRESHOLDS_BYTES,
        what="thresholds document",
    )
    try:
        thresholds = Thresholds.model_validate_json(raw)
        apply(sidecar, thresholds)
    except ValidationError as invalid:
        problems = "; ".join(validation_problems(invalid, root="(body)", limit=10))
    except ValueError as inconsistent:  # valid fields the gate still cannot compile (nothing swapped)
        problems = str(inconsistent)
    else:
        log.info(
            "thresholds %s (calibration %s) applied by admin push", thresholds.derived_at, thresholds.calibration_id
        )
        return web.json_response({"applied": True, "calibrationId": thresholds.calibration_id})
    sidecar.metrics.reject_thresholds()
    log.warning("rejected thresholds push: %s", problems)
    return responses.error(422, "invalid thresholds: " + problems, kind="invalid_request_error")


def apply(sidecar: Sidecar, thresholds: Thresholds) -> None:
    """Swap in validated thresholds and publish them as metrics."""
    sidecar.gate.load(thresholds)
    sidecar.metrics.set_thresholds(thresholds)


def state(sidecar: Sidecar) -> dict[str, Any]:
    """Thresholds, calibration id, live counters and rate estimates with their ages, the books by tenant."""
    now = time.monotonic()
    t = sidecar.gate.thresholds
    ledger = sidecar.gate.ledger
    rates = sidecar.rates
    summary = sidecar.ttft.tracker.summary()
    return {
        "ready": sidecar.gate.ready and sidecar.upstream_up and not sidecar.gate.drain.active,
        "upstreamUp": sidecar.upstream_up,
        "drain": sidecar.gate.drain.describe(),
        "calibrationId": t.calibration_id if t else None,
        "thresholds": t.model_dump(mode="json", by_alias=True) if t else None,
        "live": {
            "queuedPrefillTokens": ledger.queued_prefill_tokens,
            "streams": ledger.streams,
            "reservedKvTokens": ledger.reserved_kv_tokens,
            "deferred": sidecar.gate.deferred,
        },
        "rates": {
            "prefillTokensPerSecond": {
                "calibrated": t.prefill_tokens_per_second if t else None,
                "live": rates.prefill_tokens_per_s(now, sidecar.settings.rate_max_age_s),
                "ageSeconds": rates.prefill_age_s(now),
            },
            "decodeTokensPerSecond": {
                "live": rates.decode_tokens_per_s(now, sidecar.settings.rate_max_age_s),
                "ageSeconds": rates.decode_age_s(now),
            },
            "maxAgeSeconds": sidecar.settings.rate_max_age_s,
        },
        "ttftError": _ttft_error(sidecar.gate.machine.errors),
        "ttftPrediction": {
            "samples": summary.samples,
            "medianAbsRelativeError": summary.median_abs_relative_error,
            "medianActualOverPredicted": summary.median_ratio,
            "sloMet": summary.met,
            "sloMissed": summary.missed,
        },
        "promptCountError": {
            "estimateP95": sidecar.usage.prompt_error.estimate.quantile(0.95),
            "countedP95": sidecar.usage.prompt_error.counted.quantile(0.95),
            "samples": len(sidecar.usage.prompt_error.counted),
        },
        "tenants": tenants_state(
            sidecar.gate.machine.tenants, [c.name for c in t.classes] if t else [], sidecar.gate.clock()
        ),
        "costs": _costs(sidecar),
    }


def _costs(sidecar: Sidecar) -> dict[str, Any]:
    """The cost book's reading (``cost_book``): what the cost order judges by, and the quartiles
    the metrics count by."""
    t = sidecar.gate.thresholds
    costs = sidecar.gate.machine.costs.summary(sidecar.gate.clock())
    return {
        "order": t.shedding_order if t else None,
        "reserveSlots": t.cost_reserve_slots if t else None,
        "warm": costs.warm,
        "pressure": costs.pressure,
        "boundarySeconds": costs.boundary_s,
        "quartileBoundsSeconds": list(costs.quartile_bounds_s),
        "owedQuartiles": [k + 1 for k, owed in enumerate(costs.owed) if owed],
    }


async def get_state(sidecar: Sidecar, _request: web.Request) -> web.Response:
    """GET /slogate/v1/state."""
    return web.json_response(state(sidecar))


def drain_authorized(sidecar: Sidecar, request: web.Request) -> bool:
    """The drain hook's token is offered, or no admin token file is configured."""
    path = sidecar.settings.admin_token_file
    if path is None:
        return True
    try:
        admin_token = path.read_bytes()
    except OSError:
        log.error("admin token file %s unreadable: refusing the drain", path)
        return False
    offered = request.headers.get(drain_token.HEADER, "").strip().encode("utf-8", "surrogateescape")
    return bool(admin_token.strip()) and drain_token.drain_allowed(admin_token, offered)


async def get_drain(sidecar: Sidecar, request: web.Request) -> web.Response:
    """GET /slogate/v1/drain: drain, and answer once no admitted stream remains or at the deadline.

    200 once done (the kubelet only waits for it); ``drained`` says which of the two it was.
    403, and nothing drained, without the hook's token (when the sidecar has an admin token)."""
    if not drain_authorized(sidecar, request):
        return responses.error(
            403, f"the drain needs the {drain_token.HEADER} header of the pod's hook", kind="permission_error"
        )
    drain = sidecar.gate.drain
    sidecar.gate.begin_drain(DrainCause.HOOK)
    drained = await drain.drained()
    if not drained:
        log.warning("drain deadline (%g s) passed with %d admitted streams running", drain.deadline_s, drain.streams)
    return web.json_response({"drained": drained, "streams": drain.streams, **drain.describe()})


async def get_metrics(sidecar: Sidecar, _request: web.Request) -> web.Response:
    """GET /metrics: live gauges are read from the ledger at scrape time."""
    now = time.monotonic()
    sidecar.metrics.set_accounting(sidecar.gate.machine.accounting(now))
    sidecar.metrics.set_rates(sidecar.rates, now, sidecar.settings.rate_max_age_s)
    sidecar.metrics.upstream_up.set(1 if sidecar.upstream_up else 0)
    sidecar.metrics.draining.set(1 if sidecar.gate.drain.active else 0)
    body, content_type = sidecar.metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": content_type})


def _ttft_error(errors: TtftErrorModel | None) -> dict[str, Any] | None:
    """What the gate learned of its TTFT error: the bias by streams in service, the margins."""
    if errors is None:
        return None
    return {
        "quantile": errors.quantile,
        "marginPrior": errors.prior,
        "biasByStreams": list(errors.bias.factors),
        "margins": {name: {"value": m.value, "samples": m.samples} for name, m in errors.margins.items()},
    }
