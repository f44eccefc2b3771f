"""Assembling and running one sidecar: two ports, one upstream poller, the drain.

Proxy port: the inference API, /v1/models and /health passed through, /healthz (alive)
and /readyz (thresholds loaded, upstream healthy, not draining). Admin port: the admin
API, the drain (the llama.cpp container's preStop hook) and /metrics. Both log one access
line per request unless ``access_log`` is off. The poller reads the upstream's /health
and /metrics counters every ``poll_interval_s``; rates come from counter deltas
(llama-server's gauges reset on every scrape, so they are never used). ``serve_forever``
runs a sidecar process: the first SIGTERM or SIGINT starts a final drain (``drain.py``),
after which it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import ValidationError

from slogate_admission.schema import Thresholds
from slogate_admission.validation import first_problem
from slogate_llama.client import LlamaClient
from slogate_llama.counters import MetricsError
from slogate_llama.routes import Route
from slogate_sidecar import admin, openapi, responses
from slogate_sidecar.bad_request import BadRequest
from slogate_sidecar.drain import Drain, DrainCause
from slogate_sidecar.gate import Gate
from slogate_sidecar.learners import MetricsLearner, TtftLearner, UsageLearner
from slogate_sidecar.metrics import SidecarMetrics
from slogate_sidecar.offered_demand import DemandMeter
from slogate_sidecar.passthrough import passthrough
from slogate_sidecar.proxy import InferenceProxy
from slogate_sidecar.rates import RateEstimator
from slogate_sidecar.routing_signals import RoutingSignals
from slogate_sidecar.settings import SidecarSettings
from slogate_sidecar.state import Sidecar
from slogate_sidecar.tenants import TenantMetrics

log = logging.getLogger("slogate.sidecar")
access_log = logging.getLogger("slogate.sidecar.access")


def build_sidecar(settings: SidecarSettings) -> Sidecar:
    """The shared state, with boot thresholds loaded if the file is valid."""
    rates = RateEstimator()
    metrics = SidecarMetrics()
    gate = Gate(
        live_prefill_rate=lambda now: rates.prefill_tokens_per_s(now, settings.rate_max_age_s),
        drain=Drain(settings.drain_deadline_s),
    )
    RoutingSignals(gate).register(metrics.registry)  # routing signals, computed when scraped (docs/routing.md)
    TenantMetrics(gate).register(metrics.registry)  # the books by tenant, read when scraped (docs/metrics.md)
    ttft, usage, recorded = TtftLearner(), UsageLearner(), MetricsLearner(metrics)
    gate.observers.append(recorded)
    gate.learners.extend((ttft, usage, recorded))
    sidecar = Sidecar(
        settings=settings, gate=gate, rates=rates, metrics=metrics, ttft=ttft, usage=usage, demand=DemandMeter(metrics)
    )
    if settings.thresholds_file is not None:
        try:
            admin.apply(sidecar, Thresholds.model_validate_json(settings.thresholds_file.read_text()))
            log.info("thresholds loaded from %s", settings.thresholds_file)
        except (OSError, ValueError) as problem:  # ValidationError is a ValueError
            # Not ready rather than guessing: readiness keeps traffic away until a push.
            log.error(
                "thresholds file %s unusable, not ready until thresholds are pushed: %s",
                settings.thresholds_file,
                boot_problem(problem),
            )
    return sidecar


def boot_problem(problem: OSError | ValueError) -> str:
    """One line saying what is wrong with the boot thresholds file."""
    if isinstance(problem, OSError):
        return problem.strerror or str(problem)
    if not isinstance(problem, ValidationError):  # valid fields the gate cannot compile
        return str(problem)
    return first_problem(problem)


ADMIN_PATHS = ("/slogate/", "/metrics")
"""Paths served on the admin port only: asked on the client port, the 404 says where."""


def json_errors(admin_port: int | None = None) -> Middleware:
    """Refusals raised rather than returned as OpenAI-style JSON, like every other error: a
    ``BadRequest`` (a body unreadable, too large, late or invalid: ``body.read_body``,
    ``requests``) and aiohttp's own (404, 405); an unexpected exception is logged whole and
    answered with a JSON 500. Given ``admin_port`` (the client port's middleware), a 404 for
    an admin path says it is there."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as bad:
            return web.json_response(bad.body(), status=bad.status)
        except web.HTTPException as refusal:
            if refusal.status < 400:
                raise
            message = f"{refusal.reason}: {request.method} {request.path}"
            if refusal.status == 404 and admin_port is not None and request.path.startswith(ADMIN_PATHS):
                where = f"admin port ({admin_port})" if admin_port else "admin port"
                message += f" is served on the sidecar's {where}, not on this client port"
            elif refusal.status == 404:
                message += " is not an endpoint of the slogate sidecar"
            kept = {k: v for k, v in refusal.headers.items() if k.lower() in ("allow", "retry-after")}
            return responses.error(
                refusal.status,
                message,
                kind="invalid_request_error",
                code=refusal.reason.lower().replace(" ", "_"),
                headers=kept,
            )
        except Exception:
            log.exception("unexpected error handling %s %s", request.method, request.path)
            return responses.error(
                500, "internal error in the slogate sidecar (logged)", kind="server_error", code="internal_error"
            )

    return middleware


CLIENT_GONE = 499
"""The access log's status for a request whose client left before the answer (nginx's)."""


@web.middleware
async def log_access(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One info line per request, after it ends (a stream: after its last byte).

    Class and outcome are read from the answer (the class header of a forwarded request,
    the ``slogate`` details of a rejection), so the gate keeps no extra state for them;
    with the logger above INFO nothing is formatted at all."""
    started = time.perf_counter()
    status, response = CLIENT_GONE, None
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as answer:  # redirects only: json_errors answers every error
        status = answer.status
        raise
    finally:
        if access_log.isEnabledFor(logging.INFO):
            klass, outcome = admission_of(response)
            access_log.info(
                "%s %s %d class=%s outcome=%s %.1fms",
                request.method,
                request.path,
                status,
                klass,
                outcome,
                (time.perf_counter() - started) * 1000,
            )


def admission_of(response: web.StreamResponse | None) -> tuple[str, str]:
    """(class, outcome) of a gated request's answer; ("-", "-") for anything else."""
    if response is None:
        return "-", "-"
    klass = response.headers.get("X-Slogate-Class")
    if klass is not None:  # set on every admitted request's answer
        return klass, "degrade" if "X-Slogate-Degraded" in response.headers else "admit"
    refused = response.status == 400 or response.get(responses.SHED, False)
    body = response.body if isinstance(response, web.Response) and refused else None
    if isinstance(body, bytes) and b'"slogate"' in body:  # a rejection: a small JSON body
        try:
            details = json.loads(body).get("slogate")
        except (ValueError, AttributeError):  # not the sidecar's own JSON object after all
            return "-", "-"
        if isinstance(details, dict):
            return str(details.get("class", "-")), str(details.get("outcome", "-"))
    return "-", "-"


def middlewares(sidecar: Sidecar, admin_port: int | None = None) -> list[Middleware]:
    """The access log outermost (it sees the final status), then JSON errors."""
    errors = json_errors(admin_port)
    return [log_access, errors] if sidecar.settings.access_log else [errors]


MAX_LINE_BYTES = 8190
"""Longest request line or header field (aiohttp answers 400 beyond)."""
MAX_HEADERS = 100
"""Most header fields in one request (aiohttp answers 400 beyond)."""
LINGER_S = 1.0
"""After answering a request whose body was not read whole (413, 408, an early 503),
aiohttp reads and discards the rest so the client sees the answer rather than a reset;
for this long at most (its default, 10 s, would let a stalled client hold the connection)."""

SLOW_POLLS_BEFORE_DOWN = 3
"""A saturated llama-server may answer /health late; only a refused connection, a
non-200 answer or this many slow polls in a row mean it is down."""


async def poll_upstream(sidecar: Sidecar) -> None:
    """Track the upstream's health and its counters, forever (cancelled at shutdown)."""
    settings = sidecar.settings
    llama = LlamaClient(settings.upstream, sidecar.client)
    timeout = aiohttp.ClientTimeout(total=max(settings.poll_interval_s, 1.0) * 2)
    slow = 0
    while True:
        try:
            up = await llama.health_status(timeout) == 200
            counters = await llama.scrape(timeout)
            if counters is not None:  # None: no --metrics (501); health alone decides
                sidecar.rates.observe(counters, time.monotonic())
            slow = 0
        except (TimeoutError, aiohttp.ServerTimeoutError):
            slow += 1
            up = sidecar.upstream_up and slow < SLOW_POLLS_BEFORE_DOWN
        except (aiohttp.ClientError, MetricsError):
            up = False
        if up != sidecar.upstream_up:
            log.warning("upstream %s is %s", settings.upstream, "up" if up else "DOWN")
        sidecar.upstream_up = up
        sidecar.gate.drain.observe_upstream(up)
        await asyncio.sleep(settings.poll_interval_s)


def proxy_app(sidecar: Sidecar) -> web.Application:
    """The client-facing application."""
    app = web.Application(
        client_max_size=sidecar.settings.max_body_bytes,
        middlewares=middlewares(sidecar, admin_port=sidecar.settings.admin_port),
    )
    inference = InferenceProxy(sidecar)
    for route in Route:
        app.router.add_post(route.value, inference.handle)
    app.router.add_get("/v1/models", partial(passthrough, sidecar))
    app.router.add_get("/health", partial(passthrough, sidecar))

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def readyz(_request: web.Request) -> web.Response:
        if sidecar.gate.drain.active:
            return responses.not_ready("draining: admitting nothing until the drain is over")
        if not sidecar.gate.ready:
            return responses.not_ready("no thresholds loaded")
        if not sidecar.upstream_up:
            return responses.not_ready("upstream llama-server unavailable")
        return web.json_response(
            {
                "ready": True,
                "calibrationId": sidecar.gate.thresholds and sidecar.gate.thresholds.calibration_id,
            }
        )

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if sidecar.settings.expose_upstream_admin:
        app.router.add_route("*", "/{tail:.*}", partial(passthrough, sidecar))
    return app


def admin_app(sidecar: Sidecar) -> web.Application:
    """The operator- and Prometheus-facing application."""
    app = web.Application(client_max_size=admin.MAX_THRESHOLDS_BYTES, middlewares=middlewares(sidecar))
    app.router.add_put("/slogate/v1/thresholds", partial(admin.put_thresholds, sidecar))
    app.router.add_get(openapi.OPENAPI_PATH, openapi.get_openapi)
    app.router.add_get("/slogate/v1/state", partial(admin.get_state, sidecar))
    app.router.add_get("/slogate/v1/drain", partial(admin.get_drain, sidecar))
    app.router.add_get("/metrics", partial(admin.get_metrics, sidecar))
    return app


@contextlib.asynccontextmanager
async def running(sidecar: Sidecar, shutdown_timeout_s: float = 60.0) -> AsyncIterator[tuple[int, int]]:
    """Serve both ports and poll the upstream; yields the bound (proxy, admin) ports.

    On exit, requests still running get ``shutdown_timeout_s`` to end, then are cancelled."""
    settings = sidecar.settings
    # A fresh connection per upstream request: llama-server closes a connection after a
    # streamed response, so reusing a pooled one at once (a deferred request taking the
    # slot just freed) fails with "server disconnected". Loopback connects cost ~0.1 ms.
    sidecar.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256, force_close=True))
    poller = asyncio.create_task(poll_upstream(sidecar))
    # handler_cancellation: a client that disconnects cancels its handler, which closes
    # the upstream request (llama-server then aborts the generation) and releases the ticket.
    # keepalive_timeout also closes a connection whose request line and headers have not
    # all arrived in that long (aiohttp arms it at connect): slowloris on the headers.
    runners = [
        web.AppRunner(
            app,
            handler_cancellation=True,
            shutdown_timeout=shutdown_timeout_s,
            access_log=None,
            keepalive_timeout=settings.client_read_timeout_s,
            lingering_time=LINGER_S,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
        )
        for app in (proxy_app(sidecar), admin_app(sidecar))
    ]
    try:
        ports = []
        for runner, port in zip(runners, (settings.port, settings.admin_port), strict=True):
            await runner.setup()
            site = web.TCPSite(runner, settings.host, port)
            await site.start()
            # The bound port when 0 was asked for, from the runner: any event loop's server (uvloop's too).
            ports.append(int(runner.addresses[0][1]))
        yield ports[0], ports[1]
    finally:
        poller.cancel()
        for runner in runners:
            await runner.cleanup()
        await sidecar.session.close()


