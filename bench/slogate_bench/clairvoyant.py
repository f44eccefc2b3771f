"""The clairvoyant bound: on one arrival trace, the goodput no front can beat.

Every front (direct, a count cap, slogate) is judged on the very trace a measured run
sent, against two numbers computed in the simulator's server model (``simulator``):

- ``clairvoyant``, *achieved*: an admission plan made knowing every request's exact
  service, replayed in the simulator (the ``Planned`` front) on that trace: its on-time
  completions really happen there, so it is a lower bound on the best any front can do.
  Plans forward each admitted request at its arrival (llama-server's FIFO keeps the
  arrival order); they neither hold nor reorder.
- ``upper_bound``, *certified*: no front in that model, however it admits, holds or
  reorders, gets more requests completed with TTFT within the SLO. A work relaxation,
  proved at ``_upper_bound``.

The best possible lies between the two (finding it exactly is NP-hard: it contains
scheduling with deadlines), so a front's goodput as a share of the clairvoyant's is an
honest score: near 100% means nothing much is left to win on that trace.

The plan: an exact-lookahead greedy in the spirit of Moore-Hodgson
------------------------------------------------------------------
Arrivals are taken in time order; each is tentatively forwarded, and the server is run
ahead (exactly, in the simulator's model, with no further arrivals) until every request
forwarded so far has its first token. Under FIFO a request's TTFT depends only on the
requests ahead of it, so later arrivals cannot change what this lookahead sees. If a
request would then miss the SLO, one request is dropped: among those still in the server
(queued, prefilling or decoding), the one with the most work (``server_seconds_per_request``
at ``streams``) whose removal puts every request back on time, found by replaying the
trace without it from its arrival (snapshots of the server at each arrival keep that
short). The newcomer always qualifies: without it the server is as it was, on time.
Dropping the biggest rather than the newcomer keeps the count and leaves the most room
for what comes next, as Moore-Hodgson's rule does for one machine. A request whose
prefill alone exceeds the SLO is never admitted. Requests are judged on time with a 1 ns
margin, so the float rounding of the simulator's own replay never flips one.

The bound: a work relaxation
----------------------------
Requests on time that arrive in a stretch [a, b] have their first tokens by b + SLO; by
then all but at most ``slots`` of them (still decoding) have completed. So their prefills
T_prefill(n_in) and those completions' decodes, each token costing at least the cheapest
t_decode(B) / B, fit in b - a + SLO server-seconds: taking requests smallest-work-first
until that budget (plus the ``slots`` largest decodes) is spent counts at most as many as
can be on time. Summed over a cut of the trace into stretches, the least such sum over
all cuts is the bound (proof at ``_upper_bound``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from slogate_admission.service import server_seconds_per_request
from slogate_bench.capacity import ServerModel
from slogate_bench.scenario import ArrivalLike, config_for_trace, trace_of
from slogate_bench.simulated_fronts import Planned
from slogate_bench.simulator import simulate
from slogate_bench.workloads import DEFAULT_CLIENT_TIMEOUT_S

_MARGIN_S = 1e-9
"""The plan keeps every TTFT this far inside the SLO (the replay's rounding is ~1e-13 s)."""
_SLACK = 1e-9
"""The upper bound's budgets are widened by this fraction: float rounding may only loosen it."""


@dataclass(frozen=True, slots=True)
class Bound:
    """The clairvoyant goodput and the certified upper bound on one trace.

    ``on_time <= optimum <= upper_bound``, counted as the measured runs count goodput
    (``load.Run.goodput``): completed with TTFT within the SLO, per second of the window.
    """

    requests: int
    """Arrivals in the trace."""
    feasible: int
    """Arrivals whose prefill alone fits the SLO: the others are never on time."""
    admitted: int
    """Forwarded by the clairvoyant plan."""
    on_time: int
    """Of those, completed within the SLO in the simulator's replay (all of them, by construction)."""
    upper_bound: int
    """No front gets more requests completed within the SLO on this trace (certified)."""
    window_s: float
    """The arrival window goodput is divided by."""
    clairvoyant_goodput_rps: float
    """on_time / window_s: achieved by a concrete plan, a lower bound on the optimum."""
    upper_bound_goodput_rps: float
    """upper_bound / window_s: the optimum is at most this."""
    plan: frozenset[int]
    """The admitted arrivals, by index in time order (``Planned(plan)`` replays it)."""

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-ready values (the plan as a sorted list)."""
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__ if f != "plan"}, "plan": sorted(self.plan)}

    def share(self, goodput_rps: float) -> float:
        """A front's goodput as a share of the clairvoyant's (nan when that is 0)."""
        return goodput_rps / self.clairvoyant_goodput_rps if self.clairvoyant_goodput_rps > 0 else math.nan


def bound_for_trace(
    server: ServerModel,
    streams: int,
    arrivals: Iterable[ArrivalLike | tuple[float, int, int]],
    slo_s: float,
    window_s: float,
    *,
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S,
) -> Bound:
    """The clairvoyant and the upper bound on ``arrivals`` (``workloads.schedule``'s output,
    or (time, n_in, n_out) triples) within ``window_s``, for a TTFT SLO of ``slo_s``.

    ``streams`` is the batch at which a request's work is reckoned when the plan picks
    whom to drop (the concurrency cap, as for μ). Clients are as patient as the measured
    ones; an on-time request never times out (the SLO is shorter than their patience).
    """
    if not slo_s > 0 or streams < 1:
        raise ValueError(f"the SLO must be > 0 and streams >= 1, got {slo_s!r} and {streams!r}")
    trace = trace_of(arrivals)
    prefill, decode = server.prefill, server.decode
    requests = _Requests(
        at=[a.at_s for a in trace],
        prefill=[prefill.seconds(a.prompt_tokens) for a in trace],
        nout=[a.max_tokens for a in trace],
        work=[server_seconds_per_request(prefill, decode, a.prompt_tokens, a.max_tokens, streams) for a in trace],
        per_token=[0.0] + [decode.seconds_per_token(b) for b in range(1, server.slots + 1)],
        slots=server.slots,
    )
    plan = frozenset(_plan(requests, slo_s))
    replay = simulate(
        config_for_trace(
            server, trace, duration_s=window_s, ttft_slo_s=slo_s, front=Planned(plan), client_timeout_s=client_timeout_s
        )
    )
    upper = _upper_bound(requests, slo_s)
    return Bound(
        requests=len(trace),
        feasible=sum(1 for p in requests.prefill if p <= slo_s),
        admitted=len(plan),
        on_time=replay.completed_within_slo,
        upper_bound=upper,
        window_s=window_s,
        clairvoyant_goodput_rps=replay.completed_within_slo / window_s,
        upper_bound_goodput_rps=upper / window_s,
        plan=plan,
    )


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class _Requests:
    """The trace as the server model sees it: request i at index i, in time order."""

    at: list[float]
    """Arrival times."""
    prefill: list[float]
    """T_prefill(n_in): seconds of the whole server."""
    nout: list[int]
    """Tokens to decode."""
    work: list[float]
    """Server seconds at the concurrency cap: how the plan ranks whom to drop."""
    per_token: list[float]
    """t_decode(B) at index B, for B = 1 .. slots."""
    slots: int


class _Server:
    """llama-server exactly as the simulator runs it (slots, FIFO queue, prefill preempting
    processor-shared decode), for requests forwarded on arrival whose clients never leave
    early. Requests are indexes into ``_Requests``; copies are cheap (a few in flight)."""

    __slots__ = ("decoders", "fifo", "free", "left", "now", "queue", "r", "seq", "vtok", "worst")

    def __init__(self, requests: _Requests) -> None:
        self.r = requests
        self.now = 0.0
        self.free = requests.slots
        self.queue: deque[int] = deque()
        self.fifo: deque[int] = deque()
        """In slots with prompt work, in the order they got them; the head is prefilling."""
        self.left = 0.0
        """The head's prefill seconds still to go."""
        self.decoders: list[tuple[float, int, int]] = []
        """(finish on the token clock, seq, request), a heap."""
        self.vtok = 0.0
        """Tokens each decoding stream has made since t = 0 (they advance together)."""
        self.seq = 0
        self.worst = -math.inf
        """The longest TTFT among first tokens since this copy was made."""

    def copy(self) -> _Server:
        other = _Server.__new__(_Server)
        other.r, other.now, other.free, other.left, other.vtok = self.r, self.now, self.free, self.left, self.vtok
        other.queue, other.fifo, other.decoders = deque(self.queue), deque(self.fifo), list(self.decoders)
        other.seq, other.worst = self.seq, -math.inf
        return other

    def inside(self) -> list[int]:
        """Forwarded requests not yet completed."""
        return [*self.queue, *self.fifo, *(i for _, _, i in self.decoders)]

    def forward(self, i: int) -> None:
        if self.free > 0:
            self.free -= 1
            self._start(i)
        else:
            self.queue.append(i)

    def run_until(self, t: float) -> None:
        """Every event up to ``t`` (a completion at ``t`` goes before an arrival at ``t``)."""
        while (e := self._next()) <= t:
            self._advance(e)
            self._event()
        self._advance(t)

    def drain(self) -> float:
        """Run with no more arrivals until every forwarded request has its first token;
        the longest TTFT since this copy was made."""
        while self.fifo or self.queue:
            self._advance(self._next())
            self._event()
        return self.worst

    def _next(self) -> float:
        if self.fifo:
            return self.now + self.left
        if self.decoders:
            return self.now + (self.decoders[0][0] - self.vtok) * self.r.per_token[len(self.decoders)]
        return math.inf

    def _advance(self, t: float) -> None:
        if t <= self.now:
            return
        if self.fifo:
            self.left -= t - self.now
        elif self.decoders:
            self.vtok += (t - self.now) / self.r.per_token[len(self.decoders)]
        self.now = t

    def _event(self) -> None:
        r = self.r
        if self.fifo:  # the head's prefill is done: its first token
            i = self.fifo.popleft()
            self.left = r.prefill[self.fifo[0]] if self.fifo else 0.0
            self.worst = max(self.worst, self.now - r.at[i])
            if r.nout[i] <= 0:
                self._free_slot()
            else:
                self.seq += 1
                heapq.heappush(self.decoders, (self.vtok + r.nout[i], self.seq, i))
            return
        finish = self.decoders[0][0]
        self.vtok = finish
        while self.decoders and self.decoders[0][0] <= finish + 1e-9:
            heapq.heappop(self.decoders)
            self._free_slot()

    def _start(self, i: int) -> None:
        self.fifo.append(i)
        if len(self.fifo) == 1:
            self.left = self.r.prefill[i]

    def _free_slot(self) -> None:
        if self.queue:
            self._start(self.queue.popleft())
        else:
            self.free += 1


def _plan(requests: _Requests, slo_s: float) -> set[int]:
    """The admitted arrivals (see the module docstring): every one of them on time."""
    at, prefill, work = requests.at, requests.prefill, requests.work
    deadline = slo_s - _MARGIN_S
    admitted: set[int] = set()
    before: list[_Server] = []  # before[i]: the server as arrival i finds it
    server = _Server(requests)
    for j in range(len(at)):
        server.run_until(at[j])
        before.append(server.copy())
        if prefill[j] > deadline:
            continue
        server.forward(j)
        admitted.add(j)
        if server.copy().drain() <= deadline:
            continue
        # Removing the newcomer restores the previous, on-time state; a bigger request
        # still in the server may do as well and leave more room.
        victim = j
        replay: tuple[_Server, list[_Server]] = (before[j].copy(), [])
        for k in sorted(server.inside(), key=lambda k: -work[k]):
            if work[k] <= work[j]:
                break
            trial = _replay(before, k, j, admitted)
            if max(trial[0].worst, trial[0].copy().drain()) <= deadline:
                victim, replay = k, trial
                break
        admitted.discard(victim)
        server, before[victim + 1 :] = replay
    return admitted


def _replay(before: list[_Server], k: int, j: int, admitted: set[int]) -> tuple[_Server, list[_Server]]:
    """The server just after arrival ``j`` had ``k`` never been forwarded, and what the
    arrivals after ``k`` would have found (a new ``before[k + 1 : j + 1]``)."""
    server = before[k].copy()
    found = []
    for i in range(k + 1, j + 1):
        server.run_until(server.r.at[i])
        found.append(server.copy())
        if i in admitted:
            server.forward(i)
    return server, found


# --------------------------------------------------------------------------- the bound


def _upper_bound(requests: _Requests, slo_s: float) -> int:
    """The most requests any front can get completed with TTFT <= ``slo_s``: certified.

    Why it is a bound. Let S be the requests some front gets on time, and [a, b] any
    stretch of arrival times; S_I those of S arriving in it. In the simulator's model:
    (1) a prompt's prefill runs alone on the server, at one second of its T_prefill per
    second, after its arrival; (2) B streams decoding share the server, each of their
    tokens costing t_decode(B) / B server-seconds, at least c = min over B <= slots of
    t_decode(B) / B; (3) at most ``slots`` requests are in slots at once. Each request of
    S_I has its first token by H = b + SLO, so by H it has either completed or is still
    in a slot, decoding: at most ``slots`` of them, the set R. All the prefills of S_I and
    the decodes of S_I \\ R happen inside [a, H], on one server, so

        sum over S_I of p_i  +  sum over S_I \\ R of d_i  <=  H - a,

    with p_i = T_prefill(n_in) and d_i = c · n_out; hence sum over S_I of (p_i + d_i) <=
    b - a + SLO + (the ``slots`` largest d_i of the stretch). The most requests whose
    works fit under a budget are the smallest first, so |S_I| is at most that count.
    Cutting the timeline into stretches at any arrivals, |S| = sum of |S_I| is at most
    the sum of the stretches' counts; the least such sum over every cut (a DP over the
    arrivals, O(n²)) is the bound. Requests with p_i > SLO are never on time and are left
    out. Other work (late requests, abandoned prompts) only takes server time away, and
    holding or reordering changes none of (1)-(3): the bound holds for every front that
    forwards each request's full max_tokens (the simulated ones do, unless slogate clamps
    n_out to a slot's context, which the benchmark's mixes never reach).
    """
    at, prefill, nout, slots = requests.at, requests.prefill, requests.nout, requests.slots
    cheapest_token = min(requests.per_token[b] / b for b in range(1, slots + 1))  # c
    feasible = [i for i in range(len(at)) if prefill[i] <= slo_s]
    m = len(feasible)
    best = [0.0] + [math.inf] * m  # best[b]: the bound over the first b feasible arrivals
    for a in range(m):
        start = at[feasible[a]]
        works: list[float] = []  # the stretch's p + d, sorted
        chosen, total = 0, 0.0  # how many of the smallest fit, and their sum
        credit: list[float] = []  # the `slots` largest d (a min-heap)
        credit_sum = 0.0
        for b in range(a, m):
            i = feasible[b]
            d = cheapest_token * nout[i]
            if len(credit) < slots:
                heapq.heappush(credit, d)
                credit_sum += d
            elif d > credit[0]:
                credit_sum += d - heapq.heapreplace(credit, d)
            budget = (at[i] - start + slo_s + credit_sum) * (1 + _SLACK)
            w = prefill[i] + d
            pos = bisect.bisect_right(works, w)
            works.insert(pos, w)
            if pos < chosen:  # it is among the smallest: in it goes
                total += w
                chosen += 1
            while chosen and total > budget:
                chosen -= 1
                total -= works[chosen]
            while chosen < len(works) and total + works[chosen] <= budget:
                total += works[chosen]
                chosen += 1
            best[b + 1] = min(best[b + 1], best[a] + chosen)
    return int(best[m])
