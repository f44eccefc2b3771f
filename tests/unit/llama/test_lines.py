"""llama-server's stream split into lines by slogate_llama.lines: every split of the bytes
gives the same lines, a line far past aiohttp's 512 KiB readline limit is one line, and a
line past the bound is refused rather than buffered without end."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slogate_llama.lines import Lines, LineTooLongError


def split(data: bytes, cuts: list[int], max_bytes: int = 1 << 26) -> list[bytes]:
    lines, found, start = Lines(max_bytes), [], 0
    for cut in sorted(set(cuts)):
        found += lines.feed(data[start:cut])
        start = cut
    return found + lines.feed(data[start:]) + lines.end()


def newline_lines(data: bytes) -> list[bytes]:
    """The lines of ``data`` split at b"\n" only (a stream's framing; \r is just a byte)."""
    *whole, rest = data.split(b"\n")
    return [line + b"\n" for line in whole] + ([rest] if rest else [])


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=20))
def test_any_split_gives_the_lines_of_the_whole(data: bytes, cuts: list[int]) -> None:
    assert split(data, cuts) == newline_lines(data)


def test_a_line_of_megabytes_is_one_line() -> None:
    event = b'data: {"probs":"' + b"x" * 3_000_000 + b'"}\n'
    data = event + b"\n" + b"data: [DONE]\n"
    cuts = list(range(0, len(data), 65_536))  # as a socket would deliver it
    assert split(data, cuts) == [event, b"\n", b"data: [DONE]\n"]


def test_a_line_past_the_bound_is_refused() -> None:
    lines = Lines(max_bytes=1000)
    assert lines.feed(b"a" * 600) == []
    with pytest.raises(LineTooLongError, match="1000 bytes"):
        lines.feed(b"a" * 600)
