"""Pure parts of calibration: server args, prompt lengths, medians, prompts, outputs."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from slogate_admission.schema import CalibrationProfile, PrefillPoint
from slogate_calibration.measure import PromptMaker, median_points, prefill_lengths
from slogate_calibration.output import (
    TERMINATION_MESSAGE_LIMIT,
    compact_json,
    full_json,
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


def test_median_points_discard_one_disturbed_timing() -> None:
    raw = [PrefillPoint(prompt_tokens=512, seconds=s) for s in (2.0, 2.1, 5.0)]
    raw.append(PrefillPoint(prompt_tokens=32, seconds=0.1))
    assert median_points(raw) == [
        PrefillPoint(prompt_tokens=32, seconds=0.1),
        PrefillPoint(prompt_tokens=512, seconds=2.1),
    ]


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
