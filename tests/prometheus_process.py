"""Debian's real Prometheus for integration tests: started on a free port, scraping given
targets every second (rules evaluated every second too), and a client of its HTTP API.

Shared by tests/integration/test_alerting_shedding.py (the chart's alert rules against a
real sidecar) and tests/integration/test_autoscaling_prometheus.py (the autoscaling query
over two). Fails, never skips, when prometheus is missing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from ports import free_ports

JOB = "slogate-sidecars"
"""The scrape job of every target."""


@dataclass(frozen=True)
class Target:
    """One endpoint to scrape, with the labels Prometheus attaches to its series."""

    url: str
    """Its base URL (``/metrics`` is scraped)."""
    labels: Mapping[str, str]
    """As a PodMonitor's relabelling gives them in a cluster: namespace, workload, pod, ..."""


@dataclass
class Prometheus:
    """A running Prometheus and a client of its HTTP API."""

    url: str
    session: aiohttp.ClientSession
    log: Path

    async def api(self, path: str, **params: str) -> Any:
        async with self.session.get(self.url + path, params=params) as response:
            body = await response.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    async def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query, now or at Unix time ``at``."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = await self.api("/api/v1/query", **params)
        result: list[dict[str, Any]] = data["result"]
        return result

    async def alerts(self, name: str) -> list[dict[str, Any]]:
        data = await self.api("/api/v1/alerts")
        return [a for a in data["alerts"] if a["labels"]["alertname"] == name]

    async def rule(self, name: str) -> dict[str, Any]:
        data = await self.api("/api/v1/rules", type="alert")
        found = [r for g in data["groups"] for r in g["rules"] if r["name"] == name]
        assert len(found) == 1, f"rule {name}: {found}"
        rule: dict[str, Any] = found[0]
        return rule

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@asynccontextmanager
async def running_prometheus(
    tmp_path: Path, targets: Sequence[Target], rules: Sequence[dict[str, Any]] = ()
) -> AsyncIterator[Prometheus]:
    """Debian's prometheus on a free port, scraping ``targets`` every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: `make prometheus` installs Debian's prometheus package", pytrace=False)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": list(rules)}, sort_keys=False))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [
                    {"targets": [t.url.removeprefix("http://")], "labels": dict(t.labels)} for t in targets
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            prometheus = Prometheus(url, session, log)
            for _ in range(300):  # generous: Prometheus replays its (empty) WAL first
                if process.poll() is not None:
                    pytest.fail(f"prometheus exited ({process.returncode}):\n{prometheus.log_tail()}", pytrace=False)
                try:
                    async with session.get(url + "/-/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"prometheus never became ready:\n{prometheus.log_tail()}", pytrace=False)
            yield prometheus
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], prometheus: Prometheus, attempts: int = 600) -> Any:
    """Poll `check()` every 0.2 s until it returns something truthy (bounded, generous)."""
    for _ in range(attempts):
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}\nprometheus log:\n{prometheus.log_tail()}", pytrace=False)
