"""The shedding alert, end to end: Debian's real Prometheus with the chart's rules scrapes a
real sidecar in front of the real llama-server; quiet at low load, firing under overload.

The rules are rendered from the chart with ci/fast-alerts-values.yaml (20 s windows, `for:
2s`); Prometheus scrapes and evaluates every second. No operator runs here, so the shedding
alerts use their fallback ratios (the AdmissionPolicy defaults, 5 % and 25 %). The test
asserts states and orderings on Prometheus' own clock, never durations.
"""

from __future__ import annotations

import asyncio
import random
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from prometheus_process import Target, running_prometheus, wait_for
from sidecar_harness import RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_admission.derivation import longest_admitted_prompt
from slogate_admission.schema import CalibrationProfile
from slogate_calibration.runtime import LlamaServer
from unit.chart.chart_tools import CHART, concrete, dashboard, dashboard_exprs, load_values, rule_groups

FAST_VALUES = CHART / "ci" / "fast-alerts-values.yaml"
# The labels the PodMonitor's relabelling gives a sidecar's series in a cluster.
TARGET_LABELS = {"namespace": "llm", "policy": "smollm2", "workload": "smollm2", "pod": "smollm2-0"}
WARNING = "SlogateSheddingWarning"
CRITICAL = "SlogateSheddingCritical"


async def low_load(gate: RunningSidecar, count: int) -> list[int]:
    """One short request at a time: well within any budget."""
    statuses = []
    for _ in range(count):
        async with gate.session.post(gate.url + "/completion", json={"prompt": "The sky is", "n_predict": 4}) as r:
            await r.read()
            statuses.append(r.status)
        await asyncio.sleep(0.2)
    return statuses


async def overload_burst(gate: RunningSidecar, rng: random.Random, prompt_tokens: int, size: int = 16) -> list[int]:
    """`size` concurrent prompts, each a third of the TTFT budget: a few fit, the rest do not."""

    async def one() -> int:
        start = rng.randrange(1000, 30000)  # distinct prompts: no cache reuse
        body = {"prompt": list(range(start, start + prompt_tokens)), "n_predict": 8}
        async with gate.session.post(gate.url + "/completion", json=body) as r:
            await r.read()
            assert r.status != 429 or r.headers.get("Retry-After"), "a 429 without Retry-After"
            return r.status

    return list(await asyncio.gather(*(one() for _ in range(size))))


def parse_time(stamp: str) -> datetime:
    """Prometheus' RFC 3339 times carry nanoseconds; Python parses at most microseconds."""
    match = re.fullmatch(r"(.+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    assert match, stamp
    head, fraction, zone = match.groups()
    return datetime.fromisoformat(f"{head}.{(fraction or '0')[:6]}{'+00:00' if zone == 'Z' else zone}")


async def test_shedding_alert_quiet_at_low_load_firing_under_overload(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    rules = rule_groups(load_values(FAST_VALUES))
    thresholds = thresholds_for(calibrated_profile, slo={"ttftSeconds": 2.0}, deferral={"maxWaitSeconds": 0})
    prompt_tokens = longest_admitted_prompt(thresholds, share=1 / 3)
    assert prompt_tokens >= 4, f"the calibrated server prefills only {prompt_tokens} tokens in a third of 2 s"
    async with (
        sidecar_in_front_of(llama_server.url, tmp_path, thresholds) as gate,
        running_prometheus(tmp_path, [Target(gate.admin_url, TARGET_LABELS)], rules) as prometheus,
    ):
        # The target is up and its series carry the labels the rules group by.
        up = await wait_for(
            "the sidecar target up", lambda: prometheus.query('up{job="slogate-sidecars"} == 1'), prometheus
        )
        assert up[0]["metric"]["policy"] == "smollm2"

        # ---- Low load: every request admitted; the rule sees traffic and stays inactive.
        statuses = await low_load(gate, 12)
        assert statuses == [200] * 12
        seen = await wait_for(
            "the low load in Prometheus",
            lambda: prometheus.query('sum(increase(slogate_requests_total{outcome="admit"}[20s])) > 0'),
            prometheus,
        )
        traffic_seen_at = float(seen[0]["value"][0])
        refused = await prometheus.query('sum(rate(slogate_requests_total{outcome="reject"}[20s]))')
        assert float(refused[0]["value"][1]) == 0.0

        async def evaluated_after_traffic() -> dict[str, Any] | None:
            rule = await prometheus.rule(WARNING)
            return rule if parse_time(rule["lastEvaluation"]).timestamp() > traffic_seen_at else None

        rule = await wait_for("an evaluation of the rule after the low load", evaluated_after_traffic, prometheus)
        assert rule["health"] == "ok", rule.get("lastError")
        assert rule["state"] == "inactive"
        assert await prometheus.alerts(WARNING) == []
        assert await prometheus.alerts(CRITICAL) == []

        # ---- Overload: bursts until the warning fires, bounded by a generous deadline (a
        # bound on the wait, not a claim about speed: burst after burst may be refused in a
        # millisecond, so a count of bursts would not give Prometheus its scrapes).
        rng = random.Random(7)
        states_seen: list[str] = []
        burst_statuses: list[int] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 180
        while loop.time() < deadline:
            burst_statuses += await overload_burst(gate, rng, prompt_tokens)
            alerts = await prometheus.alerts(WARNING)
            states_seen += [a["state"] for a in alerts]
            if "firing" in states_seen:
                break
            await asyncio.sleep(0.25)
        else:
            pytest.fail(
                f"{WARNING} never fired: states {states_seen}, statuses {sorted(set(burst_statuses))}, "
                f"rule {await prometheus.rule(WARNING)}\n{prometheus.log_tail()}",
                pytrace=False,
            )
        print(f"alert states seen {states_seen}; overload of {prompt_tokens}-token prompts: "
              f"{burst_statuses.count(200)} admitted, "
              f"{burst_statuses.count(429)} rejected")  # fmt: skip
        assert burst_statuses.count(429) > burst_statuses.count(200) > 0  # it sheds, and still serves
        assert set(burst_statuses) <= {200, 429}
        firing_alerts = [a for a in alerts if a["state"] == "firing"]
        assert len(firing_alerts) == 1, alerts  # one workload, one alert
        firing = firing_alerts[0]
        assert {k: firing["labels"][k] for k in ("namespace", "policy", "workload", "severity")} == {
            "namespace": "llm", "policy": "smollm2", "workload": "smollm2", "severity": "warning"
        }  # fmt: skip
        assert float(firing["value"]) > 0.05
        assert firing["annotations"]["runbook_url"].endswith("#slogatesheddingwarning")
        assert "llm/smollm2/smollm2 refuses" in firing["annotations"]["summary"]

        # ---- The dashboard's queries run against this real Prometheus without error, and
        # its rejection ratio sees the overload.
        for _where, expr in dashboard_exprs(dashboard()):
            await prometheus.query(concrete(expr))  # asserts status success
        by_workload = next(e for w, e in dashboard_exprs(dashboard()) if w.startswith("panel 'Rejection ratio"))
        ratios = await prometheus.query(concrete(by_workload))
        assert ratios
        assert max(float(r["value"][1]) for r in ratios) > 0.05
        assert await gate.wait_idle()
