"""An operator upgrade that changes how the container fingerprint is computed recalibrates
nothing unless the container changed (the second review: the fingerprint of the same
Deployment changed between recent releases, and an upgrade started every policy's Job).

The upgrade is played in-process: the first operator calibrates; the second runs with
another FINGERPRINT_VERSION and a fingerprint function that hashes differently."""

from __future__ import annotations

import pytest
from operator_flows import ARGS_T1, apply_and_calibrate, current_job, roll_out, status_of

from api_cluster import CONFIGMAPS, Cluster
from kopf_thread import running_operator, settle
from polling import eventually
from slogate_operator import names, reconcile, stores, targets
from slogate_operator.fingerprint import FINGERPRINT_VERSION, LlamaContainer, container_fingerprint

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread


def rehashed(llama: LlamaContainer, recalibrate: str | None = None) -> str:
    """The next release's algorithm: the same inputs, hashed another way."""
    return container_fingerprint(llama, recalibrate)[::-1]


def stored_notes(cluster: Cluster) -> dict[str, str]:
    return dict(cluster.get(CONFIGMAPS, "smollm2-thresholds")["metadata"]["annotations"])


def test_a_new_fingerprint_algorithm_keeps_the_calibration_of_an_unchanged_container(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_operator(cluster):
        apply_and_calibrate(cluster)
    before = stored_notes(cluster)
    assert before[names.ANNOTATION_FINGERPRINT_VERSION] == FINGERPRINT_VERSION
    jobs_before = len(cluster.calls("POST", "jobs"))

    monkeypatch.setattr(targets, "container_fingerprint", rehashed)
    monkeypatch.setattr(reconcile, "FINGERPRINT_VERSION", "next")
    monkeypatch.setattr(stores, "FINGERPRINT_VERSION", "next")
    with running_operator(cluster):
        eventually(lambda: stored_notes(cluster)[names.ANNOTATION_FINGERPRINT_VERSION] == "next", what="adopted")
        after = stored_notes(cluster)
        assert after[names.ANNOTATION_CONTAINER_FINGERPRINT] == before[names.ANNOTATION_CONTAINER_FINGERPRINT][::-1]
        assert after[names.ANNOTATION_CONTAINER_DIGEST] == before[names.ANNOTATION_CONTAINER_DIGEST]
        settle("smollm2")
        assert status_of(cluster, "Calibrated") == "True"
        assert len(cluster.calls("POST", "jobs")) == jobs_before  # nothing measured again
        # A measured setting changes (threads): that is a new calibration, as before.
        roll_out(cluster, ARGS_T1)
        eventually(lambda: current_job(cluster), what="the recalibration's Job")
        assert len(cluster.calls("POST", "jobs")) == jobs_before + 1
