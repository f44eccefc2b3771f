"""The reject-latency benchmark's pure parts: nginx's config, the probes' gate, the statistics, the
published block; and the C and Python floors answer 429 as the benchmark counts them. No test
asserts a duration."""

from __future__ import annotations

import math
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from canned_profiles import smollm2_profile
from fake_upstream import serve
from slogate_admission.decision import GateConfig, LiveState, Outcome, Request, decide
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_bench.live import bare_rejector
from slogate_bench.live.nginx import LIMIT_PATH, RETURN_PATH, nginx_config, spawned_nginx
from slogate_bench.live.priority import descendants, parse_autogroup
from slogate_bench.live.probes import PROBE_BODY, PROBE_CLASS, PROBE_HEADERS, curl_argv, parse_curl
from slogate_bench.reports.reject_floor import (
    CARRIER,
    CLIENT_WAIT_LABEL,
    DOC_BEGIN,
    DOC_END,
    markdown,
    quantile,
    summarize,
    table,
)
from slogate_bench.runs.reject_floor import CONDITIONS, TARGETS, probe_policy
from slogate_bench.runs.suite import SLO_S

needs_nginx = pytest.mark.usefixtures("nginx_binary")  # fails, never skips, without nginx


# --------------------------------------------------------------------------- nginx


def test_the_nginx_config_keeps_everything_under_its_prefix(tmp_path: Path) -> None:
    text = nginx_config(18123, tmp_path)
    assert "listen 127.0.0.1:18123;" in text
    for line in ("daemon off;", "worker_processes 1;", "access_log off;", "limit_req_status 429;"):
        assert line in text
    assert f"pid {tmp_path / 'nginx.pid'};" in text
    assert f"error_log {tmp_path / 'error.log'}" in text
    paths = [line.split()[1].rstrip(";") for line in text.splitlines() if line.strip().split(" ")[0].endswith("_path")]
    assert len(paths) == 5
    assert all(p.startswith(str(tmp_path)) for p in paths)
    assert (
        f"location = {RETURN_PATH}/completion {{\n            add_header Retry-After 1 always;\n            return 429 '"
        in text
    )
    assert "limit_req_zone $binary_remote_addr zone=floor:1m rate=1r/m;" in text  # an empty key is never limited


@needs_nginx
def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / "temp" / kind).mkdir(parents=True)
    conf = tmp_path / "nginx.conf"
    conf.write_text(nginx_config(18124, tmp_path))
    done = subprocess.run(
        ["nginx", "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@needs_nginx
async def test_nginx_refuses_with_429_both_ways(tmp_path: Path) -> None:
    async with spawned_nginx(tmp_path) as nginx, aiohttp.ClientSession() as session:
        statuses: dict[str, list[int]] = {}
        for path in (RETURN_PATH, LIMIT_PATH):
            for _ in range(3):
                async with session.post(nginx.url + path + "/completion", data=PROBE_BODY, headers=PROBE_HEADERS) as r:
                    await r.read()
                    statuses.setdefault(path, []).append(r.status)
                    if r.status == 429:
                        assert r.headers["Retry-After"] == "1"
                        assert r.content_type == "application/json"
    assert statuses[RETURN_PATH] == [429, 429, 429]
    first, *rest = statuses[LIMIT_PATH]
    assert first != 429  # one a minute is let through (to no file: 403 or 404)
    assert rest == [429, 429]


async def test_the_bare_aiohttp_server_always_refuses() -> None:
    async with serve(bare_rejector.app()) as url, aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.post(url + "/completion", data=PROBE_BODY, headers=PROBE_HEADERS) as r:
                assert r.status == 429
                assert r.headers["Retry-After"] == "1"
                assert await r.read() == bare_rejector.BODY
        async with session.get(url + "/health") as r:
            assert r.status == 200


# --------------------------------------------------------------------------- the probes' gate


def test_probes_are_refused_at_once_whenever_a_stream_is_in_and_the_load_is_gated_as_in_the_benchmarks() -> None:
    profile = smollm2_profile()
    now = datetime.now(UTC)
    benchmarks = derive_thresholds(
        Policy.model_validate({"slo": {"ttftSeconds": SLO_S}, "deferral": {"maxWaitSeconds": 0.5}}),
        profile,
        derived_at=now,
    )
    with_probes = derive_thresholds(probe_policy(), profile, derived_at=now)
    (plain,) = benchmarks.classes
    load_class, probe_class = with_probes.classes
    assert with_probes.default_class == load_class.name
    for field in ("ttft_slo_seconds", "ttft_budget_seconds", "concurrency_cap"):
        assert getattr(load_class, field) == getattr(plain, field), field
    assert (probe_class.name, probe_class.concurrency_cap) == (PROBE_CLASS, 1)
    config = GateConfig.from_thresholds(with_probes)
    probe = Request(100, 32, PROBE_CLASS)
    assert decide(config, probe, LiveState(), 0.0).outcome is Outcome.ADMIT  # an idle server: admitted
    for streams in range(1, with_probes.concurrency_cap + 1):
        for slot_wait in (0.0, 0.4, math.inf):  # however soon a slot is expected: never a deferral
            refused = decide(config, probe, LiveState(streams=streams, slot_wait_s=slot_wait), 0.0)
            assert refused.outcome is Outcome.REJECT
            assert refused.fits_ever  # so a 429, not the 400 of a request that can never fit


def test_curl_posts_the_probe_and_reports_status_and_time(tmp_path: Path) -> None:
    argv = curl_argv("http://127.0.0.1:1/completion", tmp_path / "body.json")
    assert argv[0] == "curl"
    assert argv[-1] == "http://127.0.0.1:1/completion"
    assert f"@{tmp_path / 'body.json'}" in argv
    assert f"X-Slogate-Class: {PROBE_CLASS}" in argv
    assert "Expect:" in argv  # no 100-continue round trip
    assert parse_curl("429 0.001234") == (429, 0.001234)
    assert parse_curl("000 0.000100")[0] == 0
    with pytest.raises(ValueError, match="unpack"):
        parse_curl("")


# --------------------------------------------------------------------------- priorities


def test_autogroup_lines_and_process_trees() -> None:
    assert parse_autogroup("/autogroup-262 nice 0\n") == (262, 0)
    assert parse_autogroup("/autogroup-7 nice -10") == (7, -10)
    with pytest.raises(ValueError, match="not an autogroup line"):
        parse_autogroup("nice 0")
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1}
    assert sorted(descendants(parents, 10)) == [10, 11, 12, 13]
    assert descendants(parents, 99) == [99]


# --------------------------------------------------------------------------- statistics and the block


def test_quantiles_pool_the_repeats_and_keep_their_spread() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0, 3.0], 0.99) == 3.0
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)
    summary = summarize([[1.0, 2.0, 3.0], [], [4.0, 5.0, 6.0]])
    assert summary is not None
    assert summary.rejections == 6
    assert (summary.p50.pooled, summary.p50.low, summary.p50.high) == (3.0, 2.0, 5.0)  # [] takes no part
    assert (summary.p99.pooled, summary.p99.low, summary.p99.high) == (6.0, 3.0, 6.0)
    assert summarize([[], []]) is None


