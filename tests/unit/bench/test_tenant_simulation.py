"""Tenants in the simulator: per-tenant counts, the gate told each request's tenant and tokens,
the share rule's effect in virtual time, the fairness measures and the report's section."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from canned_profiles import NOW, smollm2_profile
from slogate_admission import gate_machine
from slogate_admission.decision import Request
from slogate_admission.derivation import derive_thresholds
from slogate_admission.ledger import Ticket
from slogate_admission.schema import Policy, Thresholds
from slogate_bench.reports.tenant_simulation import FIGURE_LINK, tenant_simulation_section
from slogate_bench.runs import tenant_simulation
from slogate_bench.runs.tenant_simulation import fairness, jain_index, max_min_fair_shares
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.engine import simulate
from slogate_sim.fronts import Direct, Forward, FrontSpec, Gated, SlogateFront
from slogate_sim.lengths import SampledLengths, TokenLengths
from slogate_sim.routing import Routing
from slogate_sim.scenario import SimulationConfig, SimulationResult, TenantCounts, Traced, trace_of
from slogate_sim.tenant_traffic import tenant_schedule, zipf_rates
from slogate_sim.workloads import Workload, preset

SLO_S = 2.0
SERVER = ServerModel.from_profile(smollm2_profile())
CHAT = preset("chat")
# Prompts of 100-300 tokens and 8 tokens out: slots free fast, so the prefill queue is what a
# flood fills, the resource the share rule divides.
PREFILL_HEAVY = Workload(TokenLengths(100, 300), TokenLengths.fixed(8), name="prefill-heavy")
COUNTED = ("offered", "admitted", "rejected", "timed_out", "completed", "completed_within_slo")


def thresholds(tenants: dict[str, object] | None = None) -> Thresholds:
    raw: dict[str, object] = {"slo": {"ttftSeconds": SLO_S}}
    if tenants is not None:
        raw["tenants"] = tenants
    return derive_thresholds(Policy.model_validate(raw), smollm2_profile(), derived_at=NOW)


def mu(workload: Workload) -> float:
    return capacity_rps(SERVER, workload, thresholds().concurrency_cap)


def run(
    trace: tuple[Traced, ...], front: FrontSpec, duration_s: float, workload: Workload = CHAT, **config: Any
) -> SimulationResult:
    return simulate(
        SimulationConfig(
            server=SERVER,
            workload=workload,
            arrival_rate_rps=len(trace) / duration_s,
            duration_s=duration_s,
            ttft_slo_s=SLO_S,
            front=front,
            trace=trace,
            **config,
        )
    )


def noisy_trace(workload: Workload, duration_s: float, seed: int = 1) -> tuple[Traced, ...]:
    capacity = mu(workload)
    return trace_of(tenant_schedule({"A": 4 * capacity, "B": 0.25 * capacity}, duration_s, workload, seed=seed))


# ---------------------------------------------------------------------- the simulator's counts


def test_a_trace_keeps_each_arrivals_tenant() -> None:
    arrivals = tenant_schedule({"a": 2.0, "b": 1.0}, 20.0, CHAT, seed=3)
    trace = trace_of(arrivals)
    assert [t.tenant for t in trace] == [a.tenant for a in arrivals]
    assert {t.tenant for t in trace} == {"a", "b"}
    assert trace_of([(1.0, 5, 6, "x"), (0.5, 1, 2)]) == (Traced(0.5, 1, 2), Traced(1.0, 5, 6, "x"))


@pytest.mark.parametrize(
    ("front", "config"),
    [
        (Gated(thresholds({})), {}),
        (Gated(thresholds()), {}),
        (Direct(), {}),
        # Two pods, a refusal retried on the other: counted once, under its tenant.
        (Gated(thresholds({})), {"replicas": 2, "routing": Routing("retry-429", 2)}),
    ],
)
def test_per_tenant_counts_add_up_to_the_runs(front: FrontSpec, config: dict[str, Any]) -> None:
    duration = 120.0
    trace = trace_of(tenant_schedule(zipf_rates(3 * mu(CHAT), 12), duration, CHAT, seed=4))
    # A few requests naming no tenant, counted under None.
    trace = tuple(dataclasses.replace(t, tenant=None) if i % 17 == 0 else t for i, t in enumerate(trace))
    result = run(trace, front, duration, dataclasses.replace(CHAT, client_timeout_s=1.5), **config)
    assert result.tenants is not None
    assert None in result.tenants
    for name in COUNTED:
        assert sum(getattr(c, name) for c in result.tenants.values()) == getattr(result, name), name
    # The run overloads: a gate refuses, an ungated server's clients give up.
    assert (result.timed_out if isinstance(front, Direct) else result.rejected) > 0
    for tenant, counts in result.tenants.items():
        offered = sum(t.tenant == tenant for t in trace)
        assert counts.offered == offered
        assert counts.share_rejected == counts.rejected_by_reason.get("tenant_share", 0) <= counts.rejected
    shares = sum(c.share_rejected for c in result.tenants.values())
    uses_shares = isinstance(front, Gated) and front.thresholds.tenants is not None
    assert (shares > 0) == uses_shares


def test_without_tenant_names_there_are_no_tenant_counts() -> None:
    trace = trace_of(tenant_schedule({"a": 1.0}, 30.0, CHAT, seed=2))
    nameless = tuple(dataclasses.replace(t, tenant=None) for t in trace)
    assert run(nameless, Gated(thresholds({})), 30.0).tenants is None
    assert run(trace, Gated(thresholds({})), 30.0).tenants is not None


def test_without_a_tenant_policy_the_gate_judges_as_if_no_tenant_were_named() -> None:
    duration = 300.0
    trace = noisy_trace(CHAT, duration)
    nameless = tuple(dataclasses.replace(t, tenant=None) for t in trace)
    named = run(trace, Gated(thresholds()), duration)
    plain = run(nameless, Gated(thresholds()), duration)
    assert named.tenants is not None
    assert plain.tenants is None
    assert named.as_dict() == plain.as_dict()  # every count, rate and quantile
    assert named.rejected > 0
    assert sum(c.share_rejected for c in named.tenants.values()) == 0


def test_the_gate_is_told_each_tenant_and_what_each_request_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    arrived: list[str | None] = []
    released: list[int | None] = []
    original_arrive, original_release = gate_machine.GateMachine.arrive, gate_machine.GateMachine.release

    def arrive(self: gate_machine.GateMachine, request: Any, now: float) -> Any:
        arrived.append(request.tenant)
        return original_arrive(self, request, now)

    def release(self: gate_machine.GateMachine, ticket: Ticket, now: float, output_tokens: int | None = None) -> Any:
        released.append(output_tokens)
        return original_release(self, ticket, now, output_tokens)

    monkeypatch.setattr(gate_machine.GateMachine, "arrive", arrive)
    monkeypatch.setattr(gate_machine.GateMachine, "release", release)
    duration = 120.0
    trace = noisy_trace(CHAT, duration)
    # Clients that leave after half a second: some admitted requests end before their first token.
    result = run(trace, Gated(thresholds({})), duration, dataclasses.replace(CHAT, client_timeout_s=0.5))
    assert arrived == [t.tenant for t in trace]
    assert result.timed_out > 0
    assert len(released) == result.admitted
    assert isinstance(CHAT.output_tokens, SampledLengths)
    # A completed request reports its whole n_out (clients read to the end); one whose client
    # left before its first token, none.
    assert {n for n in released if n != 0} <= set(CHAT.output_tokens.samples)
    assert sum(n != 0 for n in released) == result.completed
    assert released.count(0) == result.admitted - result.completed > 0


def test_the_gate_is_told_each_requests_class_and_a_slot_kept_for_a_class_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trace's classes reach the gate; with 2 of the 4 slots kept for class b, the flood in
    class a never holds more than 2 streams, and b's requests get the rest."""
    arrived: list[str | None] = []
    most = {"a": 0}
    original = gate_machine.GateMachine.arrive

    def arrive(self: gate_machine.GateMachine, request: Any, now: float) -> Any:
        arrived.append(request.class_name)
        verdict = original(self, request, now)
        in_a = sum(t.class_name == "a" for t in self.ledger._tickets)
        most["a"] = max(most["a"], in_a)
        return verdict

    monkeypatch.setattr(gate_machine.GateMachine, "arrive", arrive)
    duration = 120.0
    classes = {"A": "a", "B": "b"}
    trace = tuple(dataclasses.replace(t, class_name=classes[str(t.tenant)]) for t in noisy_trace(CHAT, duration))
    policy = Policy.model_validate(
        {"slo": {"ttftSeconds": SLO_S}, "classes": [{"name": "b", "reservedSlots": 2}, {"name": "a"}]}
    )
    kept = derive_thresholds(policy, smollm2_profile(), derived_at=NOW)
    assert [c.concurrency_cap for c in kept.classes] == [4, 2]
    result = run(trace, Gated(kept), duration, CHAT)
    assert arrived == [t.class_name for t in trace]
    assert result.tenants is not None
    assert result.tenants["A"].rejected > 0
    assert most["a"] == 2  # A's class holds at most its cap of streams, and reaches it
    assert result.tenants["B"].completed_within_slo > 0


