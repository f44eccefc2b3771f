"""The reject-latency benchmark's background load: the bench's open loop, in a process of its own.

The benchmarks measure rejection latency in the load generator itself; to take each layer's
floor, the probes run in a client of their own, and the load (the chat mix at a multiple of
μ, Poisson, as ``load.open_loop`` sends it) comes from this process, so that its work
(streaming and parsing the admitted requests) is on the machine, as in the benchmarks, but
not in the probing client's event loop.

Run: ``python -m slogate_bench.live.floor_load URL RATE_RPS SECONDS [--seed N]``. It runs until
its arrivals end or SIGTERM, then prints what became of the requests that ended (one JSON
object: outcome -> count, ``ended`` and ``within_slo``); requests still in flight at SIGTERM are abandoned
(their connections close, and the gate aborts them upstream).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections import Counter

from slogate_bench.live.load import open_loop
from slogate_bench.results import Result
from slogate_sim.workloads import preset


async def drive(url: str, rate_rps: float, seconds: float, seed: int, slo_s: float) -> dict[str, int]:
    """Open-loop chat traffic to ``url`` until the arrivals end or SIGTERM; the outcome counts
    (and ``within_slo``: served with the first token within ``slo_s``)."""
    counts: Counter[str] = Counter()

    def ended(result: Result) -> None:
        counts[result.outcome] += 1
        counts["ended"] += 1
        if result.outcome == "ok" and result.ttft_s is not None and result.ttft_s <= slo_s:
            counts["within_slo"] += 1

    task = asyncio.create_task(open_loop(url, rate_rps, seconds, preset("chat"), seed=seed, progress=ended))
    at_stop: list[Counter[str]] = []

    def stop() -> None:
        at_stop.append(counts.copy())  # what ended before the stop: the abandoned ones are not outcomes
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return dict(at_stop[0] if at_stop else counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("rate_rps", type=float)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--seed", type=int, default=400)
    parser.add_argument("--slo", type=float, default=2.0, help="TTFT SLO, seconds, for the within_slo count")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(drive(args.url, args.rate_rps, args.seconds, args.seed, args.slo))), flush=True)


if __name__ == "__main__":
    main()
