"""`make bench-fleet-sim`'s pieces on a small fleet.json of two canned pods: the replay sends the
measured schedule, every routing has a share of least-pressure, and the report adds up to the JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from canned_profiles import smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_bench.published import replace_block
from slogate_bench.reports.fleet_simulation import BEGIN, END, block, load_verdicts, share_points
from slogate_bench.runs import fleet_simulation
from slogate_bench.runs.demo import demo_policy
from slogate_bench.runs.fleet_simulation import MeasuredFleet, simulated_routing, study, validation
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.routing import Routing
from slogate_sim.workloads import preset, schedule

FRONTS = [  # (front, layer, nginx routing, tries), as `make bench-fleet` names them
    ("direct", "direct", "random", 1),
    ("count-cap", "count-cap", "random", 1),
    ("random", "slogate", "random", 1),
    ("least_conn", "slogate", "least_conn", 1),
    ("retry", "slogate", "random", 2),
    ("least_conn+retry", "slogate", "least_conn", 2),
]


def measured_fleet(path: Path) -> dict[str, Any]:
    profile = smollm2_profile()
    thresholds = derive_thresholds(demo_policy(2.0), profile, derived_at=datetime(2026, 1, 1, tzinfo=UTC))
    mu = capacity_rps(ServerModel.from_profile(profile), preset("chat"), thresholds.concurrency_cap)
    pod = {
        "profile": profile.model_dump(mode="json", by_alias=True),
        "thresholds": thresholds.model_dump(mode="json", by_alias=True),
        "capacity_rps": mu,
        "count_cap": {"concurrency": 4, "queue": 8},
    }
    runs = []
    for load in (1.0, 2.0):
        rate = load * 2 * mu
        sent = len(schedule(rate, 30.0, preset("chat"), seed=int(100 * load)))
        for front, layer, routing, tries in FRONTS:
            runs.append({
                "front": front, "layer": layer, "routing": routing, "tries": tries, "load": load,
                "arrival_rate_rps": rate, "schedule_seed": int(100 * load), "offered": sent,
                "goodput_rps": 0.5 * load, "refused_after_tries": 0,
            })  # fmt: skip
    raw = {
        "started_at": "2026-12-03T17:00:00+00:00",
        "workload": "chat",
        "client_timeout_s": 10.0,
        "slo_s": 2.0,
        "duration_s": 30.0,
        "pods": [pod, pod],
        "runs": runs,
    }
    path.write_text(json.dumps(raw))
    return raw


def test_a_missing_measurement_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="run `make bench-fleet` first"):
        MeasuredFleet.read(tmp_path / "fleet.json")


def test_each_measured_front_has_its_simulated_twin_but_least_conn_with_retry() -> None:
    twins = {front: simulated_routing({"routing": r, "tries": t}) for front, _, r, t in FRONTS}
    assert twins == {
        "direct": Routing("random"),
        "count-cap": Routing("random"),
        "random": Routing("random"),
        "least_conn": Routing("least-requests"),
        "retry": Routing("retry-429", 2),
        "least_conn+retry": None,
    }


def test_the_replay_sends_each_measured_run_its_own_arrivals(tmp_path: Path) -> None:
    raw = measured_fleet(tmp_path / "fleet.json")
    fleet = MeasuredFleet.read(tmp_path / "fleet.json")
    rows = validation(fleet)
    assert len(rows) == len(raw["runs"]) - 2  # least_conn+retry at each load has no twin
    for row in rows:
        assert row["simulated_offered"] == row["offered"]
        assert row["ratio"] == pytest.approx(row["simulated_goodput_rps"] / row["measured_goodput_rps"])
    # Same arrivals, same pods: the fronts differ only in what they refused.
    by_load = {(r["front"], r["load"]): r for r in rows}
    assert by_load[("direct", 2.0)]["simulated_refused"] == 0
    assert by_load[("retry", 2.0)]["simulated_refused"] <= by_load[("random", 2.0)]["simulated_refused"]


def test_the_study_scores_every_routing_against_least_pressure_and_the_report_adds_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured_fleet(tmp_path / "fleet.json")
    fleet = MeasuredFleet.read(tmp_path / "fleet.json")
    monkeypatch.setattr(fleet_simulation, "SIZES", {4: (120.0, (1, 2))})
    monkeypatch.setattr(fleet_simulation, "LOADS", (1.0,))
    rows = study(fleet, Console(quiet=True))
    routings = fleet_simulation.ROUTINGS
    assert len(rows) == 2 * len(routings)
    assert all(r["share_of_least_pressure"] == 1.0 for r in rows if r["routing"] == "least-pressure")
    points = share_points(rows)
    assert set(points) == {(4, r, 1.0) for r in routings}
    for mean, low, high in points.values():
        assert low <= mean <= high

    raw = {
        "environment": {"cpu": "test cpu, 2 cores", "python": "3.11"},
        "started_at": "a",
        "ended_at": "b",
        "measured_started_at": "c",
        "slo_s": 2.0,
        "workload": "chat",
        "sizes": {"4": {"duration_s": 120.0, "seeds": [1, 2]}},
        "loads": [1.0],
        "routings": list(routings),
        "validation": validation(fleet),
        "study": rows,
        "speed_profile": "docs/bench/profile.json",
        "speed": [{"routing": "random", "offered": 1234, "cpu_s": 1.5}],
    }
    text = block(raw)
    assert text.startswith(BEGIN)
    assert text.endswith(END)
    validation_rows = [line for line in text.splitlines() if line.startswith("| ") and "req/s |" in line]
    assert len(validation_rows) == len(raw["validation"])
    for routing in routings:
        assert f"| {routing} | " in text
    assert "| random | 1,234 | 1.5 |" in text
    verdicts = load_verdicts(raw["validation"])
    assert set(verdicts) == {1.0, 2.0}
    # The block replaces only what lies between its markers.
    doc = tmp_path / "fleet.md"
    doc.write_text(f"# Fleets\n\nmeasured text\n\n{BEGIN}\nstale block\n{END}\n\nafter\n")
    replace_block(doc, BEGIN, END, text)
    rendered = doc.read_text()
    assert rendered.startswith("# Fleets\n\nmeasured text\n\n")
    assert rendered.endswith("\n\nafter\n")
    assert "stale block" not in rendered


def test_the_speed_figure_runs_every_routing_on_the_same_arrivals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(smollm2_profile().model_dump_json(by_alias=True))
    monkeypatch.setattr(fleet_simulation, "SPEED_REPLICAS", 3)
    monkeypatch.setattr(fleet_simulation, "SPEED_SECONDS", 60.0)
    rows = fleet_simulation.speed(profile, 2.0)
    assert [r["routing"] for r in rows] == list(fleet_simulation.ROUTINGS)
    assert len({r["offered"] for r in rows}) == 1
    assert all(r["replicas"] == 3 and r["cpu_s"] >= 0 for r in rows)
