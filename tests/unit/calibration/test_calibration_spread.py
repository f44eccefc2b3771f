"""The repeatability block of docs/calibration.md: generated from the committed runs, never typed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slogate_bench.runs.calibration_spread import DOC_BEGIN, DOC_END, StageClock, markdown, spread_row

ROOT = Path(__file__).resolve().parents[3]


def test_the_published_block_is_the_rendering_of_the_committed_runs() -> None:
    figures = json.loads((ROOT / "docs" / "bench" / "calibration-spread.json").read_text())
    block = markdown(figures)
    doc = (ROOT / "docs" / "calibration.md").read_text()
    assert block in doc
    assert doc.count(DOC_BEGIN) == doc.count(DOC_END) == 1
    # Every run is in it: the duration row covers them all, and none is hidden as failed.
    done = [r for r in figures["runs"] if "durationS" in r]
    durations = sorted(r["durationS"] for r in done)
    assert f"| **total** | {durations[0]:.1f} |" in block
    assert f"| {durations[-1]:.1f} | |" in block


def test_stage_durations_add_up_to_the_run() -> None:
    clock = StageClock([("preflight", 10.0), ("prefill", 12.5), ("decode", 30.0), ("repeat", 41.0)])
    stages = clock.durations(end=50.0)
    assert stages == {"preflight": 2.5, "prefill": 17.5, "decode": 11.0, "repeat": 9.0}
    assert sum(stages.values()) == pytest.approx(50.0 - 10.0)


def test_spread_row() -> None:
    assert spread_row([400.0, 500.0, 450.0]) == (400.0, 450.0, 500.0, pytest.approx(100 / 450))
