"""The llama-server model on a hand-worked schedule: slots and FIFO queue, prefill preempting
decode, processor-shared decode, copies, and the clairvoyant's worst TTFT on top."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from slogate_admission.service import DecodeCurve, PrefillCurve
from slogate_sim.capacity import ServerModel
from slogate_sim.clairvoyant import _Job, _Lookahead
from slogate_sim.server import DECODE, PREFILL, SERVER_QUEUE, LlamaServer

# Two slots; a token takes 0.25 s with one stream decoding, 0.5 s (each) with two. Binary
# fractions: every time below is exact.
MODEL = ServerModel(slots=2, prefill=PrefillCurve(0.0, 0.01), decode=DecodeCurve((4.0, 2.0)))


@dataclass(eq=False)
class Job:
    name: str
    prefill_s: float
    output_tokens: int
    where: int = 0


def run(server: LlamaServer[Job]) -> list[tuple[float, str, str]]:
    """Every completion until idle, handled as the simulator does: (time, event, request)."""
    log = []
    while (t := server.next_completion()) < math.inf:
        server.advance(t)
        if server.prefill_due():
            job = server.finish_prefill()
            log.append((t, "first token", job.name))
            server.start_decode(job)
        else:
            for job in server.finish_decodes():
                log.append((t, "end", job.name))
                server.free_slot()
    return log


def abc(server: LlamaServer[Job]) -> tuple[Job, Job, Job]:
    """A (1 s of prefill, 4 tokens), B (2 s, 2 tokens), C (0.5 s, 1 token), all at t = 0."""
    jobs = Job("A", 1.0, 4), Job("B", 2.0, 2), Job("C", 0.5, 1)
    for job in jobs:
        server.forward(job)
    return jobs


def test_prefill_preempts_decode_and_the_queue_is_fifo() -> None:
    server = LlamaServer[Job](MODEL, itertools.count(), window=5.0)
    a, b, c = abc(server)
    assert (a.where, b.where, c.where) == (PREFILL, PREFILL, SERVER_QUEUE)
    assert server.free_slots == 0
    assert list(server.server_queue) == [c]
    assert run(server) == [
        (1.0, "first token", "A"),  # A's prefill, then B's: A's stream stalls meanwhile
        (3.0, "first token", "B"),
        (4.0, "end", "B"),  # 2 streams: B's 2 tokens at 0.5 s; A has made 2 of its 4
        (4.5, "first token", "C"),  # C takes B's slot; its prefill stalls A again
        (5.0, "end", "C"),  # C's 1 token at 0.5 s (A: 3 of 4)
        (5.25, "end", "A"),  # alone: its last token at 0.25 s
    ]
    assert (a.where, b.where, c.where) == (DECODE, DECODE, DECODE)
    assert server.free_slots == 2
    assert server.vtokens == 4.0
    assert server.busy == 5.0  # computing throughout, counted up to the window only


def test_streams_ending_together_end_in_the_order_they_started() -> None:
    server = LlamaServer[Job](MODEL, itertools.count())
    server.forward(Job("first", 1.0, 1))
    server.forward(Job("second", 1.0, 2))
    server.forward(Job("third", 1.0, 1))  # queued until a slot frees
    assert server.next_completion() == 1.0
    server.advance(1.0)
    server.start_decode(server.finish_prefill())
    server.advance(2.0)  # "first" stalled behind "second"'s prefill
    server.start_decode(server.finish_prefill())
    assert server.next_completion() == 2.5  # 2 streams: 0.5 s a token
    server.advance(2.5)
    assert [j.name for j in server.finish_decodes()] == ["first"]
    server.free_slot()  # "third" prefills 2.5 .. 3.5 s, "second" stalls with 1 token to go
    server.advance(3.5)
    server.start_decode(server.finish_prefill())  # its 1 token ends on "second"'s last
    assert server.next_completion() == 4.0
    server.advance(4.0)
    assert [j.name for j in server.finish_decodes()] == ["second", "third"]


def test_a_copy_runs_ahead_on_its_own() -> None:
    server = LlamaServer[Job](MODEL, itertools.count())
    abc(server)
    server.advance(1.0)
    server.start_decode(server.finish_prefill())  # A's first token
    ahead = server.copy()
    assert run(ahead)[-1] == (5.25, "end", "A")
    # The original has not moved: B is still prefilling, C still queued.
    assert (server.last, server.prefill_left, server.vtokens) == (1.0, 2.0, 0.0)
    assert [j.name for j in server.server_queue] == ["C"]
    assert server.next_completion() == 3.0
    server.forward(Job("D", 0.25, 1))
    assert [e for e in run(server) if e[1] == "first token"] == [
        (3.0, "first token", "B"),
        (4.5, "first token", "C"),
        (5.25, "first token", "D"),  # after C, in the slot C's end freed
    ]


def test_the_lookahead_reports_the_worst_ttft_since_it_was_copied() -> None:
    # The clairvoyant's server: A, B, C as above, C arriving at 0.5 s.
    jobs = [_Job(0, 0.0, 1.0, 4), _Job(1, 0.0, 2.0, 2), _Job(2, 0.5, 0.5, 1)]
    server = _Lookahead(MODEL)
    server.forward(jobs[0])
    server.forward(jobs[1])
    server.run_until(0.5)
    server.forward(jobs[2])
    assert server.copy().drain() == 4.0  # C: first token at 4.5 s
    server.run_until(3.0)  # A's and B's first tokens
    assert server.worst == 3.0
    assert sorted(server.inside()) == [0, 1, 2]
    assert server.copy().drain() == 4.0
    server.run_until(5.0)  # C ends
    assert server.copy().drain() == -math.inf  # no first token left to come
    assert server.worst == 4.0
    assert server.inside() == [0]  # A, still decoding
