"""A refusal from slogate is safe to send to another pod: nothing of it reached llama-server.

Every kind of 429 the sidecar answers (TTFT, full slots, full KV, a full deferral queue, a
deferral that ran out, the zero-token pre-check before counting, a refusal after counting,
draining)
and every 503 it answers itself (no thresholds, upstream down, upstream gone since the last
poll) is checked to carry Retry-After and to have started no generation upstream: the fake
llama-server counts every call it gets by path. The contrast: once llama-server has seen a
generation, its failures reach the client as 502 (or, mid-stream, as an error event after a
200), never as 429 or 503, so a balancer retrying 429 and 503 never runs a generation twice.
docs/routing.md, "A refusal is safe to retry".
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from canned_profiles import smollm2_profile
from held_upstream import HeldUpstream, held_upstream, hold, until
from ports import free_ports
from sidecar_harness import DRAIN_HEADERS, Answer, ask, sidecar_in_front_of, thresholds_for
from slogate_admission.decision import Outcome, Request
from slogate_admission.schema import Thresholds

QUIET = {"poll_interval_s": 3600.0, "upstream_read_timeout_s": 10.0}
"""One upstream poll at start, then none: every later upstream call is the request's. (A
request admitted by mistake would wait for a held generation: it fails in 10 s, not 60.)"""


def policy(slo: float = 2.0, cap: int = 4, max_wait: float | None = None) -> Thresholds:
    """One class."""
    return thresholds_for(
        smollm2_profile(), slo={"ttftSeconds": slo}, concurrency={"max": cap}, deferral={"maxWaitSeconds": max_wait}
    )


def safe_to_retry(answer: Answer, status: int, fake: HeldUpstream | None, generations_before: int) -> None:
    """A refusal a balancer may send elsewhere: its status, a Retry-After, and no generation upstream."""
    assert answer.status == status, answer
    assert answer.retry_after is not None, answer
    assert answer.retry_after.isdigit(), answer.retry_after
    assert int(answer.retry_after) >= 1
    if fake is not None:
        assert fake.generations == generations_before, fake.calls


TOKENS = {"prompt": [1] * 50, "n_predict": 4}
"""A prompt of counted tokens: no /tokenize call is needed to know its size."""


async def test_a_ttft_refusal_and_a_refusal_after_counting_start_no_generation(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, policy(slo=2.0), **QUIET) as gate:
        held = [await hold(gate, fake, 250) for _ in range(2)]  # 1.5 s of prefill queued, SLO 2 s
        before = fake.generations

        ttft = await ask(gate, {"prompt": [1] * 250, "n_predict": 4})
        safe_to_retry(ttft, 429, fake, before)
        assert ttft.reasons == ["ttft"]

        # Text is counted by llama-server's /tokenize once an empty prompt would pass: that call
        # generates nothing and holds no slot; the refusal that follows starts no generation.
        assert gate.sidecar.gate.decide(Request(0, 4)).outcome is Outcome.ADMIT
        tokenized = fake.calls["/tokenize"]
        counted = await ask(gate, {"prompt": "x" * 800, "n_predict": 4})  # the fake counts 200 tokens
        safe_to_retry(counted, 429, fake, before)
        assert counted.reasons == ["ttft"]
        assert fake.calls["/tokenize"] == tokenized + 1

        fake.release()
        assert await asyncio.gather(*held) == [200, 200]


async def test_full_slots_are_refused_before_counting_the_prompt(tmp_path: Path) -> None:
    async with (
        held_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, policy(cap=1, max_wait=0.0), **QUIET) as gate,
    ):
        held = await hold(gate, fake, 20)
        before, tokenized = fake.generations, fake.calls["/tokenize"]
        for body in (TOKENS, {"prompt": "a text prompt, counted only if an empty one would pass", "n_predict": 4}):
            answer = await ask(gate, body)
            safe_to_retry(answer, 429, fake, before)
            assert answer.reasons == ["concurrency"]
        assert fake.calls["/tokenize"] == tokenized  # the zero-token pre-check refused it first
        fake.release()
        assert await held == 200


async def test_a_full_kv_cache_is_refused(tmp_path: Path) -> None:
    # Half the calibrated cache, so that KV binds before the four slots do.
    thresholds = policy(max_wait=0.0).model_copy(update={"kv_capacity_tokens": 4096})
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:
        held = [await hold(gate, fake, 10, n_predict=1500) for _ in range(2)]  # 3,020 of 4,096 cells
        before = fake.generations
        answer = await ask(gate, {"prompt": [1] * 10, "n_predict": 1500})
        safe_to_retry(answer, 429, fake, before)
        assert answer.reasons == ["kv"]
        fake.release()
        assert await asyncio.gather(*held) == [200] * 2


async def test_a_request_an_idle_gate_refuses_too_gets_400_without_retry_after(tmp_path: Path) -> None:
    # The README walkthrough's classes (--slo-ttft 10 --classes interactive:1:1,batch): batch
    # inherits interactive's 1 s budget, and a 360-token prompt needs more than that alone at
    # the margin. It was a 429 "retry after 1 s" for ever; a retry never helps, so it is a 400.
    thresholds = thresholds_for(
        smollm2_profile(),
        slo={"ttftSeconds": 10.0},
        classes=[{"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1}, {"name": "batch"}],
    )
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:
        before = fake.generations
        answer = await ask(gate, {"prompt": [1] * 360, "n_predict": 4}, headers={"X-Slogate-Class": "batch"})
        assert answer.status == 400, answer
        assert answer.retry_after is None
        assert answer.body["error"]["code"] == "slogate_request_too_large"
        assert answer.body["slogate"]["neverFits"] == ["ttft"]
        assert answer.body["slogate"]["retryAfterSeconds"] is None
        assert "class 'batch'" in answer.body["error"]["message"]
        assert fake.generations == before
        # The same gate, the same class, a prompt an idle gate admits: served.
        fake.release()
        short = await ask(gate, {"prompt": [1] * 40, "n_predict": 4}, headers={"X-Slogate-Class": "batch"})
        assert short.status == 200, short
        assert fake.generations == before + 1


async def test_a_wait_no_stream_end_can_serve_is_refused_at_once(tmp_path: Path) -> None:
    thresholds = policy(cap=1, max_wait=30.0)
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:
        held = await hold(gate, fake, 20)
        before = fake.generations
        waiting = asyncio.create_task(ask(gate, TOKENS))  # it waits for the one stream's end ...
        await until(lambda: gate.sidecar.gate.deferred == 1)
        answer = await ask(gate, TOKENS)  # ... and no end is left for this one: refused now
        safe_to_retry(answer, 429, fake, before)
        assert answer.reasons == ["concurrency", "queue_full"]
        assert gate.sidecar.gate.deferred == 1
        fake.release()
        assert await held == 200
        assert (await waiting).status == 200


async def test_a_deferral_that_runs_out_is_refused(tmp_path: Path) -> None:
    thresholds = policy(cap=1, max_wait=0.3)
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:
        held = await hold(gate, fake, 20)
        before = fake.generations
        waiting = asyncio.create_task(ask(gate, TOKENS))
        await until(lambda: gate.sidecar.gate.deferred == 1)
        assert gate.sidecar.gate.deferred == 1  # it waited for the slot ...
        answer = await waiting  # ... which stayed busy past its deadline
        safe_to_retry(answer, 429, fake, before)
        assert answer.reasons == ["concurrency"]
        fake.release()
        assert await held == 200


async def test_a_draining_sidecar_refuses_with_429(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, policy(), **QUIET) as gate:
        # The llama.cpp container's preStop hook; with nothing admitted it answers at once.
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as response:
            assert response.status == 200
        for body in (TOKENS, {"prompt": "some text", "n_predict": 4}):
            answer = await ask(gate, body)
            safe_to_retry(answer, 429, fake, 0)
            assert answer.body["error"]["code"] == "slogate_draining"
        assert fake.calls["/tokenize"] == 0


async def test_without_thresholds_the_sidecar_answers_503_itself(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, None, **QUIET) as gate:
        for body in (TOKENS, {"prompt": "some text", "n_predict": 4}):
            safe_to_retry(await ask(gate, body), 503, fake, 0)
        assert fake.calls["/tokenize"] == 0


async def test_with_the_upstream_down_the_sidecar_answers_503_itself(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, policy(), poll_interval_s=0.1) as gate:
        fake.healthy = False
        await until(lambda: not gate.sidecar.upstream_up)
        assert not gate.sidecar.upstream_up
        for body in (TOKENS, {"prompt": "some text", "n_predict": 4}):
            safe_to_retry(await ask(gate, body), 503, fake, 0)
        assert fake.calls["/tokenize"] == 0


async def test_an_upstream_gone_since_the_last_poll_gets_503(tmp_path: Path) -> None:
    (nothing_there,) = free_ports()
    async with sidecar_in_front_of(f"http://127.0.0.1:{nothing_there}", tmp_path, policy(), **QUIET) as gate:
        gate.sidecar.upstream_up = True  # the last poll found it; it has died since
        safe_to_retry(await ask(gate, TOKENS), 503, None, 0)
        assert not gate.sidecar.upstream_up  # the refused connection marked it down


async def test_once_a_generation_reached_llama_server_no_failure_is_429_or_503(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, policy(), **QUIET) as gate:
        for status, relayed in ((503, 502), (500, 502), (400, 400)):
            fake.answer_status = status
            before = fake.generations
            answer = await ask(gate, TOKENS)
            assert answer.status == relayed, (status, answer)
            assert answer.retry_after is None
            assert fake.generations == before + 1  # this one did reach llama-server
        assert await gate.wait_idle()


async def test_the_overload_status_is_a_setting_for_every_shed_and_nothing_else(tmp_path: Path) -> None:
    """--overload-status 529 (NVIDIA Dynamo's): the gate's refusal and a drain's answer 529 with
    their Retry-After, starting no generation; a request that never fits stays a 400, and the
    sheds' retries are still told from first tries (offered_demand keeps their keys)."""
    quiet = {**QUIET, "overload_status": 529}
    async with (
        held_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, policy(cap=1, max_wait=0.0), **quiet) as gate,
    ):
        held = await hold(gate, fake, 20)
        before = fake.generations
        shed = await ask(gate, TOKENS, headers={"Idempotency-Key": "same"})
        safe_to_retry(shed, 529, fake, before)
        assert shed.reasons == ["concurrency"]
        retried = gate.sidecar.metrics.retried_requests._value.get()
        again = await ask(gate, TOKENS, headers={"Idempotency-Key": "same"})
        assert again.status == 529
        assert gate.sidecar.metrics.retried_requests._value.get() == retried + 1
        huge = await ask(gate, {"prompt": [1] * 4000, "n_predict": 4})
        assert huge.status == 400
        fake.release()
        assert await held == 200
        # The drain hook answers once nothing is admitted.
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as response:
            assert response.status == 200
        generations = fake.generations
        draining = await ask(gate, TOKENS)
        safe_to_retry(draining, 529, fake, generations)
        assert draining.body["error"]["code"] == "slogate_draining"
