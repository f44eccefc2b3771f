"""The simulator: closed forms (M/M/1, Little's law, μ), the gate's promises, collapse, the CLI."""

import dataclasses
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from canned_profiles import smollm2_profile
from slogate_admission import gate_machine
from slogate_admission.decision import Decision, decide
from slogate_admission.derivation import derive_thresholds, longest_prompt_within
from slogate_admission.queueing import mm1_time_in_system
from slogate_admission.schema import Policy, Thresholds
from slogate_cli.arguments import OneLineParser
from slogate_cli.main import build_parser, main
from slogate_cli.simulate_command import add_parser
from slogate_cli.simulate_table import table
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.engine import simulate
from slogate_sim.fronts import Direct, Gated, line_up
from slogate_sim.lengths import TokenLengths
from slogate_sim.limits import CountCap
from slogate_sim.scenario import GateKind, SimulationResult, config_for_load, mm1_config
from slogate_sim.workloads import CHAT_OUTPUTS, CHAT_PROMPTS, Workload, preset

SLO_S = 2.0
SERVER = ServerModel.from_profile(smollm2_profile())
# Chat-like traffic on the bundled model: prompts of 100..400 tokens, replies of 32..128.
CHAT = Workload(TokenLengths(100, 400), TokenLengths(32, 128))


def thresholds(**policy: object) -> Thresholds:
    raw: dict[str, object] = {"slo": {"ttftSeconds": SLO_S}, **policy}
    return derive_thresholds(Policy.model_validate(raw), smollm2_profile(), derived_at=datetime(2026, 1, 1, tzinfo=UTC))


def run(gate: GateKind, load: float, *, workload: Workload = CHAT, duration_s: float = 3600.0, seed: int = 7,
        policy: Thresholds | None = None, slo_s: float = SLO_S) -> SimulationResult:  # fmt: skip
    t = policy or thresholds()
    config = config_for_load(
        SERVER, workload, load=load, duration_s=duration_s, ttft_slo_s=slo_s,
        front=line_up(t, CountCap(4, 8))[gate], concurrency=t.concurrency_cap, seed=seed,
    )  # fmt: skip
    return simulate(config)


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize(
    ("rho", "customers"),
    [(0.5, 100_000), (0.8, 200_000), (0.9, 1_000_000)],
)
def test_mm1_mean_time_in_system_within_5_percent(rho: float, customers: int) -> None:
    # Exp(1/μ) service, one slot, no gate, patient clients. The sample mean at ρ = 0.9 is
    # noisy (relative sd ≈ 19 / √n, the busy periods are long), hence a million customers.
    mu = 1.0
    result = simulate(mm1_config(rho * mu, mu, duration_s=customers / (rho * mu), seed=2026))
    closed = mm1_time_in_system(rho * mu, mu)  # 1 / (μ − λ)
    assert result.offered == pytest.approx(customers, rel=0.01)
    assert result.completed == result.offered  # nobody gives up, nobody is turned away
    assert result.mean_time_in_system_s is not None
    assert result.mean_time_in_system_s == pytest.approx(closed, rel=0.05)
    assert result.utilization == pytest.approx(rho, rel=0.01)  # the server is busy a fraction ρ


@pytest.mark.parametrize(("gate", "load"), [("direct", 0.8), ("direct", 4.0), ("slogate", 2.0), ("count-cap", 2.0)])
def test_littles_law_l_equals_lambda_w(gate: GateKind, load: float) -> None:
    # L is integrated over time, W is averaged over requests: two independent bookkeepings.
    result = run(gate, load)
    assert result.mean_time_in_system_s is not None
    lam = result.entered / result.duration_s
    assert result.mean_in_system == pytest.approx(lam * result.mean_time_in_system_s, rel=0.03)


def test_capacity_is_the_derived_mu_and_the_simulated_server_delivers_it() -> None:
    t = thresholds()
    reference = Workload(
        TokenLengths.fixed(t.reference_prompt_tokens), TokenLengths.fixed(t.reference_output_tokens),
        client_timeout_s=math.inf,
    )  # fmt: skip
    mu = capacity_rps(SERVER, reference, t.concurrency_cap)
    assert mu == pytest.approx(t.throughput_rps, rel=1e-12)
    # Overloaded with patient clients, every slot stays busy: completions per second = μ.
    for load in (1.5, 3.0):
        result = run("direct", load, workload=reference, policy=t)
        assert result.throughput_rps == pytest.approx(mu, rel=0.02)
        assert result.utilization > 0.99


