"""One gate: a recorded trace through the sidecar's real HTTP app and through the simulator.

The trace has arrivals of two classes (sizes chosen so every request is told apart by
its n_out), first tokens, completions, clients leaving (while deferred and mid-stream),
deferral deadlines and a threshold swap in the middle. (a) The sidecar's aiohttp app, in
front of a scripted upstream that emits each first token and each end when the trace
says, on a hand-moved clock that also runs its deferral deadlines; (b) the simulator's
slogate front on the same clock. Every request's fate (first outcome, final outcome,
reasons, Retry-After) must be the same, in the same order, or either side changed alone.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from canned_profiles import NOW, smollm2_profile
from fake_upstream import METRICS, llama_app, serve
from sidecar_harness import sidecar_in_front_of
from slogate_admission.decision import Decision, Request
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_sidecar.lease import Lease, Usage
from slogate_sidecar.metrics import DeferralResult
from slogate_sim.fronts import Forward, Hold, Refuse, SlogateFront


def thresholds(cap: int) -> Thresholds:
    """Interactive (5 s) above batch (20 s), at most 1.5 s of deferral."""
    policy = Policy.model_validate(
        {
            "concurrency": {"max": cap},
            "classes": [{"name": "interactive", "ttftSeconds": 5.0}, {"name": "batch", "ttftSeconds": 20.0}],
            "deferral": {"maxWaitSeconds": 1.5},
        }
    )
    return derive_thresholds(policy, smollm2_profile(), derived_at=NOW)


# --------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class Arrive:
    at: float
    name: str
    prompt_tokens: int
    output_tokens: int
    """Unique per request: how both sides tell the requests apart."""
    class_name: str


@dataclass(frozen=True)
class FirstToken:
    at: float
    name: str


@dataclass(frozen=True)
class Complete:
    at: float
    name: str


@dataclass(frozen=True)
class Leave:
    """The client hangs up (deferred: out of the queue; admitted: the request is abandoned)."""

    at: float
    name: str


@dataclass(frozen=True)
class Swap:
    at: float
    cap: int


Event = Arrive | FirstToken | Complete | Leave | Swap

TRACE: list[Event] = [
    Arrive(0.0, "a", 100, 11, "interactive"),  # admitted
    Arrive(0.1, "b", 200, 12, "batch"),  # admitted: both slots taken
    Arrive(0.2, "c", 50, 13, "batch"),  # deferred: it waits for the soonest end
    Arrive(0.4, "e", 70, 15, "interactive"),  # deferred, ahead of c: it takes the soonest end
    Arrive(0.45, "d", 60, 14, "batch"),  # refused: queue_full (two wait ahead, two in service)
    FirstToken(0.5, "a"),
    Complete(0.8, "a"),  # frees a slot: e (higher class) goes first
    Arrive(1.0, "f", 3000, 16, "interactive"),  # beyond one slot's context: refused for good
    FirstToken(1.2, "b"),
    Leave(1.5, "c"),  # gives up while deferred
    Arrive(1.6, "g", 80, 17, "batch"),  # deferred
    Swap(2.0, 3),  # a third slot: g goes in
    FirstToken(2.1, "e"),
    Arrive(2.2, "h", 90, 18, "batch"),  # deferred
    FirstToken(2.5, "g"),
    Leave(2.6, "g"),  # hangs up mid-stream: abandoned, its slot goes to h
    Arrive(2.7, "i", 40, 19, "interactive"),  # deferred; its 1.5 s wait runs out at 4.2: refused
    Arrive(2.75, "j", 45, 21, "batch"),  # deferred behind i; its wait runs out too: refused
    FirstToken(3.0, "h"),
    Complete(5.0, "b"),
    Complete(5.5, "e"),
    Complete(6.0, "h"),
    Complete(6.5, "i"),
]


@dataclass(frozen=True)
class Fate:
    """What became of one request, as both sides must agree."""

    name: str
    first: str
    final: str
    reasons: tuple[str, ...]
    retry_after_s: float | None
    predicted_ttft_s: float | None = None
    """Of the final decision: it reads the queue, so it shows the books were kept alike."""

    @classmethod
    def of(cls, name: str, first: Decision, final: Decision, admitted: bool) -> Fate:
        retry = None if admitted or final.retry_after_s is None else round(final.retry_after_s, 3)
        reasons = tuple(r.value for r in final.reasons)
        predicted = round(final.predicted_ttft_s, 4)
        return cls(name, first.outcome.value, "admitted" if admitted else "refused", reasons, retry, predicted)


def names_by_output(trace: list[Event]) -> dict[int, str]:
    return {e.output_tokens: e.name for e in trace if isinstance(e, Arrive)}


# --------------------------------------------------------------------------- (b) the simulator's front


def simulated_fates(trace: list[Event]) -> list[Fate]:
    """Replay through the simulator's slogate front, deadlines in virtual time."""
    front = SlogateFront(thresholds(cap=2))
    firsts: dict[str, Decision] = {}
    deadlines: list[tuple[float, str]] = []
    fates: list[Fate] = []
    held: set[str] = set()

    def settle(answers: list[Forward | Refuse]) -> None:
        for answer in answers:
            name = str(answer.key)
            held.discard(name)
            assert answer.decision is not None
            fates.append(Fate.of(name, firsts[name], answer.decision, isinstance(answer, Forward)))

    def advance(to: float) -> None:
        while deadlines and deadlines[0][0] <= to:
            at, name = heapq.heappop(deadlines)
            if name in held:
                settle(front.deadline(name, at))

    for event in trace:
        advance(event.at)
        if isinstance(event, Arrive):
            answer = front.arrive(event.name, Request(event.prompt_tokens, event.output_tokens, event.class_name),
                                  event.at)  # fmt: skip
            assert answer.decision is not None
            firsts[event.name] = answer.decision
            if isinstance(answer, Hold):
                held.add(event.name)
                heapq.heappush(deadlines, (answer.deadline, event.name))
            else:
                settle([answer])
        elif isinstance(event, FirstToken):
            settle(front.first_token(event.name, event.at))
        elif isinstance(event, Complete):
            settle(front.ended(event.name, event.at))
        elif isinstance(event, Leave):
            if event.name in held:
                held.discard(event.name)
                front.left(event.name, event.at)
                fates.append(Fate(event.name, "defer", "left", (), None))
            else:
                settle(front.ended(event.name, event.at))
        else:
            settle(front.swap(thresholds(event.cap), event.at))
    advance(float("inf"))
    return fates


