#!/usr/bin/env python3
"""Copy the repository's CRDs (crds/, the single source) into the chart's crds/.

    charts/slogate/sync-crds.py          # copy, and delete copies whose source is gone
    charts/slogate/sync-crds.py --check  # exit 1, naming each difference, if out of date

The chart's crds/ holds byte-identical copies of ../../crds/*.yaml plus the files the
chart owns itself (CHART_OWNED: kopf's peering CRDs, which kopf ships no manifest for).
Helm installs crds/ before any template and never templates them, so copies are exact.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHART_CRDS = Path(__file__).resolve().parent / "crds"
SOURCE_CRDS = Path(__file__).resolve().parents[2] / "crds"
CHART_OWNED = frozenset({"kopf.dev_peerings.yaml"})


def source_files() -> dict[str, bytes]:
    """The CRD manifests of the single source, by file name."""
    if not SOURCE_CRDS.is_dir():
        raise SystemExit(f"sync-crds: {SOURCE_CRDS} does not exist: nothing to copy from")
    found = {p.name: p.read_bytes() for p in sorted(SOURCE_CRDS.glob("*.yaml")) if p.is_file()}
    clash = CHART_OWNED & found.keys()
    if clash:
        raise SystemExit(f"sync-crds: {sorted(clash)} exist in both crds/ and the chart: keep one")
    return found


def differences() -> list[str]:
    """What differs between crds/ and the chart's copies (empty: in sync)."""
    wanted = source_files()
    problems: list[str] = []
    for name, content in wanted.items():
        copy = CHART_CRDS / name
        if not copy.exists():
            problems.append(f"missing in the chart: {name}")
        elif copy.read_bytes() != content:
            problems.append(f"differs from crds/{name}: charts/slogate/crds/{name}")
    for copy in sorted(CHART_CRDS.glob("*.yaml")):
        if copy.name not in wanted and copy.name not in CHART_OWNED:
            problems.append(f"stale copy (no crds/{copy.name}): charts/slogate/crds/{copy.name}")
    return problems


def sync() -> list[str]:
    """Make the chart's copies equal the source; returns what was changed."""
    wanted = source_files()
    CHART_CRDS.mkdir(exist_ok=True)
    changed: list[str] = []
    for name, content in wanted.items():
        copy = CHART_CRDS / name
        if not copy.exists() or copy.read_bytes() != content:
            copy.write_bytes(content)
            changed.append(f"copied crds/{name}")
    for copy in sorted(CHART_CRDS.glob("*.yaml")):
        if copy.name not in wanted and copy.name not in CHART_OWNED:
            copy.unlink()
            changed.append(f"removed stale {copy.name}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 when out of date")
    args = parser.parse_args(argv)
    if args.check:
        problems = differences()
        for problem in problems:
            print(f"sync-crds: {problem}", file=sys.stderr)
        if problems:
            print("sync-crds: run charts/slogate/sync-crds.py to update the chart", file=sys.stderr)
        return 1 if problems else 0
    for line in sync() or ["already in sync"]:
        print(f"sync-crds: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
