"""Calibration: measure one live llama-server and produce its CalibrationProfile.

Stages, in order, all under one time budget: preflight (is it llama-server, is it
idle; then the GGUF metadata, KV geometry and fingerprint), warm-up, tokenizer, prefill
(every prompt length's minimum timings), decode (every B's minimum rounds), repeat (more
timings of the points whose medians are still uncertain, while the budget allows; see
``repetition``). A run that exceeds its budget stops and names the stage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from slogate_admission.derivation import DEFAULT_REFERENCE_PROMPT_TOKENS
from slogate_admission.schema import CalibrationProfile, KVInfo, ServerInfo
from slogate_calibration.corpus import SAMPLES
from slogate_calibration.fitting import fit_prefill
from slogate_calibration.measure import (
    DECODE_MIN_ROUNDS,
    PromptMaker,
    confidence,
    decode_point,
    decode_points,
    measure_tokens_per_char,
    prefill_lengths,
    prefill_min_timings,
    prefill_point,
    prefill_points,
)
from slogate_calibration.model_file import (
    ModelFile,
    ModelFileError,
    fingerprint,
    kv_bytes_per_token_for,
    read_model_file,
)
from slogate_calibration.repetition import Allowance, repeat_unsettled, time_required
from slogate_calibration.server_args import speed_settings
from slogate_llama.client import LlamaClient, ServerProps, UpstreamError

DEFAULT_BUDGET_S = 90.0
"""The measurement's time budget wherever a user does not set one (`slogate calibrate`,
`slogate up`, the operator's ``calibration.budgetSeconds``): the minimum work takes about
40 s on a 2-core VM, repetitions stop by three quarters of it (docs/calibration.md)."""


class CalibrationError(RuntimeError):
    """Calibration cannot run or cannot finish; the message says why."""


class UpstreamBusyError(CalibrationError):
    """The server already serves traffic: measurements would be wrong."""


class BudgetExceededError(CalibrationError):
    """The run took longer than its budget."""

    def __init__(self, stage: str, budget_s: float) -> None:
        super().__init__(
            f"calibration exceeded its {budget_s:g} s budget in stage {stage!r}, before one timing of every "
            "point: the server answered slower than the budget allows (a busy or slow machine); give it "
            "more time (--budget-seconds, or the policy's calibration.budgetSeconds)"
        )
        self.stage = stage


@dataclass(frozen=True, slots=True)
class CalibrationSettings:
    """What to measure and how hard."""

    upstream: str
    """Base URL of the llama-server to measure."""
    model_path: Path | None = None
    """The GGUF file it serves; unset: the path its /props reports (same host or pod)."""
    server_args: Sequence[str] = ()
    """The server's command-line arguments: threads, batch and cache types are not in /props."""
    budget_s: float = DEFAULT_BUDGET_S
    """Stop (and write nothing) after this long."""
    force: bool = False
    """Measure even if the server is busy (the numbers will be pessimistic)."""
    wait_s: float = 0.0
    """First wait this long for GET /health to answer 200 (a server still loading its
    model); not counted in the budget. 0: the server must be up already."""
    seed: int = 0


REPEAT_BUDGET_SHARE = 0.75
"""Extra timings (stage 'repeat') start only while they are expected to end within the
first three quarters of the budget: the last quarter is headroom for a machine that
slows down mid-run."""
REPEAT_STOP_MARGIN_S = 2.0
"""And one still running this long before the budget ends is dropped (the fit and the
profile that follow take milliseconds): repetitions never make a run fail its budget."""


@dataclass(slots=True)
class Progress:
    """Hooks for a progress display: total work units, then one call per unit done.

    ``start`` is called again, with a larger total, when the stage 'repeat' plans more."""

    start: Callable[[int], None] = lambda _total: None
    advance: Callable[[], None] = lambda: None
    stage: Callable[[str], None] = lambda _name: None


@dataclass(slots=True)
class _Run:
    settings: CalibrationSettings
    progress: Progress
    stage: str = "preflight"
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    """Work units finished: the base of a progress total that grows in stage 'repeat'."""

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.progress.stage(stage)

    def advance(self) -> None:
        self.done += 1
        self.progress.advance()

    def plan(self, more: int) -> None:
        self.progress.start(self.done + more)


async def calibrate(settings: CalibrationSettings, progress: Progress | None = None) -> CalibrationProfile:
    """Measure the server; raise CalibrationError (or a subclass) with a clear message."""
    if settings.wait_s > 0:
        try:
            async with LlamaClient(settings.upstream) as client:
                await client.wait_healthy(settings.wait_s)
        except UpstreamError as error:
            raise CalibrationError(f"stage 'wait': {error}") from None
    run = _Run(settings, progress or Progress())
    try:
        async with asyncio.timeout(settings.budget_s):
            return await _measure(run)
    except TimeoutError:
        raise BudgetExceededError(run.stage, settings.budget_s) from None
    except UpstreamError as error:
        raise CalibrationError(f"stage {run.stage!r}: {error}") from None


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What is being measured: the server's shape, its model, and their fingerprint."""

    props: ServerProps
    model: ModelFile
    settings: dict[str, str]
    cache_type_k: str
    cache_type_v: str
    kv_bytes_per_token: float
    fingerprint: str
    fingerprint_inputs: dict[str, str]