def _raw() -> dict[str, Any]:
    """A run of two repeats in which each layer's latency is fixed: its index in ms, times the repeat
    (the aiohttp client's own wait: half a ms, times the repeat). Without load there is no carrier
    to probe, and no load to count."""
    conditions = [{"key": c.key, "short": c.short, "label": c.label, "carrier": c.carrier} for c in CONDITIONS]
    targets = [{"key": k, "label": v} for k, v in TARGETS.items()]
    phases = []
    for repeat in (1, 2):
        for c in CONDITIONS:
            probes = {
                t["key"]: {
                    "rejected_s": [(i + 1) * repeat / 1e3] * 10,
                    "client_wait_s": [] if t["key"].startswith("curl-") else [repeat / 2e3] * 10,
                    "other": {},
                }
                for i, t in enumerate(targets)
                if c.carrier is not None or CARRIER not in t["key"]
            }
            probes["nginx-limit"]["other"] = {"404": 1}
            load = {"ended": 20, "ok": 6, "within_slo": 6, "rejected": 14} if c.carrier else {}
            phases.append({"condition": c.key, "repeat": repeat, "probes": probes, "load": load})
    return {
        "environment": {"date": "2026-12-03 12:00 UTC", "cpu": "test"},
        "settings": {"load": 4.0, "repeats": 2, "warmup_s": 5.0, "seconds": 25.0, "gap_ms": [5.0, 25.0]},
        "profile": "canned",
        "mu_rps": 1.35,
        "rate_rps": 5.4,
        "conditions": conditions,
        "targets": targets,
        "phases": phases,
        "wall_s": 480.0,
    }


def _ms(target: str) -> str:
    """The p50 and p99 every condition shows for ``target`` in ``_raw``: its index, times the 2nd repeat."""
    return f"{(list(TARGETS).index(target) + 1) * 2:.2f} ms"


def test_the_block_shows_every_layer_in_every_condition_and_what_was_left_out() -> None:
    raw = _raw()
    cells = table(raw)
    assert len(cells) == len(CONDITIONS) * len(TARGETS)
    nginx = cells["default", "nginx-return"]
    assert nginx is not None
    assert nginx.rejections == 20
    assert (nginx.p99.pooled, nginx.p99.low, nginx.p99.high) == (0.002, 0.001, 0.002)
    assert cells["no-load", CARRIER] is None  # nothing to refuse without load
    block = markdown(raw)
    assert block.startswith(DOC_BEGIN)
    assert block.endswith(DOC_END)
    for c in CONDITIONS:
        assert c.short in block
    for label in TARGETS.values():
        assert sum(line.startswith(f"| {label} |") for line in block.splitlines()) == 2  # p99 and p50 tables
    assert f"nginx `limit_req` 429 (C): {2 * len(CONDITIONS)} × 404" in block  # counted, not timed
    wait_row = f"| {CLIENT_WAIT_LABEL} | " + " | ".join(["1.00 (0.50–1.00)"] * len(CONDITIONS)) + " |"
    assert wait_row in block.splitlines()  # the measuring client's own scheduling, under the p99 table
    m = _ms("curl-nginx-return")
    assert f"no Python anywhere): p50 {m}, p99 {m} under the load; p50 {m}, p99 {m} with none." in block
    assert f"{_ms(CARRIER)} as the benchmarks run it" in block
    assert "not met." in block
    assert "| default | as the benchmarks run it | asyncio sidecar | 40 | 12 (12) | 28 |" in block
    assert (
        "| no load | no load at all: llama-server idle (nothing for the carrier to refuse) | no sidecar | 0 |" in block
    )
