"""llm-d-router's headers, both ways, through the real sidecar in front of a fake llama-server:
the objective names the class, the fairness id the tenant, a request's own TTFT SLO tightens
its class's (never loosens it); sheds say ``rejected-saturated`` and admissions their wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from canned_profiles import smollm2_profile
from held_upstream import held_upstream, hold
from sidecar_harness import ask, sidecar_in_front_of, thresholds_for
from slogate_admission.decision import GateConfig, Request, decide, never_fits, own_limits
from slogate_admission.ledger import Ledger
from slogate_sidecar import gateway_headers
from slogate_sidecar.bad_request import BadRequest

QUIET = {"poll_interval_s": 3600.0, "upstream_read_timeout_s": 10.0}
TOKENS = {"prompt": [1] * 50, "n_predict": 4}
CLASSES = [{"name": "interactive", "ttftSeconds": 1.0}, {"name": "batch", "ttftSeconds": 10.0}]


def two_classes(**policy: object) -> object:
    return thresholds_for(smollm2_profile(), slo={}, classes=CLASSES, **policy)


def test_a_requests_own_slo_tightens_its_class_and_never_loosens_it() -> None:
    config = GateConfig.from_thresholds(two_classes())  # type: ignore[arg-type]
    batch = config.limits_for("batch")
    assert own_limits(config, Request(10, 4, "batch")) is batch
    assert own_limits(config, Request(10, 4, "batch", ttft_slo_s=60.0)) is batch  # looser: the class's
    tight = own_limits(config, Request(10, 4, "batch", ttft_slo_s=0.5))
    assert (tight.ttft_slo_s, tight.ttft_budget_s) == (0.5, 0.5)
    # The same limits in decide and in never_fits: a prompt whose prefill alone misses 50 ms
    # never fits under that SLO, and fits under its class's.
    long = Request(200, 4, "batch", ttft_slo_s=0.05)
    assert never_fits(config, long)
    assert not never_fits(config, Request(200, 4, "batch"))
    assert not decide(config, long, Ledger().snapshot(0.0, None, 0), 0.0).fits_ever


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"x-llm-d-slo-ttft-ms": "250"}, 0.25),
        ({"x-slo-ttft-ms": "1500"}, 1.5),  # the older name
        ({"x-llm-d-slo-ttft-ms": "100", "x-slo-ttft-ms": "900"}, 0.1),  # the current name first
    ],
)
def test_the_slo_header_is_read_in_milliseconds(headers: dict[str, str], expected: float | None) -> None:
    assert gateway_headers.ttft_slo_s(headers) == expected


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan", "inf", ""])
def test_an_slo_header_the_gate_cannot_read_is_a_400(value: str) -> None:
    with pytest.raises(BadRequest, match="x-llm-d-slo-ttft-ms must be a positive number of milliseconds"):
        gateway_headers.ttft_slo_s({"x-llm-d-slo-ttft-ms": value})


async def test_the_objective_names_the_class_after_slogates_own_header(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, two_classes(), **QUIET) as gate:  # type: ignore[arg-type]
        fake.release()
        for headers, expected in (
            ({"x-llm-d-inference-objective": "Batch"}, "batch"),
            ({"x-llm-d-inference-objective": "batch", "X-Slogate-Class": "interactive"}, "interactive"),
            ({"x-llm-d-inference-objective": "unknown"}, "batch"),  # the default class (the lowest)
        ):
            async with gate.session.post(gate.url + "/completion", json=TOKENS, headers=headers) as response:
                await response.read()
                assert response.status == 200
                assert response.headers["X-Slogate-Class"] == expected
                assert response.headers[gateway_headers.QUEUE_DURATION_MS].isdigit()


async def test_the_fairness_id_names_the_tenant(tmp_path: Path) -> None:
    thresholds = thresholds_for(smollm2_profile(), tenants={})
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:
        fake.release()
        headers = {"x-llm-d-inference-fairness-id": "team-a"}
        async with gate.session.post(gate.url + "/completion", json=TOKENS, headers=headers) as response:
            await response.read()
            assert response.status == 200
        state = await gate.state()
        assert "team-a" in state["tenants"]["accounts"]


async def test_a_tighter_slo_sheds_what_the_class_would_admit_in_the_gateways_words(tmp_path: Path) -> None:
    thresholds = thresholds_for(smollm2_profile(), slo={"ttftSeconds": 10.0}, deferral={"maxWaitSeconds": 0.0})
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:
        held = await hold(gate, fake, 300)  # about a second of prefill queued ahead
        body = {"prompt": [1] * 100, "n_predict": 4}
        tight = {"x-llm-d-slo-ttft-ms": "700"}  # its own prefill fits, not behind the queue
        async with gate.session.post(gate.url + "/completion", json=body, headers=tight) as response:
            refused = await response.json()
            assert response.status == 429
            assert response.headers[gateway_headers.DROPPED_REASON] == gateway_headers.SATURATED
            assert response.headers["Retry-After"].isdigit()
        assert refused["slogate"]["reasons"] == ["ttft"]
        # Looser than the class's 10 s: the class's holds, and the same request is admitted.
        loose = await hold(gate, fake, 100, **{"x-llm-d-slo-ttft-ms": "600000"})
        bad = await ask(gate, body, headers={"x-llm-d-slo-ttft-ms": "fast"})
        assert bad.status == 400
        assert bad.body["error"]["param"] == "x-llm-d-slo-ttft-ms"
        fake.release()
        assert [await held, await loose] == [200, 200]
