"""The stand-ins' /metrics text is what the parser reads, in the real llama-server's shape."""

from __future__ import annotations

import urllib.request
from dataclasses import fields, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slogate_calibration.runtime import LlamaServer
from slogate_llama.counters import GAUGES, LLAMACPP_PREFIX, LlamaCounters, parse_samples
from slogate_llama.exposition import HELP, IDLE, exposition

# Values llama-server prints exactly (six significant digits at most), or absent.
printable = st.integers(min_value=0, max_value=999_999).map(float) | st.sampled_from([0.5, 4.25, 1.5e7])
counters = st.builds(
    LlamaCounters,
    **{f.name: printable for f in fields(LlamaCounters) if f.name != "prompt_tokens_cached_total"},
    prompt_tokens_cached_total=st.none() | printable,
)


@given(counters)
def test_the_parser_reads_back_what_a_stand_in_serves(values: LlamaCounters) -> None:
    assert LlamaCounters.from_text(exposition(values)) == values


def test_every_field_is_a_typed_metric_and_an_absent_one_is_left_out() -> None:
    text = exposition(replace(IDLE, prompt_tokens_cached_total=None))
    assert "prompt_tokens_cached_total" not in text
    declared = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")}
    required = [f.name for f in fields(LlamaCounters) if f.name != "prompt_tokens_cached_total"]
    assert declared == {LLAMACPP_PREFIX + name: "gauge" if name in GAUGES else "counter" for name in required}
    assert set(HELP) == {f.name for f in fields(LlamaCounters)}


def test_values_are_printed_as_llama_server_prints_them() -> None:
    text = exposition(replace(IDLE, prompt_tokens_total=1234567, prompt_seconds_total=3.5))
    assert "llamacpp:prompt_tokens_total 1.23457e+06\n" in text
    assert "llamacpp:prompt_seconds_total 3.5\n" in text
    assert "llamacpp:requests_processing 0\n" in text


@pytest.mark.integration
def test_a_stand_ins_lines_are_the_real_servers(llama_server: LlamaServer) -> None:
    """Every HELP and TYPE line a stand-in prints, the real binary prints too."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(llama_server.url + "/metrics", timeout=30) as response:
        real = response.read().decode()
    ours = exposition(IDLE)
    assert {line for line in ours.splitlines() if line.startswith("#")} <= set(real.splitlines())
    assert {s.name for s in parse_samples(ours)} <= {s.name for s in parse_samples(real)}