CUT_AFTER_S = 1.0
"""Once a final drain is over, what is still running (streams past the deadline, a last
response being written) gets this long before it is cancelled: the sidecar then exits."""


async def serve_forever(settings: SidecarSettings) -> None:
    """Serve until a final drain is over: the first SIGTERM or SIGINT starts it, a second stops at once.

    Draining, the sidecar refuses new work (429) and is not ready, lets the admitted streams
    finish within ``drain_deadline_s``, then exits; its ports stay open until then."""

    def started(port: int, admin_port: int) -> None:
        log.info(
            "slogate sidecar: proxy on %s:%d, admin on %s:%d, upstream %s",
            settings.host,
            port,
            settings.host,
            admin_port,
            settings.upstream,
        )

    await serve_until_drained(build_sidecar(settings), started)


async def serve_until_drained(
    sidecar: Sidecar, started: Callable[[int, int], None], draining: Callable[[Drain], None] | None = None
) -> None:
    """``serve_forever`` for a sidecar already built: ``started(port, admin_port)`` once both
    ports listen, ``draining(drain)`` when the first signal begins the final drain. A second
    signal cancels the calling task (the caller catches CancelledError)."""
    main = asyncio.current_task()
    assert main is not None

    def on_signal() -> None:
        if sidecar.gate.drain.final:
            log.warning("second signal: stopping now")
            main.cancel()
        else:
            sidecar.gate.begin_drain(DrainCause.SIGNAL)
            if draining is not None:
                draining(sidecar.gate.drain)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        async with running(sidecar, shutdown_timeout_s=CUT_AFTER_S) as (port, admin_port):
            started(port, admin_port)
            await sidecar.gate.drain.final_drained()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
