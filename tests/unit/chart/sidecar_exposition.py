"""What the sidecar and the operator really export, to check alerts and dashboard against.

Read from the sidecar's own SidecarMetrics after it loaded thresholds (which creates the
zero series of every outcome, class, result and kind), with its collector of the tenants'
series over a gate that judged a tenant's request, and from the operator's metrics
registry, not from a hand-kept list. The kube-state-metrics series the autoscaling alerts
join with are the one hand-kept list: kube-state-metrics' own table of them.
"""

from __future__ import annotations

import re
from functools import cache

from prometheus_client.parser import text_string_to_metric_families

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Request, decide
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_operator import metrics as operator_metrics
from slogate_sidecar.gate import Gate
from slogate_sidecar.metrics import SidecarMetrics
from slogate_sidecar.tenants import TenantMetrics

# Labels Prometheus adds at scrape time (PodMonitor relabelling), not the sidecar.
TARGET_LABELS = frozenset({"namespace", "workload", "pod", "policy", "job", "instance", "container"})

_HPA = frozenset({"namespace", "horizontalpodautoscaler"})
KUBE_STATE_METRICS = {
    "kube_horizontalpodautoscaler_info": _HPA
    | {"scaletargetref_api_version", "scaletargetref_kind", "scaletargetref_name"},
    "kube_horizontalpodautoscaler_spec_max_replicas": _HPA,
    "kube_horizontalpodautoscaler_status_current_replicas": _HPA,
    "kube_horizontalpodautoscaler_status_desired_replicas": _HPA,
}
"""kube-state-metrics' HPA series the alerts read, with their labels, as its
docs/metrics/workload/horizontalpodautoscaler-metrics.md lists them (v2)."""

_SELECTOR = re.compile(r"\b((?:slogate|kube)_[a-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


@cache
def sidecar_samples() -> dict[str, frozenset[tuple[str, str]]]:
    """Sample name -> every (label, value) pair seen on it, from a sidecar with two classes
    that tells tenants apart."""
    metrics = SidecarMetrics()
    policy = Policy.model_validate(
        {
            "slo": {"ttftSeconds": 2.0},
            "concurrency": {"max": 4},
            "classes": [{"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1}, {"name": "batch"}],
            "tenants": {"weights": {"acme": 2}},
        }
    )
    thresholds = derive_thresholds(policy, smollm2_profile(), derived_at=NOW)
    metrics.set_thresholds(thresholds)
    # The tenants' series exist for the accounts the gate has: a listed tenant's, and one
    # request naming an unlisted tenant gives it its own.
    gate = Gate(clock=lambda: 0.0)
    TenantMetrics(gate).register(metrics.registry)
    gate.machine.load(thresholds, now=0.0)
    gate.machine.arrive(Request(200, 128, "batch", tenant="globex"), now=0.0)
    # Decisions have no zero series: make two real ones (an admit, and a rejection behind
    # five seconds of queued prefill), and one first token for the class histograms.
    gate = GateConfig.from_thresholds(thresholds)
    overloaded = LiveState(queued_prefill_tokens=5 * gate.prefill_tokens_per_s)
    for state in (LiveState(), overloaded):
        metrics.record_decision(decide(gate, Request(200, 128, "interactive"), state, now=0), 1e-6)
    metrics.record_ttft("interactive", predicted_s=0.5, actual_s=0.6, slo_s=1.0)
    body, _ = metrics.exposition()
    seen: dict[str, set[tuple[str, str]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            seen.setdefault(sample.name, set()).update(sample.labels.items())
    return {name: frozenset(pairs) for name, pairs in seen.items()}


@cache
def operator_samples() -> dict[str, frozenset[str]]:
    """Sample name -> label names, for every metric of the operator's registry."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
    found: dict[str, frozenset[str]] = {}
    for metric in operator_metrics.ALL:
        for family in metric.describe():
            for suffix in suffixes[family.type]:
                found[family.name + suffix] = frozenset(metric._labelnames)
    return found


def unknown_references(expr: str) -> list[str]:
    """Metric names and exact label matches in `expr` that nothing exports (empty: all real)."""
    samples = sidecar_samples()
    operator = operator_samples()
    problems: list[str] = []
    names = set(re.findall(r"\b(slogate_[a-z0-9_]+)\b", expr))
    for name in sorted(names):
        if name not in samples and name not in operator and ":" not in name:
            problems.append(f"metric {name} is not exported")
    for name in sorted(set(re.findall(r"\b(kube_[a-z0-9_]+)\b", expr)) - set(KUBE_STATE_METRICS)):
        problems.append(f"metric {name} is not one of kube-state-metrics' that the alerts know")
    for name, body in _SELECTOR.findall(expr):
        for label, op, value in _MATCHER.findall(body):
            if label in TARGET_LABELS or label == "le":
                continue
            if name in KUBE_STATE_METRICS:
                if label not in KUBE_STATE_METRICS[name]:
                    problems.append(f"{name} has no label {label}")
            elif name in operator:
                # The operator's series carry their policy's namespace (honorLabels).
                if label not in operator[name] | {"namespace"}:
                    problems.append(f"{name} has no label {label}")
            elif name in samples and op in ("=", "!=") and (label, value) not in samples[name]:
                problems.append(f'{name} never has {label}="{value}"')
    return problems
