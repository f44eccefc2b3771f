"""How a simulated fleet's requests find a pod: the balancers users put before many pods.

- ``random``: a pod drawn uniformly for each request (a Kubernetes Service spreads
  connections so; nginx ``random``).
- ``round-robin``: pods in turn (nginx's default).
- ``least-requests``: the pod with the fewest requests in it from this balancer, held at
  its gate or forwarded (nginx ``least_conn``, Envoy ``LEAST_REQUEST``); ties go to the
  pod touched longest ago (round robin among them).
- ``retry-429[:TRIES]``: ``random``, and a request its pod's gate refuses (at arrival, or
  at the end of a deferral: no byte has reached the client yet) goes to another pod not
  yet tried, up to TRIES pods in all (3 by default, ingress-nginx's
  ``proxy-next-upstream-tries``); what nginx does with ``proxy_next_upstream http_429``
  (docs/routing.md), instantly (a 429 takes a millisecond, not simulated).
- ``least-pressure``: least-pressure routing over the per-pod gates, a balancer that reads
  every gate's books at every arrival (what an endpoint picker such as llm-d-router's approaches;
  not a bound: the bound on any front is the clairvoyant's, ``clairvoyant``): every request
  goes to the pod whose gate is least pressed (``Front.pressure``: slogate's predicted
  queue wait with a free stream before any pod without one; a count cap's requests in it),
  which then decides. With count caps of C and no queue this is a single loss system of
  N·C servers (Erlang B), which the tests check.

Each rule is given by a ``Routing`` (a name and its tries) and runs as a ``Router`` made
fresh per run; every random draw comes from the run's seed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from slogate_sim.fronts import Front

RoutingName = Literal["random", "round-robin", "least-requests", "retry-429", "least-pressure"]
ROUTINGS: tuple[RoutingName, ...] = ("random", "round-robin", "least-requests", "retry-429", "least-pressure")
DEFAULT_RETRY_TRIES = 3
"""ingress-nginx's default ``proxy-next-upstream-tries``."""
_DRAWS = 4096
"""Pod indices drawn per batch."""


@dataclass(frozen=True, slots=True)
class Routing:
    """A balancer's rule."""

    name: RoutingName = "random"
    tries: int = 1
    """Pods tried per request, the first included; more than 1 only for ``retry-429``."""

    def __post_init__(self) -> None:
        if self.name not in ROUTINGS:
            raise ValueError(f"unknown routing {self.name!r}: one of {', '.join(ROUTINGS)} (retry-429:TRIES)")
        if self.tries < 1:
            raise ValueError(f"tries must be >= 1, got {self.tries}")
        if self.tries > 1 and self.name != "retry-429":
            raise ValueError(f"only retry-429 tries more than one pod, not {self.name}")

    @classmethod
    def parse(cls, text: str) -> Routing:
        """``random``, ``round-robin``, ``least-requests``, ``least-pressure``, ``retry-429`` or
        ``retry-429:TRIES``; ValueError naming the choices otherwise."""
        name, _, tries = text.partition(":")
        if name == "retry-429":
            try:
                count = int(tries) if tries else DEFAULT_RETRY_TRIES
            except ValueError:
                raise ValueError(f"retry-429:TRIES takes a whole number of tries, not {tries!r}") from None
            return cls("retry-429", count)
        if tries:
            raise ValueError(f"only retry-429 takes :TRIES, not {text!r}")
        return cls(name, 1)  # type: ignore[arg-type]  # checked in __post_init__

    def __str__(self) -> str:
        return f"retry-429:{self.tries}" if self.name == "retry-429" else self.name


class LeastKey:
    """The pod with the least key, keys changing one pod at a time: a heap whose stale
    entries are skipped when they surface (O(log N) per change and per look)."""

    __slots__ = ("_heap", "_keys", "_seq")

    def __init__(self, pods: int) -> None:
        self._keys = [0.0] * pods
        self._seq = list(range(pods))
        self._heap = [(0.0, i, i) for i in range(pods)]
        """(key, seq of the update, pod): the entry is current while seq is the pod's."""

    def update(self, pod: int, key: float, seq: int) -> None:
        """``pod``'s key is now ``key`` (``seq``: a number larger than any before it). Equal
        keys go to the pod touched longest ago, so a pod that just refused a request, its
        key unchanged, goes behind the others of its key: round robin among ties, as nginx's
        ``least_conn`` does, rather than the same pod offered every arrival."""
        self._keys[pod] = key
        self._seq[pod] = seq
        heapq.heappush(self._heap, (key, seq, pod))
        if len(self._heap) > 8 * len(self._keys) + 1024:  # too many stale entries: rebuild
            self._heap = [(k, s, p) for p, (k, s) in enumerate(zip(self._keys, self._seq, strict=True))]
            heapq.heapify(self._heap)

    def add(self, key: float) -> int:
        """One more pod, with this key; its index."""
        pod = len(self._keys)
        self._keys.append(key)
        self._seq.append(-1)
        return pod

    def least(self) -> int:
        """The pod with the least key (of equal keys, the one touched longest ago)."""
        heap, seqs = self._heap, self._seq
        while heap[0][1] != seqs[heap[0][2]]:
            heapq.heappop(heap)
        return heap[0][2]


class Router:
    """One run's balancer: picks a request's first pod and, for ``retry-429``, the next."""

    def __init__(self, routing: Routing, pods: int, seed: int) -> None:
        self.routing = routing
        self.pods = pods
        # The fifth stream of the seed: the first four are the arrivals' (``engine``).
        self._rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(5)[4])
        self._draws: list[int] = []
        self._turn = 0
        self._least = LeastKey(pods) if routing.name in ("least-requests", "least-pressure") else None
        self._by_conns = routing.name == "least-requests"
        self._seq = pods

        self.tracks = self._least is not None
        """Whether it must hear of every change at a pod (``changed``)."""

    def first(self) -> int:
        """The pod a new request goes to."""
        name = self.routing.name
        if name in ("random", "retry-429"):
            return self._draw()
        if name == "round-robin":
            self._turn = (self._turn + 1) % self.pods
            return self._turn
        assert self._least is not None
        return self._least.least()

    def next(self, tried: Sequence[int]) -> int | None:
        """Another pod for a refused request, not one of ``tried``; None when its tries are
        spent (or every pod was tried)."""
        if len(tried) >= min(self.routing.tries, self.pods):
            return None
        while True:  # tries are few and pods many: a rejection draw ends fast
            pod = self._draw()
            if pod not in tried:
                return pod

    def changed(self, pod: int, conns: int, front: Front, *, routable: bool = True) -> None:
        """Something happened at ``pod``: ``conns``, its requests from this balancer, or its
        ``front``'s pressure may have moved (only called when ``tracks``). A pod not
        ``routable`` (starting, or stopping) is sent nothing."""
        assert self._least is not None
        self._seq += 1
        key = (conns if self._by_conns else front.pressure()) if routable else math.inf
        self._least.update(pod, key, self._seq)

    def add_pod(self) -> int:
        """A pod joins (not routable until ``changed`` says so); its index. Only the routings
        that see every pod (least-requests, least-pressure) take pods that come and go."""
        if self._least is None:
            raise ValueError(
                f"a fleet that changes size needs least-requests or least-pressure routing, not {self.routing}"
            )
        self.pods += 1
        return self._least.add(math.inf)

    def _draw(self) -> int:
        if not self._draws:
            self._draws = self._rng.integers(0, self.pods, size=_DRAWS).tolist()[::-1]
        return self._draws.pop()
