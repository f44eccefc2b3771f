"""Pure parts of calibration: server args, prompt lengths, prompts, outputs, stored profiles."""

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slogate_admission.schema import CalibrationConfidence, CalibrationProfile, PrefillPoint
from slogate_calibration.measure import PromptMaker, prefill_lengths
from slogate_calibration.output import (
    TERMINATION_MESSAGE_LIMIT,
    compact_json,
    full_json,
    summary_line,
    write_atomic,
)
from slogate_calibration.server_args import speed_settings


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["-t", "2", "-np", "4", "-c", "8192"],
            {"threads": "2", "parallel": "4", "ctx_size": "8192"},
        ),
        (
            ["--threads=3", "--cache-type-k", "q8_0", "-ctv", "q8_0"],
            {"threads": "3", "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
        ),
        (["--model", "/m.gguf", "--port", "8080", "--metrics"], {}),
        (["-t", "2", "--threads", "4"], {"threads": "4"}),  # the last one wins, as in llama-server
        (
            ["--no-kv-unified", "-b", "512", "-ub", "256"],
            {"kv_unified": "false", "batch_size": "512", "ubatch_size": "256"},
        ),
    ],
)
def test_speed_settings(args: list[str], expected: dict[str, str]) -> None:
    assert speed_settings(args) == expected


def test_speed_settings_flag_without_value() -> None:
    with pytest.raises(ValueError, match="--threads has no value"):
        speed_settings(["--threads"])


def test_prefill_lengths_reach_the_slot_context() -> None:
    assert prefill_lengths(2048) == [32, 128, 512, 1024, 2032]
    assert prefill_lengths(512) == [32, 128, 496]
    assert prefill_lengths(100) == [32, 84]


def test_prompt_maker_exact_lengths_and_distinct_prompts() -> None:
    maker = PromptMaker(list(range(1000, 1100)), seed=3)
    prompts = [maker.make(300) for _ in range(5)]
    assert all(len(p) == 300 for p in prompts)
    assert len({tuple(p) for p in prompts}) == 5  # different starting points


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "profile.json"
    write_atomic(target, "first")
    write_atomic(target, "second")
    assert target.read_text() == "second"
    assert [p.name for p in target.parent.iterdir()] == ["profile.json"]


def test_write_atomic_failure_leaves_old_file(tmp_path: Path) -> None:
    target = tmp_path / "profile.json"
    write_atomic(target, "good")

    with pytest.raises(TypeError):
        write_atomic(target, 12345)  # type: ignore[arg-type]
    assert target.read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]


def _profile() -> CalibrationProfile:
    return CalibrationProfile.model_validate(
        {
            "id": "q4_1-abc-20261202",
            "fingerprint": "0123456789abcdef",
            "measuredAt": datetime(2026, 12, 2, tzinfo=UTC).isoformat(),
            "model": {"name": "m", "quantization": "Q4_1", "nLayers": 30, "nKvHeads": 3, "headDim": 64},
            "server": {"slots": 4, "ctxPerSlot": 2048},
            "prefill": {
                "form": "affine", "interceptS": 0.01, "linearS": 0.004,
                "points": [{"promptTokens": n, "seconds": 0.004 * n} for n in range(1, 400)],
            },
            "decode": [{"streams": b, "tokensPerSecond": 100 / b} for b in range(1, 5)],
            "kv": {"bytesPerToken": 23040, "capacityTokens": 8192, "perRequestMaxTokens": 2048},
            "fingerprintInputs": {f"k{i}": "v" * 50 for i in range(40)},
        }
    )  # fmt: skip


