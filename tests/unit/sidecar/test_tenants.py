"""Tenants at the sidecar, through HTTP: who a request's tenant is, the 429 ``tenant_share``,
the served tokens corrected to llama-server's count, and what /metrics and /state show.

The share rule itself is the core's (``slogate_admission.tenant_shares``, tested there);
here the fake llama-server holds generations before their first token, so the prompts an
admitted request brings stay in its tenant's holdings while the test looks. On the canned
profile a 3 s SLO gives the class a budget of about 1,000 queued prompt tokens, so with two
tenants active each may hold about 500.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from held_upstream import held_upstream, hold, until
from sidecar_harness import RunningSidecar, ask, sidecar_in_front_of, thresholds_for
from slogate_admission.schema import Thresholds
from slogate_admission.tenant_schema import OTHER_TENANTS
from slogate_llama.routes import Route
from slogate_sidecar.prompt_tokens import estimate_prompt_tokens
from slogate_sidecar.requests import parse_request
from slogate_sidecar.tenants import TENANT_SERIES

QUIET = {"poll_interval_s": 3600.0, "upstream_read_timeout_s": 10.0}
"""One upstream poll at start, then none: every later upstream call is a request's."""
TENANT = "X-Slogate-Tenant"


def policy(tenants: dict[str, Any] | None = None, **more: Any) -> Thresholds:
    """One class, SLO 3 s, four slots; ``tenants``: the policy's ``tenants`` (None: none)."""
    extra = {"tenants": tenants} if tenants is not None else {}
    return thresholds_for(smollm2_profile(), **extra, **more)


async def tenant_samples(gate: RunningSidecar) -> dict[str, dict[str, float]]:
    """Every ``slogate_tenant_*`` sample of /metrics: series -> tenant -> value."""
    async with gate.session.get(gate.admin_url + "/metrics") as response:
        text = await response.text()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("slogate_tenant_"):
                out.setdefault(sample.name, {})[sample.labels["tenant"]] = sample.value
    return out


def by(name: str) -> dict[str, str]:
    return {TENANT: name}


async def test_a_tenant_over_its_share_is_refused_while_the_other_is_admitted(tmp_path: Path) -> None:
    async with (
        held_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, policy(tenants={}), **QUIET) as gate,
    ):
        held = [await hold(gate, fake, 50, **by("team-b")), await hold(gate, fake, 300, **by("team-a"))]
        generations = fake.generations

        # team-a holds 300 of its ~500: 300 more would take it past its share (the server has room).
        over = await ask(gate, {"prompt": [1] * 300, "n_predict": 4}, by("team-a"))
        assert over.status == 429, over
        assert over.reasons == ["tenant_share"]
        assert over.body["error"]["code"] == "slogate_rejected"
        assert "fair share" in over.body["error"]["message"]
        assert over.retry_after is not None
        assert over.retry_after.isdigit()
        assert int(over.retry_after) >= 1
        assert fake.generations == generations  # nothing of it reached llama-server

        held.append(await hold(gate, fake, 50, **by("team-b")))  # the other tenant is admitted
        held.append(await hold(gate, fake, 10, **by("team-a")))  # and team-a within its share too

        metrics = await tenant_samples(gate)
        assert set(metrics) == set(TENANT_SERIES)
        assert metrics["slogate_tenant_admitted_requests_total"] == {"team-a": 2, "team-b": 2, OTHER_TENANTS: 0}
        assert metrics["slogate_tenant_admitted_prompt_tokens_total"] == {
            "team-a": 310,
            "team-b": 100,
            OTHER_TENANTS: 0,
        }
        assert metrics["slogate_tenant_refused_requests_total"] == {"team-a": 1, "team-b": 0, OTHER_TENANTS: 0}
        assert metrics["slogate_tenant_refused_prompt_tokens_total"] == {"team-a": 300, "team-b": 0, OTHER_TENANTS: 0}
        assert metrics["slogate_tenant_share_refusals_total"] == {"team-a": 1, "team-b": 0, OTHER_TENANTS: 0}
        assert metrics["slogate_tenant_held_prompt_tokens"] == {"team-a": 310, "team-b": 100, OTHER_TENANTS: 0}
        assert metrics["slogate_tenant_weight"] == {"team-a": 1, "team-b": 1, OTHER_TENANTS: 1}
        served = metrics["slogate_tenant_served_tokens"]
        assert served["team-a"] > served["team-b"] > served[OTHER_TENANTS] == 0

        state = (await gate.state())["tenants"]
        assert state["header"] == TENANT
        assert state["activeWeight"] == {"default": 2.0}
        team_a = state["accounts"]["team-a"]
        assert team_a["heldPromptTokens"] == {"default": 310}
        assert (team_a["requestsInside"], team_a["shareRefusals"], team_a["listed"]) == (2, 1, False)

        fake.release()
        assert await asyncio.gather(*held) == [200] * 4
        assert await gate.wait_idle()
        metrics = await tenant_samples(gate)
        assert metrics["slogate_tenant_held_prompt_tokens"] == {"team-a": 0, "team-b": 0, OTHER_TENANTS: 0}
        accounts = (await gate.state())["tenants"]["accounts"]
        assert {name: a["requestsInside"] for name, a in accounts.items()} == {"team-a": 0, "team-b": 0, "_other": 0}


