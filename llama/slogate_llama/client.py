"""The one client of llama-server's HTTP API, and a /health probe for code without a loop.

Two kinds of caller fail differently, so the calls come in two groups:

* the sidecar's (``health_status``, ``scrape``, ``apply_template``, ``count_tokens``)
  raise aiohttp's own errors as they come, because the sidecar answers each one its own
  way: a refused connection is a 503 (and marks the upstream down), silence a 504, a
  prompt llama-server refuses (``aiohttp.ClientResponseError``, 4xx) the client's 400,
  anything else a 502. An answer without llama-server's fields raises KeyError or
  ValueError (``MetricsError`` for /metrics).
* calibration's (``wait_healthy``, ``props``, ``counters``, ``tokenize``, ``complete``)
  raise ``UpstreamError``, one sentence saying what was tried and what came back
  ("unreachable", "not llama-server", "answered 500"): calibration is run by people and
  by Kubernetes Jobs, and a traceback helps neither.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import aiohttp

from slogate_llama.counters import LlamaCounters, MetricsError

__all__ = ["ADD_SPECIAL", "LlamaClient", "ServerProps", "Timings", "UpstreamError", "probe_health", "tokenize_body"]

ADD_SPECIAL = True
"""Every /tokenize call asks for the special tokens a prompt gets (``add_special``).

