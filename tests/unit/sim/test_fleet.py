"""The fleet simulator: Erlang B for random and least-pressure routing, conservation, what routing can
and cannot change, the router's pieces, and the CLI's fleet flags."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from canned_profiles import smollm2_profile
from chat_fleet import CHAT, SERVER, SLO_S, thresholds
from slogate_admission.queueing import erlang_b
from slogate_cli.main import main
from slogate_sim.engine import _Simulation, simulate
from slogate_sim.fronts import CountCapped, Direct, Gated, SlogateFront
from slogate_sim.lengths import TokenLengths
from slogate_sim.limits import CountCap
from slogate_sim.routing import ROUTINGS, LeastKey, Router, Routing
from slogate_sim.scenario import SimulationConfig, SimulationResult, config_for_load
from slogate_sim.workloads import Workload


def fleet(routing: str, *, replicas: int = 6, load: float = 1.0, duration_s: float = 900.0, seed: int = 3,
          front: Gated | CountCapped | Direct | None = None) -> SimulationResult:  # fmt: skip
    t = thresholds()
    config = config_for_load(
        SERVER, CHAT, load=load, duration_s=duration_s, ttft_slo_s=SLO_S, front=front or Gated(t),
        concurrency=t.concurrency_cap, seed=seed, replicas=replicas, routing=Routing.parse(routing),
    )  # fmt: skip
    return simulate(config)


# --------------------------------------------------------------------------- Erlang B


def loss_fleet(routing: str, replicas: int, slots: int, erlangs_per_pod: float, arrivals: int) -> SimulationConfig:
    """Pods of ``slots`` parallel Exp(1) slots, a count cap of ``slots`` and no queue."""
    rate = erlangs_per_pod * replicas  # λ · E[S] with E[S] = 1 s
    workload = Workload(
        TokenLengths.fixed(1), TokenLengths.fixed(1), client_timeout_s=math.inf,
        service="exponential", exponential_mean_s=1.0,
    )  # fmt: skip
    return SimulationConfig(
        server=dataclasses.replace(SERVER, slots=slots),
        workload=workload,
        arrival_rate_rps=rate,
        duration_s=arrivals / rate,
        ttft_slo_s=math.inf,
        front=CountCapped(CountCap(slots, 0)),
        seed=11,
        replicas=replicas,
        routing=Routing.parse(routing),
    )


@pytest.mark.parametrize(
    ("replicas", "slots", "erlangs_per_pod"),
    [(10, 4, 3.0), (8, 2, 1.0), (50, 4, 3.5)],
)
def test_random_routing_blocks_as_erlang_b_of_one_pod_at_its_share(
    replicas: int, slots: int, erlangs_per_pod: float
) -> None:
    # Random routing splits Poisson arrivals into N Poisson streams of a/N: each pod is an
    # M/M/C/C loss system. The issue asks for 2 points of a percent; we hold half a point.
    result = simulate(loss_fleet("random", replicas, slots, erlangs_per_pod, 150_000))
    assert result.offered >= 100_000
    blocked = result.rejected / result.offered
    assert blocked == pytest.approx(erlang_b(slots, erlangs_per_pod), abs=0.005)
    assert result.tries == result.offered
    assert result.completed == result.offered - result.rejected


@pytest.mark.parametrize(
    ("replicas", "slots", "erlangs_per_pod"),
    [(10, 4, 3.0), (8, 2, 1.5), (50, 4, 3.8)],
)
def test_least_pressure_routing_blocks_as_erlang_b_of_the_whole_fleet(
    replicas: int, slots: int, erlangs_per_pod: float
) -> None:
    # One gate over all pods: an arrival is refused only when every slot of the fleet is busy.
    result = simulate(loss_fleet("least-pressure", replicas, slots, erlangs_per_pod, 150_000))
    assert result.offered >= 100_000
    blocked = result.rejected / result.offered
    assert blocked == pytest.approx(erlang_b(slots * replicas, erlangs_per_pod * replicas), abs=0.005)
    # Pooling: the fleet behind one gate blocks less than any of its pods alone would.
    assert blocked < erlang_b(slots, erlangs_per_pod)


def test_retry_on_a_refusal_lies_between_random_and_least_pressure() -> None:
    random_, retry, least_pressure = (
        simulate(loss_fleet(r, 10, 4, 3.0, 100_000)) for r in ("random", "retry-429:3", "least-pressure")
    )
    share = [r.rejected / r.offered for r in (random_, retry, least_pressure)]
    assert share[0] > share[1] > share[2]
    assert retry.offered < retry.tries <= 3 * retry.offered


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("routing", ["random", "round-robin", "least-requests", "retry-429:2", "least-pressure"])
def test_every_request_ends_once_whatever_the_routing(routing: str) -> None:
    # Overload, patient-but-finite clients, deferral: every offered request completes, is
    # refused after its tries, or its client leaves; never two of these, never none.
    result = fleet(routing, load=3.0, duration_s=300.0)
    assert result.offered == result.completed + result.rejected + result.timed_out
    assert result.admitted <= result.offered
    assert result.completed_within_slo <= result.completed
    assert result.replicas == 6
    assert result.routing == routing
    tries = Routing.parse(routing).tries
    assert result.offered <= result.tries <= tries * result.offered
    assert (result.tries > result.offered) == (tries > 1)


@pytest.mark.parametrize("routing", ["least-requests", "retry-429:3", "least-pressure"])
def test_at_the_end_every_pod_and_gate_is_empty(routing: str) -> None:
    # The books a router reads (a pod's requests from the balancer, a gate's ledger and
    # queue) return to zero once every request has left: nothing leaks under overload.
    t = thresholds()
    config = config_for_load(SERVER, CHAT, load=2.5, duration_s=120.0, ttft_slo_s=SLO_S, front=Gated(t),
                             concurrency=t.concurrency_cap, seed=2, replicas=40, routing=Routing.parse(routing))  # fmt: skip
    run = _Simulation(config)
    result = run.run()
    assert result.rejected > 0
    assert result.completed > 0
    assert run.tally.inside == 0
    for pod in run.pods:
        assert pod.conns == 0
        assert isinstance(pod.front, SlogateFront)
        assert pod.front.machine.is_idle()
        assert pod.free_slots == pod.server.slots


def test_one_replica_is_the_single_pod_simulator_whatever_the_routing() -> None:
    results = {r: fleet(r, replicas=1, load=2.0, duration_s=600.0) for r in ("random", "round-robin", "least-pressure")}
    base = dataclasses.asdict(results["random"])
    for result in results.values():
        assert {k: v for k, v in dataclasses.asdict(result).items() if k != "routing"} == {
            k: v for k, v in base.items() if k != "routing"
        }


def test_routing_changes_where_requests_go_not_which_arrive() -> None:
    results = [fleet(r, load=1.0) for r in ROUTINGS]
    assert len({r.offered for r in results}) == 1
    assert len({r.arrival_rate_rps for r in results}) == 1


def test_at_the_fleets_capacity_the_orderings_of_routing_hold() -> None:
    # Same arrivals; the gate protects every pod, so routing decides how much is admitted.
    by = {
        r: fleet(r, replicas=10, load=1.0, duration_s=1200.0)
        for r in ("random", "least-requests", "retry-429:3", "least-pressure")
    }
    goodput = {r: res.goodput_rps for r, res in by.items()}
    assert goodput["least-pressure"] >= max(goodput.values())
    assert goodput["least-requests"] > goodput["random"]
    assert goodput["retry-429:3"] > goodput["random"]
    # The gate's promise does not depend on routing: admitted requests meet the SLO.
    for res in by.values():
        assert res.completed_within_slo >= 0.99 * res.completed


def test_pods_can_differ_and_are_cycled_over_the_replicas() -> None:
    # Pod 0 is llama-server alone, pod 1 refuses everything beyond one stream: with round
    # robin, only pod 1's share of the arrivals can be refused.
    t = thresholds()
    pods = ((SERVER, Direct()), (SERVER, CountCapped(CountCap(1, 0))))
    config = config_for_load(SERVER, CHAT, load=2.0, duration_s=300.0, ttft_slo_s=SLO_S, front=Direct(),
                             concurrency=t.concurrency_cap, seed=5, replicas=4,
                             routing=Routing("round-robin"))  # fmt: skip
    alone = simulate(config)
    mixed = simulate(dataclasses.replace(config, pods=pods))
    assert alone.rejected == 0
    assert 0 < mixed.rejected <= mixed.offered // 2 + 1


# --------------------------------------------------------------------------- the router


def test_routings_parse_and_refuse_nonsense() -> None:
    assert Routing.parse("retry-429") == Routing("retry-429", 3)
    assert Routing.parse("retry-429:2") == Routing("retry-429", 2)
    assert str(Routing.parse("retry-429:2")) == "retry-429:2"
    assert str(Routing.parse("least-requests")) == "least-requests"
    for bad, message in [
        ("fastest", "unknown routing"),
        ("random:2", "only retry-429 takes"),
        ("retry-429:two", "whole number"),
        ("retry-429:0", "tries must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            Routing.parse(bad)


def test_least_key_finds_the_least_and_goes_round_the_ties() -> None:
    least = LeastKey(4)
    assert least.least() == 0  # all 0: the first pod
    for seq, (pod, key) in enumerate([(0, 2.0), (1, 1.0), (2, 1.0), (3, 5.0)], start=10):
        least.update(pod, key, seq)
    assert least.least() == 1  # 1 and 2 tie; 1 was touched longer ago
    least.update(1, 1.0, 20)  # touched, its key unchanged (it refused a request): behind 2
    assert least.least() == 2
    least.update(2, 1.0, 21)
    assert least.least() == 1
    least.update(1, 3.0, 22)
    assert least.least() == 2
    for seq in range(21, 2000):  # many stale entries: the heap is rebuilt, answers hold
        least.update(2, float(seq % 7) + 10.0, seq)
    assert least.least() == 0


def test_retry_never_tries_a_pod_twice_nor_more_than_its_tries() -> None:
    router = Router(Routing("retry-429", 3), pods=3, seed=1)
    for _ in range(200):
        tried = [router.first()]
        while (pod := router.next(tried)) is not None:
            assert pod not in tried
            tried.append(pod)
        assert len(tried) == 3
    two_pods = Router(Routing("retry-429", 5), pods=2, seed=1)
    tried = [two_pods.first()]
    while (pod := two_pods.next(tried)) is not None:
        tried.append(pod)
    assert sorted(tried) == [0, 1]


# --------------------------------------------------------------------------- the CLI


def test_the_cli_simulates_a_fleet_and_its_json_rows_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(smollm2_profile().model_dump_json(by_alias=True))
    argv = ["simulate", "--profile", str(profile), "--slo-ttft", "2", "--gate", "slogate,count-cap",
            "--replicas", "5", "--routing", "random,retry-429:2,least-pressure", "--load", "1x,2x",
            "--duration", "120", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replicas"] == 5
    rows = {(r["gate"], r["routing"], r["load"]) for r in report["runs"]}
    assert len(rows) == len(report["runs"]) == 2 * 3 * 2
    assert all(r["replicas"] == 5 for r in report["runs"])
    # Without --json, a table with the routing and tries per request.
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "5 pods" in out
    assert "retry-429:2" in out
    assert "tries/req" in out


def test_the_cli_reports_erlang_b_beside_an_exponential_loss_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(smollm2_profile().model_dump_json(by_alias=True))
    argv = ["simulate", "--profile", str(profile), "--slo-ttft", "2", "--service", "exponential", "--slots", "4",
            "--gate", "count-cap", "--count-cap-concurrency", "4", "--count-cap-queue", "0",
            "--replicas", "10", "--routing", "random,least-pressure,least-requests", "--load", "0.75",
            "--duration", "2000", "--json"]  # fmt: skip
    assert main(argv) == 0
    runs = {r["routing"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert runs["random"]["erlang_b_blocking"] == pytest.approx(erlang_b(4, 3.0))
    assert runs["least-pressure"]["erlang_b_blocking"] == pytest.approx(erlang_b(40, 30.0))
    assert runs["least-requests"]["erlang_b_blocking"] is None  # no closed form for it here
    for r in ("random", "least-pressure"):
        assert runs[r]["rejected"] / runs[r]["offered"] == pytest.approx(runs[r]["erlang_b_blocking"], abs=0.01)