async def test_without_a_tenant_policy_tenants_change_nothing_and_have_no_series(tmp_path: Path) -> None:
    async with (
        held_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, policy(), api_key_tenants={"key-a": "team-a"}, **QUIET) as gate,
    ):
        held = [await hold(gate, fake, 50, **by("team-b")), await hold(gate, fake, 300, **by("team-a"))]
        # What the tenant policy refuses above is admitted: the header is not read at all.
        held.append(await hold(gate, fake, 300, **by("team-a"), Authorization="Bearer key-a"))
        assert gate.sidecar.gate.machine.tenants is None
        assert await tenant_samples(gate) == {}
        assert (await gate.state())["tenants"] is None
        fake.release()
        assert await asyncio.gather(*held) == [200] * 3


async def test_the_header_is_the_thresholds_and_an_api_key_names_a_tenant_without_it(tmp_path: Path) -> None:
    thresholds = policy(tenants={"header": "X-Team", "weights": {"team-a": 2.5}})
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds, api_key_tenants={"key-c": "team-c"}, **QUIET) as gate,
    ):
        sent = [
            ({"X-Team": "team-a"}, "team-a"),
            ({"X-Team": "team-a", "Authorization": "Bearer key-c"}, "team-a"),  # the header first
            ({TENANT: "team-b"}, OTHER_TENANTS),  # not the header these thresholds name
            ({"Authorization": "Bearer key-c"}, "team-c"),
            ({"Authorization": "Bearer key-unknown"}, OTHER_TENANTS),
            ({}, OTHER_TENANTS),
        ]
        for headers, _ in sent:
            assert (await ask(gate, {"prompt": [1] * 20, "n_predict": 2}, headers)).status == 200
        assert await gate.wait_idle()
        metrics = await tenant_samples(gate)
        expected = {name: sum(1 for _, n in sent if n == name) for _, name in sent}
        assert metrics["slogate_tenant_admitted_requests_total"] == expected
        assert metrics["slogate_tenant_admitted_prompt_tokens_total"] == {k: 20 * v for k, v in expected.items()}
        assert metrics["slogate_tenant_weight"] == {"team-a": 2.5, "team-c": 1, OTHER_TENANTS: 1}
        state = (await gate.state())["tenants"]
        assert state["header"] == "X-Team"
        assert state["accounts"]["team-a"]["listed"] is True
        assert state["accounts"]["team-c"]["listed"] is False


async def test_a_flood_of_tenant_names_gets_at_most_max_tracked_plus_one_labels(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, policy(tenants={"maxTracked": 3}), **QUIET) as gate,
    ):
        names = [f"tenant-{i}" for i in range(10)]
        invalid = ["_other", "_sneaky", "has space", "x" * 129, "semi;colon"]
        for name in names + invalid:
            assert (await ask(gate, {"prompt": [1] * 20, "n_predict": 2}, by(name))).status == 200
        assert await gate.wait_idle()
        metrics = await tenant_samples(gate)
        for series in TENANT_SERIES:
            assert set(metrics[series]) == {"tenant-0", "tenant-1", "tenant-2", OTHER_TENANTS}, series
        admitted = metrics["slogate_tenant_admitted_requests_total"]
        # The first three have accounts of their own; the other seven and every invalid name share one.
        assert admitted == {"tenant-0": 1, "tenant-1": 1, "tenant-2": 1, OTHER_TENANTS: 7 + len(invalid)}
        assert len((await gate.state())["tenants"]["accounts"]) == 4


