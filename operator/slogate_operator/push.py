"""Pushing thresholds to every running sidecar, and counting who has them.

Each sidecar is asked first (GET /slogate/v1/state): one that already serves these
thresholds (it booted from the ConfigMap, or took an earlier push) counts as
acknowledged without a write. Otherwise PUT /slogate/v1/thresholds with the bearer
token; 200 is an acknowledgement. Attempts back off; a sidecar still behind after
them is retried by a later pass, not before its rounds' backoff (which goes on doubling
from the attempts' up to ``retry_max_s``, the resync period) is over.

Pods are pushed to when running with their sidecar container running, ready or not:
an injected sidecar is not ready *until* it has thresholds, so waiting for readiness
would wait forever.

Pushes never hold a policy's reconcile pass: a ``PushTracker`` per policy runs one round
at a time in the background (short timeouts, bounded parallelism), remembers who
acknowledged which thresholds (by pod uid and sidecar restart count, so a restarted
sidecar is asked again), and wakes the policy when a push changed what its status says (an
acknowledgement, a sidecar failing, or failing otherwise), never for a failure repeated: 200
unreachable sidecars once kept a policy in a pass every second and a half, each listing the
200 pods. A pass reports what is known and starts pushes to the sidecars still behind whose
backoff is over.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from slogate_admission.schema import Thresholds
from slogate_operator import names

log = logging.getLogger("slogate.operator.push")
STATE_PATH = "/slogate/v1/state"
THRESHOLDS_PATH = "/slogate/v1/thresholds"
MAX_PARALLEL = 16
RETRY_SLACK_S = 1.0
"""A sidecar whose backoff ends this soon is retried now, with the others: the failures of one
round end within seconds of each other, and so do their backoffs, so one pass retries them."""


@dataclass(frozen=True, slots=True)
class SidecarEndpoint:
    """One pod's sidecar admin API."""

    pod: str
    url: str
    incarnation: str = ""
    """Pod uid and sidecar restart count: a new incarnation has to be asked again."""


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
        restarts = sum(
            int(c.get("restartCount") or 0)
            for c in status.get("containerStatuses") or ()
            if c.get("name") == names.SIDECAR_CONTAINER
        )
        incarnation = f"{meta.get('uid', meta.get('name'))}/{restarts}"
        found.append(SidecarEndpoint(str(meta.get("name")), f"http://{host}:{admin_port}", incarnation))
    return sorted(found, key=lambda e: e.pod)


@dataclass(frozen=True, slots=True)
class PushSettings:
    """How hard to try."""

    attempts: int = 3
    backoff_s: float = 0.5
    timeout_s: float = 2.0
    retry_max_s: float = 30.0
    """The longest wait before a sidecar that failed is pushed to again."""

    def retry_after(self, failures: int) -> float:
        """The wait after ``failures`` failed pushes in a row: the attempts' backoff, doubling on."""
        return float(min(self.retry_max_s, self.backoff_s * 2.0 ** (self.attempts + failures - 2)))


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


@dataclass(eq=False)
class PushTracker:
    """One policy's pushes: who has which thresholds, and the pushes under way."""

    acknowledged: dict[str, str] = field(default_factory=dict)
    """Endpoint incarnation -> calibration id + digest of the thresholds it serves."""
    problems: dict[str, str] = field(default_factory=dict)
    """Endpoint incarnation -> why the last attempt failed."""
    inflight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """Endpoint incarnation -> its push under way (one at a time per sidecar)."""
    failures: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Endpoint incarnation -> failed pushes in a row, and the clock's time before which it is not retried."""
    clock: Callable[[], float] = time.monotonic
    _wake: tuple[float, asyncio.TimerHandle] | None = None
    """The pass asked for when the first backoff ends (its time on ``clock``), if one is."""
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_PARALLEL))

    def report(self, found: Sequence[SidecarEndpoint], version: str) -> PushReport:
        """Who of ``found`` is known to serve ``version``; the rest, with the reason if one is known."""
        acknowledged = tuple(e.pod for e in found if self.acknowledged.get(e.incarnation) == version)
        behind = tuple(
            (e.pod, self.problems.get(e.incarnation, "push under way"))
            for e in found
            if self.acknowledged.get(e.incarnation) != version
        )
        return PushReport(targeted=len(found), acknowledged=acknowledged, behind=behind)

    def start(
        self,
        session: aiohttp.ClientSession,
        found: Sequence[SidecarEndpoint],
        thresholds: Thresholds,
        token: str,
        settings: PushSettings,
        *,
        done: Callable[[], None],
    ) -> int:
        """Push to every endpoint of ``found`` that is behind and not being pushed to; how many started.

        A frozen sidecar holds only its own push (and one of MAX_PARALLEL places): a new pod
        is pushed to beside it. One that failed waits out its backoff. ``done`` runs after a
        push that changed what the status says, so the policy's next pass reports it.
        """
        version = thresholds_version(thresholds)
        live = {e.incarnation for e in found}
        for book in (self.acknowledged, self.problems, self.failures):
            for gone in [key for key in book if key not in live]:
                del book[gone]  # pods that left: forget them
        body = thresholds.model_dump_json(by_alias=True)
        started = 0
        for endpoint in found:
            key = endpoint.incarnation
            if self.acknowledged.get(key) == version or key in self.inflight:
                continue
            if self.clock() < self.failures.get(key, (0, -1.0))[1] - RETRY_SLACK_S:
                continue  # failed lately: the pass asked for at the end of its backoff tries again

            async def push(endpoint: SidecarEndpoint = endpoint, key: str = key) -> None:
                try:
                    async with self.gate:
                        problem = await _push_one(
                            session, endpoint, thresholds=thresholds, body=body, token=token, settings=settings
                        )
                finally:
                    self.inflight.pop(key, None)
                if problem is None:
                    self.acknowledged[key] = version
                    self.problems.pop(key, None)
                    self.failures.pop(key, None)
                    done()
                    return
                failed = self.failures.get(key, (0, 0.0))[0] + 1
                self.failures[key] = (failed, self.clock() + settings.retry_after(failed))
                self._wake_for_retry(done)
                if self.problems.get(key) != problem:  # news: the status says it
                    log.warning("sidecar of pod %s does not have thresholds %s: %s", endpoint.pod, version, problem)
                    self.problems[key] = problem
                    done()

            self.inflight[key] = asyncio.ensure_future(push())
            started += 1
        return started

    def _wake_for_retry(self, done: Callable[[], None]) -> None:
        """A pass when the first backoff ends, unless one is asked for by then already: the
        sidecars that failed in the same round are retried by that pass together."""
        due = self.next_retry()
        if due is None or (self._wake is not None and self.clock() < self._wake[0] <= due):
            return
        if self._wake is not None:
            self._wake[1].cancel()
        self._wake = (due, asyncio.get_running_loop().call_later(max(0.0, due - self.clock()), done))

    def next_retry(self) -> float | None:
        """When (the tracker's clock) the first sidecar that failed may be pushed to again."""
        waiting = [until for key, (_, until) in self.failures.items() if key not in self.inflight]
        return min(waiting) if waiting else None

    def cancel(self) -> None:
        for task in list(self.inflight.values()):
            task.cancel()
        if self._wake is not None:
            self._wake[1].cancel()


def thresholds_version(thresholds: Thresholds) -> str:
    """Which thresholds a sidecar was acknowledged for: calibration id and a digest of the document."""
    body = thresholds.model_dump_json(by_alias=True)
    return f"{thresholds.calibration_id}/{hashlib.sha256(body.encode()).hexdigest()[:12]}"