async def identify(client: LlamaClient, s: CalibrationSettings) -> ServerIdentity:
    """Preflight and model stages: llama-server? idle? which model, which settings?

    Cheap (no inference), so `slogate up` runs it to look up a cached profile.
    """
    props = await client.props()
    counters = await client.counters()
    if counters.requests_processing > 0 and not s.force:
        raise UpstreamBusyError(
            f"{s.upstream} is serving {counters.requests_processing:g} request(s): a busy "
            "server measures slow; stop its traffic or pass --force"
        )
    settings = speed_settings(s.server_args)
    model_path = s.model_path or Path(props.model_path)
    try:
        # ~4 s of parsing the tokenizer in the header: off the loop, so a budget can
        # still fire (and name this stage) while it runs.
        model = await asyncio.to_thread(read_model_file, model_path)
    except ModelFileError as error:
        raise CalibrationError(f"{error}; pass --model with the GGUF file the server serves") from None
    cache_k = settings.get("cache_type_k", "f16")
    cache_v = settings.get("cache_type_v", "f16")
    try:
        bytes_per_token = kv_bytes_per_token_for(model, cache_k, cache_v)
    except ValueError as error:
        raise CalibrationError(f"KV cache geometry: {error}") from None
    settings |= {"slots": str(props.total_slots), "ctx_per_slot": str(props.ctx_per_slot)}
    digest, inputs = fingerprint(model, settings)
    return ServerIdentity(props, model, settings, cache_k, cache_v, bytes_per_token, digest, inputs)


async def identify_server(settings: CalibrationSettings) -> ServerIdentity:
    """``identify`` with its own connection; upstream failures become CalibrationError."""
    try:
        async with LlamaClient(settings.upstream) as client:
            return await identify(client, settings)
    except UpstreamError as error:
        raise CalibrationError(str(error)) from None


async def _measure(run: _Run) -> CalibrationProfile:
    s = run.settings
    async with LlamaClient(s.upstream) as client:
        run.enter("preflight")
        who = await identify(client, s)
        props = who.props
        lengths = prefill_lengths(props.ctx_per_slot)
        minimum = sum(prefill_min_timings(n) for n in lengths) + props.total_slots * DECODE_MIN_ROUNDS
        run.progress.start(2 + len(SAMPLES) + minimum)

        run.enter("warm-up")
        # The first requests after start pay one-off costs (page faults, thread spin-up).
        warm = PromptMaker(list(range(100, 400)), seed=s.seed)
        for _ in range(2):
            await client.complete(warm.make(64), n_predict=8)
            run.advance()

        run.enter("tokenizer")
        density = await measure_tokens_per_char(client, SAMPLES, run.advance)
        maker = PromptMaker(await client.tokenize("\n".join(SAMPLES)), seed=s.seed)

        # What a profile cannot do without (one timing of every point, two of the points its
        # confidence is stated on), then the rest of the minimum and the repetitions as the
        # budget allows: a busy machine ends in time with fewer timings, and the profile says so.
        reference = min(DEFAULT_REFERENCE_PROMPT_TOKENS, props.ctx_per_slot // 2)
        run.enter("prefill")
        prefill = prefill_points(client, maker, lengths, reference)
        await time_required(prefill, time.monotonic, run.advance)

        run.enter("decode")
        decode = decode_points(client, maker, props.total_slots)
        await time_required(decode, time.monotonic, run.advance)

        run.enter("repeat")
        allowance = Allowance(deadline=run.started + REPEAT_BUDGET_SHARE * s.budget_s)
        stop_in_s = max(0.0, run.started + s.budget_s - REPEAT_STOP_MARGIN_S - time.monotonic())
        await repeat_unsettled([*prefill, *decode], allowance, run.advance, run.plan, stop_in_s=stop_in_s)

    measured_at = datetime.now(UTC)
    return CalibrationProfile(
        id=f"{who.model.quantization.lower()}-{who.fingerprint[:8]}-{measured_at:%Y%m%dT%H%M%SZ}",
        fingerprint=who.fingerprint,
        measured_at=measured_at,
        model=who.model.to_model_info(),
        server=ServerInfo(
            slots=props.total_slots,
            ctx_per_slot=props.ctx_per_slot,
            threads=_int_or_none(who.settings.get("threads")),
            batch_size=_int_or_none(who.settings.get("batch_size")),
            cache_type_k=who.cache_type_k,
            cache_type_v=who.cache_type_v,
        ),
        prefill=fit_prefill([prefill_point(p) for p in prefill]),
        decode=tuple(decode_point(p) for p in decode),
        kv=KVInfo(
            bytes_per_token=who.kv_bytes_per_token,
            capacity_tokens=props.total_slots * props.ctx_per_slot,
            per_request_max_tokens=props.ctx_per_slot,
        ),
        tokens_per_char=density,
        fingerprint_inputs=who.fingerprint_inputs,
        duration_s=time.monotonic() - run.started,
        confidence=confidence(prefill, decode, reference),
    )


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None