def test_compact_form_fits_a_termination_message() -> None:
    profile = _profile()
    assert len(full_json(profile).encode()) > TERMINATION_MESSAGE_LIMIT
    compact = compact_json(profile)
    assert len(compact.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = CalibrationProfile.model_validate_json(compact)
    assert back.prefill.points == ()
    assert back.prefill.linear_s == profile.prefill.linear_s
    assert back.fingerprint == profile.fingerprint


OLD_PROFILE = {
    # Written by the version before repetition counts and the stated confidence (docs/bench/profile.json).
    "schemaVersion": 1, "id": "q4_1-13b4aa9d-20261202T130929Z", "fingerprint": "13b4aa9d574e8379",
    "measuredAt": "2026-12-02T13:09:29.560966Z",
    "model": {"name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "quantization": "Q4_1", "nLayers": 30, "nKvHeads": 3,
              "headDim": 64, "fileBytes": 98362432},
    "server": {"slots": 4, "ctxPerSlot": 2048, "threads": 2, "batchSize": None, "cacheTypeK": "f16",
               "cacheTypeV": "f16"},
    "prefill": {"form": "quadratic", "interceptS": 0.02050107506592544, "linearS": 0.004096695086893028,
                "quadraticS": 8.464878722830305e-07, "rmsRelativeError": 0.05962316196319309,
                "points": [{"promptTokens": 32, "seconds": 0.154474}, {"promptTokens": 128, "seconds": 0.5263335},
                           {"promptTokens": 512, "seconds": 2.6265140000000002},
                           {"promptTokens": 1024, "seconds": 4.8897215}, {"promptTokens": 2032, "seconds": 11.850318}]},
    "decode": [{"streams": 1, "tokensPerSecond": 99.66371446403413}, {"streams": 2, "tokensPerSecond": 54.8343629352864},
               {"streams": 3, "tokensPerSecond": 37.16866342412145}, {"streams": 4, "tokensPerSecond": 32.226911224342444}],
    "kv": {"bytesPerToken": 23040.0, "capacityTokens": 8192, "perRequestMaxTokens": 2048},
    "tokensPerChar": {"mean": 0.4979082175291483, "p95": 1.864864864864865, "max": 1.864864864864865, "samples": 14},
    "fingerprintInputs": {"ctx_per_slot": "2048", "quantization": "Q4_1", "slots": "4", "threads": "2"},
    "durationS": 73.26248229500015,
}  # fmt: skip


def test_a_profile_from_before_the_confidence_still_validates() -> None:
    profile = CalibrationProfile.model_validate_json(json.dumps(OLD_PROFILE))
    assert profile.confidence is None
    assert all(p.timings is None and p.spread is None for p in profile.prefill.points)
    assert all(d.timings is None and d.spread is None for d in profile.decode)
    # Written again, it says nothing it did not measure: no invented counts or spreads.
    again = json.loads(full_json(profile))
    assert again["confidence"] is None
    assert CalibrationProfile.model_validate(again) == profile


def test_the_compact_form_keeps_the_confidence() -> None:
    confident = _profile().model_copy(
        update={
            "confidence": CalibrationConfidence(
                tolerance=0.03, prefill_reference_tokens=512, prefill_uncertainty=0.012,
                decode_streams=4, decode_uncertainty=0.02, unsettled_prefill_tokens=(2032,),
            )
        }
    )  # fmt: skip
    back = CalibrationProfile.model_validate_json(compact_json(confident))
    assert back.confidence == confident.confidence


def test_the_summary_line_states_the_confidence() -> None:
    points = [{"promptTokens": n, "seconds": n / 400, "timings": 3, "spread": 0.02} for n in (32, 128, 512, 1024)]
    profile = _profile().model_copy(
        update={
            "prefill": _profile().prefill.model_copy(
                update={"points": tuple(PrefillPoint.model_validate(p) for p in points)}
            ),
            "duration_s": 51.6,
            "confidence": CalibrationConfidence(
                tolerance=0.03, prefill_reference_tokens=512, prefill_uncertainty=0.0123,
                decode_streams=4, decode_uncertainty=0.0081, unsettled_prefill_tokens=(1024,),
                unsettled_decode_streams=(3,),
            ),
        }
    )  # fmt: skip
    assert summary_line(profile) == (
        "q4_1-abc-20261202 in 52 s: prefill 400 tok/s ± 1.2% at 512-token prompts, decode 25 tok/s per stream "
        "± 0.8% at B = 4 (± one standard error; above the 3% tolerance when repetitions ran out: "
        "1024-token prompts, B = 3)"
    )
    assert summary_line(_profile()).endswith("no stated confidence (a profile from an older version)")


def test_the_summary_line_says_when_the_budget_ended_before_every_planned_timing() -> None:
    """A busy machine's run ends in time with fewer timings (``time_required``), and says which."""
    timings = {32: 3, 128: 3, 512: 2, 1024: 1}
    points = [{"promptTokens": n, "seconds": n / 400, "timings": t, "spread": 0.02} for n, t in timings.items()]
    profile = _profile().model_copy(
        update={
            "prefill": _profile().prefill.model_copy(
                update={"points": tuple(PrefillPoint.model_validate(p) for p in points)}
            ),
            "confidence": CalibrationConfidence(
                tolerance=0.03, prefill_reference_tokens=512, prefill_uncertainty=0.02,
                decode_streams=4, decode_uncertainty=0.01, unsettled_prefill_tokens=(512, 1024),
            ),
        }
    )  # fmt: skip
    assert summary_line(profile).endswith(
        "the budget ended before every planned timing (a busy machine): 512-token prompts 2 of 3, "
        "1024-token prompts 1 of 2)"
    )
