"""Run a real sidecar in-process, in front of a given upstream, for integration tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from slogate_admission import drain_token
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_sidecar.app import build_sidecar, running
from slogate_sidecar.settings import SidecarSettings
from slogate_sidecar.state import Sidecar

TOKEN = "s3cret-admin-token"
DRAIN_HEADERS = {drain_token.HEADER: drain_token.drain_token(TOKEN.encode())}
"""What the drain hook the operator writes sends, for this TOKEN."""


def thresholds_for(profile: CalibrationProfile, **policy: Any) -> Thresholds:
    raw: dict[str, Any] = {"slo": {"ttftSeconds": 3.0}, **policy}
    return derive_thresholds(Policy.model_validate(raw), profile, derived_at=datetime.now(UTC))


@dataclass
class RunningSidecar:
    sidecar: Sidecar
    url: str
    admin_url: str
    session: aiohttp.ClientSession

    async def state(self) -> dict[str, Any]:
        async with self.session.get(self.admin_url + "/slogate/v1/state") as response:
            result: dict[str, Any] = await response.json()
            return result

    async def push(self, body: bytes | str, token: str | None = TOKEN) -> aiohttp.ClientResponse:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with self.session.put(self.admin_url + "/slogate/v1/thresholds", data=body, headers=headers) as r:
            await r.read()
            return r

    async def wait_idle(self) -> bool:
        """Wait (bounded, 10 s) until the gate's books are empty: handlers end after clients."""
        for _ in range(200):
            if self.sidecar.gate.is_idle():
                return True
            await asyncio.sleep(0.05)
        return False


@asynccontextmanager
async def sidecar_in_front_of(
    upstream: str, tmp_path: Path, thresholds: Thresholds | None, **overrides: Any
) -> AsyncIterator[RunningSidecar]:
    """A sidecar on free loopback ports, ready once its first upstream poll succeeded."""
    thresholds_file = tmp_path / "thresholds.json"
    if thresholds is not None:
        thresholds_file.write_text(thresholds.model_dump_json(by_alias=True))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = SidecarSettings(
        upstream=upstream, port=0, admin_port=0, thresholds_file=thresholds_file,
        admin_token_file=token_file, poll_interval_s=0.2,
    )  # fmt: skip
    sidecar = build_sidecar(replace(settings, **overrides))
    async with running(sidecar) as (port, admin_port), aiohttp.ClientSession() as session:
        for _ in range(100):
            if sidecar.upstream_up:
                break
            await asyncio.sleep(0.05)
        yield RunningSidecar(sidecar, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", session)


@dataclass(frozen=True)
class Answer:
    """A request's answer: status, Retry-After and JSON body."""

    status: int
    retry_after: str | None
    body: dict[str, Any]

    @property
    def reasons(self) -> list[str]:
        """The refusal's reasons (``slogate.reasons``), in the gate's order."""
        return list(self.body.get("slogate", {}).get("reasons", []))


async def ask(
    gate: RunningSidecar, body: dict[str, Any], headers: dict[str, str] | None = None, path: str = "/completion"
) -> Answer:
    """One request, answered at once (a refusal, or a generation the upstream does not hold)."""
    async with gate.session.post(gate.url + path, json=body, headers=headers) as response:
        text = await response.text()
        data = json.loads(text) if text and response.content_type == "application/json" else {}
        return Answer(response.status, response.headers.get("Retry-After"), data)
