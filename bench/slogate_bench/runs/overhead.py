"""What the gate itself costs: the core's decision in-process, the sidecar alone on one core.

- Decision: ``decide`` timed in batches of 1,000 calls against a realistic state.
- Sidecar throughput: ``slogate sidecar`` (the benchmarks' slogate front) pinned to CPU 0,
  an instant stub upstream and ``wrk`` pinned to CPU 1. Two runs: every request rejected (the gate held
  full by one open stream, concurrency cap 1, no deferral), and every request proxied
  (a 64-slot stub server, small non-streaming requests with token prompts).

Run: .venv/bin/python -m slogate_bench.runs.overhead  (needs Debian's wrk)
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from slogate_admission.decision import GateConfig, LiveState, Request, decide
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench.live.fronts import SlogateFront
from slogate_bench.live.processes import free_port, until_ready
from slogate_bench.live.stub_upstream import HOLD_TOKEN

WRK_SCRIPT = """wrk.method = "POST"
wrk.body = '{"prompt":[1,2,3],"n_predict":1}'
wrk.headers["Content-Type"] = "application/json"
"""


def stub_profile(slots: int = 64) -> CalibrationProfile:
    """A profile for the stub: many slots, flat decode, so the gate's caps never bind."""
    return CalibrationProfile.model_validate(
        {
            "id": "stub",
            "fingerprint": "stub",
            "measuredAt": datetime.now(UTC).isoformat(),
            "model": {"name": "stub", "quantization": "none", "nLayers": 1, "nKvHeads": 1, "headDim": 1},
            "server": {"slots": slots, "ctxPerSlot": 2048},
            "prefill": {"form": "affine", "interceptS": 0.0, "linearS": 0.0001},
            "decode": [{"streams": b, "tokensPerSecond": 1000.0} for b in range(1, slots + 1)],
            "kv": {"bytesPerToken": 1, "capacityTokens": slots * 2048, "perRequestMaxTokens": 2048},
        }
    )


def decision_time_us(profile: CalibrationProfile, batches: int = 200, per_batch: int = 1000) -> dict[str, float]:
    """Median and p99 of per-call time over batches, microseconds."""
    thresholds = derive_thresholds(
        Policy.model_validate(
            {"slo": {"ttftSeconds": 2.0}, "classes": [{"name": "a", "reservedSlots": 1}, {"name": "b"}]}
        ),
        profile,
        derived_at=datetime.now(UTC),
    )
    config = GateConfig.from_thresholds(thresholds)
    state = LiveState(queued_prefill_tokens=300.0, streams=2, reserved_kv_tokens=900, prefill_tokens_per_s=250.0)
    request = Request(200, 64, "b")
    per_call = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(per_batch):
            decide(config, request, state, 0.0)
        per_call.append((time.perf_counter() - start) / per_batch * 1e6)
    per_call.sort()
    return {"median_us": statistics.median(per_call), "p99_us": per_call[int(0.99 * (len(per_call) - 1))]}


@contextmanager
def process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:  # graceful shutdown waits for held streams
            proc.kill()
            proc.wait()


def wrk(url: str, seconds: int, connections: int) -> dict[str, float]:
    """Run wrk on CPU 1; requests/s and non-2xx count."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return {"requests_per_s": rps, "requests": total, "non_2xx": int(non2xx.group(1)) if non2xx else 0}


async def sidecar_throughput(seconds: int = 10) -> dict[str, dict[str, float]]:
    """Rejections/s and proxied requests/s of one sidecar pinned to CPU 0."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk not found: apt-get install wrk")
    results: dict[str, dict[str, float]] = {}
    work = Path(tempfile.mkdtemp(prefix="slogate-overhead-"))
    stub_port = free_port()
    stub = f"http://127.0.0.1:{stub_port}"
    cases: dict[str, Thresholds] = {
        "proxied": derive_thresholds(
            Policy.model_validate({"slo": {"ttftSeconds": 5.0}}), stub_profile(), derived_at=datetime.now(UTC)
        ),
        "rejected": derive_thresholds(
            Policy.model_validate(
                {"slo": {"ttftSeconds": 5.0}, "concurrency": {"max": 1}, "deferral": {"maxWaitSeconds": 0}}
            ),
            stub_profile(),
            derived_at=datetime.now(UTC),
        ),
    }
    stub_argv = ["taskset", "-c", "1", sys.executable, "-m", "slogate_bench.live.stub_upstream", str(stub_port)]
    with process(stub_argv) as stub_process:
        await until_ready("the stub upstream", stub + "/health", stub_process.poll, 10.0, None)
        for name, thresholds in cases.items():
            async with SlogateFront(thresholds, cpus="0").in_front_of(stub, work / name) as gate:
                holder = None
                if name == "rejected":  # one open stream fills the cap of 1
                    holder = subprocess.Popen(
                        [
                            "curl",
                            "-sN",
                            "-X",
                            "POST",
                            f"{gate.url}/completion",
                            "-H",
                            "Content-Type: application/json",
                            "-d",
                            json.dumps({"prompt": [HOLD_TOKEN, 1, 2], "n_predict": 1, "stream": True}),
                        ],
                        stdout=subprocess.DEVNULL,
                    )
                    await asyncio.sleep(0.5)
                connections = 32 if name == "rejected" else 16
                results[name] = await asyncio.to_thread(wrk, f"{gate.url}/completion", seconds, connections)
                if holder is not None:
                    holder.terminate()
    return results


def main() -> None:
    profile_files = sorted(Path(".slogate/profiles").glob("*.json"))
    profile = CalibrationProfile.model_validate_json(profile_files[0].read_text()) if profile_files else stub_profile(4)
    report = {"decision": decision_time_us(profile), "sidecar_one_core": asyncio.run(sidecar_throughput())}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
