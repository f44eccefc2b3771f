"""llama-server's stream split into lines, from chunks of any size.

aiohttp's ``readline`` (what ``async for line in response.content`` does) refuses a line
longer than its buffer's high-water mark (512 KiB here) with its ``LineTooLong``. One ``data:``
event of llama-server grows with ``n_probs``: a client asking for thousands of probabilities
per token gets events of megabytes. A relay must not turn that valid request into a 500, so
it splits the bytes itself, with a bound far above any such event that still keeps a broken
upstream from filling the memory.
"""

from __future__ import annotations

MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest line accepted (64 MiB; n_probs at the server's own maximum stays far below)."""


class LineTooLongError(ValueError):
    """The upstream sent more than ``MAX_LINE_BYTES`` without a line break."""


class Lines:
    """Feed chunks, get the lines they complete (each with its ``\\n``); ``end()`` returns the
    unterminated rest, if any."""

    def __init__(self, max_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        self._scanned = 0
        """How much of the buffer holds no line break (not searched again)."""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        found, start, search = [], 0, self._scanned
        while (end := self._buffer.find(b"\n", search)) >= 0:
            found.append(bytes(self._buffer[start : end + 1]))
            start = search = end + 1
        del self._buffer[:start]  # once per chunk: linear in it, however many lines it holds
        self._scanned = len(self._buffer)
        if self._scanned > self.max_bytes:
            raise LineTooLongError(f"more than {self.max_bytes} bytes without a line break")
        return found

    def end(self) -> list[bytes]:
        rest, self._buffer, self._scanned = bytes(self._buffer), bytearray(), 0
        return [rest] if rest else []
