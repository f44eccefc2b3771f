"""The sidecar's metrics, read back through Prometheus's own text parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import (
    Decision,
    GateConfig,
    LiveState,
    Outcome,
    Reason,
    Request,
    decide,
)
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_llama.counters import LlamaCounters
from slogate_sidecar.metrics import SidecarMetrics
from slogate_sidecar.rates import RateEstimator

Labels = frozenset[tuple[str, str]]


def two_class_thresholds() -> Thresholds:
    policy = Policy.model_validate(
        {
            "slo": {"timePerOutputTokenSeconds": 0.05},  # both classes set their own TTFT SLO
            "concurrency": {"max": 4},
            "classes": [
                {"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1},
                {"name": "batch", "ttftSeconds": 10},
            ],
            "degradation": {"clampMaxTokens": True},
        }
    )
    return derive_thresholds(policy, smollm2_profile(), derived_at=NOW)


def one_class_thresholds() -> Thresholds:
    policy = Policy.model_validate({"slo": {"ttftSeconds": 3.0}, "concurrency": {"max": 2}})
    profile = smollm2_profile(id="cal-two", fingerprint="e" * 16)
    return derive_thresholds(policy, profile, derived_at=NOW)


def scrape(metrics: SidecarMetrics) -> dict[str, dict[Labels, float]]:
    """Every sample of the exposition: name -> labels -> value (``le`` as a float string)."""
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            labels = {k: str(float(v)) if k == "le" else v for k, v in s.labels.items()}
            out.setdefault(s.name, {})[frozenset(labels.items())] = s.value
    return out


def series(samples: dict[str, dict[Labels, float]], name: str) -> dict[Labels, float]:
    return samples.get(name, {})


def key(**labels: str | float) -> Labels:
    """Labels for a lookup; ``klass`` stands for ``class``, ``le`` is normalised."""
    renamed = {("class" if k == "klass" else k): v for k, v in labels.items()}
    return frozenset((k, str(float(v)) if k == "le" else str(v)) for k, v in renamed.items())


@pytest.fixture
def gate() -> GateConfig:
    return GateConfig.from_thresholds(two_class_thresholds())


@pytest.fixture
def decisions(gate: GateConfig) -> dict[str, Decision]:
    rate = gate.prefill_tokens_per_s
    made = {
        "admit": decide(gate, Request(200, 128, "interactive"), LiveState(), now=0),
        "degrade": decide(gate, Request(200, 2000, "interactive"), LiveState(), now=0),
        "defer": decide(gate, Request(200, 128, "batch"), LiveState(queued_prefill_tokens=2 * rate), now=0),
        "reject": decide(
            gate,
            Request(200, 500, "interactive"),
            LiveState(queued_prefill_tokens=5 * rate, streams=4, reserved_kv_tokens=8000),
            now=0,
        ),
    }
    # Preconditions: the core made the decisions this test is about.
    assert made["admit"].outcome is Outcome.ADMIT
    assert made["admit"].reasons == ()
    assert made["degrade"].outcome is Outcome.ADMIT
    assert made["degrade"].clamped
    assert made["defer"].outcome is Outcome.DEFER
    assert made["defer"].reasons == (Reason.TTFT,)
    assert made["reject"].outcome is Outcome.REJECT
    assert set(made["reject"].reasons) == {
        Reason.TTFT,
        Reason.KV,
        Reason.CONCURRENCY,
        Reason.DECODE,
    }
    assert made["reject"].retry_after_s is not None
    return made


def test_decisions_count_per_reason_and_requests_once(decisions: dict[str, Decision]) -> None:
    m = SidecarMetrics()
    m.set_thresholds(two_class_thresholds())
    durations = {"admit": 2e-6, "degrade": 3e-6, "defer": 2e-5, "reject": 5e-3}
    for name, d in decisions.items():
        m.record_decision(d, durations[name])
    s = scrape(m)

    assert series(s, "slogate_decisions_total") == {
        key(outcome="admit", reason="none", klass="interactive"): 1.0,
        key(outcome="degrade", reason="kv", klass="interactive"): 1.0,
        key(outcome="defer", reason="ttft", klass="batch"): 1.0,
        key(outcome="reject", reason="ttft", klass="interactive"): 1.0,
        key(outcome="reject", reason="kv", klass="interactive"): 1.0,
        key(outcome="reject", reason="concurrency", klass="interactive"): 1.0,
        key(outcome="reject", reason="decode", klass="interactive"): 1.0,
    }
    requests = series(s, "slogate_requests_total")
    assert {k: v for k, v in requests.items() if v} == {
        key(outcome="admit", klass="interactive"): 1.0,
        key(outcome="degrade", klass="interactive"): 1.0,
        key(outcome="defer", klass="batch"): 1.0,
        key(outcome="reject", klass="interactive"): 1.0,
    }
    # Every outcome x class exists from the start (zeros), so ratios never lack a series.
    assert len(requests) == 4 * 2
    # The documented rejection ratio: 1 rejected request of 4, not 4 of 7 decision series.
    rejected = sum(v for k, v in requests.items() if ("outcome", "reject") in k)
    assert rejected / sum(requests.values()) == 0.25

    assert series(s, "slogate_retry_after_seconds_count") == {key(): 1.0}
    assert series(s, "slogate_retry_after_seconds_sum")[key()] == pytest.approx(decisions["reject"].retry_after_s)
    buckets = series(s, "slogate_decision_duration_seconds_bucket")
    assert buckets[key(le=1e-6)] == 0.0
    assert buckets[key(le=5e-6)] == 2.0
    assert buckets[key(le=2.5e-5)] == 3.0
    assert buckets[key(le=1e-2)] == 4.0
    assert series(s, "slogate_decision_duration_seconds_count") == {key(): 4.0}
    assert series(s, "slogate_decision_duration_seconds_sum")[key()] == pytest.approx(5.025e-3)


def test_thresholds_replace_class_series_and_info() -> None:
    m = SidecarMetrics()
    assert series(scrape(m), "slogate_thresholds_loaded") == {key(): 0.0}
    assert series(scrape(m), "slogate_threshold_token_budget") == {}

    first = two_class_thresholds()
    m.set_thresholds(first)
    s = scrape(m)
    assert series(s, "slogate_threshold_token_budget") == {
        key(klass=c.name): pytest.approx(c.token_budget) for c in first.classes
    }
    assert series(s, "slogate_threshold_concurrency_cap") == {
        key(klass="interactive"): 4.0,
        key(klass="batch"): 3.0,
    }
    assert series(s, "slogate_decode_rate_tokens_per_second") == {key(source="calibrated"): 45.0}

    second = one_class_thresholds()
    m.set_thresholds(second)
    s = scrape(m)
    (only,) = second.classes
    assert only.name == "default"
    assert series(s, "slogate_threshold_token_budget") == {key(klass="default"): pytest.approx(only.token_budget)}
    assert series(s, "slogate_threshold_ttft_budget_seconds") == {key(klass="default"): 3.0}
    assert series(s, "slogate_threshold_concurrency_cap") == {key(klass="default"): 2.0}
    assert "slogate_threshold_l_max" not in s  # deprecated on the wire, ignored by the gate
    assert series(s, "slogate_kv_capacity_tokens") == {key(): 8192.0}
    assert series(s, "slogate_prefill_rate_tokens_per_second") == {
        key(source="calibrated"): pytest.approx(second.prefill_tokens_per_second)
    }
    assert series(s, "slogate_decode_rate_tokens_per_second") == {key(source="calibrated"): 69.0}
    assert series(s, "slogate_thresholds_info") == {
        key(
            calibration_id="cal-two",
            fingerprint="e" * 16,
            model="SmolLM2-135M-Instruct",
            quantization="Q4_1",
        ): 1.0
    }
    assert series(s, "slogate_thresholds_loaded") == {key(): 1.0}
    # Counters of a vanished class keep their history.
    assert key(outcome="admit", klass="interactive") in series(s, "slogate_requests_total")

    m.reject_thresholds()
    assert series(scrape(m), "slogate_threshold_updates_total") == {
        key(result="applied"): 2.0,
        key(result="rejected"): 1.0,
    }


def test_ttft_histograms_error_ratio_and_slo() -> None:
    m = SidecarMetrics()
    m.record_ttft("interactive", predicted_s=0.5, actual_s=0.6, slo_s=1.0)  # +20 %, met
    m.record_ttft("interactive", predicted_s=1.0, actual_s=3.0, slo_s=1.0)  # +200 %, missed
    s = scrape(m)
    assert series(s, "slogate_ttft_predicted_seconds_count") == {key(klass="interactive"): 2.0}
    assert series(s, "slogate_ttft_predicted_seconds_sum")[key(klass="interactive")] == 1.5
    assert series(s, "slogate_ttft_actual_seconds_sum")[key(klass="interactive")] == 3.6
    actual = series(s, "slogate_ttft_actual_seconds_bucket")
    assert actual[key(klass="interactive", le=0.75)] == 1.0
    assert actual[key(klass="interactive", le=3.0)] == 2.0
    ratio = series(s, "slogate_ttft_prediction_error_ratio_bucket")
    assert ratio[key(le=0.1)] == 0.0
    assert ratio[key(le=0.25)] == 1.0
    assert ratio[key(le=1.0)] == 1.0
    assert ratio[key(le=2.0)] == 2.0
    assert series(s, "slogate_ttft_prediction_error_ratio_count") == {key(): 2.0}
    # Negative buckets: OpenMetrics drops _sum (it would not be a counter); use quantiles.
    assert "slogate_ttft_prediction_error_ratio_sum" not in s
    assert series(s, "slogate_slo_requests_total") == {
        key(klass="interactive", result="met"): 1.0,
        key(klass="interactive", result="missed"): 1.0,
    }


def test_live_rates_appear_and_vanish_with_staleness() -> None:
    m = SidecarMetrics()
    rates = RateEstimator()
    m.set_rates(rates, now=0.0, max_age_s=5.0)
    s = scrape(m)
    assert series(s, "slogate_prefill_rate_tokens_per_second") == {}
    assert series(s, "slogate_rate_age_seconds") == {}

    def snap(prompt: float, prompt_s: float) -> LlamaCounters:
        return LlamaCounters(prompt, prompt_s, 100.0, 2.0, 0.0, 0.0, 0.0)

    rates.observe(snap(0, 0), 10.0)
    rates.observe(snap(600, 2.0), 11.0)
    m.set_rates(rates, now=12.0, max_age_s=5.0)
    s = scrape(m)
    assert series(s, "slogate_prefill_rate_tokens_per_second") == {key(source="live"): 300.0}
    assert series(s, "slogate_decode_rate_tokens_per_second") == {}  # no decode sample yet
    assert series(s, "slogate_rate_age_seconds") == {key(kind="prefill"): 1.0}

    m.set_rates(rates, now=20.0, max_age_s=5.0)  # 9 s old: stale
    s = scrape(m)
    assert series(s, "slogate_prefill_rate_tokens_per_second") == {}
    assert series(s, "slogate_rate_age_seconds") == {key(kind="prefill"): 9.0}


def test_accounting_upstream_and_deferrals() -> None:
    m = SidecarMetrics()
    m.set_accounting(LiveState(queued_prefill_tokens=1234.5, streams=3, reserved_kv_tokens=4000, deferred=2))
    m.record_upstream_error("timeout")
    m.record_deferral("timed_out", "batch")
    m.client_disconnects.inc()
    m.upstream_up.set(1)
    s = scrape(m)
    assert series(s, "slogate_queued_prefill_tokens") == {key(): 1234.5}
    assert series(s, "slogate_inflight_streams") == {key(): 3.0}
    assert series(s, "slogate_kv_reserved_tokens") == {key(): 4000.0}
    assert series(s, "slogate_deferred_requests") == {key(): 2.0}
    assert series(s, "slogate_upstream_errors_total") == {
        key(kind="unreachable"): 0.0,
        key(kind="timeout"): 1.0,
        key(kind="status_5xx"): 0.0,
        key(kind="aborted"): 0.0,
    }
    assert series(s, "slogate_deferral_outcomes_total") == {key(result="timed_out", klass="batch"): 1.0}
    assert series(s, "slogate_client_disconnects_total") == {key(): 1.0}
    assert series(s, "slogate_upstream_up") == {key(): 1.0}


def test_two_sidecars_in_one_process_do_not_share_series() -> None:
    a, b = SidecarMetrics(), SidecarMetrics()
    a.client_disconnects.inc()
    assert series(scrape(a), "slogate_client_disconnects_total") == {key(): 1.0}
    assert series(scrape(b), "slogate_client_disconnects_total") == {key(): 0.0}


def test_requests_are_counted_by_cost_quartile_where_they_end(decisions: dict[str, Decision]) -> None:
    """An arrival's end, by its cost quartile: admitted or refused at once, a deferral when it
    ends (not when the client left); a decision without a quartile (a cold book) is not ranked."""
    m = SidecarMetrics()
    m.set_thresholds(two_class_thresholds())
    m.record_decision(decisions["admit"]._replace(cost_quartile=1), 1e-6)
    m.record_decision(decisions["reject"]._replace(cost_quartile=4), 1e-6)
    m.record_decision(decisions["defer"]._replace(cost_quartile=3), 1e-6)  # counted when it ends
    m.record_decision(decisions["reject"], 1e-6)  # cold book: no quartile
    m.record_deferral("admitted", "batch", 3)
    m.record_deferral("timed_out", "batch", 4)
    m.record_deferral("cancelled", "batch", 2)
    counted = series(scrape(m), "slogate_cost_quartile_requests_total")
    assert len(counted) == 4 * 2  # every quartile x result from the start
    assert {k: v for k, v in counted.items() if v} == {
        key(quartile="1", result="admitted"): 1.0,
        key(quartile="3", result="admitted"): 1.0,
        key(quartile="4", result="refused"): 2.0,
    }
