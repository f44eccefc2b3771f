"""The benchmark's gate as its own process: ready before use, its state readable, gone after."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from sidecar_harness import thresholds_for
from slogate_bench.live.gate_process import spawned_gate


async def test_a_spawned_gate_serves_then_stops(tmp_path: Path) -> None:
    thresholds = thresholds_for(smollm2_profile())
    async with fake_upstream() as upstream:
        async with spawned_gate(upstream.url, thresholds, tmp_path) as gate:
            async with aiohttp.ClientSession() as session:
                async with session.get(gate.url + "/readyz") as ready:
                    assert ready.status == 200
                body = {"prompt": [1, 2, 3], "n_predict": 2}
                async with session.post(gate.url + "/completion", json=body) as answer:
                    assert answer.status == 200
            books = await gate.books()
            assert books["thresholds"]["calibrationId"] == thresholds.calibration_id
            assert sum(books["deferrals"].values()) == 0  # nothing was deferred
            assert Path(f"/proc/{gate.pid}/cmdline").read_bytes().split(b"\0")[3:5] == [b"sidecar", b"--upstream"]
        with pytest.raises(aiohttp.ClientConnectionError):  # the process is gone with the context
            async with aiohttp.ClientSession() as session, session.get(gate.url + "/readyz"):
                pass
    assert "thresholds loaded" in (tmp_path / "sidecar.log").read_text()


async def test_a_gate_that_cannot_start_says_so(tmp_path: Path) -> None:
    thresholds = thresholds_for(smollm2_profile())
    with pytest.raises(RuntimeError, match="not ready within"):
        # Nothing listens upstream: the sidecar runs but never becomes ready.
        async with spawned_gate("http://127.0.0.1:9", thresholds, tmp_path, ready_timeout_s=3):
            pass
