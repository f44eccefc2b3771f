"""The autoscaling query of the ScaledObject the operator builds, evaluated by a real
Prometheus over two real pods' sidecars.

Debian's prometheus scrapes two real sidecars (in-process, as in sidecar_harness), each in
front of its own real llama-server (`-t 1`: two one-thread pods on this two-core machine),
every second. Both carry the labels a PodMonitor gives one Deployment's pods: the same
namespace and workload, their own pod. Both enforce thresholds derived from the session's
measured profile.

The load: first tries at fixed inter-arrival times, alternating between the two pods, all
alike (a 96-token prompt, 16 tokens asked), at twice the rate one pod sustains of that
request, 2 / c with c its price in server-seconds on the enforced thresholds
(``demand.offered_work_s``); after every fourth, a retry of it on the other pod carrying
``x-stainless-retry-count: 1``, as the OpenAI SDK sends it. Whatever the pods admit or
refuse, the sidecars' own counters hold exactly the first tries sent to each (their work
c each), and the retries apart.

Evaluated by Prometheus at a moment whose rate window lies inside the load, the ScaledObject's
query (``slogate_operator.autoscaling.scaled_object``, its trigger's query and threshold)
gives ρ ≈ 2.0: KEDA's HPA asks for ⌈ρ / threshold⌉ pods (HPA's AverageValue rule, the
threshold the average per pod), ⌈2.0 / 0.7⌉ = 3, for any ρ in (1.4, 2.1], the band the test
asserts. Counting the retries as demand would read ρ ≈ 2.5 and ask for 4. Once the window has
passed with no load, the query gives 0, and the autoscaler falls to minReplicas (⌈0⌉ = 0,
raised to the minimum). Counts and values are asserted, never durations.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prometheus_process import Prometheus, Target, running_prometheus, wait_for
from sidecar_harness import RunningSidecar, sidecar_in_front_of
from slogate_admission.decision import GateConfig
from slogate_admission.demand import offered_work_s
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_calibration.runtime import LlamaRuntime, LlamaServer, LlamaServerError
from slogate_operator.autoscaling import AutoscalerRequest, scaled_object
from slogate_operator.builders import PolicyRef
from slogate_operator.spec import AutoscalingSpec

NAMESPACE, WORKLOAD = "llm", "smollm2"
MATCHERS = f'namespace="{NAMESPACE}",workload="{WORKLOAD}"'
WINDOW_S = 20
"""The query's rate window: twenty 1 s scrapes."""
MIN_REPLICAS = 1
AUTOSCALING = AutoscalingSpec(enabled=True, min_replicas=MIN_REPLICAS, max_replicas=10, metric_window_seconds=WINDOW_S)
"""The policy's spec.autoscaling: the defaults (targetUtilization 0.7) but a short window."""
TRIGGER = scaled_object(
    AutoscalerRequest(PolicyRef("assistant", NAMESPACE, "uid-1"), WORKLOAD, AUTOSCALING, "http://prometheus:9090")
)["spec"]["triggers"][0]["metadata"]
QUERY: str = TRIGGER["query"]
"""The autoscaling query under test: the ScaledObject's."""
TARGET = float(TRIGGER["threshold"])
"""The autoscaler's target: ρ per pod (0.7, the policy's targetUtilization default)."""

LOAD = 2.0
"""Offered first tries, in pods' worth of capacity."""
LOAD_S = WINDOW_S + 10
"""Long enough for a whole window, well inside the load, to be evaluated."""
RETRY_EVERY = 4
"""Every fourth first try is followed by a retry of it."""
PROMPT_TOKENS = 96
OUTPUT_TOKENS = 16
POD_THREADS = 1


def over_window(series: str) -> str:
    return f"sum(rate({series}{{{MATCHERS}}}[{WINDOW_S}s]))"


def replicas(rho: float, target: float = TARGET, minimum: int = MIN_REPLICAS) -> int:
    """What HPA (and KEDA's HPA) ask for from ρ: ⌈ρ / target⌉, never below the minimum."""
    return max(minimum, math.ceil(rho / target))


