"""The /metrics text of a stand-in llama-server: what the test fake and the benchmark stub serve.

Printed from `LlamaCounters` itself (its fields are the metric names, `GAUGES` says which
are gauges) in llama-server's own shape: a ``# HELP`` and a ``# TYPE`` line per metric,
the value as C++ streams print it (six significant digits). A metric the parser comes to
need is then a line every stand-in serves, rather than a hand-copied string that drifts;
a test compares these lines with the real binary's.
"""

from __future__ import annotations

from dataclasses import fields

from slogate_llama.counters import GAUGES, LLAMACPP_PREFIX, LlamaCounters

__all__ = ["HELP", "IDLE", "exposition"]

HELP = {
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens",
    "prompt_seconds_total": "Total time spent processing prompts",
    "tokens_predicted_total": "Number of generation tokens processed",
    "tokens_predicted_seconds_total": "Total time spent generating tokens",
    "n_decode_total": "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    "requests_processing": "Number of requests processing",
    "requests_deferred": "Number of requests deferred",
    "prompt_tokens_cached_total": "Number of prompt tokens reused from the cache",
}
"""llama-server's ``# HELP`` text of each `LlamaCounters` field, verbatim."""

IDLE = LlamaCounters(
    prompt_tokens_total=0,
    prompt_seconds_total=0,
    tokens_predicted_total=0,
    tokens_predicted_seconds_total=0,
    n_decode_total=0,
    requests_processing=0,
    requests_deferred=0,
    prompt_tokens_cached_total=0,
)
"""A server that has served nothing yet, as a freshly started llama-server reports."""


def exposition(counters: LlamaCounters) -> str:
    """The /metrics body llama-server would print for these values.

    An optional field that is None (a build without that metric) is left out.
    """
    lines: list[str] = []
    for field in fields(LlamaCounters):
        value = getattr(counters, field.name)
        if value is None:
            continue
        name = LLAMACPP_PREFIX + field.name
        kind = "gauge" if field.name in GAUGES else "counter"
        lines += [f"# HELP {name} {HELP[field.name]}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
    return "\n".join(lines) + "\n"
