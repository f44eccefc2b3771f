"""The inference path: parse, count, decide, forward, relay, account.

The upstream is always asked to stream, so the first token is seen exactly (the
prompt leaves the queue then); clients that asked for one JSON answer get it
reassembled. Whatever happens (completion, upstream error, client disconnect,
which cancels this handler and so closes the upstream connection, aborting the
generation) the ticket is released in ``finally``. While the sidecar drains, every
request is refused with 429 ``slogate_draining`` before anything reaches llama-server.
Each arrival the gate decides on is counted once, as offered demand or as a retry, and
every 429 is remembered for the retries it will bring (``offered_demand``). A body that
cannot be read, parsed or gated raises ``BadRequest``, which ``app.json_errors`` answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from slogate_admission.decision import Decision, Outcome, Request
from slogate_admission.output_tokens import OutputTokenEstimate, estimate_output_tokens
from slogate_llama.lines import Lines, LineTooLongError
from slogate_llama.routes import Route, as_upstream_stream
from slogate_llama.stream import Reassembler, carries_token, event, event_data, may_be_final, usage_of
from slogate_sidecar import gateway_headers, responses
from slogate_sidecar.body import read_body
from slogate_sidecar.drain import Draining
from slogate_sidecar.lease import Lease, Origin, Usage
from slogate_sidecar.offered_demand import attempt_of
from slogate_sidecar.passthrough import upstream_failure, upstream_timeout
from slogate_sidecar.prompt_tokens import count_prompt_tokens, estimate_prompt_tokens
from slogate_sidecar.requests import BadRequest, ParsedRequest, parse_request, with_output_limit
from slogate_sidecar.settings import PromptCounting
from slogate_sidecar.state import Sidecar

MULTI_GENERATION_FIELDS = ("n", "n_cmpl")
"""Fields asking llama-server for several generations of one prompt (one slot each)."""
FALLBACK_TOKENS_PER_CHAR = 0.5
"""Used only if the profile carried no tokenizer density (older profiles)."""


@dataclass(slots=True)
class Exchange:
    """One admitted request's progress through the upstream."""

    route: Route
    parsed: ParsedRequest
    lease: Lease
    final_chunk: dict[str, Any] | None = None
    """llama-server's last chunk (usage, timings), once it came."""

    @property
    def decision(self) -> Decision:
        """The admitting decision."""
        return self.lease.decision


