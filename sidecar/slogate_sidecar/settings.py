"""Sidecar settings: one frozen dataclass, one docstring per field."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal


class PromptCounting(StrEnum):
    """How the gate learns n_in for a text prompt."""

    ESTIMATE = "estimate"
    """Characters x the calibrated tokens-per-character (p95): no upstream call."""
    TOKENIZE = "tokenize"
    """llama-server's own /tokenize (and /apply-template for chat): exact, one or two
    loopback calls, made only after a zero-token pre-check did not already reject."""


OverloadStatus = Literal[429, 503, 529]
"""The statuses a deliberate shed may answer with (``SidecarSettings.overload_status``)."""
OVERLOAD_STATUSES: tuple[OverloadStatus, ...] = (429, 503, 529)


@dataclass(frozen=True, slots=True)
class SidecarSettings:
    """How one sidecar runs."""

    upstream: str
    """llama-server's base URL, normally http://127.0.0.1:8080 in the same pod."""
    host: str = "127.0.0.1"
    """Address the proxy and admin ports bind to (0.0.0.0 in a pod)."""
    port: int = 8081
    """Client traffic: the OpenAI-compatible API, /completion, /healthz, /readyz."""
    admin_port: int = 8082
    """The admin API (/slogate/v1/...) and /metrics: reachable by the operator and Prometheus only."""
    thresholds_file: Path | None = None
    """Thresholds at boot (the ConfigMap mount); replaced at runtime by PUT."""
    admin_token_file: Path | None = None
    """Bearer token for PUT /slogate/v1/thresholds; without it every PUT is refused."""
    api_key_classes: dict[str, str] = field(default_factory=dict)
    """API key -> class, for requests that carry ``Authorization: Bearer <key>``."""
    api_key_tenants: dict[str, str] = field(default_factory=dict)
    """API key -> tenant, for requests that carry ``Authorization: Bearer <key>`` and no tenant
    header; read only while the thresholds carry a tenant policy (docs/sidecar.md, "Tenants")."""
    class_header: str = "X-Slogate-Class"
    """Header naming the request's class; an unknown class gets the default class."""
    prompt_counting: PromptCounting = PromptCounting.TOKENIZE
    """See PromptCounting; tokenize is exact and was measured cheap (docs/sidecar.md)."""
    max_body_bytes: int = 1 << 20
    """Larger request bodies get 413."""
    max_output_tokens: int = 1 << 20
    """max_tokens beyond this is absurd: 400 (KV limits are the gate's business)."""
    upstream_connect_timeout_s: float = 2.0
    """No connection in this long: 504, as for a read timeout (a refused connection is a 503
    at once: the upstream is down)."""
    upstream_read_timeout_s: float = 60.0
    """No byte from the upstream for this long: 504 (or the stream is cut)."""
    client_read_timeout_s: float = 30.0
    """A client that has not sent its whole request in this long is dropped (slowloris):
    headers not complete, the connection is closed; body not complete, 408. Both ports. Also
    how long an idle keep-alive connection stays open."""
    poll_interval_s: float = 1.0
    """How often the upstream's /health and /metrics counters are read."""
    rate_max_age_s: float = 30.0
    """A live rate older than this is stale: the calibrated rate is used instead."""
    expose_upstream_admin: bool = False
    """Pass llama-server's other endpoints (/slots, /props, ...) through; off by default."""
    drain_deadline_s: float = 25.0
    """How long admitted streams may run on once a drain begins (SIGTERM, or the preStop hook's
    GET /slogate/v1/drain); after a SIGTERM, those still running then are cut. Below
    Kubernetes' default 30 s grace period: in a pod the operator passes the pod's grace period
    less 5 s (docs/sidecar.md, "Draining")."""
    overload_status: OverloadStatus = 429
    """The status of a deliberate shed (the gate's refusal, a drain's): 429 Too Many Requests,
    which clients, gateways and Envoy treat as "retry later, elsewhere"; 503 (vLLM's, SGLang's)
    or 529 (NVIDIA Dynamo's) for clients built for those. A 5xx counts against availability
    SLOs and makes Envoy's outlier detection eject the shedding pod (docs/routing.md)."""
    access_log: bool = True
    """One info line per request on logger ``slogate.sidecar.access``: method, path, status,
    class, outcome, duration. Off: no per-request work at all (the middleware is absent)."""
