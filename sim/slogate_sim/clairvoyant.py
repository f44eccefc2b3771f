"""The clairvoyant bound: on one arrival trace, the goodput no front can beat.

Every front (direct, a count cap, slogate) is judged on the very trace a measured run
sent, against two numbers computed in the simulator's server model (``server``):

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
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

from slogate_admission.service import server_seconds_per_request
from slogate_sim.capacity import ServerModel
from slogate_sim.engine import simulate
from slogate_sim.fronts import Planned
from slogate_sim.scenario import ArrivalLike, config_for_trace, trace_of
from slogate_sim.server import SERVER_QUEUE, LlamaServer
from slogate_sim.workloads import DEFAULT_CLIENT_TIMEOUT_S

_MARGIN_S = 1e-9
"""The plan keeps every TTFT this far inside the SLO (the replay's rounding is ~1e-13 s)."""
_SLACK = 1e-9
"""The upper bound's budgets are widened by this fraction: float rounding may only loosen it."""


@dataclass(frozen=True, slots=True)
class Bound:
    """The clairvoyant goodput and the certified upper bound on one trace.

    ``on_time <= optimum <= upper_bound``, counted as the measured runs count goodput
    (``results.Run.goodput``): completed with TTFT within the SLO, per second of the window.
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
    plan = frozenset(_plan(server, requests, slo_s))
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


@dataclass(slots=True, eq=False)
class _Job:
    """Arrival ``index`` of the trace, as the server model reads it."""

    index: int
    arrival: float
    prefill_s: float
    output_tokens: int
    where: int = SERVER_QUEUE
    """Where the server put it (unread here)."""


class _Lookahead(LlamaServer[_Job]):
    """llama-server exactly as the simulator runs it (``server``), for requests forwarded on
    arrival whose clients never leave early, and the longest TTFT since it was copied. Copies
    are cheap (a few requests in flight)."""

    __slots__ = ("worst",)

    def __init__(self, model: ServerModel) -> None:
        super().__init__(model, itertools.count())
        self.worst = -math.inf
        """The longest TTFT among first tokens since this copy was made."""

    def copy(self) -> Self:
        other = super().copy()
        other.worst = -math.inf
        return other

    def inside(self) -> list[int]:
        """Forwarded requests not yet completed."""
        return [job.index for job in (*self.server_queue, *self.prefill_fifo, *(j for _, _, j in self.decoders))]

    def run_until(self, t: float) -> None:
        """Every event up to ``t`` (a completion at ``t`` goes before an arrival at ``t``)."""
        while (e := self.next_completion()) <= t:
            self.advance(e)
            self._event()
        self.advance(t)

    def drain(self) -> float:
        """Run with no more arrivals until every forwarded request has its first token;
        the longest TTFT since this copy was made."""
        while self.prefill_fifo or self.server_queue:
            self.advance(self.next_completion())
            self._event()
        return self.worst

    def _event(self) -> None:
        if self.prefill_fifo:  # the head's prefill is done: its first token
            job = self.finish_prefill()
            self.worst = max(self.worst, self.last - job.arrival)
            if job.output_tokens <= 0:
                self.free_slot()
            else:
                self.start_decode(job)
            return
        for _ in self.finish_decodes():
            self.free_slot()


def _plan(model: ServerModel, requests: _Requests, slo_s: float) -> set[int]:
    """The admitted arrivals (see the module docstring): every one of them on time."""
    at, prefill, work = requests.at, requests.prefill, requests.work
    jobs = [_Job(i, at[i], prefill[i], requests.nout[i]) for i in range(len(at))]
    deadline = slo_s - _MARGIN_S
    admitted: set[int] = set()
    before: list[_Lookahead] = []  # before[i]: the server as arrival i finds it
    server = _Lookahead(model)
    for j in range(len(at)):
        server.run_until(at[j])
        before.append(server.copy())
        if prefill[j] > deadline:
            continue
        server.forward(jobs[j])
        admitted.add(j)
        if server.copy().drain() <= deadline:
            continue
        # Removing the newcomer restores the previous, on-time state; a bigger request
        # still in the server may do as well and leave more room.
        victim = j
        replay: tuple[_Lookahead, list[_Lookahead]] = (before[j].copy(), [])
        for k in sorted(server.inside(), key=lambda k: -work[k]):
            if work[k] <= work[j]:
                break
            trial = _replay(before, jobs, k, j, admitted)
            if max(trial[0].worst, trial[0].copy().drain()) <= deadline:
                victim, replay = k, trial
                break
        admitted.discard(victim)
        server, before[victim + 1 :] = replay
    return admitted


def _replay(
    before: list[_Lookahead], jobs: list[_Job], k: int, j: int, admitted: set[int]
) -> tuple[_Lookahead, list[_Lookahead]]:
    """The server just after arrival ``j`` had ``k`` never been forwarded, and what the
    arrivals after ``k`` would have found (a new ``before[k + 1 : j + 1]``)."""
    server = before[k].copy()
    found = []
    for i in range(k + 1, j + 1):
        server.run_until(jobs[i].arrival)
        found.append(server.copy())
        if i in admitted:
            server.forward(jobs[i])
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