@pytest.fixture(scope="module")
def pod_servers(llama_runtime: LlamaRuntime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LlamaServer]]:
    """Two one-thread llama-servers, one per pod (the suite's slots and context)."""
    logs = tmp_path_factory.mktemp("autoscaling-pods")
    with ExitStack() as stack:
        servers = []
        for index in range(2):
            server = LlamaServer(llama_runtime, threads=POD_THREADS, log_path=logs / f"pod-{index}.log")
            try:
                stack.enter_context(server)
            except LlamaServerError as exc:
                pytest.fail(str(exc), pytrace=False)
            servers.append(server)
        yield servers


def enforced_thresholds(profile: CalibrationProfile) -> Thresholds:
    policy = Policy.model_validate({"slo": {"ttftSeconds": 3.0}, "deferral": {"maxWaitSeconds": 0}})
    return derive_thresholds(policy, profile, derived_at=datetime.now(UTC))


@dataclass
class Sent:
    """What the load sent to one pod, and how it was answered."""

    first_tries: int = 0
    retries: int = 0
    statuses: list[int] = field(default_factory=list)


async def post(
    session: aiohttp.ClientSession, gate: RunningSidecar, body: dict[str, Any], headers: dict[str, str], sent: Sent
) -> None:
    async with session.post(gate.url + "/completion", json=body, headers=headers) as response:
        await response.read()
        sent.statuses.append(response.status)


async def offer(gates: list[RunningSidecar], rate: float, seconds: float) -> tuple[list[Sent], float, float]:
    """First tries at ``rate``/s, at fixed times, alternating pods; retries after every
    ``RETRY_EVERY``-th on the other pod. Returns what each pod got, and the Unix times of the
    first and last first try."""
    sent = [Sent() for _ in gates]
    gap = 1.0 / rate
    count = int(seconds * rate)
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        start, started_at = loop.time(), time.time()
        for k in range(count):
            await asyncio.sleep(max(0.0, start + k * gap - loop.time()))
            pod = k % len(gates)
            body = {"prompt": list(range(1000 + k, 1000 + k + PROMPT_TOKENS)), "n_predict": OUTPUT_TOKENS}
            sent[pod].first_tries += 1
            tasks.append(asyncio.create_task(post(session, gates[pod], body, {}, sent[pod])))
            if k % RETRY_EVERY == RETRY_EVERY - 1:
                await asyncio.sleep(gap / 2)
                other = (pod + 1) % len(gates)
                sent[other].retries += 1
                retry = {"x-stainless-retry-count": "1"}
                tasks.append(asyncio.create_task(post(session, gates[other], body, retry, sent[other])))
        ended_at = started_at + (count - 1) * gap
        await asyncio.gather(*tasks)
    return sent, started_at, ended_at


