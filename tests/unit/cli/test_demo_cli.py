"""`slogate demo`'s table: every request sent is in exactly one outcome column."""

from __future__ import annotations

import io
from typing import get_args

from rich.console import Console

from slogate_bench.results import Outcome, Result, Run
from slogate_bench.runs.demo import outcomes, table

OUTCOMES = ("within SLO", "served late", "rejected", "refused", "timed out", "errors")


def printed_rows(runs: dict[str, Run], slo_s: float) -> dict[str, dict[str, str]]:
    """The table as the terminal shows it, by run name then column header."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table(runs, slo_s, rate=2.5))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "sent" in line)
    names = [c.strip() for c in header.split("┃")[1:-1]]
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0] in runs:
            rows[cells[0]] = dict(zip(names[1:], cells[1:], strict=True))
    return rows


def test_every_outcome_the_load_generator_records_has_a_column() -> None:
    results = [Result(kind, 200, 0.5 if kind == "ok" else None, 1.0) for kind in get_args(Outcome)]
    results += [Result("ok", 200, 3.0, 4.0), Result("ok", 200, None, 1.0)]  # late; served without a token
    counts = outcomes(Run(10.0, results), slo_s=2.0)
    assert list(counts) == ["sent", *OUTCOMES]
    assert counts["sent"] == len(results)
    assert sum(counts[c] for c in OUTCOMES) == counts["sent"]
    assert (counts["within SLO"], counts["served late"]) == (1, 2)


def test_the_printed_table_adds_up_for_each_run() -> None:
    # The burst of the "first contact" report: 53 sent, 11 within SLO, 2 served late, 40 timed out.
    direct = Run(20.0, [Result("ok", 200, 1.0, 2.0)] * 11 + [Result("ok", 200, 3.5, 5.0)] * 2
                 + [Result("timeout", 0, None, 10.0)] * 39 + [Result("error", 0, None, 0.1)])  # fmt: skip
    gated = Run(20.0, [Result("ok", 200, 0.8, 1.5)] * 12 + [Result("rejected", 429, None, 0.002)] * 38
                + [Result("refused", 400, None, 0.001)] * 3)  # fmt: skip
    rows = printed_rows({"llama-server alone": direct, "through slogate": gated}, slo_s=2.0)
    assert set(rows) == {"llama-server alone", "through slogate"}
    for row in rows.values():
        assert int(row["sent"]) == 53
        assert sum(int(row[c]) for c in OUTCOMES) == 53, row
    assert (rows["llama-server alone"]["within SLO"], rows["llama-server alone"]["served late"]) == ("11", "2")
    assert (rows["through slogate"]["rejected"], rows["through slogate"]["refused"]) == ("38", "3")