def test_a_slogate_front_corrects_the_tenants_charge_to_the_tokens_generated() -> None:
    front = SlogateFront(thresholds({"outputWeight": 2}))
    answer = front.arrive("r", Request(100, 50, tenant="a"), 0.0)
    assert isinstance(answer, Forward)
    booked = answer.output_tokens
    tenants = front.machine.tenants
    assert tenants is not None
    account = tenants.account("a", 0.0)
    assert tenants.served_tokens(account, 0.0) == pytest.approx(100 + 2 * booked)
    front.first_token("r", 0.5)
    front.ended("r", 1.0, output_tokens=10)
    # The charge decays (half-life 60 s) and the correction is added at the end.
    expected = (100 + 2 * booked) * 2 ** (-1.0 / 60.0) + 2 * (10 - booked)
    assert tenants.served_tokens(account, 1.0) == pytest.approx(expected)


def test_with_the_policy_the_light_tenant_keeps_more_of_its_goodput() -> None:
    # The noisy neighbour in virtual time, where the prefill queue is what A floods.
    duration = 120.0
    trace = noisy_trace(PREFILL_HEAVY, duration)
    without = run(trace, Gated(thresholds()), duration, PREFILL_HEAVY)
    fair = run(trace, Gated(thresholds({})), duration, PREFILL_HEAVY)
    alone = run(tuple(t for t in trace if t.tenant == "B"), Gated(thresholds()), duration, PREFILL_HEAVY)
    assert without.tenants is not None
    assert fair.tenants is not None
    assert alone.tenants is not None
    b_without, b_fair, b_alone = without.tenants["B"], fair.tenants["B"], alone.tenants["B"]
    assert b_without.offered == b_fair.offered == b_alone.offered > 20
    assert b_without.completed_within_slo < b_fair.completed_within_slo <= b_alone.completed_within_slo
    assert fair.tenants["A"].share_rejected > 0