# --------------------------------------------------------------------------- (a) the sidecar


class HandClock:
    """The gate's clock, moved by the test; deadlines run when it passes them."""

    def __init__(self, start: float) -> None:
        self.start = self.now = start
        self._due: list[tuple[float, int, Callable[[], None], Handle]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    def schedule(self, at: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        heapq.heappush(self._due, (at, next(self._seq), callback, handle))
        return handle

    def due_before(self, to: float) -> tuple[float, Callable[[], None]] | None:
        """The next live deadline at or before ``to`` (the clock moves to it), if any."""
        while self._due and self._due[0][0] <= to:
            at, _, callback, handle = heapq.heappop(self._due)
            if not handle.cancelled:
                self.now = at
                return at, callback
        return None


@dataclass
class Handle:
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class ScriptedUpstream:
    """llama-server whose every generation waits for the trace's first token and end."""

    by_prompt: dict[int, str]
    received: dict[str, asyncio.Event] = field(default_factory=dict)
    first: dict[str, asyncio.Event] = field(default_factory=dict)
    done: dict[str, asyncio.Event] = field(default_factory=dict)

    def events(self, table: dict[str, asyncio.Event], name: str) -> asyncio.Event:
        return table.setdefault(name, asyncio.Event())

    async def health(self, _r: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(self, _r: web.Request) -> web.Response:
        return web.Response(text=METRICS)  # constant: no live rate

    async def tokenize(self, _r: web.Request) -> web.Response:
        raise AssertionError("the trace's prompts are token ids: nothing to count")

    async def apply_template(self, _r: web.Request) -> web.Response:
        raise AssertionError("no chat in the trace")

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = self.by_prompt[len(body["prompt"])]
        self.events(self.received, name).set()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await self.events(self.first, name).wait()
        chunk = {"content": "x", "stop": False, "tokens_predicted": 1}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await self.events(self.done, name).wait()
        final = {
            "content": "",
            "stop": True,
            "tokens_predicted": 2,
            "timings": {"prompt_n": len(body["prompt"]), "cache_n": 0},
        }
        await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await response.write_eof()
        return response


@dataclass
class Witness:
    """The gate's observer and learner: what the sidecar decided, and when leases ended."""

    names: dict[int, str]
    first: dict[str, Decision] = field(default_factory=dict)
    fates: list[Fate] = field(default_factory=list)
    ended: set[str] = field(default_factory=set)

    def decided(self, decision: Decision, seconds: float) -> None:  # noqa: ARG002
        name = self.names[decision.output_tokens]
        self.first[name] = decision
        if decision.outcome.value != "defer":
            self.fates.append(Fate.of(name, decision, decision, decision.outcome.value == "admit"))

    def deferral_ended(self, first: Decision, final: Decision, result: DeferralResult) -> None:
        name = self.names[first.output_tokens]
        if result == "cancelled":
            self.fates.append(Fate(name, "defer", "left", (), None))
        else:
            self.fates.append(Fate.of(name, first, final, result == "admitted"))

    def first_token(self, lease: Lease) -> None:
        pass

    def completed(self, lease: Lease, usage: Usage) -> None:  # noqa: ARG002
        self.ended.add(self.names[lease.decision.output_tokens])

    def abandoned(self, lease: Lease) -> None:
        self.ended.add(self.names[lease.decision.output_tokens])


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll (bounded) until ``condition`` holds: network hops take real time."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def sidecar_fates(trace: list[Event], tmp_path: Path) -> tuple[list[Fate], dict[str, dict[str, Any]]]:
    """Replay through the real sidecar app; also what each client saw over HTTP."""
    arrivals = {e.name: e for e in trace if isinstance(e, Arrive)}
    upstream = ScriptedUpstream({e.prompt_tokens: e.name for e in arrivals.values()})
    witness = Witness(names_by_output(trace))
    clock = HandClock(1000.0)
    seen: dict[str, dict[str, Any]] = {}
    clients: dict[str, asyncio.Task[None]] = {}
    async with serve(llama_app(upstream)) as url, sidecar_in_front_of(url, tmp_path, thresholds(cap=2)) as running:
        gate = running.sidecar.gate
        gate.clock, gate.schedule = clock, clock.schedule
        gate.observers.append(witness)
        gate.learners.append(witness)

        async def client(e: Arrive) -> None:
            body = {"prompt": list(range(e.prompt_tokens)), "n_predict": e.output_tokens, "stream": True}
            headers = {"X-Slogate-Class": e.class_name}
            async with running.session.post(running.url + "/completion", json=body, headers=headers) as r:
                seen[e.name] = {"status": r.status, "retry_after": r.headers.get("Retry-After")}
                if r.status != 200:
                    seen[e.name]["body"] = await r.json()
                    return
                async for line in r.content:
                    if line.startswith(b"data: "):
                        seen[e.name].setdefault("chunks", 0)
                        seen[e.name]["chunks"] += 1

        async def quiet() -> None:
            """Every decided request's effect is visible: admitted ones reached the upstream,
            refused ones have their answer; and nothing changes for a few loop turns."""

            def settled() -> bool:
                for fate in witness.fates:
                    if fate.final == "admitted" and not upstream.events(upstream.received, fate.name).is_set():
                        return False
                    if fate.final == "refused" and fate.name not in seen:
                        return False
                return True

            await until(settled, "the decided requests' effects")
            for _ in range(5):
                await asyncio.sleep(0.01)

        async def advance(to: float) -> None:
            while (due := clock.due_before(clock.start + to)) is not None:
                due[1]()
                await quiet()
            clock.now = clock.start + to

        def admitted(name: str) -> bool:
            return any(f.name == name and f.final == "admitted" for f in witness.fates)

        for event in trace:
            await advance(event.at)
            if isinstance(event, FirstToken | Complete) and not admitted(event.name):
                continue  # refused: the trace's later events for it do not happen (nor in the simulator)
            if isinstance(event, Arrive):
                before = len(witness.first)
                clients[event.name] = asyncio.create_task(client(event))
                await until(lambda b=before: len(witness.first) > b, f"{event.name} decided")
            elif isinstance(event, FirstToken):
                upstream.events(upstream.first, event.name).set()
                await until(lambda n=event.name: seen.get(n, {}).get("chunks", 0) >= 1, f"{event.name}'s first token")
            elif isinstance(event, Complete):
                upstream.events(upstream.done, event.name).set()
                await until(lambda n=event.name: n in witness.ended, f"{event.name} completed")
            elif isinstance(event, Leave):
                clients[event.name].cancel()
                deferred_left = event.name not in upstream.received
                condition = (
                    (lambda n=event.name: any(f.name == n and f.final == "left" for f in witness.fates))
                    if deferred_left
                    else (lambda n=event.name: n in witness.ended)
                )
                await until(condition, f"{event.name} gone")
            else:
                answer = await running.push(thresholds(event.cap).model_dump_json(by_alias=True))
                assert answer.status == 200
            await quiet()
        await advance(60.0)
        await asyncio.gather(*clients.values(), return_exceptions=True)
    return witness.fates, seen


async def test_the_sidecar_and_the_simulator_decide_every_request_alike(tmp_path: Path) -> None:
    expected = simulated_fates(TRACE)
    fates, seen = await sidecar_fates(TRACE, tmp_path)
    assert fates == expected, "\n".join(f"{a}\n{b}\n" for a, b in zip(fates, expected, strict=False))
    # The trace exercises what it claims to.
    finals = {(f.first, f.final) for f in expected}
    assert {
        ("admit", "admitted"),
        ("defer", "admitted"),
        ("defer", "refused"),
        ("defer", "left"),
        ("reject", "refused"),
    } <= finals
    assert any("queue_full" in f.reasons for f in expected)
    # And every client saw its fate over HTTP: refusals carry the reasons and Retry-After.
    for fate in fates:
        if fate.final == "refused":
            details = seen[fate.name]["body"]["slogate"]
            assert tuple(details["reasons"]) == fate.reasons
            assert details["retryAfterSeconds"] == fate.retry_after_s
            if fate.retry_after_s is None:  # no wait would help (beyond one slot): 400, no Retry-After
                assert seen[fate.name]["status"] == 400
            else:
                assert seen[fate.name]["status"] == 429
                assert seen[fate.name]["retry_after"] == str(max(1, math.ceil(fate.retry_after_s)))
        elif fate.final == "admitted":
            assert seen.get(fate.name, {}).get("status", 200) == 200
