"""Canned core objects shaped like the bundled SmolLM2-135M on these machines: a calibration
profile, and the fixed clock it is dated by."""

from datetime import UTC, datetime

from slogate_admission.schema import CalibrationProfile

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def smollm2_profile(**overrides: object) -> CalibrationProfile:
    """~330 tok/s prefill, 98/69/57/45 tok/s per stream at B = 1..4, 4 slots x 2048."""
    raw: dict[str, object] = {
        "id": "cal-test",
        "fingerprint": "f" * 16,
        "measuredAt": NOW.isoformat(),
        "model": {
            "name": "SmolLM2-135M-Instruct",
            "quantization": "Q4_1",
            "nLayers": 30,
            "nKvHeads": 3,
            "headDim": 64,
        },
        "server": {"slots": 4, "ctxPerSlot": 2048, "threads": 2},
        "prefill": {"form": "quadratic", "interceptS": 0.02, "linearS": 0.0029, "quadraticS": 1e-7},
        "decode": [
            {"streams": 1, "tokensPerSecond": 98},
            {"streams": 2, "tokensPerSecond": 69},
            {"streams": 3, "tokensPerSecond": 57},
            {"streams": 4, "tokensPerSecond": 45},
        ],
        "kv": {"bytesPerToken": 23040, "capacityTokens": 8192, "perRequestMaxTokens": 2048},
        "tokensPerChar": {"mean": 0.25, "p95": 0.3, "max": 0.4, "samples": 20},
    }
    raw.update(overrides)
    return CalibrationProfile.model_validate(raw)
