"""Kubernetes label selectors, the one reading of them in the operator: parsed from the API's
``{matchLabels, matchExpressions}``, matched against labels, and rendered as the
``labelSelector`` query the API server filters a list by, or back as the API's form.

The query says every requirement, set-based ones included (``key in (a,b)``, ``key notin
(a,b)``, ``key``, ``!key``): a query of the matchLabels alone lists what the expressions
exclude, and any caller that trusted it would count those objects too. Values are a set to
the API server (it sorts them when it parses), so the query sorts them, and its requirements
go in key order as the server's own rendering does: one selector, one query string.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: tuple[Operator, ...] = get_args(Operator)


class SelectorError(ValueError):
    """Not a label selector the API server would accept."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions entry."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()
    """As written (the API's form keeps their order; the query does not need it)."""

    def __post_init__(self) -> None:
        if self.operator not in OPERATORS:
            raise SelectorError(f"operator {self.operator!r} is not one of {', '.join(OPERATORS)}")
        if self.operator in ("In", "NotIn") and not self.values:
            raise SelectorError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise SelectorError(f"operator {self.operator} takes no values")

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        return present == (self.operator == "Exists")

    def query(self) -> str:
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        # "()" is the set of the empty value, and "(,a)" adds it to a: the server's parser reads both so.
        word = "in" if self.operator == "In" else "notin"
        return f"{self.key} {word} ({','.join(sorted(set(self.values)))})"

    def to_api(self) -> dict[str, Any]:
        found: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            found["values"] = list(self.values)
        return found


@dataclass(frozen=True, slots=True)
class Selector:
    """A label selector: every matchLabels pair and every requirement must hold. The empty
    selector selects everything (the API's ``{}``; an absent one is the caller's to judge)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    """Sorted by key: two selectors of the same pairs are equal."""
    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def of(cls, match_labels: Mapping[str, str] | None = None, *requirements: Requirement) -> Selector:
        return cls(tuple(sorted((str(k), str(v)) for k, v in (match_labels or {}).items())), tuple(requirements))

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> Selector:
        """The API's ``{matchLabels, matchExpressions}``; None reads as ``{}``. SelectorError if malformed."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise SelectorError(f"a label selector is an object, not {type(raw).__name__}")
        expressions = []
        for term in raw.get("matchExpressions") or ():
            if not isinstance(term, Mapping) or not isinstance(term.get("key"), str):
                raise SelectorError(f"matchExpressions entry {term!r} has no key")
            values = tuple(str(v) for v in term.get("values") or ())
            expressions.append(Requirement(term["key"], cast(Operator, term.get("operator")), values))
        return cls.of(raw.get("matchLabels"), *expressions)

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(key in labels and labels[key] == value for key, value in self.match_labels) and all(
            requirement.matches(labels) for requirement in self.requirements
        )

    def selects(self, obj: Mapping[str, Any]) -> bool:
        """Whether the object's own labels (``metadata.labels``) match."""
        return self.matches((obj.get("metadata") or {}).get("labels") or {})

    def query(self) -> str:
        """The ``labelSelector`` query parameter; "" for the empty selector (no parameter)."""
        terms = [(key, f"{key}={value}") for key, value in self.match_labels]
        terms += [(requirement.key, requirement.query()) for requirement in self.requirements]
        return ",".join(text for _, text in sorted(terms, key=lambda term: term[0]))

    def to_api(self) -> dict[str, Any]:
        """The API's form, each part only when it has something (as the API server stores it)."""
        found: dict[str, Any] = {}
        if self.match_labels:
            found["matchLabels"] = dict(self.match_labels)
        if self.requirements:
            found["matchExpressions"] = [requirement.to_api() for requirement in self.requirements]
        return found

    def requiring(self, *requirements: Requirement) -> Selector:
        """This selector narrowed by more requirements."""
        return Selector(self.match_labels, (*self.requirements, *requirements))


def labelled(key: str, value: str | None = None) -> Selector:
    """The selector of one label: ``key=value``, or ``key`` present whatever its value (None)."""
    return Selector.of({key: value}) if value is not None else Selector.of(None, Requirement(key, "Exists"))
