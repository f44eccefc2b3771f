"""Validation errors as sentences: where in the document, and what is wrong.

One formatter for every place that reports a pydantic ValidationError to a person (a
pushed thresholds document, a boot file, a calibration Job's result, a policy spec, a
command-line flag), so the same mistake reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError


def validation_problems(
    error: ValidationError, *, prefix: Sequence[str | int] = (), root: str = "(document)", limit: int | None = None
) -> list[str]:
    """One ``where: what`` line per problem (at most ``limit``). ``where`` is the dotted
    path below ``prefix`` (``root`` for the document itself); pydantic's "Value error, "
    lead-in of our own validators' messages is dropped."""
    lines = []
    for e in error.errors()[:limit]:
        where = ".".join(str(part) for part in (*prefix, *e["loc"])) or root
        lines.append(f"{where}: {str(e['msg']).removeprefix('Value error, ')}")
    return lines


def first_problem(error: ValidationError, *, prefix: Sequence[str | int] = (), root: str = "(document)") -> str:
    """The first problem, saying how many more there are: for one-line error messages."""
    (first,) = validation_problems(error, prefix=prefix, root=root, limit=1)
    others = error.error_count() - 1
    return first + (f" (and {others} more problem{'s' if others > 1 else ''})" if others else "")
