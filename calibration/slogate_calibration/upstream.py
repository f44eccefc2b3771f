"""An async client for the llama-server endpoints calibration reads.

Every failure becomes an ``UpstreamError`` whose message says what was tried and
what came back: "unreachable", "not llama-server", "answered 500". Calibration is
run by operators and by Kubernetes Jobs; a traceback helps neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import aiohttp

from slogate_calibration.prometheus_text import LlamaCounters, MetricsError


class UpstreamError(RuntimeError):
    """The upstream is unreachable, is not llama-server, or failed a request."""


@dataclass(frozen=True, slots=True)
class ServerProps:
    """What /props says about the server's shape."""

    total_slots: int
    ctx_per_slot: int
    model_path: str
    model_ftype: str


@dataclass(frozen=True, slots=True)
class Timings:
    """llama-server's own timings of one completion (server-side, no HTTP overhead)."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int

    @property
    def predicted_per_second(self) -> float:
        """Decode rate of this stream, tokens/s."""
        return self.predicted_n / (self.predicted_ms / 1000) if self.predicted_ms > 0 else 0.0


class LlamaClient:
    """One aiohttp session against one llama-server base URL."""

    def __init__(self, base_url: str, *, request_timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=5)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        # Enough connections for every slot at once: the decode sweep runs B streams.
        connector = aiohttp.TCPConnector(limit=64)
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, path: str, body: object = None) -> aiohttp.ClientResponse:
        if self._session is None:
            raise RuntimeError("LlamaClient used outside `async with`")
        url = self.base_url + path
        try:
            response = await self._session.request(method, url, json=body)
            await response.read()
        except (aiohttp.ClientConnectionError, TimeoutError, OSError) as error:
            raise UpstreamError(f"upstream {self.base_url} unreachable ({method} {path}): {error}") from None
        if response.status >= 400:
            text = (await response.text(errors="replace"))[:200]
            raise UpstreamError(f"upstream {method} {path} answered {response.status}: {text}")
        return response

    async def _json(self, method: str, path: str, body: object = None) -> Any:
        response = await self._request(method, path, body)
        try:
            return await response.json(content_type=None)
        except ValueError:
            raise UpstreamError(f"upstream {path} did not answer JSON: is it llama-server?") from None

    async def wait_healthy(self, timeout_s: float, *, poll_s: float = 0.5) -> None:
        """Poll GET /health until it answers 200 (the model is loaded), or raise after ``timeout_s``.

        A calibration Job starts llama-server beside the calibrator: on loopback, where no
        kubelet probe can reach it, so the calibrator waits for it itself.
        """
        if self._session is None:
            raise RuntimeError("LlamaClient used outside `async with`")
        url = self.base_url + "/health"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = "nothing listening"
        while True:
            try:
                async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=min(5.0, timeout_s))) as answer:
                    if answer.status == 200:
                        return
                    last = f"/health answered {answer.status}"  # 503 while the model loads
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                last = f"unreachable: {error}"
            if loop.time() + poll_s > deadline:
                raise UpstreamError(f"{self.base_url} was not healthy within {timeout_s:g} s ({last})")
            await asyncio.sleep(poll_s)

    async def props(self) -> ServerProps:
        """GET /props; an upstream without its llama-server fields is not llama-server."""
        try:
            raw = await self._json("GET", "/props")
            return ServerProps(
                total_slots=int(raw["total_slots"]),
                ctx_per_slot=int(raw["default_generation_settings"]["n_ctx"]),
                model_path=str(raw.get("model_path", "")),
                model_ftype=str(raw.get("model_ftype", "")),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise UpstreamError(
                f"{self.base_url}/props lacks llama-server's fields ({error!r}): is it llama-server?"
            ) from None
        except UpstreamError as error:
            raise UpstreamError(f"{error}; is it llama-server?") from None

    async def counters(self) -> LlamaCounters:
        """GET /metrics parsed into the counters (needs llama-server's --metrics)."""
        response = await self._request("GET", "/metrics")
        try:
            return LlamaCounters.from_text(await response.text())
        except MetricsError as error:
            raise UpstreamError(str(error)) from None

    async def tokenize(self, text: str) -> list[int]:
        """POST /tokenize: the model's own token ids for ``text``."""
        raw = await self._json("POST", "/tokenize", {"content": text, "add_special": False})
        return [int(t) for t in raw["tokens"]]

    async def complete(self, prompt: Sequence[int], n_predict: int) -> Timings:
        """POST /completion with a token prompt; returns llama-server's timings.

        ``cache_prompt: false`` defeats prompt caching (every token is prefilled) and
        ``ignore_eos`` makes the decode length exactly ``n_predict``.
        """
        body = {
            "prompt": list(prompt),
            "n_predict": n_predict,
            "cache_prompt": False,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        raw = await self._json("POST", "/completion", body)
        try:
            t = raw["timings"]
            return Timings(
                prompt_n=int(t["prompt_n"]),
                prompt_ms=float(t["prompt_ms"]),
                predicted_n=int(t["predicted_n"]),
                predicted_ms=float(t["predicted_ms"]),
                cache_n=int(t.get("cache_n", 0)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise UpstreamError(f"/completion answered without timings ({error!r})") from None
