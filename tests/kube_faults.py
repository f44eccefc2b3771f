"""Faults the tests inject in front of the real API server (tests/api_proxy.py answers them)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from api_proxy import Call

RBAC_AGENTS = ("slogate-operator/", "kopf/")
"""User-Agent prefixes of the operator's service account: its own client and kopf's."""


@dataclass
class Fault:
    """Answer the next ``times`` requests of ``method`` on ``plural`` with ``status``."""

    method: str
    plural: str
    status: int
    times: int = 1


@dataclass
class RandomFaults:
    """Answer a seeded random ``share`` of the resource calls of ``agents`` (User-Agent
    prefixes: the operator's own client and kopf's) with one of ``statuses``. As a real API
    server, a 409 only ever answers a write (a read drawn for 409 gets a 500); discovery is
    spared, and watch streams unless ``watches`` (a broken watch delays kopf's events only)."""

    share: float
    seed: int
    statuses: tuple[int, ...] = (500, 409)
    agents: tuple[str, ...] = RBAC_AGENTS
    watches: bool = False
    blackout_after_create: str | None = None
    """Once an object of this plural is created, fail every call of ``agents`` with 500 from
    then on, as if the operator had died right after that create (until ``blackout`` is cleared)."""
    blackout: bool = False
    met: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    """(method, plural, status) of every call failed so far."""

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def status_for(self, request: Call) -> int | None:
        """The status to fail ``request`` with, or None to serve it."""
        plural = request.resource.plural if request.resource is not None else None
        if not plural or not request.headers.get("User-Agent", "").startswith(self.agents):
            return None
        if not self.watches and request.params.get("watch") in ("true", "1"):
            return None
        if self.blackout:
            status = 500
        elif self._rng.random() < self.share:
            status = self._rng.choice(self.statuses)
            if status == 409 and request.method == "GET":
                status = 500
        else:
            return None
        self.met[request.method, plural, status] += 1
        return status

    @property
    def failed(self) -> int:
        """How many calls were failed so far."""
        return sum(self.met.values())