class InferenceProxy:
    """Handlers for /v1/chat/completions, /v1/completions and /completion."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sc = sidecar

    def classify(self, request: web.Request) -> str | None:
        """The class: the header, else a gateway's objective (``gateway_headers``), else the API
        key's class, else None (the default class)."""
        named = request.headers.get(self.sc.settings.class_header)
        if named:
            return named.strip().lower()
        objective = gateway_headers.objective(request.headers)
        if objective is not None:
            return objective
        key = api_key(request)
        return self.sc.settings.api_key_classes.get(key) if key is not None else None

    def tenant_of(self, request: web.Request) -> str | None:
        """The tenant, only while the thresholds carry a tenant policy: the header the policy
        names, else the API key's tenant, else None. The name is passed on as sent: the core
        books a name that is not a valid tenant name, like none, to the shared account."""
        thresholds = self.sc.gate.thresholds
        if thresholds is None or thresholds.tenants is None:
            return None
        named = request.headers.get(thresholds.tenants.header) or gateway_headers.fairness_id(request.headers)
        if named:
            return named
        key = api_key(request)
        return self.sc.settings.api_key_tenants.get(key) if key is not None else None

    async def _read(self, request: web.Request, route: Route) -> ParsedRequest:
        """The validated request; ``BadRequest`` (answered by ``app.json_errors``) if it is unfit."""
        settings = self.sc.settings
        raw = await read_body(request, timeout_s=settings.client_read_timeout_s, max_bytes=settings.max_body_bytes)
        parsed = parse_request(
            route, raw, max_body_bytes=settings.max_body_bytes, max_output_tokens=settings.max_output_tokens
        )
        one_generation(parsed)
        return parsed

    def _output_tokens(self, parsed: ParsedRequest) -> int:
        """n_out per policy: max_tokens, the route's learned quantile, or the default; at least 1,
        because llama-server generates one token even when asked for 0 (the reservation must hold)."""
        thresholds = self.sc.gate.thresholds
        assert thresholds is not None  # the gate is ready
        policy = thresholds.output_tokens
        learned = (
            self.sc.usage.output_tokens[parsed.route].quantile(policy.quantile)
            if policy.estimate is OutputTokenEstimate.ROUTE_QUANTILE
            else None
        )
        estimate = estimate_output_tokens(
            policy.estimate,
            max_tokens=parsed.max_tokens,
            default=policy.default,
            route_quantile=learned,
        )
        return max(1, estimate)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Decide on one arrival, then serve or refuse it; a 429 is remembered for its retries."""
        arrived = self.sc.gate.clock()  # the clock the gate decides with
        attempt = attempt_of(request.headers)
        retry = self.sc.demand.is_retry(attempt, arrived)  # judged on arrival, against refusals so far
        response = await self._arrival(request, arrived, retry=retry)
        self.sc.demand.answered(attempt, response, self.sc.gate.clock())
        return response

    async def _arrival(self, request: web.Request, arrived: float, *, retry: bool) -> web.StreamResponse:
        sc = self.sc
        refused = self._refused_at_once()
        if refused is not None:
            return refused
        parsed = await self._read(request, Route(request.path))
        if sc.gate.drain.active:  # it began while the body arrived: no /tokenize call either
            return self._draining()
        class_name, tenant = self.classify(request), self.tenant_of(request)
        own_slo = gateway_headers.ttft_slo_s(request.headers)
        n_out = self._output_tokens(parsed)
        tokens_per_char = (sc.gate.thresholds and sc.gate.thresholds.tokens_per_char) or FALLBACK_TOKENS_PER_CHAR
        estimated_n_in = estimate_prompt_tokens(parsed, tokens_per_char)
        empty = Request(0, n_out, class_name, tenant=tenant, ttft_slo_s=own_slo)
        n_in = await self._prompt_tokens(parsed, empty, estimated_n_in, retry=retry)
        if isinstance(n_in, web.Response):
            return n_in
        req = Request(n_in, n_out, class_name, tenant=tenant, ttft_slo_s=own_slo)
        return await self._decide_and_serve(request, parsed, req, arrived, estimated_n_in, retry=retry)

    def _refused_at_once(self) -> web.Response | None:
        """The answer to give before reading the request: draining (429), or unable to decide (503)."""
        sc = self.sc
        # Draining first: a draining sidecar's llama-server may be down (restarting), and a
        # 429 says "another replica", where a 503 would be a failure.
        if sc.gate.drain.active:
            return self._draining()
        if not sc.gate.ready:
            return responses.not_ready("no thresholds loaded: the gate cannot decide")
        if not sc.upstream_up:
            return responses.not_ready("upstream llama-server is unavailable")
        return None

    async def _prompt_tokens(
        self, parsed: ParsedRequest, empty: Request, estimated: int, *, retry: bool
    ) -> int | web.Response:
        """n_in: the estimate, or llama-server's exact count; or the answer that ends the request.

        A refusal before counting is demand all the same: its estimate is what the gate knew."""
        sc = self.sc
        if sc.settings.prompt_counting is not PromptCounting.TOKENIZE or parsed.prompt_token_count is not None:
            return estimated
        # n_in only makes matters worse: if even an empty prompt is refused, refuse
        # now, without an upstream call (rejections must stay cheap).
        pre = sc.gate.precheck(empty, estimated)
        if pre.outcome is Outcome.REJECT:
            sc.metrics.record_decision(pre, 0.0)
            sc.demand.decided(
                retry=retry, request=dataclasses.replace(empty, prompt_tokens=estimated), config=sc.gate.config
            )
            return responses.rejection(pre, sc.settings.overload_status)
        try:
            return await count_prompt_tokens(sc.client, sc.settings.upstream, parsed, upstream_timeout(sc))
        except aiohttp.ClientResponseError as refused:
            if 400 <= refused.status < 500:  # llama-server refused this prompt: the client's problem
                return responses.error(
                    400,
                    f"llama-server cannot tokenize this prompt: {refused.message}",
                    kind="invalid_request_error",
                    code="invalid_prompt",
                )
            return upstream_failure(sc, refused)
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as failure:
            return upstream_failure(sc, failure)

    async def _decide_and_serve(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        req: Request,
        arrived: float,
        estimated_n_in: int,
        *,
        retry: bool,
    ) -> web.StreamResponse:
        origin = Origin(parsed.route, estimated_n_in, req.prompt_tokens, parsed.prompt_token_count is not None)
        if self.sc.gate.drain.active:  # the gate would refuse it undecided (Draining): no demand here
            return self._draining()
        # Counted as the gate decides: acquire decides before its first await, and its
        # observers count the same arrival in slogate_requests_total.
        self.sc.demand.decided(retry=retry, request=req, config=self.sc.gate.config)
        try:
            admission = await self.sc.gate.acquire(req, origin, arrived)
        except Draining:
            return self._draining()
        if admission.lease is None:
            return responses.rejection(admission.final, self.sc.settings.overload_status)
        exchange = Exchange(parsed.route, parsed, admission.lease)
        try:
            return await self._forward(request, exchange)
        finally:
            if exchange.final_chunk is not None:
                exchange.lease.complete(Usage(*usage_of(exchange.route, exchange.final_chunk)))
            else:
                exchange.lease.abandon()

    async def _forward(self, request: web.Request, ex: Exchange) -> web.StreamResponse:
        sc = self.sc
        body = as_upstream_stream(with_output_limit(ex.parsed, ex.decision.output_tokens), ex.route)
        headers = {
            "X-Slogate-Class": ex.decision.class_name,
            "X-Slogate-Predicted-Ttft": f"{ex.decision.predicted_ttft_s:.4f}",
            **gateway_headers.admitted_headers(ex.lease.ticket.admitted_at - ex.lease.arrived_at),
        }
        if ex.decision.clamped:
            headers["X-Slogate-Degraded"] = f"max_tokens={ex.decision.output_tokens}"
        response: web.StreamResponse | None = None
        try:
            async with sc.client.post(
                sc.settings.upstream + ex.route.value, json=body, timeout=upstream_timeout(sc)
            ) as upstream:
                if upstream.status >= 400:
                    payload = await upstream.read()
                    status = upstream.status if upstream.status < 500 else 502
                    if status == 502:
                        sc.metrics.record_upstream_error("status_5xx")
                    return web.Response(
                        body=payload,
                        status=status,
                        content_type=upstream.content_type,
                        headers=headers,
                    )
                if ex.parsed.stream:
                    response = web.StreamResponse(
                        headers={
                            "Content-Type": "text/event-stream",
                            "Cache-Control": "no-cache",
                            **headers,
                        }
                    )
                    await response.prepare(request)
                    await self._relay(upstream, response, ex)
                    await response.write_eof()
                    return response
                return await self._reassemble(upstream, ex, headers)
        except asyncio.CancelledError:
            sc.metrics.client_disconnects.inc()
            raise
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            sc.metrics.client_disconnects.inc()  # the client left mid-stream
            raise asyncio.CancelledError from None
        except (aiohttp.ClientError, TimeoutError) as failure:
            if response is None:
                return upstream_failure(sc, failure)
            # Headers are gone: end the stream with an error event the client can parse.
            upstream_failure(sc, failure, started=True)
            error = {
                "error": {
                    "message": f"upstream failed mid-stream: {failure!r}",
                    "type": "server_error",
                }
            }
            try:
                await response.write(event(error))
                await response.write_eof()
            except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                pass
            return response

    def _draining(self) -> web.Response:
        self.sc.gate.drain.refuse()
        self.sc.metrics.drain_refusals.inc()
        return responses.draining(self.sc.settings.overload_status)

    def _observe(self, ex: Exchange, line: bytes, *, parse_all: bool) -> dict[str, Any] | None:
        """Parse an SSE line when needed: until the first token, at the end, or always."""
        data = event_data(line)
        if data is None:
            return None
        final = may_be_final(line)
        if not (parse_all or final or ex.lease.ttft_s is None):
            return None
        try:
            chunk: dict[str, Any] = json.loads(data)
        except ValueError:  # not JSON: relayed as it is, but it tells the gate nothing
            return None
        if not isinstance(chunk, dict):
            return None
        if ex.lease.ttft_s is None and carries_token(ex.route, chunk):
            ex.lease.first_token()
        if final:
            ex.final_chunk = chunk
        return chunk

    async def _relay(self, upstream: aiohttp.ClientResponse, response: web.StreamResponse, ex: Exchange) -> None:
        """Chunk by chunk, no buffering: each SSE line is written as it arrives."""
        async for line in upstream_lines(upstream):
            self._observe(ex, line, parse_all=False)
            await response.write(line)

    async def _reassemble(
        self, upstream: aiohttp.ClientResponse, ex: Exchange, headers: dict[str, str]
    ) -> web.Response:
        builder = Reassembler(ex.route)
        async for line in upstream_lines(upstream):
            chunk = self._observe(ex, line, parse_all=True)
            if chunk is not None:
                builder.add(chunk)
        result = builder.result()
        if isinstance(result, dict):  # (several native results: usage stays from the last chunk)
            ex.final_chunk = result
        return web.json_response(result, headers=headers)


def api_key(request: web.Request) -> str | None:
    """The key of ``Authorization: Bearer <key>``, or None."""
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth.startswith("Bearer ") else None


def one_generation(parsed: ParsedRequest) -> None:
    """One request, one stream: the accounting (slots, KV, queue) depends on it, so anything
    else is a ``BadRequest``. llama-server runs ``n`` (OpenAI's) or ``n_cmpl`` (its own)
    generations of one prompt in as many slots, and a batch prompt one per text."""
    several = [field for field in MULTI_GENERATION_FIELDS if not _is_one(parsed.body.get(field))]
    if parsed.prompt_count > 1 or several:
        raise BadRequest(
            "slogate gates one generation per request: send one prompt, with n (and n_cmpl) = 1",
            param="prompt" if parsed.prompt_count > 1 else several[0],
            code="slogate_one_generation_per_request",
        )


def _is_one(value: object) -> bool:
    """Absent (null) or the number 1."""
    return value is None or (type(value) in (int, float) and value == 1)


async def upstream_lines(upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The upstream's lines, however long (slogate_llama.lines: aiohttp's readline stops at
    512 KiB); a line past the bound is an upstream failure (502), like a broken payload."""
    lines = Lines()
    try:
        async for chunk in upstream.content.iter_any():
            for line in lines.feed(chunk):
                yield line
    except LineTooLongError as error:
        raise aiohttp.ClientPayloadError(str(error)) from error
    for line in lines.end():
        yield line
