"""Token lengths: one distribution, drawn one at a time (load generator) or in batches (simulator)."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from slogate_sim.lengths import Lengths, LognormalLengths, MixedLengths, SampledLengths, TokenLengths
from slogate_sim.workloads import CHAT_PROMPTS, PRESETS, preset, schedule

KINDS: list[Lengths] = [
    TokenLengths(100, 400),
    TokenLengths.fixed(512),
    SampledLengths((32, 64, 128)),
    LognormalLengths(median=100, sigma=0.7, low=16, high=1000),
    MixedLengths(((0.05, TokenLengths.fixed(1500)), (0.95, TokenLengths(100, 300)))),
]


@pytest.mark.parametrize("lengths", KINDS, ids=lambda k: k.describe())
def test_both_ways_of_drawing_are_the_same_distribution(lengths: Lengths) -> None:
    rng = random.Random(3)
    one_at_a_time = [lengths.one(rng) for _ in range(20_000)]
    batch = lengths.draw(np.random.default_rng(3), 20_000)
    for drawn in (one_at_a_time, batch):
        assert lengths.low <= min(drawn) <= max(drawn) <= lengths.high
    assert statistics.fmean(batch) == pytest.approx(statistics.fmean(one_at_a_time), rel=0.03)
    for tokens in (lengths.low - 1, 150, 300, 450, lengths.high):
        share = lengths.share_over(tokens)  # what warnings quote: the share a prefill can never serve
        for drawn in (one_at_a_time, batch):
            assert sum(n > tokens for n in drawn) / len(drawn) == pytest.approx(share, abs=0.01)


def test_the_load_generators_chat_draws_are_the_ones_the_benchmark_always_sent() -> None:
    # Prompts lognormal around 100 (σ 0.7, 16..1000), then max_tokens from (32, 64, 128), from one stream.
    rng = random.Random(1)
    expected = []
    for _ in range(500):
        n_in = max(16, min(1000, round(rng.lognormvariate(math.log(100), 0.7))))
        expected.append((n_in, rng.choice((32, 64, 128))))
    assert preset("chat").draws(500) == expected
    contents = random.Random("1/contents")  # the schedule's own stream: an id, then the same two draws
    first = contents.randrange(1000, 40000)
    n_in = max(16, min(1000, round(contents.lognormvariate(math.log(100), 0.7))))
    arrival = schedule(50.0, 10.0, PRESETS["chat"], seed=1)[0]
    assert (arrival.first_token_id, arrival.prompt_tokens, arrival.max_tokens) == (
        first,
        n_in,
        contents.choice((32, 64, 128)),
    )


def test_the_heavy_tail_picks_its_part_with_one_uniform_draw() -> None:
    rng = random.Random(1)
    expected = [1500 if rng.random() < 0.05 else rng.randint(100, 300) for _ in range(500)]
    heavy = preset("heavy_tail")
    rng = random.Random(1)
    assert [heavy.prompt_tokens.one(rng) for _ in range(500)] == expected


def test_each_says_what_it_is() -> None:
    assert [k.describe() for k in KINDS] == [
        "100-400",
        "512",
        "32, 64 or 128",
        "lognormal around 100 (σ 0.7, 16-1000)",
        "1500 (5%) or 100-300 (95%)",
    ]
    assert CHAT_PROMPTS.share_over(15) == 1.0
    assert CHAT_PROMPTS.share_over(1000) == 0.0


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: TokenLengths(5, 4), "low <= high"),
        (lambda: SampledLengths(()), "at least one sample"),
        (lambda: SampledLengths((0, 3)), "every one >= 1"),
        (lambda: LognormalLengths(100, 0.0, 1, 10), "sigma > 0"),
        (lambda: MixedLengths(((0.5, TokenLengths.fixed(1)),)), "adding up to 1"),
    ],
)
def test_nonsense_is_refused(make: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        make()  # type: ignore[operator]