async def test_served_tokens_are_corrected_to_llama_servers_count_when_it_is_known(tmp_path: Path) -> None:
    # An output token weighs 1 here, and the counters barely decay in the test's time.
    thresholds = policy(tenants={"outputWeight": 1.0, "halfLifeSeconds": 86400})
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:

        async def generate(tenant: str) -> int:
            body = {"prompt": [1] * 100, "n_predict": 50}  # one answer, reassembled: its usage read whole
            async with gate.session.post(gate.url + "/completion", json=body, headers=by(tenant)) as response:
                await response.read()
                return response.status

        completed = asyncio.create_task(generate("done"))
        abandoned = asyncio.create_task(generate("gone"))
        await until(lambda: fake.started == 2)
        assert fake.started == 2
        served = (await tenant_samples(gate))["slogate_tenant_served_tokens"]
        # Charged at admission: n_in + n_out as booked (n_predict).
        assert served["done"] == pytest.approx(150, rel=1e-3)
        assert served["gone"] == pytest.approx(150, rel=1e-3)

        abandoned.cancel()  # the client leaves: nothing says how many tokens it got
        await until(lambda: gate.sidecar.gate.ledger.streams == 1)
        fake.release()  # the other ends, llama-server saying it generated 2 tokens
        assert await completed == 200
        assert await gate.wait_idle()
        served = (await tenant_samples(gate))["slogate_tenant_served_tokens"]
        assert served["done"] == pytest.approx(102, rel=1e-3)
        assert served["gone"] == pytest.approx(150, rel=1e-3)


async def test_refusals_before_the_prompt_is_counted_are_in_the_tenants_books(tmp_path: Path) -> None:
    """The zero-token pre-check (no /tokenize call) is its tenant's arrival: counted, and under the share rule."""
    async with (
        held_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, policy(tenants={}), **QUIET) as gate,
    ):
        # team-a alone is not limited: it takes 600 of the ~1,000 tokens. Then team-b is active.
        held = [await hold(gate, fake, 300, **by("team-a")), await hold(gate, fake, 300, **by("team-a"))]
        held.append(await hold(gate, fake, 50, **by("team-b")))
        tokenized = fake.calls["/tokenize"]

        text = {"prompt": "a text prompt, counted by llama-server only if an empty one would pass", "n_predict": 4}
        over = await ask(gate, text, by("team-a"))  # past its share before any token of its own
        assert (over.status, over.reasons) == (429, ["tenant_share"])
        assert fake.calls["/tokenize"] == tokenized

        # team-b takes the last slot; team-c then finds none. It holds none of its share of the
        # streams and nothing waits ahead of it, so it may wait for the soonest stream end: the
        # pre-check passes, its prompt is counted, and its wait runs out (no stream ends).
        held.append(await hold(gate, fake, 10, **by("team-b")))
        full = await ask(gate, text, by("team-c"))
        assert full.status == 429
        assert "concurrency" in full.reasons
        assert "tenant_share" not in full.reasons  # team-c holds nothing
        assert fake.calls["/tokenize"] == tokenized + 1

        thresholds = gate.sidecar.gate.thresholds
        assert thresholds is not None
        assert thresholds.tokens_per_char is not None
        parsed = parse_request(Route.NATIVE, json.dumps(text).encode(), max_body_bytes=1 << 20, max_output_tokens=99)
        estimate = estimate_prompt_tokens(parsed, thresholds.tokens_per_char)
        metrics = await tenant_samples(gate)
        assert metrics["slogate_tenant_refused_requests_total"] == {"team-a": 1, "team-b": 0, "team-c": 1, "_other": 0}
        assert metrics["slogate_tenant_refused_prompt_tokens_total"]["team-a"] == estimate
        assert metrics["slogate_tenant_share_refusals_total"] == {"team-a": 1, "team-b": 0, "team-c": 0, "_other": 0}
        # Refused before counting, team-c is active all the same: its share is held for it.
        assert (await gate.state())["tenants"]["activeWeight"] == {"default": 3.0}

        fake.release()
        assert await asyncio.gather(*held) == [200] * 4