# --------------------------------------------------------------------------- the gate's promises


def test_slogate_keeps_admitted_requests_within_the_slo_and_goodput_up_under_overload() -> None:
    at = {load: run("slogate", load) for load in (1.0, 2.0, 4.0)}
    for load in (2.0, 4.0):
        r = at[load]
        assert r.rejected > 0.3 * r.offered  # it really was overloaded and shed
        assert r.completed_within_slo >= 0.99 * r.admitted
        assert r.timed_out == 0
        assert r.goodput_rps >= 0.9 * at[1.0].goodput_rps
    assert at[4.0].goodput_rps >= 0.8 * at[4.0].capacity_rps  # the server does useful work at capacity


def test_without_a_gate_the_server_collapses_at_4x() -> None:
    none, gated = run("direct", 4.0), run("slogate", 4.0)
    assert none.utilization > 0.99  # the machine is 100% busy...
    assert none.timed_out > 0.9 * none.offered  # ...on prompts whose clients have already hung up
    assert none.goodput_rps < 0.05 * none.capacity_rps
    assert gated.goodput_rps > 10 * none.goodput_rps
    assert none.offered == gated.offered  # the same arrivals for both


def test_a_count_cap_with_a_queue_also_collapses() -> None:
    capped = run("count-cap", 4.0)
    assert capped.rejected > 0
    assert capped.goodput_rps < 0.1 * capped.capacity_rps


def test_deferral_waits_for_capacity_and_still_meets_the_slo() -> None:
    # A loose SLO and two slots: short prompts are held back by the concurrency cap, not the
    # TTFT budget, so the gate defers them until a stream ends (or rejects when the wait runs out).
    policy = thresholds(slo={"ttftSeconds": 8.0}, concurrency={"max": 2}, deferral={"maxWaitSeconds": 5})
    short = Workload(TokenLengths(50, 150), TokenLengths(64, 256))
    r = run("slogate", 2.0, workload=short, policy=policy, slo_s=8.0)
    assert r.deferred > 0.2 * r.offered
    admitted_at_once = r.entered - r.deferred
    assert r.admitted > admitted_at_once  # some deferred requests were admitted after waiting
    assert r.rejected > 0
    assert r.completed_within_slo == r.admitted
    assert r.ttft_p99_s is not None
    assert r.ttft_p99_s <= 8.0


def test_the_gate_is_the_core_predicate(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    def spy(*args: Any, **kwargs: Any) -> Decision:
        decision = decide(*args, **kwargs)
        calls.append(decision.predicted_ttft_s)
        return decision

    # The simulator drives the core's GateMachine (the sidecar's own): its decisions are decide's.
    monkeypatch.setattr(gate_machine, "decide", spy)
    r = run("slogate", 2.0, duration_s=600.0)
    assert len(calls) >= r.offered  # every arrival was judged by decide (deferrals more than once)


# --------------------------------------------------------------------------- determinism and input checks


def test_same_seed_same_result_and_another_seed_differs() -> None:
    first = run("slogate", 2.0, duration_s=900.0, seed=11)
    assert run("slogate", 2.0, duration_s=900.0, seed=11) == first
    assert run("slogate", 2.0, duration_s=900.0, seed=12) != first


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"arrival_rate_rps": 0.0}, "arrival_rate_rps"),
        ({"workload": Workload(TokenLengths.fixed(2000), TokenLengths.fixed(100))}, "beyond one slot"),
    ],
)
def test_bad_configurations_are_refused(change: dict[str, object], fragment: str) -> None:
    base = config_for_load(SERVER, CHAT, load=1.0, duration_s=10.0, ttft_slo_s=SLO_S, front=Gated(thresholds()))
    with pytest.raises(ValueError, match=fragment):
        dataclasses.replace(base, **change)  # type: ignore[arg-type]


def test_token_lengths_reject_an_empty_range() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        TokenLengths(5, 4)


def test_the_ungated_server_queue_is_unbounded_and_abandoned_requests_cost_nothing_there() -> None:
    config = config_for_load(SERVER, CHAT, load=4.0, duration_s=600.0, ttft_slo_s=SLO_S, front=Direct(), seed=3)
    r = simulate(config)
    assert r.rejected == 0
    assert r.admitted == r.offered
    assert r.completed + r.timed_out == r.offered  # everyone leaves one way or the other


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(smollm2_profile().model_dump_json(by_alias=True))
    return path


def cli(*argv: str) -> int:
    return main(["simulate", *argv])


