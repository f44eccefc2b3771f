"""The reject-latency benchmark's client: one probe at a time, to every layer in turn.

A probe is the same POST everywhere (a chat-sized completion request in the probes' own
class), on a fresh TCP connection as the benchmarks' clients make them (no keep-alive), timed
from sending to the whole answer read. Two clients time it:

- aiohttp, as the benchmarks' load generator (``load.py``) does: the number docs/benchmarks.md publishes;
- curl (C, libcurl), its own ``time_total``, the process start left out: what a client with
  no Python in it sees, so that the Python client's own share can be told apart.

Rounds go through every target in a fresh random order, with a random pause after each probe,
so machine drift and periodic stalls hit every layer alike.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp

Client = Literal["aiohttp", "curl"]
PROBE_CLASS = "probe"
PROBE_BODY = json.dumps(
    {"prompt": list(range(1000, 1100)), "n_predict": 32, "stream": True, "cache_prompt": False}
).encode()
"""A chat-sized request (100 prompt tokens, the mix's median), the same bytes to every layer."""
PROBE_HEADERS = {"Content-Type": "application/json", "X-Slogate-Class": PROBE_CLASS}
PROBE_TIMEOUT_S = 5.0
REJECTED = 429


@dataclass(frozen=True)
class Target:
    """Where a probe goes, and which client times it."""

    url: str
    client: Client = "aiohttp"


def curl_argv(url: str, body_file: Path, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """curl POSTing ``body_file`` with the probe's headers; it prints ``STATUS SECONDS``.
    (``Expect:`` empty: no 100-continue round trip, which curl may ask for before a body.)"""
    headers = [arg for name, value in PROBE_HEADERS.items() for arg in ("-H", f"{name}: {value}")]
    return [
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{time_total}",
        "-m",
        f"{timeout_s:g}",
        "-X",
        "POST",
        *headers,
        "-H",
        "Expect:",
        "--data-binary",
        f"@{body_file}",
        url,
    ]


def parse_curl(output: str) -> tuple[int, float]:
    """``429 0.001234`` -> (429, 0.001234); curl's 000 (no answer) is status 0."""
    status, seconds = output.split()
    return int(status), float(seconds)


async def probe(session: aiohttp.ClientSession, url: str) -> tuple[int, float]:
    """(status, seconds from sending to the whole answer read); status 0 for no answer. A probe the
    gate admits (200) is hung up on at once: its generation is aborted, and it is no rejection."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S), session.post(url, data=PROBE_BODY, headers=PROBE_HEADERS) as r:
            if r.status == 200:
                r.close()
                return 200, time.perf_counter() - started
            await r.read()
            return r.status, time.perf_counter() - started
    except (TimeoutError, aiohttp.ClientError):
        return 0, time.perf_counter() - started


async def probe_curl(url: str, body_file: Path) -> tuple[int, float]:
    """The same probe by curl, timed by curl itself."""
    child = await asyncio.create_subprocess_exec(
        *curl_argv(url, body_file), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await child.communicate()
    try:
        return parse_curl(out.decode())
    except ValueError:
        return 0, PROBE_TIMEOUT_S


def run_queue_wait_s() -> float:
    """Seconds this thread has spent runnable but not running (``/proc/thread-self/schedstat``):
    across a probe, how long the probing client itself waited for a CPU."""
    return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9


class Prober:
    """Both clients, ready: an aiohttp session with a fresh connection per request, curl's body file."""

    def __init__(self, session: aiohttp.ClientSession, body_file: Path) -> None:
        self.session = session
        self.body_file = body_file
        body_file.write_bytes(PROBE_BODY)

    async def one(self, target: Target) -> tuple[int, float]:
        """One probe of ``target`` with its client."""
        if target.client == "curl":
            return await probe_curl(target.url, self.body_file)
        return await probe(self.session, target.url)

    async def window(
        self, targets: dict[str, Target], seconds: float, gap_ms: tuple[float, float], rng: random.Random
    ) -> dict[str, dict[str, Any]]:
        """Rounds of one probe per target, in a fresh shuffled order each round, until ``seconds``
        pass: per target the 429s' latencies and a count of every other status."""
        found: dict[str, dict[str, Any]] = {
            key: {"rejected_s": [], "client_wait_s": [], "other": Counter()} for key in targets
        }
        order = list(targets)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            rng.shuffle(order)
            for key in order:
                waited = run_queue_wait_s()
                status, took = await self.one(targets[key])
                waited = run_queue_wait_s() - waited
                if status == REJECTED:
                    found[key]["rejected_s"].append(took)
                    found[key]["client_wait_s"].append(waited)
                else:
                    found[key]["other"][str(status)] += 1
                await asyncio.sleep(rng.uniform(*gap_ms) / 1e3)
        return found