# ---------------------------------------------------------------------- fairness


def test_water_filling_gives_small_demands_in_full_and_the_rest_the_level() -> None:
    shares, level = max_min_fair_shares([3.0, 1.0, 10.0, 2.0], 10.0)
    assert shares == [3.0, 1.0, 4.0, 2.0]
    assert level == 4.0
    assert max_min_fair_shares([3.0, 3.0], 4.0) == ([2.0, 2.0], 2.0)
    shares, level = max_min_fair_shares([1.0, 2.0], 5.0)  # every demand fits
    assert (shares, level) == ([1.0, 2.0], math.inf)
    assert max_min_fair_shares([], 1.0) == ([], math.inf)
    with pytest.raises(ValueError, match=">= 0"):
        max_min_fair_shares([1.0, -1.0], 1.0)


def test_jains_index_on_hand_computed_cases() -> None:
    assert jain_index([1.0, 1.0, 1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == 0.25
    assert jain_index([1.0, 2.0]) == pytest.approx(9 / 10)
    with pytest.raises(ValueError, match="at least one"):
        jain_index([])


def test_fairness_of_a_run_on_a_hand_computed_case() -> None:
    # Goodput 2 in all: 0.5 fits whole, then 1.5 for two tenants is a level of 0.75.
    measures = fairness([0.5, 1.0, 4.0, 0.0], [0.5, 0.25, 1.25, 0.0])
    assert measures["tenants"] == 3  # one sent nothing: left out
    assert measures["fair_level_rps"] == pytest.approx(0.75)
    # goodput / fair share: 1, 1/3, 5/3: two of three reach 90%.
    assert measures["satisfied_share"] == pytest.approx(2 / 3)
    assert measures["jain"] == pytest.approx(27 / 35)
    assert measures["light_tenants"] == 1
    assert measures["light_goodput_ratio"] == pytest.approx(1.0)


# ---------------------------------------------------------------------- the report


def canned_raw(b_with: int, total_with: float) -> dict[str, Any]:
    """Two seeds; B sends 100 and alone gets 90 within the SLO; the rest as given."""

    def counts(within: int, admitted: int, share: int = 0) -> dict[str, Any]:
        return dataclasses.asdict(
            TenantCounts(
                offered=100,
                admitted=admitted,
                rejected=100 - admitted,
                share_rejected=share,
                rejected_by_reason={"concurrency": 100 - admitted - share, "tenant_share": share},
                completed=admitted,
                completed_within_slo=within,
            )
        )

    noisy = []
    for seed in (1, 2):
        noisy += [
            {"variant": "alone", "seed": seed, "goodput_rps": 0.9, "tenants": {"B": counts(90, 90)}},
            {"variant": "without", "seed": seed, "goodput_rps": 1.0,
             "tenants": {"A": counts(50, 60), "B": counts(30, 30)}},
            {"variant": "with", "seed": seed, "goodput_rps": total_with,
             "tenants": {"A": counts(40, 50, 5), "B": counts(b_with, b_with, 1)}},
        ]  # fmt: skip
    fair = {"tenants": 2, "fair_level_rps": 0.5, "satisfied_share": 0.5, "jain": 0.8, "light_tenants": 1,
            "light_goodput_ratio": 0.9}  # fmt: skip
    zipf = [
        {"load": 2.0, "variant": v, "seed": s, "offered": 200, "goodput_rps": g, "rejected": 20, "share_rejected": 4,
         "fairness": fair, "per_tenant": {"offered": [150, 50], "completed_within_slo": [100, 45],
                                          "fair_share_rps": [0.5, 0.45]}}
        for v, g in (("without", 1.0), ("with", 0.98)) for s in (1, 2)
    ]  # fmt: skip
    return {
        "environment": {"date": "2026-12-03 12:00 UTC", "cpu": "a CPU, 2 cores"},
        "wall_s": 12.3,
        "measured_started_at": "2026-12-03T18:06:22+00:00",
        "workload": "chat",
        "slo_s": 2.0,
        "mu_rps": 0.857,
        "concurrency_cap": 4,
        "client_timeout_s": 10.0,
        "tenant_policy": {"halfLifeSeconds": 60.0, "maxTracked": 64, "outputWeight": 1.69, "outputWeightMeasured": True},
        "seeds": [1, 2],
        "noisy": {"duration_s": 100.0, "rates_x_mu": {"A": 4.0, "B": 0.25}, "runs": noisy},
        "zipf": {"duration_s": 100.0, "tenants": 2, "exponent": 1.0, "loads": [2.0], "satisfied_at": 0.9,
                 "runs": zipf},
    }  # fmt: skip


def test_the_section_renders_the_json_and_judges_the_goals() -> None:
    lines = tenant_simulation_section(canned_raw(b_with=85, total_with=0.97))
    text = "\n".join(lines)
    assert lines[0].startswith("### Simulated")
    assert f"]({FIGURE_LINK})" in text
    rows = [line for line in lines if line.startswith("| ") and not line.startswith(("| run", "| load", "| ---"))]
    assert len(rows) == 3 + 2  # alone, without, with; the Zipf load without and with
    with_row = next(r for r in rows if "spec.tenants" in r)
    assert "| 94.4% |" in with_row  # 85 of B alone's 90
    assert "B's goodput with the policy, of B alone: 94.4% (goal ≥ 90%: met)" in text
    assert "total goodput with the policy, of without: 97.0% (goal ≥ 95%: met)" in text
    assert "without the policy B keeps 33.3% of its goodput alone (it collapses below 50%: yes)" in text
    assert "`concurrency` 140" in text  # B's refusals with A beside it, without: 70 per seed
    assert "| 2x | with | 0.980/s | 98.0% |" in text

    missed = "\n".join(tenant_simulation_section(canned_raw(b_with=60, total_with=0.9)))
    assert "(goal ≥ 90%: not met)" in missed
    assert "(goal ≥ 95%: not met)" in missed


def test_the_bench_writes_a_json_that_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole command on the measured pod, shrunk: one seed, short runs, ten tenants.
    monkeypatch.setattr(tenant_simulation, "SEEDS", (1,))
    monkeypatch.setattr(tenant_simulation, "NOISY_DURATION_S", 120.0)
    monkeypatch.setattr(tenant_simulation, "ZIPF_DURATION_S", 120.0)
    monkeypatch.setattr(tenant_simulation, "ZIPF_TENANTS", 10)
    out, figure = tmp_path / "t.json", tmp_path / "t.png"
    monkeypatch.setattr("sys.argv", ["x", "--out", str(out), "--figure", str(figure)])
    tenant_simulation.main()
    raw = json.loads(out.read_text())
    assert figure.stat().st_size > 0
    assert [r["variant"] for r in raw["noisy"]["runs"]] == ["alone", "without", "with", "b_first", "b_kept_1",
                                                             "b_kept_2"]  # fmt: skip
    assert len(raw["zipf"]["runs"]) == len(tenant_simulation.ZIPF_LOADS) * 2
    for r in raw["zipf"]["runs"]:
        assert sum(r["per_tenant"]["offered"]) == r["offered"]
        assert sum(r["per_tenant"]["rejected"]) == r["rejected"]
        assert sum(r["per_tenant"]["fair_share_rps"]) == pytest.approx(r["goodput_rps"])
    assert tenant_simulation_section(raw)[0].startswith("### Simulated")
