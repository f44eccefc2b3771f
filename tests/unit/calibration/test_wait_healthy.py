"""The calibrator waits for a llama-server that is still loading its model (a calibration
Job starts both at once; no kubelet probe can reach a server on loopback). The wait itself,
``LlamaClient.wait_healthy``, is tested in tests/unit/llama/test_client.py."""

from __future__ import annotations

import pytest

from slogate_calibration.calibrate import CalibrationError, CalibrationSettings, calibrate


async def test_calibrate_names_the_wait_stage_when_nothing_ever_listens() -> None:
    settings = CalibrationSettings(upstream="http://127.0.0.1:9", wait_s=0.3)
    with pytest.raises(CalibrationError, match=r"stage 'wait'.*not healthy within 0\.3 s"):
        await calibrate(settings)
