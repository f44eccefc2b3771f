"""Re-render published reports from their committed results files, without re-running anything.

    python -m slogate_bench.reports              # every report whose results are in docs/bench/
    python -m slogate_bench.reports fleet tenants-simulated

Each name is a report a ``make bench-*`` writes after its run; this is the one entry point for
rendering any of them again (after a change to a renderer, or to check that a doc block is its
JSON's). ``reject`` renders from the raw probes under ``.slogate/bench-logs/`` (not committed), so
it runs only when named.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from slogate_bench.reports import autoscaling, benchmarks, cost_simulation, fleet, fleet_simulation, tenant_simulation
from slogate_bench.runs import calibration_spread, reject_floor

Render = Callable[[], object]
REPORTS: dict[str, tuple[str, Render]] = {
    "benchmarks": (
        "docs/benchmarks.md, its figures and the README's numbers (make bench-full)",
        lambda: benchmarks.main([]),
    ),
    "fleet": ("the measured block of docs/fleet.md and its figures (make bench-fleet)", lambda: fleet.main([])),
    "fleet-simulated": (
        "the simulated block of docs/fleet.md and its figure (make bench-fleet-sim)",
        lambda: fleet_simulation.main([]),
    ),
    "autoscaling": (
        "the simulated block of docs/autoscaling.md and its figures (make bench-autoscale)",
        lambda: autoscaling.main([]),
    ),
    "tenants-simulated": (
        "docs/bench/tenants-simulated.png (make bench-tenants-sim)",
        lambda: tenant_simulation.main([]),
    ),
    "cost-simulated": (
        "the measured block of docs/admission-math.md's cost order (make bench-cost-sim)",
        lambda: cost_simulation.main([]),
    ),
    "calibration": (
        "the repeatability block of docs/calibration.md (make bench-calibration)",
        lambda: calibration_spread.main(["--render"]),
    ),
    "reject": (
        "the block of docs/reject-latency.md, from .slogate's raw probes (make bench-reject)",
        lambda: reject_floor.main(["--render"]),
    ),
}
ALL = tuple(name for name in REPORTS if name != "reject")


def main(argv: Sequence[str] | None = None) -> None:
    """Render the named reports (default: every one whose results are committed), in order."""
    parser = argparse.ArgumentParser(
        prog="python -m slogate_bench.reports",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(f"{name}: {what}" for name, (what, _) in REPORTS.items()),
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(REPORTS))
    names = parser.parse_args(argv).names or ALL
    unknown = [name for name in names if name not in REPORTS]
    if unknown:
        parser.error(f"no report named {', '.join(unknown)}; the reports are {', '.join(REPORTS)}")
    for name in names:
        REPORTS[name][1]()
        print(f"rendered {name}")


if __name__ == "__main__":
    main()