def test_cli_json_compares_gates_on_the_same_arrivals(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(
        "--profile", str(profile_file), "--slo-ttft", "2", "--load", "1x,4", "--gate", "direct,slogate",
        "--duration", "600", "--seed", "3", "--prompt-tokens", "100-400", "--output-tokens", "32-128", "--json",
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["ttft_slo_s"] == 2.0
    runs = {(r["gate"], r["load"]): r for r in report["runs"]}
    assert set(runs) == {("direct", 1.0), ("direct", 4.0), ("slogate", 1.0), ("slogate", 4.0)}
    assert runs["direct", 4.0]["offered"] == runs["slogate", 4.0]["offered"]
    assert runs["slogate", 4.0]["goodput_rps"] > runs["direct", 4.0]["goodput_rps"]
    assert runs["direct", 1.0]["arrival_rate_rps"] == pytest.approx(report["capacity_rps"])


def test_cli_table(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(
        "--profile", str(profile_file), "--slo-ttft", "2", "--load", "2x", "--gate", "count-cap", "--duration", "300"
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "count-cap" in out
    assert "goodput" in out
    assert "2x" in out


def test_the_count_cap_is_sized_as_the_benchmarks_size_it_unless_given(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its queue is floor(SLO · μ) by default (``fair_count_cap``), not a fixed 8: the strawman
    that made the count cap look hopeless (0.002 vs 1.056 req/s at 2x in issue 29's walkthrough)."""
    argv = ["--profile", str(profile_file), "--slo-ttft", "2", "--load", "2x", "--gate", "count-cap,slogate"]
    assert cli(*argv, "--duration", "600", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    mu = report["capacity_rps"]
    assert report["count_cap"] == {"concurrency": report["concurrency_cap"], "queue": math.floor(2 * mu)}
    goodput = {r["gate"]: r["goodput_rps"] for r in report["runs"]}
    assert goodput["count-cap"] > 0.5 * goodput["slogate"]  # a fair baseline, not a strawman
    assert cli(*argv, "--duration", "60", "--count-cap-queue", "8", "--json") == 0
    assert json.loads(capsys.readouterr().out)["count_cap"]["queue"] == 8


def test_cli_exponential_service_reports_the_mm1_closed_form(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli(
        "--profile", str(profile_file), "--slo-ttft", "2", "--load", "0.5", "--gate", "direct",
        "--service", "exponential", "--duration", "20000", "--json",
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    (r,) = json.loads(out)["runs"]
    assert r["mm1_time_in_system_s"] == pytest.approx(2 / r["capacity_rps"])
    assert r["mean_time_in_system_s"] == pytest.approx(r["mm1_time_in_system_s"], rel=0.1)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--load", "0x"], "must be a finite number > 0"),
        (["--load", "fast"], "expected a multiple of capacity"),
        (["--gate", "maybe"], "choose from direct, slogate, count-cap"),
        (["--prompt-tokens", "9-3"], "expected N or LOW-HIGH"),
    ],
)
def test_cli_bad_flags_are_one_line_exit_2(
    profile_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli("--profile", str(profile_file), "--slo-ttft", "2", *argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--profile", "/nonexistent/profile.json", "--slo-ttft", "2"], "cannot read"),
        (["--slo-ttft", "2", "--service", "exponential", "--gate", "slogate"], "use none or count-cap"),
        (["--slo-ttft", "2", "--prompt-tokens", "2000"], "beyond one slot"),
        (["--slo-tpot", "0.05"], "give --slo-ttft"),
        (["--slo-ttft", "2", "--tenants"], "--tenants and --tenant-weights change nothing here"),
        (["--slo-ttft", "2", "--tenant-weights", "a:2"], "change nothing here"),
    ],
)
def test_cli_bad_inputs_are_one_line_exit_2(
    profile_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    full = argv if "--profile" in argv else ["--profile", str(profile_file), *argv]
    assert cli(*full) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert fragment in err
    assert err.startswith("slogate simulate: error: ")
    assert err.count("\n") == 1


def test_add_parser_registers_simulate_like_the_dispatcher_does(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = OneLineParser(prog="slogate")
    add_parser(parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser))
    args = parser.parse_args(
        ["simulate", "--profile", str(profile_file), "--slo-ttft", "2", "--load", "2x", "--duration", "300", "--json"]
    )
    assert args.run(args) == 0
    (r,) = [r for r in json.loads(capsys.readouterr().out)["runs"] if r["gate"] == "slogate"]
    assert r["load"] == 2.0
    assert r["completed_within_slo"] == r["admitted"]


# --------------------------------------------------------------------------- the CLI: workload and classes


def test_the_default_workload_is_the_benchmarks_chat_mix(profile_file: Path) -> None:
    args = build_parser().parse_args(["simulate", "--profile", str(profile_file), "--slo-ttft", "2"])
    chat = preset("chat")
    assert (args.prompt_tokens, args.output_tokens) == (chat.prompt_tokens, chat.output_tokens)
    assert (chat.prompt_tokens, chat.output_tokens) == (CHAT_PROMPTS, CHAT_OUTPUTS)
    assert build_parser().parse_args(
        ["simulate", "--profile", "p", "--prompt-tokens", "512"]
    ).prompt_tokens == TokenLengths(512, 512)


def json_report(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], list[str]]:
    code = cli("--duration", "60", "--load", "1x", "--json", *argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err.splitlines()


def test_a_workload_whose_own_prefill_misses_the_slo_is_warned_with_its_share(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The case: every prompt takes longer than the SLO to prefill alone (512 tokens:
    # 1.53 s on the test profile, 1.4 s SLO): every row 0 req/s, now with the reason.
    report, err = json_report(capsys, "--profile", str(profile_file), "--slo-ttft", "1.4", "--prompt-tokens", "512")
    assert err == [
        "slogate simulate: warning: every request of the workload needs more than the 1.4 s TTFT SLO of class "
        "'default' for its own prefill on an idle server (only prompts up to 468 tokens fit): no gate serves any "
        "within it, goodput is 0"
    ]
    assert report["warnings"] == [err[0].removeprefix("slogate simulate: warning: ")]
    assert {r["goodput_rps"] for r in report["runs"]} == {0.0}
    # The chat mix at 2 s: its share of prompts over the longest an idle server prefills in 2 s.
    report, err = json_report(capsys, "--profile", str(profile_file), "--slo-ttft", "2", "--gate", "direct")
    longest = longest_prompt_within(SERVER.prefill, 2.0)
    share = CHAT_PROMPTS.share_over(longest)
    assert 0 < share < 0.01
    assert err == [
        f"slogate simulate: warning: {share:.1%} of the workload's requests (prompts over {longest} tokens) need "
        "more than the 2 s TTFT SLO of class 'default' for their own prefill on an idle server: no gate serves "
        f"them within it, so goodput is at most {1 - share:.1%} of the offered rate"
    ]
    # A workload that fits on an idle server: no warning (the threshold is any request at all).
    report, err = json_report(capsys, "--profile", str(profile_file), "--slo-ttft", "2", "--prompt-tokens", "100-400")
    assert (err, report["warnings"]) == ([], [])


def test_slo_ttft_is_the_slo_of_classes_without_their_own_and_the_title_names_each(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--profile", str(profile_file), "--classes", "interactive:1:1,batch", "--gate", "direct")
    report, _ = json_report(capsys, *argv, "--slo-ttft", "10")
    assert report["classes"] == [{"name": "interactive", "ttft_slo_s": 1.0}, {"name": "batch", "ttft_slo_s": 10.0}]
    assert (report["default_class"], report["ttft_slo_s"]) == ("batch", 10.0)  # what goodput counts
    title = str(table(report).title)
    assert "TTFT SLO interactive 1 s, batch 10 s (arrivals: batch, the default class)" in title
    report_50, _ = json_report(capsys, *argv, "--slo-ttft", "50")
    assert report_50["classes"][1] == {"name": "batch", "ttft_slo_s": 50.0}


def test_slo_ttft_beside_classes_that_all_set_their_own_is_refused(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli("--profile", str(profile_file), "--slo-ttft", "2", "--classes", "interactive:1:1,batch:10")
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "slogate simulate: error: --slo-ttft 2 applies to no class: every class in --classes sets its own ttft "
        "(interactive:1, batch:10); drop --slo-ttft, or a class's ttft to give it --slo-ttft's"
    ]


def test_slogate_warns_of_prompts_beyond_a_budget_the_classes_above_cap(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = json_report(
        capsys, "--profile", str(profile_file), "--classes", "interactive:1:1,batch:10", "--gate", "slogate"
    )
    longest = longest_prompt_within(SERVER.prefill, 1.0)
    share = CHAT_PROMPTS.share_over(longest)
    assert err == [
        f"slogate simulate: warning: slogate never admits {share:.1%} of the workload's requests (prompts over "
        f"{longest} tokens): the admit-now TTFT budget of class 'batch' is 1 s, capped by the classes above it"
    ]
