"""Times as the Kubernetes API writes them: RFC 3339, UTC, whole seconds, a ``Z``.

One formatter and one parser for every timestamp the operator writes into a status,
an annotation or an event, and reads back (its own, or the API server's).
"""

from __future__ import annotations

from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(moment: datetime) -> str:
    """``2026-12-03T11:28:00Z``: the API's own form (a naive datetime is taken as UTC)."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime(_FORMAT)


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 timestamp from the API (or from ``format_time``), or None if it is not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
