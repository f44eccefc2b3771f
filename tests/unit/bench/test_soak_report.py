"""The soak block of docs/reliability.md accounts for every request, as re-rendered from the
committed run (`python -m slogate_bench.runs.soak --render`)."""

from __future__ import annotations

import json
from pathlib import Path

from slogate_bench.runs.soak import markdown

ROOT = Path(__file__).resolve().parents[3]
OUTCOMES = ("within SLO", "served late", "rejected", "refused", "timed out", "errors")


def test_every_minute_and_the_whole_run_add_up() -> None:
    figures = json.loads((ROOT / "docs" / "reliability-soak.json").read_text())
    block = markdown(figures, figures["verdict"])
    rows = [line.strip("|").split("|") for line in block.splitlines() if line.startswith("| ")]
    header, *body = [[cell.strip() for cell in row] for row in rows]
    minutes = [row for row in body if not set(row[0]) <= {"-", ":"}]
    assert len(minutes) == figures["minutes"]
    for row in minutes:
        cells = dict(zip(header, row, strict=True))
        assert int(cells["offered"]) == sum(int(cells[name]) for name in OUTCOMES), row
    assert sum(int(dict(zip(header, r, strict=True))["offered"]) for r in minutes) == figures["requests"]
    summary = figures["summary"]
    assert f"{summary['ok'] - summary['within_slo']} served late" in block
    assert block in (ROOT / "docs" / "reliability.md").read_text()  # the published block is this one