A count is only useful as what a prompt costs, and llama-server's completion routes
tokenize a text prompt with ``add_special`` on: a model whose GGUF sets
``tokenizer.ggml.add_bos_token`` prefills a BOS token /tokenize leaves out by default.
So the sidecar's n_in and calibration's tokens per character (which the sidecar's
estimate mode multiplies by a prompt's characters) both count it. Calibration also
builds its timing prompts from these ids; they are sent as token ids, which llama-server
prefills verbatim, so a BOS among them is one more token of the exact length asked for.
(The bundled SmolLM2 declares no BOS: its counts are the same either way.)"""


def tokenize_body(text: str) -> dict[str, object]:
    """The /tokenize request for ``text``, under the one ``ADD_SPECIAL`` policy."""
    return {"content": text, "add_special": ADD_SPECIAL}


class UpstreamError(RuntimeError):
    """The upstream is unreachable, is not llama-server, or failed a request."""


@dataclass(frozen=True, slots=True)
class ServerProps:
    """What /props says about the server's shape."""

    total_slots: int
    """Slots (``--parallel``): requests served at once."""
    ctx_per_slot: int
    """Context cells each slot holds (``default_generation_settings.n_ctx``)."""
    model_path: str
    """The GGUF file it serves, as its command line named it ("" if not reported)."""
    model_ftype: str
    """The model's quantization as llama-server names it ("" if not reported)."""


@dataclass(frozen=True, slots=True)
class Timings:
    """llama-server's own timings of one completion (server-side, no HTTP overhead)."""

    prompt_n: int
    """Prompt tokens prefilled (cached ones excluded)."""
    prompt_ms: float
    """Milliseconds the prefill took."""
    predicted_n: int
    """Tokens generated."""
    predicted_ms: float
    """Milliseconds the generation took."""
    cache_n: int
    """Prompt tokens served from the KV cache."""

    @property
    def predicted_per_second(self) -> float:
        """Decode rate of this stream, tokens/s."""
        return self.predicted_n / (self.predicted_ms / 1000) if self.predicted_ms > 0 else 0.0


# Loopback traffic must never go through $http_proxy, whatever the environment says.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe_health(base_url: str, timeout_s: float = 2.0) -> int | None:
    """GET /health once, without an event loop: its status, or None while nothing listens.

    For starting llama-server from synchronous code (pytest fixtures, the CLI), where no
    loop runs and one inside another would fail; 503 means the model is still loading.
    """
    try:
        with _NO_PROXY_OPENER.open(base_url.rstrip("/") + "/health", timeout=timeout_s) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:  # 503 while the model loads
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


class LlamaClient:
    """llama-server's HTTP API at one base URL, over one aiohttp session.

    ``async with LlamaClient(url)`` opens a session of its own and closes it after
    (calibration); ``LlamaClient(url, session)`` borrows one it never closes (the
    sidecar's, shared with its proxy). A ``timeout`` left None is the session's.
    """

    def __init__(
        self, base_url: str, session: aiohttp.ClientSession | None = None, *, request_timeout_s: float = 120.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=5)
        self._session = session
        self._owned = False

    async def __aenter__(self) -> Self:
        if self._session is None:
            # Enough connections for every slot at once: the decode sweep runs B streams.
            connector = aiohttp.TCPConnector(limit=64)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
            self._owned = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._owned and self._session is not None:
            await self._session.close()
            self._session, self._owned = None, False

    async def _send(
        self, method: str, path: str, body: object = None, timeout: aiohttp.ClientTimeout | None = None
    ) -> aiohttp.ClientResponse:
        """The answer, its body read (so the connection is free again); aiohttp's errors as they come."""
        if self._session is None:
            raise RuntimeError("LlamaClient used outside `async with` and without a session")
        # aiohttp reads timeout=None as "no timeout at all", not as the session's.
        timeout = self._session.timeout if timeout is None else timeout
        response = await self._session.request(method, self.base_url + path, json=body, timeout=timeout)
        await response.read()
        return response

    # ------------------------------------------------------------ the sidecar's calls

    async def health_status(self, timeout: aiohttp.ClientTimeout | None = None) -> int:
        """GET /health's status: 200 once the model is loaded, 503 while it loads."""
        return (await self._send("GET", "/health", timeout=timeout)).status

    async def scrape(self, timeout: aiohttp.ClientTimeout | None = None) -> LlamaCounters | None:
        """GET /metrics parsed; None when it does not answer 200 (501: no ``--metrics``).

        Raises MetricsError for a 200 whose text is not llama-server's metrics.
        """
        response = await self._send("GET", "/metrics", timeout=timeout)
        if response.status != 200:
            return None
        return LlamaCounters.from_text(await response.text())

    async def _answer(self, path: str, body: object, timeout: aiohttp.ClientTimeout | None) -> Any:
        response = await self._send("POST", path, body, timeout)
        response.raise_for_status()
        return await response.json(content_type=None)

    async def apply_template(self, messages: object, timeout: aiohttp.ClientTimeout | None = None) -> str:
        """POST /apply-template: the prompt text the model's chat template makes of ``messages``."""
        prompt = (await self._answer("/apply-template", {"messages": messages}, timeout))["prompt"]
        if not isinstance(prompt, str):
            raise ValueError(f"/apply-template answered a {type(prompt).__name__} prompt, not text")
        return prompt

    async def count_tokens(self, text: str, timeout: aiohttp.ClientTimeout | None = None) -> int:
        """POST /tokenize: the tokens ``text`` costs as a prompt (see ``ADD_SPECIAL``)."""
        return len((await self._answer("/tokenize", tokenize_body(text), timeout))["tokens"])

    # ------------------------------------------------------------ calibration's calls

    async def _checked(self, method: str, path: str, body: object = None) -> aiohttp.ClientResponse:
        try:
            response = await self._send(method, path, body)
        except (aiohttp.ClientConnectionError, TimeoutError, OSError) as error:
            raise UpstreamError(f"upstream {self.base_url} unreachable ({method} {path}): {error}") from None
        if response.status >= 400:
            text = (await response.text(errors="replace"))[:200]
            raise UpstreamError(f"upstream {method} {path} answered {response.status}: {text}")
        return response

    async def _checked_json(self, method: str, path: str, body: object = None) -> Any:
        response = await self._checked(method, path, body)
        try:
            return await response.json(content_type=None)
        except ValueError:
            raise UpstreamError(f"upstream {path} did not answer JSON: is it llama-server?") from None

    async def wait_healthy(self, timeout_s: float, *, poll_s: float = 0.5) -> None:
        """Poll GET /health until it answers 200 (the model is loaded), or raise after ``timeout_s``.

        A calibration Job starts llama-server beside the calibrator: on loopback, where no
        kubelet probe can reach it, so the calibrator waits for it itself.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = "nothing listening"
        while True:
            try:
                status = await self.health_status(aiohttp.ClientTimeout(total=min(5.0, timeout_s)))
                if status == 200:
                    return
                last = f"/health answered {status}"  # 503 while the model loads
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                last = f"unreachable: {error}"
            if loop.time() + poll_s > deadline:
                raise UpstreamError(f"{self.base_url} was not healthy within {timeout_s:g} s ({last})")
            await asyncio.sleep(poll_s)

    async def props(self) -> ServerProps:
        """GET /props; an upstream without its llama-server fields is not llama-server."""
        try:
            raw = await self._checked_json("GET", "/props")
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
        """GET /metrics parsed into the counters (needs llama-server's ``--metrics``)."""
        response = await self._checked("GET", "/metrics")
        try:
            return LlamaCounters.from_text(await response.text())
        except MetricsError as error:
            raise UpstreamError(str(error)) from None

    async def tokenize(self, text: str) -> list[int]:
        """POST /tokenize: the model's own token ids for ``text`` (see ``ADD_SPECIAL``)."""
        raw = await self._checked_json("POST", "/tokenize", tokenize_body(text))
        try:
            return [int(t) for t in raw["tokens"]]
        except (KeyError, TypeError, ValueError) as error:
            raise UpstreamError(f"/tokenize answered without token ids ({error!r}): is it llama-server?") from None

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
        raw = await self._checked_json("POST", "/completion", body)
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
