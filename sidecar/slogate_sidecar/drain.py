"""Draining: admit nothing new, let the admitted streams finish, then stop or resume.

A drain has one of two causes (docs/sidecar.md, "Draining"):

- ``SIGNAL``: SIGTERM or SIGINT to `slogate sidecar` (Kubernetes stopping the sidecar's
  container). Final: once no admitted stream remains, or at the deadline, the sidecar
  exits (``app.serve_forever``).
- ``HOOK``: ``GET /slogate/v1/drain``, the preStop hook the operator gives the llama.cpp
  container. The kubelet runs it, and waits for its answer, before it sends llama-server
  SIGTERM; the answer comes once no admitted stream remains (or at the deadline), so
  llama-server stops with nothing running. Not final: a llama.cpp container that is
  restarted, not deleted with its pod, comes back, and the sidecar admits again once it
  has seen llama-server down and then healthy. A hook drain that never sees llama-server
  stop ends by itself twice the deadline after it began (longer than any grace period
  the operator sets, the deadline plus 5 s): the call was not followed by a stop, so
  nothing is stopping. A SIGTERM during a hook drain makes it final.

While draining, the gate refuses every new inference request and every deferred one at
once (``Draining``; the proxy answers 429 ``slogate_draining`` with a Retry-After: nothing
reached llama-server, so another replica can take it), ``/readyz`` answers 503, and the
listening sockets stay open, so refusals are answers rather than refused connections.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

log = logging.getLogger("slogate.sidecar")

STRAY_HOOK_DEADLINES = 2
"""A hook drain that has not seen llama-server stop within this many deadlines was not
followed by a stop (a stray call) and ends: the operator's grace period is the deadline
plus 5 s, so a real stop has happened by then."""


class DrainCause(StrEnum):
    """Why the sidecar drains."""

    SIGNAL = "signal"
    """SIGTERM or SIGINT: final, the sidecar exits once drained."""
    HOOK = "hook"
    """GET /slogate/v1/drain (llama.cpp container's preStop): resumes after llama-server restarts."""


class Draining(Exception):  # noqa: N818 - a state, named as one
    """The gate admits nothing: the sidecar is draining."""


@dataclass(slots=True, eq=False)
class Drain:
    """One sidecar's drain state: whether, why and since when it drains, and what it refused.

    Mutated on the event loop only. The gate keeps ``streams_now`` up to date (every
    release), so waiting for the last admitted stream is an event, not a poll.
    """

    deadline_s: float
    """How long admitted streams may run on after the drain began (SidecarSettings)."""
    cause: DrainCause | None = None
    """Why it drains now; None: it admits."""
    began_at: float | None = None
    """When the current drain began (monotonic)."""
    final: bool = False
    """A SIGTERM came: the sidecar exits once drained, whatever llama-server does."""
    refused: int = 0
    """Requests refused because the sidecar was draining, since it started (every drain)."""
    cut: int = 0
    """Admitted streams still running at a final drain's deadline: cut when the sidecar stopped."""
    resumed: int = 0
    """Hook drains that ended with the sidecar admitting again."""
    upstream_went_down: bool = False
    """The current hook drain has seen llama-server down (the first half of a restart)."""
    streams: int = 0
    """Admitted, unfinished streams (the gate's ledger, kept here by ``streams_now``)."""
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no admitted stream remains."""
    _final: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def active(self) -> bool:
        """The gate refuses everything."""
        return self.cause is not None

    def begin(self, cause: DrainCause, streams: int) -> None:
        """Start draining, with ``streams`` admitted streams running; a SIGTERM makes a drain final.

        Another call while draining keeps the first one's start (and so its deadline)."""
        if cause is DrainCause.SIGNAL and not self.final:
            self.final = True
            self._final.set()
        self.streams_now(streams)
        if self.cause is not None:
            log.info("drain (%s) now %s", self.cause.value, "final" if self.final else "continuing")
            return
        self.cause, self.began_at, self.upstream_went_down = cause, time.monotonic(), False
        log.warning(
            "draining (%s): admitting nothing, %d admitted streams have %g s to finish",
            cause.value,
            streams,
            self.deadline_s,
        )

    def streams_now(self, streams: int) -> None:
        """The number of admitted, unfinished streams changed (the gate calls this on every release)."""
        self.streams = streams
        if streams == 0:
            self._idle.set()
        else:
            self._idle.clear()

    def refuse(self) -> None:
        """Count one request refused because of the drain."""
        self.refused += 1

    def seconds_left(self) -> float | None:
        """Until the deadline of the current drain; None when not draining."""
        if self.began_at is None:
            return None
        return max(0.0, self.began_at + self.deadline_s - time.monotonic())

    async def drained(self) -> bool:
        """Wait until no admitted stream remains (True) or the deadline passes with some still running (False)."""
        if self._idle.is_set():
            return True
        left = self.seconds_left()
        if left is None:  # not draining: nothing bounds the wait but the streams themselves
            await self._idle.wait()
            return True
        try:
            async with asyncio.timeout(left):
                await self._idle.wait()
        except TimeoutError:
            pass
        return self._idle.is_set()

    async def final_drained(self) -> None:
        """Wait for a final drain to begin and end; count and log the streams it leaves to be cut."""
        await self._final.wait()
        if not await self.drained():
            self.cut = self.streams
            log.warning("drain deadline (%g s) passed: cutting %d admitted streams", self.deadline_s, self.cut)
        log.info("drained: %d requests refused while draining, %d streams cut; stopping", self.refused, self.cut)

    def observe_upstream(self, up: bool) -> None:
        """llama-server's health, as the poller saw it: a hook drain ends once it restarted."""
        if self.cause is not DrainCause.HOOK or self.final or self.began_at is None:
            return
        if not up:
            if not self.upstream_went_down:
                log.info("drain (hook): llama-server stopped")
            self.upstream_went_down = True
        elif self.upstream_went_down:
            self.resume("llama-server is back")
        elif time.monotonic() - self.began_at >= STRAY_HOOK_DEADLINES * self.deadline_s:
            self.resume(f"llama-server did not stop within {STRAY_HOOK_DEADLINES} x {self.deadline_s:g} s")

    def resume(self, why: str) -> None:
        """End a hook drain: the sidecar admits again. (A final drain ends with the process.)"""
        if self.final:
            return
        self.cause, self.began_at, self.upstream_went_down = None, None, False
        self.resumed += 1
        log.warning("drain over, admitting again: %s", why)

    def describe(self) -> dict[str, Any]:
        """The drain for GET /slogate/v1/state."""
        return {
            "draining": self.active,
            "cause": self.cause.value if self.cause is not None else None,
            "final": self.final,
            "secondsLeft": self.seconds_left(),
            "deadlineSeconds": self.deadline_s,
            "refused": self.refused,
            "cut": self.cut,
            "resumed": self.resumed,
        }
