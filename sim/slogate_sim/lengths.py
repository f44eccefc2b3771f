"""Token counts a workload draws: one description read by the load generator and the simulator.

Every distribution draws two ways from the same definition: one request at a time from
the load generator's ``random.Random`` (``one``, in the order the schedule asks), and in
batches from the simulator's numpy generator (``draw``). The streams differ; the
distribution is the same, and so is what it reports about itself (bounds, the share of
requests beyond a length).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Lengths(Protocol):
    """A distribution of token counts, each >= 1."""

    @property
    def low(self) -> int:
        """The smallest count it can draw."""
        ...

    @property
    def high(self) -> int:
        """The largest count it can draw."""
        ...

    def one(self, rng: random.Random) -> int:
        """One count (the load generator: a request at a time)."""
        ...

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` counts (the simulator: a batch at a time)."""
        ...

    def share_over(self, tokens: int) -> float:
        """The probability of a count above ``tokens``."""
        ...

    def describe(self) -> str:
        """In a few words, for tables and reports."""
        ...


@dataclass(frozen=True, slots=True)
class TokenLengths:
    """Uniform over the integers ``low``..``high`` (fixed when equal)."""

    low: int
    """The smallest count."""
    high: int
    """The largest count."""

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"token lengths need 1 <= low <= high, got {self.low}..{self.high}")

    @classmethod
    def fixed(cls, tokens: int) -> TokenLengths:
        """Always ``tokens``."""
        return cls(tokens, tokens)

    def one(self, rng: random.Random) -> int:
        """A fixed length takes nothing from ``rng``: other draws stay where they were."""
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` counts."""
        if self.low == self.high:
            return [self.low] * count
        values: list[int] = rng.integers(self.low, self.high + 1, size=count).tolist()
        return values

    def share_over(self, tokens: int) -> float:
        """The integers above ``tokens`` over all of them."""
        return max(0, self.high - max(tokens, self.low - 1)) / (self.high - self.low + 1)

    def describe(self) -> str:
        """``512`` or ``100-900``, as the command line takes it."""
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True, slots=True)
class SampledLengths:
    """One of the given counts, each sample equally likely."""

    samples: tuple[int, ...]
    """The counts to choose from (repeat one to weigh it more)."""

    def __post_init__(self) -> None:
        if not self.samples or min(self.samples) < 1:
            raise ValueError("sampled lengths need at least one sample, every one >= 1")

    @property
    def low(self) -> int:
        """The smallest sample."""
        return min(self.samples)

    @property
    def high(self) -> int:
        """The largest sample."""
        return max(self.samples)

    def one(self, rng: random.Random) -> int:
        """One sample."""
        return rng.choice(self.samples)

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` samples, with replacement."""
        values: list[int] = rng.choice(np.asarray(self.samples), size=count).tolist()
        return values

    def share_over(self, tokens: int) -> float:
        """The samples above ``tokens`` over all of them."""
        return sum(1 for n in self.samples if n > tokens) / len(self.samples)

    def describe(self) -> str:
        """``32, 64 or 128``; many samples by their range."""
        values = sorted(set(self.samples))
        if len(values) > 5:
            return f"{len(self.samples)} samples, {self.low}-{self.high}"
        if len(values) == 1:
            return str(values[0])
        return ", ".join(map(str, values[:-1])) + f" or {values[-1]}"


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """A lognormal around ``median`` with shape ``sigma``, rounded and clamped to ``low``..``high``."""

    median: float
    """exp(μ) of the underlying normal: half the counts are below it."""
    sigma: float
    """σ of the underlying normal: 0.7 puts the 99th percentile near 5x the median."""
    low: int
    """Shorter draws count as this."""
    high: int
    """Longer draws count as this."""

    def __post_init__(self) -> None:
        if not (self.median > 0 and self.sigma > 0 and 1 <= self.low <= self.high):
            raise ValueError(f"a lognormal needs median > 0, sigma > 0 and 1 <= low <= high, got {self}")

    def one(self, rng: random.Random) -> int:
        """One count."""
        return max(self.low, min(self.high, round(rng.lognormvariate(math.log(self.median), self.sigma))))

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` counts (numpy's rint rounds halves to even, as Python's round does)."""
        values = np.clip(np.rint(rng.lognormal(math.log(self.median), self.sigma, size=count)), self.low, self.high)
        drawn: list[int] = values.astype(int).tolist()
        return drawn

    def share_over(self, tokens: int) -> float:
        """P(round(X) > tokens) = P(X >= tokens + ½), from the normal's tail, within the clamp."""
        if tokens >= self.high:
            return 0.0
        if tokens < self.low:
            return 1.0
        z = (math.log(tokens + 0.5) - math.log(self.median)) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2))

    def describe(self) -> str:
        """Its parameters."""
        return f"lognormal around {self.median:g} (σ {self.sigma:g}, {self.low}-{self.high})"


@dataclass(frozen=True, slots=True)
class MixedLengths:
    """Each count from one of several distributions, picked with the given weights."""

    parts: tuple[tuple[float, Lengths], ...]
    """(weight, distribution), the weights adding up to 1; the first part is picked below its weight."""

    def __post_init__(self) -> None:
        weights = [w for w, _ in self.parts]
        if not weights or min(weights) <= 0 or not math.isclose(sum(weights), 1.0, abs_tol=1e-9):
            raise ValueError(f"a mix needs positive weights adding up to 1, got {weights}")

    @property
    def low(self) -> int:
        """The smallest count of any part."""
        return min(part.low for _, part in self.parts)

    @property
    def high(self) -> int:
        """The largest count of any part."""
        return max(part.high for _, part in self.parts)

    def one(self, rng: random.Random) -> int:
        """One uniform draw picks the part, then the part draws."""
        u, below = rng.random(), 0.0
        for weight, part in self.parts[:-1]:
            below += weight
            if u < below:
                return part.one(rng)
        return self.parts[-1][1].one(rng)

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` counts: a part per draw, then each part's draws put in place."""
        picks = rng.choice(len(self.parts), size=count, p=[w for w, _ in self.parts])
        values = np.empty(count, dtype=int)
        for i, (_, part) in enumerate(self.parts):
            where = picks == i
            values[where] = part.draw(rng, int(where.sum()))
        drawn: list[int] = values.tolist()
        return drawn

    def share_over(self, tokens: int) -> float:
        """The parts' shares, weighed."""
        return sum(weight * part.share_over(tokens) for weight, part in self.parts)

    def describe(self) -> str:
        """Each part with its weight."""
        return " or ".join(f"{part.describe()} ({weight:.0%})" for weight, part in self.parts)
