"""Offered demand: each arrival the gate decides on, counted once as a first try or as a retry.

The autoscaler's signal (``slogate_admission.demand``) is the demand clients bring, each first
try priced at the server-seconds it costs a pod. A refused client that comes back would otherwise be counted on every
try: the spec's retry amplification λ / (1 − p) (``slogate_admission.retry``), demand that
the shedding itself made. So each arrival is first judged a first try or a retry, from what it
says of itself (``attempt_of``: its headers) and from the keys this gate refused lately
(``demand.RetryMemory``, told of every 429 the sidecar answers with the Retry-After it
sent); then, once the gate has decided on it, it is counted in ``slogate_offered_*``
(requests, prompt tokens, work seconds) or in ``slogate_retried_requests_total``
(``DemandMeter.decided``).

What is counted: every arrival the gate decides on, whatever it decides (admitted, degraded,
deferred, refused, or too large ever to fit): exactly the arrivals of
``slogate_requests_total``, split in two. What is not: requests the sidecar answers without a
decision, none of them demand this pod could serve (malformed or unreadable 4xx, 413, 408; a
tokenizer that refused the prompt; 503 before thresholds or with llama-server down; 429
``slogate_draining``, which the balancer sends on to a pod that counts it). docs/metrics.md,
"Offered demand and capacity".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from aiohttp import web

from slogate_admission.decision import GateConfig, Request
from slogate_admission.demand import Attempt, DemandBook, RetryMemory
from slogate_sidecar.metrics import SidecarMetrics
from slogate_sidecar.responses import SHED

__all__ = ["KEY_HEADERS", "MAX_KEY_CHARS", "RETRY_COUNT_HEADERS", "DemandMeter", "attempt_of"]

RETRY_COUNT_HEADERS: tuple[tuple[str, int], ...] = (
    ("x-stainless-retry-count", 0),
    ("x-envoy-attempt-count", 1),
    ("x-slogate-retry-count", 0),
)
"""Headers that number an arrival's tries, each with the number its first try carries: the
OpenAI and Anthropic SDKs count retries from 0, Envoy (``include_request_attempt_count``)
counts attempts from 1, and slogate's own header counts retries from 0."""
KEY_HEADERS = ("idempotency-key", "x-request-id")
"""Headers naming one request on all of its tries, the first present wins."""
MAX_KEY_CHARS = 128
"""A longer key is remembered by its SHA-256: a header may hold 8 KiB, and the memory holds
up to ``demand.MEMORY_KEYS`` keys."""
_COUNT = re.compile(r"[0-9]{1,6}")
"""A try number as a header carries it: ASCII digits only (``int()`` would also take
``+1``, ``1_0`` or Arabic-Indic digits), and few of them."""


def attempt_of(headers: Mapping[str, str]) -> Attempt:
    """What an arrival says of itself; a header that cannot be read is ignored, never an error.

    ``retry_count`` is the largest count any header declares (one that says "retry" is
    enough); a value below its first try's number (Envoy's 0) is no count. The key is
    prefixed with its header's name, so an idempotency key never matches a request id.
    """
    counts = []
    for name, first in RETRY_COUNT_HEADERS:
        raw = headers.get(name)
        if raw is None or not _COUNT.fullmatch(raw.strip()):
            continue
        value = int(raw.strip())
        if value >= first:
            counts.append(value - first)
    return Attempt(key=_key(headers), retry_count=max(counts) if counts else None)


def _key(headers: Mapping[str, str]) -> str | None:
    for name in KEY_HEADERS:
        value = (headers.get(name) or "").strip()
        if not value:
            continue
        if len(value) > MAX_KEY_CHARS:
            # aiohttp keeps undecodable header bytes as surrogates: encode them back, never fail.
            value = "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()
        return f"{name}:{value}"
    return None


class DemandMeter:
    """One sidecar's count of offered demand: the core's ``DemandBook``, exported as counters."""

    def __init__(self, metrics: SidecarMetrics, memory: RetryMemory | None = None) -> None:
        self.metrics = metrics
        self.book = DemandBook(memory)
        """The counts and the memory of refused keys (``demand.DemandBook``)."""

    def is_retry(self, attempt: Attempt, now: float) -> bool:
        """Whether an arrival repeats a request already counted (judged when it arrives)."""
        return self.book.is_retry(attempt, now)

    def decided(self, *, retry: bool, request: Request, config: GateConfig) -> None:
        """The gate decided on an arrival: a first try adds to offered demand, a retry apart.

        ``request``: as the gate knew it when it decided, its prompt tokens given, counted by
        llama-server, or estimated from the text when refused before counting, and the n_out
        the gate books. Its work is priced on ``config``, the thresholds in force
        (``demand.offered_work_s``): the autoscaling query's series."""
        counted = self.book.count(retry=retry, request=request, config=config)
        if counted.retry:
            self.metrics.retried_requests.inc()
            return
        self.metrics.offered_requests.inc()
        self.metrics.offered_prompt_tokens.inc(counted.prompt_tokens)
        self.metrics.offered_work.inc(counted.work_s)

    def answered(self, attempt: Attempt, response: web.StreamResponse, now: float) -> None:
        """Remember the key of a try the sidecar shed (its overload status, 429 by default), for
        its Retry-After (plus grace)."""
        if not response.get(SHED, False):
            return
        retry_after = response.headers.get("Retry-After", "")
        if not _COUNT.fullmatch(retry_after):  # every 429 of the sidecar's own carries one
            return
        self.book.refused(attempt, float(retry_after), now)
