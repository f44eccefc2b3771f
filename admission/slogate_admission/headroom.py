"""What a router choosing among gates may read off one of them: its load and its room, now.

Five numbers, all from the gate's own books (the ledger, the deferral queue, the compiled
thresholds), none from the server behind it:

- ``waiting``: requests in the deferral queue;
- ``running``: admitted requests not yet finished (prefilling or decoding);
- ``kv_usage``: reserved KV cells / capacity, 0..1;
- ``queue_wait_s``: how long an arrival would wait behind the queued prefill,
  queued tokens / R, R the prefill rate decisions use now (the live rate if fresh, else the
  calibrated one, divided by the bias learned at the streams in service: ``ttft_error``);
- ``admit_now_tokens``: how many more prompt tokens the default class could admit on its
  TTFT right now. ``decide`` admits while queued ≤ max_queued = (min(budget, SLO − waited) / m
  − own) · R; for a fresh arrival (waited 0) whose own prefill is left out (own 0) that is
  min(budget, SLO) / m · R, and the room is max_queued − queued, floored at 0.

The last two are read off ``decide``'s own verdict on an empty prompt of the default class
(T_prefill(0) = 0, nothing waited): one implementation of the formula, so the room a router
sees is the room the next arrival meets. An arrival of n prompt tokens then passes the TTFT
predicate while its own prefill, T_prefill(n) · R in queue tokens (T_prefill(n) times the
calibrated rate: about n), fits in the room. The room counts the TTFT predicate only: full
slots or a full KV cache show in ``running`` and ``kv_usage``.

Before thresholds are loaded the gate admits nothing, and the numbers say so: KV usage 1,
no room, an endless queue wait. So do they when its owner says it admits nothing for a
reason of its own (a sidecar draining before its pod stops): ``admitting=False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slogate_admission.decision import Decision, GateConfig, LiveState, Request, decide
from slogate_admission.gate_machine import GateMachine

__all__ = ["CLOSED_QUEUE_WAIT_S", "Headroom", "admit_now_tokens", "headroom", "kv_usage"]

EMPTY_PROMPT = Request(prompt_tokens=0, output_tokens=0)
"""The probe: an arrival of the default class with no prompt, no output and no wait."""
CLOSED_QUEUE_WAIT_S = math.inf
"""The queue wait of a gate without thresholds: whatever arrives is refused, never served."""


@dataclass(frozen=True, slots=True)
class Headroom:
    """One gate's load and room at one instant."""

    waiting: int
    """Requests in the deferral queue."""
    running: int
    """Admitted requests not yet finished (prefilling or decoding)."""
    kv_usage: float
    """Reserved KV cells / capacity, 0..1; 1 before thresholds (nothing fits)."""
    queue_wait_s: float
    """Seconds an arrival would wait behind the queued prefill (queued / R); inf before thresholds."""
    admit_now_tokens: float
    """Prompt tokens the default class could still admit on its TTFT now; 0 before thresholds."""


def headroom(machine: GateMachine, now: float, *, admitting: bool = True) -> Headroom:
    """The gate's load and room at ``now``, from its books and ``decide`` (books nothing).

    ``admitting``: False when the gate's owner refuses every arrival whatever the books say
    (a draining sidecar); the room then reads closed, as before thresholds."""
    ledger = machine.ledger
    if not (machine.ready and admitting):
        return Headroom(machine.deferred, ledger.streams, 1.0, CLOSED_QUEUE_WAIT_S, 0.0)
    # The machine's own decide: the rate, bias and margin an arrival at ``now`` would meet.
    probe = machine.decide(EMPTY_PROMPT, now)
    return Headroom(
        waiting=machine.deferred,
        running=ledger.streams,
        kv_usage=kv_usage(ledger.reserved_kv_tokens, machine.config.kv_capacity_tokens),
        queue_wait_s=probe.queue_wait_s,
        admit_now_tokens=_room(probe, ledger.queued_prefill_tokens),
    )


def admit_now_tokens(config: GateConfig, state: LiveState, class_name: str | None = None) -> float:
    """Prompt tokens the class (default: the default class) could still admit on its TTFT in
    ``state``: max(min(budget, SLO) / m · R − queued, 0), as ``decide`` computes max_queued."""
    probe = decide(config, Request(0, 0, class_name), state, now=0.0)
    return _room(probe, state.queued_prefill_tokens)


def kv_usage(reserved_tokens: int, capacity_tokens: int) -> float:
    """Reserved / capacity, at most 1: a push that lowers the capacity below what admitted
    requests already hold reads full, not above it."""
    if capacity_tokens <= 0:
        return 1.0
    return min(max(reserved_tokens, 0) / capacity_tokens, 1.0)


def _room(probe: Decision, queued_tokens: float) -> float:
    """What the empty prompt's max_queued leaves above the queue (own prefill 0, waited 0)."""
    return max(probe.max_queued_tokens - queued_tokens, 0.0)
