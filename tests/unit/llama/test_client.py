"""The one llama-server client against a tiny aiohttp stand-in: what it sends, what it
makes of the answers, and how each kind of caller sees a failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fake_upstream import serve
from slogate_llama.client import ADD_SPECIAL, LlamaClient, ServerProps, Timings, UpstreamError, probe_health
from slogate_llama.counters import MetricsError
from slogate_llama.exposition import IDLE, exposition

NOTHING_LISTENS = "http://127.0.0.1:9"
PROPS = {"total_slots": 4, "default_generation_settings": {"n_ctx": 2048}, "model_path": "/m.gguf",
         "model_ftype": "Q4_1"}  # fmt: skip
TIMINGS = {"prompt_n": 32, "prompt_ms": 120.0, "predicted_n": 8, "predicted_ms": 400.0, "cache_n": 0}


@dataclass
class Stand:
    """llama-server's routes, each answering ``answers[path]`` = (status, JSON or text); bodies kept."""

    answers: dict[str, tuple[int, Any]] = field(default_factory=dict)
    received: list[tuple[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.received.append((request.path, body))
        status, answer = self.answers.get(request.path, (404, "File Not Found"))
        if isinstance(answer, str):
            return web.Response(text=answer, status=status)
        return web.json_response(answer, status=status)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.handle)
        return app


@pytest.fixture
async def stand() -> AsyncIterator[tuple[Stand, str]]:
    fake = Stand()
    async with serve(fake.app()) as url:
        yield fake, url


async def test_every_tokenize_call_asks_for_the_special_tokens(stand: tuple[Stand, str]) -> None:
    fake, url = stand
    fake.answers["/tokenize"] = (200, {"tokens": [1, 2, 3]})
    async with LlamaClient(url) as client:
        assert await client.tokenize("hi there") == [1, 2, 3]
        assert await client.count_tokens("hi there") == 3
    sent = {"content": "hi there", "add_special": ADD_SPECIAL}
    assert fake.received == [("/tokenize", sent), ("/tokenize", sent)]
    assert ADD_SPECIAL is True  # what llama-server's completion routes prefill


async def test_apply_template_returns_the_prompt_text(stand: tuple[Stand, str]) -> None:
    fake, url = stand
    messages = [{"role": "user", "content": "Hi"}]
    fake.answers["/apply-template"] = (200, {"prompt": "<|im_start|>user\nHi<|im_end|>\n"})
    async with LlamaClient(url) as client:
        assert await client.apply_template(messages) == "<|im_start|>user\nHi<|im_end|>\n"
        fake.answers["/apply-template"] = (200, {"prompt": None})
        with pytest.raises(ValueError, match="NoneType prompt"):
            await client.apply_template(messages)
    assert fake.received[0] == ("/apply-template", {"messages": messages})


async def test_the_sidecars_calls_raise_aiohttps_errors(stand: tuple[Stand, str]) -> None:
    """The sidecar tells a refused prompt (400 to its client) from a down upstream (503)."""
    fake, url = stand
    fake.answers["/tokenize"] = (400, {"error": {"message": "invalid"}})
    async with LlamaClient(url) as client:
        with pytest.raises(aiohttp.ClientResponseError) as refused:
            await client.count_tokens("x")
        assert (refused.value.status, refused.value.message) == (400, "Bad Request")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError):
            await LlamaClient(NOTHING_LISTENS, session).health_status()


async def test_scrape_reads_counters_and_none_without_metrics(stand: tuple[Stand, str]) -> None:
    fake, url = stand
    fake.answers["/metrics"] = (200, exposition(IDLE))
    async with LlamaClient(url) as client:
        assert await client.scrape() == IDLE
        fake.answers["/metrics"] = (501, {"error": {"message": "This server does not support metrics endpoint."}})
        assert await client.scrape() is None
        fake.answers["/metrics"] = (200, "<html>502 Bad Gateway</html>")
        with pytest.raises(MetricsError):
            await client.scrape()


async def test_health_status_is_the_status(stand: tuple[Stand, str]) -> None:
    fake, url = stand
    async with LlamaClient(url) as client:
        fake.answers["/health"] = (503, {"error": {"message": "Loading model"}})
        assert await client.health_status() == 503
        fake.answers["/health"] = (200, {"status": "ok"})
        assert await client.health_status() == 200


