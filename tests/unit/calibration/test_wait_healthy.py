"""The calibrator waits for a llama-server that is still loading its model (a calibration
Job starts both at once; no kubelet probe can reach a server on loopback)."""

from __future__ import annotations

import pytest
from aiohttp import web

from fake_upstream import serve
from slogate_calibration.calibrate import CalibrationError, CalibrationSettings, calibrate
from slogate_calibration.upstream import LlamaClient, UpstreamError


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


async def test_calibrate_names_the_wait_stage_when_nothing_ever_listens() -> None:
    settings = CalibrationSettings(upstream="http://127.0.0.1:9", wait_s=0.3)
    with pytest.raises(CalibrationError, match=r"stage 'wait'.*not healthy within 0\.3 s"):
        await calibrate(settings)
