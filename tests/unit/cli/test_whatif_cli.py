"""`slogate what-if`: the spec's worked example end to end, and bad input."""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[3] / "examples"

SPEC = ["--prefill-tps", "1200", "--slo-ttft", "2", "--prompt-tokens", "800"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", "what-if", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def what_if(*args: str) -> dict[str, object]:
    done = run(*args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_spec_1100_queued_admits() -> None:
    out = what_if(*SPEC, "--queued-tokens", "1100")
    assert out["own_prefill_s"] == pytest.approx(0.67, abs=0.005)
    assert out["queue_wait_s"] == pytest.approx(0.92, abs=0.005)
    assert out["predicted_ttft_s"] == pytest.approx(1.59, abs=0.01)
    assert out["max_queued_tokens"] == pytest.approx(1600)
    assert out["admit"] is True
    assert out["reasons"] == []
    assert out["retry_after_s"] == 0


def test_spec_2400_queued_rejects() -> None:
    out = what_if(*SPEC, "--queued-tokens", "2400")
    assert out["queue_wait_s"] == pytest.approx(2.0)
    assert out["predicted_ttft_s"] == pytest.approx(2.67, abs=0.005)
    assert out["admit"] is False
    assert out["reasons"] == ["ttft"]
    assert out["retry_after_s"] == pytest.approx(800 / 1200)


def test_spec_kv_172_mb_vs_150_mb_rejects_though_latency_passes() -> None:
    out = what_if(
        *SPEC, "--queued-tokens", "1100", "--max-tokens", "512",
        "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-bytes-per-elem", "2",
        "--kv-free-bytes", "150000000",
    )  # fmt: skip
    assert out["kv_bytes_per_token"] == 131072
    assert out["kv_needed_bytes"] == pytest.approx(172e6, rel=0.005)
    assert out["admit"] is False
    assert out["reasons"] == ["kv"]


def test_every_failed_predicate_is_listed() -> None:
    out = what_if(
        *SPEC, "--queued-tokens", "2400", "--max-tokens", "512", "--kv-bytes-per-token", "131072",
        "--kv-free-bytes", "1", "--in-flight", "4", "--concurrency-cap", "4",
    )  # fmt: skip
    assert out["reasons"] == ["ttft", "kv", "concurrency"]


def test_queueing_outputs() -> None:
    out = what_if("--arrival-rate", "9", "--service-rate", "10", "--w-max", "2", "--reject-fraction", "0.5")
    assert out["utilization"] == pytest.approx(0.9)
    assert out["mm1_time_in_system_s"] == pytest.approx(1.0)
    assert out["mm1_number_in_system"] == pytest.approx(9.0)
    assert out["l_max"] == pytest.approx(20)
    assert out["effective_arrival_multiplier"] == pytest.approx(2.0)
    assert out["effective_arrival_rate"] == pytest.approx(18.0)


def test_overload_is_reported_unstable_not_as_a_number() -> None:
    out = what_if("--arrival-rate", "15", "--service-rate", "10")
    assert out["stable"] is False
    assert out["mm1_time_in_system_s"] is None


def test_missing_inputs_are_named() -> None:
    out = what_if("--prefill-tps", "1200")
    assert "admit" not in out
    assert {"prompt_tokens", "queued_tokens", "kv_bytes_per_token", "w_max"} <= set(out["missing"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--prefill-tps", "-5"], "must be > 0"),
        (["--slo-ttft", "0"], "must be > 0"),
        (["--prompt-tokens", "eight"], "not a whole number"),
        (["--queued-tokens", "nan"], "not a finite number"),
        (["--reject-fraction", "1"], "[0, 1)"),
        (["--no-such-flag", "3"], "unrecognized arguments"),
        (["--arrival-rate", "abc"], "not a number"),
        (["--slo-ttft", "1", "--ttft-margin", "0.5"], "--ttft-margin must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert fragment in lines[0]
    assert "Traceback" not in done.stderr


def test_console_script_is_installed() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert scripts["slogate"].value == "slogate_cli.main:main"


def test_a_request_that_can_never_fit_is_not_told_to_retry() -> None:
    # 800 tokens at 330 tok/s take 2.4 s alone: a 0.05 s SLO is never met, however empty the queue.
    out = what_if("--prefill-tps", "330", "--slo-ttft", "0.05", "--prompt-tokens", "800", "--queued-tokens", "0")
    assert out["admit"] is False
    assert out["fits_ever"] is False
    assert out["reasons"] == ["ttft", "never_fits"]
    assert out["retry_after_s"] is None


def test_at_the_gates_margin_a_prompt_within_the_slo_at_the_median_never_fits() -> None:
    # 330 tokens at 330 tok/s: 1.0 s alone, within a 1.2 s SLO at the median prediction; at a
    # gate's margin of 1.59 (the calibration's timing noise) 1.59 s, beyond it on an empty queue.
    median = what_if("--prefill-tps", "330", "--slo-ttft", "1.2", "--prompt-tokens", "330", "--queued-tokens", "0")
    assert median["admit"] is True
    margin = what_if(
        "--prefill-tps", "330", "--slo-ttft", "1.2", "--prompt-tokens", "330", "--queued-tokens", "0",
        "--ttft-margin", "1.59",
    )  # fmt: skip
    assert margin["reasons"] == ["ttft", "never_fits"]
    assert margin["retry_after_s"] is None
    assert margin["max_queued_tokens"] < 0  # type: ignore[operator]


def test_a_request_beyond_one_slot_never_fits() -> None:
    out = what_if("--prompt-tokens", "2000", "--max-tokens", "256", "--slot-tokens", "2048")
    assert out["reasons"] == ["kv", "never_fits"]
    assert out["retry_after_s"] is None


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "give at least one input, e.g. --prefill-tps"),
        (["--layers", "30"], "--layers also needs --kv-heads, --head-dim, --kv-bytes-per-elem"),
        (["--layers", "30", "--kv-heads", "3", "--kv-bytes-per-token", "2"], "not both"),
    ],
)
def test_inputs_that_would_be_ignored_are_refused(args: list[str], fragment: str) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert fragment in line


def test_a_tenant_over_its_share_is_told_so_with_its_own_retry_after() -> None:
    # The worked example's 1,100 queued tokens, all its tenant's, beside one other active tenant:
    # half the 2,400-token budget is 1,200, and 1,100 + 800 exceed it by 700 tokens, which
    # drain at half the 1,200 tok/s rate in 700 / 600 s. The TTFT alone would admit it.
    out = what_if(*SPEC, "--queued-tokens", "1100", "--tenant-held-tokens", "1100", "--active-tenant-weight", "2")
    assert out["tenant_share_tokens"] == pytest.approx(1200)
    assert out["tenant_excess_tokens"] == pytest.approx(700)
    assert out["admit"] is False
    assert out["reasons"] == ["tenant_share"]
    assert out["retry_after_s"] == pytest.approx(700 / 600)
    # Alone in its class (or holding nothing) no share limits it: the TTFT verdict stands.
    alone = what_if(*SPEC, "--queued-tokens", "1100", "--tenant-held-tokens", "1100", "--active-tenant-weight", "1")
    assert (alone["admit"], alone["tenant_excess_tokens"]) == (True, 0)
    weighted = what_if(
        *SPEC,
        "--queued-tokens",
        "100",
        "--tenant-held-tokens",
        "100",
        "--tenant-weight",
        "3",
        "--active-tenant-weight",
        "4",
    )
    assert weighted["tenant_share_tokens"] == pytest.approx(1800)
    assert weighted["admit"] is True


def test_the_cost_order_prices_a_request_and_says_whether_it_is_held_back() -> None:
    """cost = 800 / 1200 + 400 / 200 = 2.667 s: beyond c* = 1 s, costly; admitted into the last of
    4 slots with 1 held back, it is held back; with a slot to spare beyond the reserve it is not."""
    common = ["--prefill-tps", "1200", "--slo-ttft", "2", "--prompt-tokens", "800", "--queued-tokens", "0"]
    cost = ["--max-tokens", "400", "--decode-tps", "200", "--cost-boundary", "1", "--reserve-slots", "1"]
    last = what_if(*common, *cost, "--in-flight", "3", "--concurrency-cap", "4")
    assert last["admit"] is True
    assert last["cost_s"] == pytest.approx(800 / 1200 + 400 / 200)
    assert last["costly"] is True
    assert last["held_back"] is True
    spare = what_if(*common, *cost, "--in-flight", "2", "--concurrency-cap", "4")
    assert spare["held_back"] is False
    cheap = what_if(
        *common, *cost[:4], "--cost-boundary", "5", "--reserve-slots", "1", "--in-flight", "3", "--concurrency-cap", "4"
    )
    assert cheap["costly"] is False
    assert "held_back" not in cheap
    priced = what_if(*common, "--max-tokens", "400", "--decode-tps", "200")
    assert priced["cost_s"] == pytest.approx(2.667, abs=1e-3)
    assert "cost_boundary" in priced["missing"]  # type: ignore[operator]


def test_the_old_spelling_of_the_slo_flag_still_works_unshown() -> None:
    assert (
        what_if("--ttft-slo", "2", "--prefill-tps", "1200", "--prompt-tokens", "800", "--queued-tokens", "1100")[
            "admit"
        ]
        is True
    )
    shown = run("--help").stdout
    assert "--slo-ttft" in shown
    assert "--ttft-slo" not in shown


def test_the_policy_a_user_applies_gives_its_classs_admit_now_budget() -> None:
    """examples/smollm2.yaml: interactive 1 s above batch 10 s, so batch is admitted at once
    within 1 s: 200 tokens at 300/s (0.667 s) leave room for 100 queued tokens, not 2,800."""
    policy = str(EXAMPLES / "smollm2.yaml")
    done = run("--policy", policy, "--class", "batch", "--prefill-tps", "300", "--prompt-tokens", "200")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_queued_tokens"] == pytest.approx(100.0)
    assert "note: ignoring targetRef" in done.stderr
    clash = run("--policy", policy, "--slo-ttft", "2")
    assert clash.returncode == 2
    assert "give --policy or --slo-ttft, not both" in clash.stderr
    unknown = run("--policy", policy, "--class", "bulk", "--prefill-tps", "300")
    assert unknown.returncode == 2
    assert "'bulk' is not a class of the policy (interactive, batch)" in unknown.stderr
