"""`slogate simulate`'s table: the simulator's report (``slogate_sim.preview``) as rows."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from slogate_sim.preview import CHAT


def slo_title(report: dict[str, Any]) -> str:
    """Each class's TTFT SLO, and which one the arrivals (and goodput) are judged by."""
    classes = report["classes"]
    if len(classes) == 1:
        return f"TTFT SLO {report['ttft_slo_s']:g} s"
    each = ", ".join(f"{c['name']} {c['ttft_slo_s']:g} s" for c in classes)
    return f"TTFT SLO {each} (arrivals: {report['default_class']}, the default class)"


def _seconds(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "-"


def table(report: dict[str, Any]) -> Table:
    """One row per gate and load."""
    timeout = report["client_timeout_s"]
    patience = f"clients give up after {timeout:g} s" if timeout is not None else "patient clients"
    lengths = (
        "chat mix"
        if report["prompt_tokens"] == report["output_tokens"] == CHAT
        else f"prompts {report['prompt_tokens']}, outputs {report['output_tokens']} tokens"
    )
    fleet = report["replicas"] > 1
    pods = f"{report['replicas']} pods, " if fleet else ""
    t = Table(
        title=(
            f"{report['model']}: {pods}capacity μ {report['capacity_rps']:.3f} req/s, {slo_title(report)}, "
            f"{lengths}, {patience} ({report['service']} service)"
        )
    )
    columns = ("gate", *(("routing", "tries/req") if fleet else ()), "load", "offered", "admitted", "rejected")
    for column in (*columns, "timed out", "within SLO", "goodput", "p50 TTFT", "p99 TTFT", "mean W", "util"):
        t.add_column(column, justify="left" if column in ("gate", "routing") else "right")
    for r in report["runs"]:
        routing = (r["routing"], f"{r['tries'] / r['offered']:.2f}" if r["offered"] else "-") if fleet else ()
        cap = report["count_cap"]
        gate = f"count-cap ({cap['concurrency']} + queue {cap['queue']})" if r["gate"] == "count-cap" else r["gate"]
        t.add_row(
            gate,
            *routing,
            f"{r['load']:g}x",
            *(str(r[k]) for k in ("offered", "admitted", "rejected", "timed_out", "completed_within_slo")),
            f"{r['goodput_rps']:.3f} req/s",
            _seconds(r["ttft_p50_s"]),
            _seconds(r["ttft_p99_s"]),
            _seconds(r["mean_time_in_system_s"]),
            f"{r['utilization']:.0%}",
        )
    return t
