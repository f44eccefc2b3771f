"""Pushing thresholds to every running sidecar, and counting who has them.

Each sidecar is asked first (GET /slogate/v1/state): one that already serves these
thresholds (it booted from the ConfigMap, or took an earlier push) counts as
acknowledged without a write. Otherwise PUT /slogate/v1/thresholds with the bearer
token; 200 is an acknowledgement. Attempts back off; a sidecar still behind after
them is retried on the next reconcile pass.

Pods are pushed to when running with their sidecar container running, ready or not:
an injected sidecar is not ready *until* it has thresholds, so waiting for readiness
would wait forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import ValidationError

from slogate_admission.schema import Thresholds
from slogate_operator import names

log = logging.getLogger("slogate.operator.push")
STATE_PATH = "/slogate/v1/state"
THRESHOLDS_PATH = "/slogate/v1/thresholds"
MAX_PARALLEL = 16


@dataclass(frozen=True, slots=True)
class SidecarEndpoint:
    """One pod's sidecar admin API."""

    pod: str
    url: str


@dataclass(frozen=True, slots=True)
class PushReport:
    """Who has the thresholds in force."""

    targeted: int
    acknowledged: tuple[str, ...]
    behind: tuple[tuple[str, str], ...]
    """(pod, why) for each sidecar that does not have them."""

    @property
    def text(self) -> str:
        """``acknowledged/targeted``, e.g. ``3/3``."""
        return f"{len(self.acknowledged)}/{self.targeted}"

    @property
    def complete(self) -> bool:
        return len(self.acknowledged) == self.targeted


def endpoints(pods: Sequence[Mapping[str, Any]], admin_port: int, *, injected: bool) -> list[SidecarEndpoint]:
    """Running pods (not terminating) with an IP and, when injected, a running sidecar."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not ip:
            continue
        if injected and not any(
            c.get("name") == names.SIDECAR_CONTAINER and (c.get("state") or {}).get("running") is not None
            for c in status.get("containerStatuses") or ()
        ):
            continue
        host = f"[{ip}]" if ":" in str(ip) else str(ip)
        found.append(SidecarEndpoint(pod=str(meta.get("name")), url=f"http://{host}:{admin_port}"))
    return sorted(found, key=lambda e: e.pod)


@dataclass(frozen=True, slots=True)
class PushSettings:
    """How hard to try."""

    attempts: int = 3
    backoff_s: float = 0.5
    timeout_s: float = 5.0


async def push_all(
    session: aiohttp.ClientSession,
    targets: Sequence[SidecarEndpoint],
    thresholds: Thresholds,
    token: str,
    settings: PushSettings,
) -> PushReport:
    """Bring every target to ``thresholds``; report who has them."""
    body = thresholds.model_dump_json(by_alias=True)
    gate = asyncio.Semaphore(MAX_PARALLEL)

    async def one(target: SidecarEndpoint) -> tuple[str, str | None]:
        async with gate:
            return target.pod, await _push_one(
                session, target, thresholds=thresholds, body=body, token=token, settings=settings
            )

    results = await asyncio.gather(*(one(t) for t in targets))
    acknowledged = tuple(pod for pod, problem in results if problem is None)
    behind = tuple((pod, problem) for pod, problem in results if problem is not None)
    for pod, problem in behind:
        log.warning("sidecar of pod %s does not have thresholds %s: %s", pod, thresholds.calibration_id, problem)
    return PushReport(targeted=len(targets), acknowledged=acknowledged, behind=behind)


async def _push_one(
    session: aiohttp.ClientSession,
    target: SidecarEndpoint,
    *,
    thresholds: Thresholds,
    body: str,
    token: str,
    settings: PushSettings,
) -> str | None:
    """None when the sidecar has the thresholds; else why not."""
    timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
    problem = "not tried"
    for attempt in range(1, settings.attempts + 1):
        try:
            if await _serves(session, target, thresholds, timeout):
                return None
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            async with session.put(target.url + THRESHOLDS_PATH, data=body, headers=headers, timeout=timeout) as put:
                text = (await put.text())[:300]
                if put.status == 200:
                    return None
                problem = f"PUT answered {put.status}: {text}"
                if put.status == 422:
                    return problem  # the sidecar judged the document invalid: retrying cannot help
        except (aiohttp.ClientError, TimeoutError) as error:
            problem = f"unreachable: {error!r}"
        if attempt < settings.attempts:
            await asyncio.sleep(settings.backoff_s * 2 ** (attempt - 1))
    return problem


async def _serves(
    session: aiohttp.ClientSession, target: SidecarEndpoint, thresholds: Thresholds, timeout: aiohttp.ClientTimeout
) -> bool:
    async with session.get(target.url + STATE_PATH, timeout=timeout) as response:
        if response.status != 200:
            return False
        state = await response.json(content_type=None)
    current = state.get("thresholds") if isinstance(state, dict) else None
    if current is None:
        return False
    try:
        return Thresholds.model_validate(current) == thresholds
    except ValidationError:
        return False