async def own_counters(gate: RunningSidecar) -> dict[str, float]:
    async with gate.session.get(gate.admin_url + "/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def value_at(prometheus: Prometheus, expr: str, at: float) -> float:
    """The one value of ``expr`` at Unix time ``at``."""
    result = await prometheus.query(expr, at=at)
    assert len(result) == 1, result
    return float(result[0]["value"][1])


async def rho_at(prometheus: Prometheus, at: float) -> float:
    """ρ, the autoscaling query's value, at Unix time ``at``."""
    return await value_at(prometheus, QUERY, at)


async def scraped_past(prometheus: Prometheus, moment: float) -> bool:
    """Both targets have a sample later than ``moment``."""
    found = await prometheus.query(f"min(timestamp(up{{{MATCHERS}}})) > {moment:.3f} and count(up{{{MATCHERS}}}) == 2")
    return bool(found)


@pytest.fixture
async def pods(
    pod_servers: list[LlamaServer], calibrated_profile: CalibrationProfile, tmp_path: Path
) -> AsyncIterator[list[RunningSidecar]]:
    thresholds = enforced_thresholds(calibrated_profile)
    async with AsyncExitStack() as stack:
        gates = []
        for index, server in enumerate(pod_servers):
            workdir = tmp_path / f"pod-{index}"
            workdir.mkdir()
            gates.append(await stack.enter_async_context(sidecar_in_front_of(server.url, workdir, thresholds)))
        yield gates


async def test_the_query_asks_for_three_pods_at_twice_one_pods_capacity_and_the_minimum_without_load(
    pods: list[RunningSidecar], tmp_path: Path
) -> None:
    targets = [
        Target(gate.admin_url, {"namespace": NAMESPACE, "workload": WORKLOAD, "pod": f"{WORKLOAD}-6b9c7d-{i}"})
        for i, gate in enumerate(pods)
    ]
    async with running_prometheus(tmp_path, targets) as prometheus:
        # Both pods enforce the same thresholds: one price c of the request sent, in server-seconds.
        enforced = pods[0].sidecar.gate.thresholds
        assert enforced is not None
        assert pods[1].sidecar.gate.thresholds == enforced
        cost = offered_work_s(GateConfig.from_thresholds(enforced), PROMPT_TOKENS, OUTPUT_TOKENS)
        mu = 1.0 / cost  # what one pod sustains of this request
        now = time.time()
        await wait_for("both sidecars scraped", lambda: scraped_past(prometheus, now), prometheus)

        sent, started, ended = await offer(pods, LOAD * mu, LOAD_S)

        # The sidecars' own counters: exactly the first tries each got, retries apart, and the
        # prompt tokens of the first tries (given as tokens: the gate knows them exactly).
        for gate, got in zip(pods, sent, strict=True):
            assert set(got.statuses) <= {200, 429}, got.statuses
            counters = await own_counters(gate)
            assert counters["slogate_offered_requests_total"] == got.first_tries
            assert counters["slogate_retried_requests_total"] == got.retries
            assert counters["slogate_offered_prompt_tokens_total"] == PROMPT_TOKENS * got.first_tries
            assert counters["slogate_offered_work_seconds_total"] == pytest.approx(cost * got.first_tries, rel=1e-9)
        first_tries = sum(s.first_tries for s in sent)
        retries = sum(s.retries for s in sent)
        assert retries == first_tries // RETRY_EVERY > 0
        admitted = sum(s.statuses.count(200) for s in sent)
        print(f"mu {mu:.3f}/s; {first_tries} first tries and {retries} retries in {LOAD_S} s; {admitted} admitted")

        # A window well inside the load: it began a second after the first try, ends before the last.
        at = ended - 1.0
        assert at - WINDOW_S >= started + 1.0
        await wait_for("the load's samples", lambda: scraped_past(prometheus, at + 1.0), prometheus)
        rho = await rho_at(prometheus, at)
        print(f"rho {rho:.3f} at {LOAD}x one pod's rate of {mu:.3f}/s")
        assert TARGET * 2 < rho <= TARGET * 3, rho  # ⌈ρ / 0.7⌉ = 3 exactly on (1.4, 2.1]
        assert replicas(rho) == 3
        # The same work over every arrival, retries included, would ask for a fourth pod.
        every_try = f"{over_window('slogate_requests_total')} / {over_window('slogate_offered_requests_total')}"
        inflated = rho * await value_at(prometheus, every_try, at)
        assert replicas(inflated) == 4, inflated

        totals = await prometheus.query(f"sum(slogate_offered_requests_total{{{MATCHERS}}})")
        assert float(totals[0]["value"][1]) == first_tries

        # No load: once a whole window has passed, ρ = 0 and the autoscaler falls to its minimum.
        quiet = ended + WINDOW_S + 2.0
        await wait_for("a window without load", lambda: scraped_past(prometheus, quiet + 1.0), prometheus)
        rho = await rho_at(prometheus, quiet)
        assert rho == 0.0
        assert replicas(rho) == MIN_REPLICAS
        for gate in pods:
            assert await gate.wait_idle()