async def test_calibrations_calls_read_props_counters_and_timings(stand: tuple[Stand, str]) -> None:
    fake, url = stand
    fake.answers |= {"/props": (200, PROPS), "/metrics": (200, exposition(IDLE)),
                     "/completion": (200, {"content": "x", "timings": TIMINGS})}  # fmt: skip
    async with LlamaClient(url) as client:
        assert await client.props() == ServerProps(4, 2048, "/m.gguf", "Q4_1")
        assert await client.counters() == IDLE
        timings = await client.complete([5] * 32, n_predict=8)
    assert timings == Timings(prompt_n=32, prompt_ms=120.0, predicted_n=8, predicted_ms=400.0, cache_n=0)
    assert timings.predicted_per_second == 20.0
    assert fake.received[-1] == ("/completion", {"prompt": [5] * 32, "n_predict": 8, "cache_prompt": False,
                                                 "ignore_eos": True, "temperature": 0.0})  # fmt: skip


@pytest.mark.parametrize(
    ("path", "answer", "call", "message"),
    [
        ("/props", (200, {"slots": 4}), "props", "lacks llama-server's fields.*is it llama-server"),
        ("/props", (200, "<html></html>"), "props", "/props did not answer JSON: is it llama-server"),
        ("/props", (500, "boom"), "props", "GET /props answered 500: boom; is it llama-server"),
        ("/metrics", (501, "no metrics"), "counters", "GET /metrics answered 501: no metrics"),
        ("/metrics", (200, ""), "counters", "metrics missing.*--metrics"),
        ("/tokenize", (200, {"tokens": None}), "tokenize", "without token ids"),
        ("/completion", (200, {"content": "x"}), "complete", "without timings"),
    ],
)
async def test_calibrations_calls_fail_with_one_sentence(
    stand: tuple[Stand, str], path: str, answer: tuple[int, Any], call: str, message: str
) -> None:
    fake, url = stand
    fake.answers[path] = answer
    calls = {"props": lambda c: c.props(), "counters": lambda c: c.counters(), "tokenize": lambda c: c.tokenize("x"),
             "complete": lambda c: c.complete([1], 1)}  # fmt: skip
    async with LlamaClient(url) as client:
        with pytest.raises(UpstreamError, match=message):
            await calls[call](client)


async def test_an_unreachable_upstream_is_one_sentence_too() -> None:
    async with LlamaClient(NOTHING_LISTENS) as client:
        with pytest.raises(UpstreamError, match=r"upstream http://127.0.0.1:9 unreachable \(GET /props\)"):
            await client.props()


async def test_a_borrowed_session_stays_open_an_own_one_closes(stand: tuple[Stand, str]) -> None:
    fake, url = stand
    fake.answers["/health"] = (200, {"status": "ok"})
    async with aiohttp.ClientSession() as session:
        async with LlamaClient(url, session) as client:
            assert await client.health_status() == 200
        assert not session.closed
        assert await LlamaClient(url, session).health_status() == 200  # no `async with` needed
    with pytest.raises(RuntimeError, match="outside `async with`"):
        await LlamaClient(url).health_status()


def loading_server(answers: list[int], calls: list[int]) -> web.Application:
    """/health answers each status of ``answers`` in turn (503: loading), then 200; appends to ``calls``."""
    app = web.Application()

    async def health(_request: web.Request) -> web.Response:
        status = answers.pop(0) if answers else 200
        calls.append(status)
        return web.json_response({"status": "loading" if status != 200 else "ok"}, status=status)

    app.router.add_get("/health", health)
    return app


async def test_wait_returns_once_health_answers_200() -> None:
    calls: list[int] = []
    async with serve(loading_server([503, 503, 503], calls)) as url, LlamaClient(url) as client:
        await client.wait_healthy(30, poll_s=0.01)
    assert calls == [503, 503, 503, 200]  # loading, then ready: no call after the 200


async def test_wait_gives_up_naming_the_last_answer() -> None:
    async with serve(loading_server([503] * 1000, [])) as url, LlamaClient(url) as client:
        with pytest.raises(UpstreamError, match="answered 503"):
            await client.wait_healthy(0.2, poll_s=0.01)


async def test_the_synchronous_probe_reads_the_status_or_nothing_listening() -> None:
    calls: list[int] = []
    async with serve(loading_server([503], calls)) as url:
        # The probe blocks: off the loop, so the stand-in on this loop can answer it.
        assert await asyncio.to_thread(probe_health, url) == 503
        assert await asyncio.to_thread(probe_health, url + "/") == 200
    assert calls == [503, 200]
    assert await asyncio.to_thread(probe_health, NOTHING_LISTENS) is None
