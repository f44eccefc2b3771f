"""Malformed requests through the gate to the real llama-server: never a 5xx.

The unit fuzzing proves the sidecar answers bad input itself with a 4xx. Some input the
gate accepts is still bad for llama-server, and this build answers 500 to a number of
such bodies ("Failed to parse messages/tools"); the gate would relay that as a 502, a
client's mistake reported as a server fault. Here hypothesis sends chat and completion
bodies with llama-server's own fields set to values of every JSON type, through the
gate to the session's llama-server (one output token each, so it stays cheap): every
answer must be 200, 400 or 429, and the gate's books empty after each.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar_harness import RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_admission.schema import CalibrationProfile
from slogate_calibration.runtime import LlamaServer
from slogate_llama.routes import Route

# Sampling and server fields this llama-server reads (from its source and /props); values of any type.
FIELDS = [
    "temperature", "top_k", "top_p", "min_p", "n_probs", "stop", "seed", "mirostat", "mirostat_tau", "penalty_last_n",
    "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_sequence_breakers",
    "xtc_probability", "typical_p", "dynatemp_range", "n_keep", "n_discard", "cache_prompt", "id_slot", "samplers",
    "logit_bias", "grammar", "json_schema", "response_format", "tools", "tool_choice", "parallel_tool_calls",
    "logprobs", "top_logprobs", "chat_template_kwargs", "reasoning_format", "add_generation_prompt",
    "return_tokens", "timings_per_token", "post_sampling_probs", "n_indent", "t_max_predict_ms", "ignore_eos",
    "lora", "input_prefix", "input_suffix", "suffix", "echo", "user", "model", "stream_options", "n", "n_cmpl",
]  # fmt: skip
MESSAGE_FIELDS = ["role", "content", "name", "tool_call_id", "reasoning_content", "tool_calls", "function_call"]
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["text", "function", "user", "auto", "none", "json_object"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "function", "name", "text", "arguments", "id", "a"]), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    route = draw(st.sampled_from(list(Route)))
    body: dict[str, Any]
    if route is Route.CHAT:
        message: dict[str, Any] = {"role": "user", "content": "Say hi."}
        for field in draw(st.lists(st.sampled_from(MESSAGE_FIELDS), max_size=2)):
            message[field] = draw(values)
        body = {"messages": [{"role": "system", "content": "Be brief."}, message]}
    else:
        body = {"prompt": draw(st.sampled_from(["Say hi.", [1, 2, 3]]))}
    for field in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        body[field] = draw(values)
    # One token out, whatever else was drawn: the point is parsing, not generating.
    for limit in ("n_predict", "max_tokens", "max_completion_tokens", "t_max_predict_ms"):
        body.pop(limit, None)
    body["n_predict" if route is Route.NATIVE else "max_tokens"] = 1
    body["stream"] = draw(st.booleans())
    return route.value, body


@pytest.fixture
async def gate(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> AsyncIterator[RunningSidecar]:
    thresholds = thresholds_for(calibrated_profile, deferral={"maxWaitSeconds": 5})
    async with sidecar_in_front_of(llama_server.url, tmp_path, thresholds) as running:
        yield running


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies())
async def test_bad_fields_reach_llama_server_as_4xx_never_5xx(
    gate: RunningSidecar, case: tuple[str, dict[str, Any]]
) -> None:
    route, body = case
    async with gate.session.post(gate.url + route, json=body) as response:
        status, text = response.status, await response.text()
    assert status in (200, 400, 429), (status, text[:300], json.dumps(body)[:400])
    if status != 200:
        assert json.loads(text)["error"]["message"]
    elif body.get("stream"):  # a served stream carries no error event
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
        assert events, text[:300]
        assert not any(isinstance(e := json.loads(event), dict) and "error" in e for event in events), text[-300:]
    assert await gate.wait_idle()
