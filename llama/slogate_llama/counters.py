"""Read llama-server's `/metrics` (Prometheus text exposition) into plain numbers.

Calibration and the sidecar derive prefill and decode rates from *deltas of llama-server's
counters* between two scrapes; its gauges are averaged since the previous scrape and reset
by every scrape, so they cannot be shared between scrapers. This module therefore cares
about reading counters exactly, under the names llama-server prints (``exposition`` prints
the same names for the stand-ins that play llama-server in tests and benchmarks).

Parsing is delegated to `prometheus_client.parser.text_string_to_metric_families`, with
one correction. That parser converts counters to the OpenMetrics convention:

* a counter declared ``# TYPE foo_total counter`` becomes a family named ``foo`` whose
  sample keeps the printed name ``foo_total`` -- harmless if one reads sample names;
* a counter declared *without* the suffix (``# TYPE foo counter``, as llama-server does
  for ``llamacpp:n_tokens_max``) keeps the family name ``foo`` but its sample is renamed
  to ``foo_total``, a name that appears nowhere in the text.

Both cases give a family ``foo`` with a sample ``foo_total``, so the families alone cannot
tell which name was printed. `parse_samples` reads the ``# TYPE`` lines itself and undoes
the renaming, so every sample here carries its name exactly as it appears in the text:
callers ask for ``llamacpp:prompt_tokens_total`` and ``llamacpp:n_tokens_max`` verbatim.

A second llama-server quirk callers must know: it prints values with C++ stream defaults,
six significant digits, so a counter past 999,999 is rounded (``1.23457e+06``). Deltas of
large counters are only as fine as that rounding; `rounding_step` says how fine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, fields

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "GAUGES",
    "LLAMACPP_PREFIX",
    "SIGNIFICANT_DIGITS",
    "LlamaCounters",
    "MetricsError",
    "MissingMetricError",
    "PrometheusParseError",
    "Sample",
    "parse_samples",
    "parse_unlabelled",
    "rounding_step",
    "sample_value",
]

LLAMACPP_PREFIX = "llamacpp:"
"""Every llama-server metric name starts with this (a colon: a valid "recording rule" name)."""

_TOTAL = "_total"

GAUGES = frozenset({"requests_processing", "requests_deferred"})
"""The `LlamaCounters` fields llama-server declares as gauges; every other one is a counter."""


SIGNIFICANT_DIGITS = 6
"""Digits llama-server prints a value with (C++ stream defaults, like ``%g``)."""


def rounding_step(printed: float) -> float:
    """The spacing of the values llama-server can print near ``printed`` (0 for 0).

    With six significant digits that is 10^(e - 5), e the decimal exponent: 1 below 10^6,
    10 up to 10^7, 100 up to 10^8 ... The true value lies within half a step of the printed
    one. The exponent is read off the same formatting, not computed with log10, so it is
    the printed value's own (999,999.7 prints as 1e+06, whose step is 10). Unknown
    (infinite) for a non-finite value.
    """
    if printed == 0:
        return 0.0
    if not math.isfinite(printed):
        return math.inf
    exponent = int(f"{abs(printed):.{SIGNIFICANT_DIGITS - 1}e}".partition("e")[2])
    return 10.0 ** (exponent - SIGNIFICANT_DIGITS + 1)


class MetricsError(ValueError):
    """The text is not usable as llama-server metrics."""


class PrometheusParseError(MetricsError):
    """The text is not Prometheus text exposition (an HTML error page, JSON, truncation...)."""


class MissingMetricError(MetricsError):
    """A sample the caller needs is absent from otherwise valid exposition text."""


@dataclass(frozen=True)
class Sample:
    """One sample line of exposition text."""

    name: str
    """Its name exactly as printed (no ``_total`` added or removed)."""
    labels: tuple[tuple[str, str], ...]
    """Its labels, as sorted (name, value) pairs."""
    value: float
    """Its value (llama-server prints six significant digits)."""

    def has_labels(self, labels: Mapping[str, str]) -> bool:
        """True if this sample carries exactly these labels (no more, no fewer)."""
        return dict(self.labels) == dict(labels)


def _counters_declared_without_total(text: str) -> frozenset[str]:
    """Names from ``# TYPE <name> counter`` lines whose name lacks the ``_total`` suffix.

    Tokenised like prometheus_client does (whitespace, at most four parts), so exactly the
    families it renamed are found.
    """
    names = set()
    for line in text.splitlines():
        parts = line.strip().split(None, 3)
        if (
            len(parts) == 4
            and parts[0] == "#"
            and parts[1] == "TYPE"
            and parts[3].strip() == "counter"
            and not parts[2].endswith(_TOTAL)
        ):
            names.add(parts[2])
    return frozenset(names)


def _snippet(text: str, limit: int = 120) -> str:
    head = text.strip().replace("\n", "\\n")
    return head if len(head) <= limit else head[:limit] + "..."


def parse_samples(text: str) -> tuple[Sample, ...]:
    """Parse exposition text into samples named exactly as printed, in text order.

    Raises PrometheusParseError, naming the start of the offending text, if it is not
    Prometheus text format. Empty text is valid and yields no samples.
    """
    renamed = _counters_declared_without_total(text)
    samples: list[Sample] = []
    try:
        # The parser is a lazy generator: it fails while being iterated, not when called.
        for family in text_string_to_metric_families(text):
            undo = family.type == "counter" and family.name in renamed
            for raw in family.samples:
                name = raw.name
                if undo and name == family.name + _TOTAL:
                    name = family.name
                labels = tuple(sorted(raw.labels.items()))
                samples.append(Sample(name=name, labels=labels, value=float(raw.value)))
    except (ValueError, IndexError, TypeError) as exc:
        detail = str(exc) or type(exc).__name__
        raise PrometheusParseError(
            f"not Prometheus text exposition ({detail}); text starts: {_snippet(text)!r}"
        ) from exc
    return tuple(samples)


def parse_unlabelled(text: str) -> dict[str, float]:
    """Map each unlabelled sample's printed name to its value.

    This is the whole of llama-server's `/metrics` in practice (its only labelled series
    is a per-position speculative-decoding counter). A name printed twice is an error
    rather than "last one wins": it means two expositions were concatenated.
    """
    values: dict[str, float] = {}
    for sample in parse_samples(text):
        if sample.labels:
            continue
        if sample.name in values:
            raise PrometheusParseError(f"sample {sample.name!r} appears more than once")
        values[sample.name] = sample.value
    return values


def sample_value(samples: Iterable[Sample], name: str, labels: Mapping[str, str] | None = None) -> float:
    """Value of the sample with this printed name and exactly these labels.

    Raises MissingMetricError listing the label sets that do exist under that name, which
    is usually all one needs to see the mistake.
    """
    wanted = labels or {}
    seen: list[dict[str, str]] = []
    for sample in samples:
        if sample.name != name:
            continue
        if sample.has_labels(wanted):
            return sample.value
        seen.append(dict(sample.labels))
    if seen:
        raise MissingMetricError(f"no sample {name}{wanted}; label sets present: {seen}")
    raise MissingMetricError(f"no sample named {name!r}")


@dataclass(frozen=True)
class LlamaCounters:
    """The llama-server counters and gauges calibration and the sidecar's live rates come from.

    Field names are the metric names without the ``llamacpp:`` prefix. The `*_total`
    fields are monotonic counters (compare two snapshots); `requests_processing` and
    `requests_deferred` are read at scrape time. `prompt_tokens_total` excludes prompt
    tokens served from the KV cache; those are `prompt_tokens_cached_total`, which older
    builds lack and is therefore optional.
    """

    prompt_tokens_total: float
    """Prompt tokens prefilled, cached ones excluded."""
    prompt_seconds_total: float
    """Seconds slots spent prefilling (summed over slots working in the same batch)."""
    tokens_predicted_total: float
    """Tokens generated, counted when a request ends."""
    tokens_predicted_seconds_total: float
    """Seconds slots spent generating (summed over slots), counted when a request ends."""
    n_decode_total: float
    """llama_decode() calls (speculative and multimodal ones excluded)."""
    requests_processing: float
    """Requests holding a slot at scrape time (a gauge)."""
    requests_deferred: float
    """Requests waiting for a slot at scrape time (a gauge)."""
    prompt_tokens_cached_total: float | None = None
    """Prompt tokens served from the KV cache; None on builds that do not print it."""

    @classmethod
    def from_samples(cls, samples: Mapping[str, float]) -> LlamaCounters:
        """Build from `parse_unlabelled` output; all required metrics must be present.

        A missing one means the upstream is not llama-server, or runs without `--metrics`
        (then `/metrics` answers 501 and nothing reaches here), or is a build whose names
        changed: all are configuration errors, reported with every missing name at once.
        """
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [LLAMACPP_PREFIX + n for n in required if LLAMACPP_PREFIX + n not in samples]
        if missing:
            raise MissingMetricError(
                f"llama-server metrics missing: {', '.join(missing)}; the upstream is not "
                "llama-server, or it runs without --metrics"
            )

        def get(name: str) -> float:
            return samples[LLAMACPP_PREFIX + name]

        return cls(
            prompt_tokens_total=get("prompt_tokens_total"),
            prompt_seconds_total=get("prompt_seconds_total"),
            tokens_predicted_total=get("tokens_predicted_total"),
            tokens_predicted_seconds_total=get("tokens_predicted_seconds_total"),
            n_decode_total=get("n_decode_total"),
            requests_processing=get("requests_processing"),
            requests_deferred=get("requests_deferred"),
            prompt_tokens_cached_total=samples.get(LLAMACPP_PREFIX + "prompt_tokens_cached_total"),
        )

    @classmethod
    def from_text(cls, text: str) -> LlamaCounters:
        """Parse a `/metrics` body and build the snapshot (see `from_samples`)."""
        return cls.from_samples(parse_unlabelled(text))
