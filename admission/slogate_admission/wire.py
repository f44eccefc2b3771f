"""The wire's base: the model every schema object derives from, and the value types they share.

Frozen, unknown fields refused (a typo never becomes a default), camelCase on the wire
(like the CRD), snake_case in Python. ``schema`` and ``tenant_schema`` build on it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["ClassName", "Model", "NonNegativeSeconds", "PositiveSeconds", "Quantile", "SloQuantile"]

# Strict: a JSON `false` is not 0 seconds (lax float parsing would take it); ints still are.
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
NonNegativeSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
Quantile = Annotated[float, Field(gt=0, lt=1)]
SloQuantile = Annotated[float, Field(ge=0.5, lt=1)]
"""A TTFT SLO's quantile: a median or above (below, the gate would admit past its own prediction)."""
ClassName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]


class Model(BaseModel):
    """Base: frozen, strict about unknown fields, camelCase on the wire."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        ser_json_inf_nan="strings",
    )
