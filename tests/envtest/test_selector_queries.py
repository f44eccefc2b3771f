"""The operator's label-selector queries (``slogate_operator.selectors``), as the real
kube-apiserver reads them: every rendered query lists exactly what the selector matches."""

from __future__ import annotations

from api_cluster import CONFIGMAPS, Cluster
from slogate_operator.selectors import Selector

LABELLED = {
    "a": {"app": "x", "tier": "a"},
    "b": {"app": "x", "tier": "b"},
    "empty": {"app": "x", "tier": ""},
    "none": {"app": "x"},
    "beta": {"app": "y", "tier": "a", "beta": "1"},
}
ASKED = [
    {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "In", "values": [""]}]},
    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", ""]}]},
    {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a", ""]}]},
    {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
    {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
    {"matchLabels": {"tier": ""}},
    {"matchLabels": {"app": "y"}, "matchExpressions": [{"key": "beta", "operator": "Exists"},
                                                      {"key": "tier", "operator": "NotIn", "values": ["b"]}]},
]  # fmt: skip


def test_the_api_server_lists_by_each_query_exactly_what_the_selector_matches(cluster: Cluster) -> None:
    """kube-apiserver parses every query the selectors render, and answers the same as ``matches``."""
    for name, labels in LABELLED.items():
        cluster.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"sel-{name}",
                                                                                          "labels": labels}})  # fmt: skip
    for raw in ASKED:
        selector = Selector.parse(raw)
        listed = {c["metadata"]["name"] for c in cluster.list(CONFIGMAPS, labels=selector.query())}
        assert sorted(n for n in listed if n.startswith("sel-")) == sorted(
            f"sel-{name}" for name, labels in LABELLED.items() if selector.matches(labels)
        ), selector.query()
