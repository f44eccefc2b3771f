"""Kubernetes label selectors in the operator (issue 27): one reading, one query, one match."""

from __future__ import annotations

from typing import Any

import pytest

from manifests import llama_deployment
from slogate_operator import injector, names, targets
from slogate_operator.selectors import Requirement, Selector, SelectorError, labelled
from slogate_operator.spec import parse_spec


def deployment_selecting(selector: dict[str, Any]) -> dict[str, Any]:
    deployment = llama_deployment("x")
    deployment["spec"]["selector"] = selector
    return deployment


def test_a_deployments_pod_query_keeps_its_match_expressions() -> None:
    """The defect: the query sent to the API server had matchLabels only, so it listed the pods
    the expressions exclude (tier=b here), and whatever trusted it counted them."""
    deployment = deployment_selecting(
        {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}
    )
    query = targets.pod_selector(deployment).query()
    assert query == "app=x,tier in (a)"


@pytest.mark.parametrize(
    ("term", "query", "selects", "refuses"),
    [
        ({"key": "tier", "operator": "In", "values": ["b", "a"]}, "tier in (a,b)",
         [{"tier": "a"}, {"tier": "b"}], [{"tier": "c"}, {}]),
        ({"key": "tier", "operator": "NotIn", "values": ["b", "a"]}, "tier notin (a,b)",
         [{"tier": "c"}, {}], [{"tier": "a"}, {"tier": "b"}]),
        ({"key": "tier", "operator": "Exists"}, "tier", [{"tier": ""}, {"tier": "a"}], [{}, {"other": "tier"}]),
        ({"key": "tier", "operator": "DoesNotExist"}, "!tier", [{}, {"other": "tier"}], [{"tier": ""}]),
    ],
)  # fmt: skip
def test_each_operator_renders_the_apiservers_syntax_and_matches_as_it_does(
    term: dict[str, Any], query: str, selects: list[dict[str, str]], refuses: list[dict[str, str]]
) -> None:
    selector = Selector.parse({"matchExpressions": [term]})
    assert selector.query() == query
    assert [selector.matches(labels) for labels in selects] == [True] * len(selects)
    assert [selector.matches(labels) for labels in refuses] == [False] * len(refuses)


def test_values_are_a_set_and_requirements_go_in_key_order() -> None:
    """The API server sorts a requirement's values and its requirements by key when it parses:
    the query does the same, so the order a manifest wrote them in changes no query."""
    written = {"matchLabels": {"zone": "eu", "app": "x"},
               "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["c", "a", "c"]},
                                    {"key": "beta", "operator": "Exists"}]}  # fmt: skip
    reordered = {"matchLabels": {"app": "x", "zone": "eu"},
                 "matchExpressions": [{"key": "beta", "operator": "Exists"},
                                      {"key": "tier", "operator": "NotIn", "values": ["a", "c"]}]}  # fmt: skip
    assert Selector.parse(written).query() == "app=x,beta,tier notin (a,c),zone=eu"
    assert Selector.parse(reordered).query() == Selector.parse(written).query()
    # The API's form keeps what was written, values in their order: an entry already stored stays as it is.
    assert Selector.parse(written).to_api()["matchExpressions"][0] == written["matchExpressions"][0]


def test_the_empty_value_is_said_as_the_server_reads_it() -> None:
    """``()`` is the set of the empty value and ``(,a)`` adds it to a (apimachinery's parser)."""
    assert Requirement("tier", "In", ("",)).query() == "tier in ()"
    assert Requirement("tier", "In", ("a", "")).query() == "tier in (,a)"
    assert Selector.of({"tier": ""}).query() == "tier="
    assert Selector.of({"tier": ""}).matches({"tier": ""})
    assert not Selector.of({"tier": ""}).matches({})


def test_the_empty_selector_selects_everything_and_asks_nothing_of_the_server() -> None:
    for empty in (Selector.parse(None), Selector.parse({}), Selector.parse({"matchLabels": {}})):
        assert empty.empty
        assert empty.query() == ""
        assert empty.to_api() == {}
        assert empty.matches({})
        assert empty.matches({"app": "x"})


def test_every_term_must_hold() -> None:
    selector = Selector.parse(
        {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}
    )
    assert selector.selects({"metadata": {"labels": {"app": "x", "tier": "a"}}})
    assert not selector.selects({"metadata": {"labels": {"app": "x", "tier": "b"}}})
    assert not selector.selects({"metadata": {"labels": {"app": "y", "tier": "a"}}})
    assert not selector.selects({"metadata": {}})


@pytest.mark.parametrize(
    "raw",
    [
        {"matchExpressions": [{"key": "a", "operator": "In"}]},
        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
        {"matchExpressions": [{"key": "a", "operator": "Near", "values": ["x"]}]},
        {"matchExpressions": [{"operator": "Exists"}]},
        ["app=x"],
    ],
)
def test_a_malformed_selector_is_refused(raw: Any) -> None:
    with pytest.raises(SelectorError):
        Selector.parse(raw)


def test_the_policys_selector_and_the_webhooks_object_selector_are_the_same_selector() -> None:
    """The spec's selector picks Deployments by it; the webhook entry sends a target's pods by
    its own selector, narrowed to pods not injected yet."""
    selector = {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}
    spec = parse_spec({"selector": selector, "slo": {"ttftSeconds": 2.0}})
    chosen = [d["metadata"]["name"] for d in targets.selected(spec, [
        deployment_selecting({}) | {"metadata": {"name": "a", "labels": {"app": "x", "tier": "a"}}},
        deployment_selecting({}) | {"metadata": {"name": "b", "labels": {"app": "x", "tier": "b"}}},
    ])]  # fmt: skip
    assert chosen == ["a"]
    assert spec.target_text() == "app=x,tier in (a)"
    endpoint = injector.Endpoint(url="https://operator.test")
    entry = injector.entry("llm", "p", deployment_selecting(selector), endpoint, "Fail")
    assert Selector.parse(entry["objectSelector"]) == Selector.parse(selector).requiring(
        Requirement(names.LABEL_POLICY, "DoesNotExist")
    )
    assert not Selector.parse(entry["objectSelector"]).matches({"app": "x", "tier": "a", names.LABEL_POLICY: "p"})


def test_one_label_selects_by_value_or_by_presence() -> None:
    assert labelled("job-name", "j").query() == "job-name=j"
    assert labelled(names.LABEL_POLICY).query() == names.LABEL_POLICY
    assert labelled("a", "1").to_api() == {"matchLabels": {"a": "1"}}
