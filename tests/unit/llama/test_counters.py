"""Table tests for reading llama-server's Prometheus text exposition."""

from __future__ import annotations

import pytest

from slogate_llama.counters import (
    LlamaCounters,
    MetricsError,
    MissingMetricError,
    PrometheusParseError,
    Sample,
    parse_samples,
    parse_unlabelled,
    sample_value,
)

# Verbatim shape of llama-server's /metrics (values changed), including the counter it
# declares without `_total` and a value printed with six significant digits.
LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1.23457e+06
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 17
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 3.5
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 400
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 4.25
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 380
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 812
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 331.2
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

SPEC_PER_POSITION = """\
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4
"""


@pytest.mark.parametrize(
    ("text", "name", "value"),
    [
        # A counter declared with `_total`: asked for exactly as printed.
        ("# TYPE a:b_total counter\na:b_total 5\n", "a:b_total", 5.0),
        # A counter declared without `_total`: prometheus_client renames its sample to
        # `..._total`; we hand back the printed name.
        ("# TYPE a:max counter\na:max 7\n", "a:max", 7.0),
        ("# TYPE g gauge\ng 0.25\n", "g", 0.25),
        ("untyped_sample 3\n", "untyped_sample", 3.0),
        ("# a free comment\nx 1\n", "x", 1.0),
        ("x 12 1700000000000\n", "x", 12.0),  # a timestamp is allowed and dropped
        ("big 1.23457e+06\n", "big", 1234570.0),  # llama-server's 6-digit rounding
        ("neg -2.5\n", "neg", -2.5),
        ("inf +Inf\n", "inf", float("inf")),
        (LLAMA_METRICS, "llamacpp:prompt_tokens_total", 1234570.0),
        (LLAMA_METRICS, "llamacpp:n_tokens_max", 812.0),
        (LLAMA_METRICS, "llamacpp:requests_deferred", 2.0),
    ],
)
def test_unlabelled_values_under_printed_names(text: str, name: str, value: float) -> None:
    assert parse_unlabelled(text)[name] == value


@pytest.mark.parametrize(
    ("text", "absent"),
    [
        ("# TYPE a:max counter\na:max 7\n", "a:max_total"),
        ("# TYPE a:b_total counter\na:b_total 5\n", "a:b"),
        (LLAMA_METRICS, "llamacpp:n_tokens_max_total"),
    ],
)
def test_no_names_are_invented(text: str, absent: str) -> None:
    assert absent not in parse_unlabelled(text)


def test_every_llama_sample_appears_once_in_order() -> None:
    names = [sample.name for sample in parse_samples(LLAMA_METRICS)]
    printed = [line.split()[0] for line in LLAMA_METRICS.splitlines() if line and not line.startswith("#")]
    assert names == printed


def test_labelled_samples_are_kept_apart_and_found_by_labels() -> None:
    text = LLAMA_METRICS + SPEC_PER_POSITION
    samples = parse_samples(text)
    name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"

    assert name not in parse_unlabelled(text)
    assert sample_value(samples, name, {"position": "0"}) == 9.0
    assert sample_value(samples, name, {"position": "1"}) == 4.0
    assert sample_value(samples, "llamacpp:requests_processing") == 3.0
    assert Sample(name, (("position", "1"),), 4.0) in samples


@pytest.mark.parametrize(
    ("name", "labels", "message"),
    [
        ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", {"position": "7"}, "'0'"),
        ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", None, "label sets present"),
        ("llamacpp:no_such_metric", None, "no sample named"),
        ("llamacpp:requests_processing", {"slot": "0"}, "label sets present"),
    ],
)
def test_sample_value_reports_what_is_missing(name: str, labels: dict[str, str] | None, message: str) -> None:
    samples = parse_samples(LLAMA_METRICS + SPEC_PER_POSITION)
    with pytest.raises(MissingMetricError, match=message):
        sample_value(samples, name, labels)


def test_llama_counters_from_llama_server_text() -> None:
    counters = LlamaCounters.from_text(LLAMA_METRICS)

    assert counters == LlamaCounters(
        prompt_tokens_total=1234570.0,
        prompt_seconds_total=3.5,
        tokens_predicted_total=400.0,
        tokens_predicted_seconds_total=4.25,
        n_decode_total=380.0,
        requests_processing=3.0,
        requests_deferred=2.0,
        prompt_tokens_cached_total=17.0,
    )


def test_prompt_tokens_cached_total_is_optional() -> None:
    text = "\n".join(line for line in LLAMA_METRICS.splitlines() if "prompt_tokens_cached_total" not in line)
    counters = LlamaCounters.from_text(text)

    assert counters.prompt_tokens_cached_total is None
    assert counters.prompt_tokens_total == 1234570.0


@pytest.mark.parametrize(
    "missing",
    [
        "llamacpp:prompt_tokens_total",
        "llamacpp:prompt_seconds_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:tokens_predicted_seconds_total",
        "llamacpp:n_decode_total",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
    ],
)
def test_missing_required_counter_is_named(missing: str) -> None:
    text = "\n".join(line for line in LLAMA_METRICS.splitlines() if missing not in line)

    with pytest.raises(MissingMetricError, match=missing) as caught:
        LlamaCounters.from_text(text)

    assert "--metrics" in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "",  # valid exposition with no samples at all
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n",
        # a labelled series is not the unlabelled counter llama-server prints
        'llamacpp:prompt_tokens_total{slot="0"} 5\n',
    ],
)
def test_not_llama_server_metrics(text: str) -> None:
    with pytest.raises(MissingMetricError, match="not llama-server"):
        LlamaCounters.from_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        '{"error":{"code":501,"message":"This server does not support metrics endpoint."}}',
        "Not Found",
        "llamacpp:prompt_tokens_total five\n",
        "llamacpp:prompt_tokens_total{slot=0} 5\n",  # unquoted label value
        "# TYPE llamacpp:prompt_tokens_total\n",  # TYPE without a type
        "a 1\na 2\n",  # the same series twice: two scrapes concatenated
    ],
)
def test_garbage_is_a_clear_parse_error(text: str) -> None:
    with pytest.raises(PrometheusParseError) as caught:
        parse_unlabelled(text)

    assert str(caught.value)
    assert isinstance(caught.value, MetricsError)
    assert isinstance(caught.value, ValueError)


def test_parse_error_quotes_the_start_of_the_text() -> None:
    with pytest.raises(PrometheusParseError, match="Bad Gateway"):
        LlamaCounters.from_text("<html><body>502 Bad Gateway</body></html>")
