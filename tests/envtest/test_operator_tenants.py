"""spec.tenants through the real operator (kopf against a real API server): the thresholds carry the tenant
policy, and a change of it alone is derived again and pushed to the running sidecars, without
a new calibration; removing it takes it out of both."""

from __future__ import annotations

import json
from typing import Any

import pytest
from counting_sidecars import CountingSidecars
from kopf.testing import KopfRunner
from operator_flows import assert_status_fits_the_crd, policy, status_of, thresholds_in

from api_cluster import DEPLOYMENTS, POLICIES, Cluster
from canned_profiles import smollm2_profile
from manifests import admission_policy, llama_deployment
from polling import eventually
from slogate_admission.schema import Thresholds
from slogate_admission.tenant_schema import DEFAULT_MAX_TRACKED, DEFAULT_TENANT_HEADER, MAX_LISTED_TENANTS
from slogate_calibration.output import compact_json
from workload_controllers import complete_job, job_names, run_pods

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread


def served(fleet: CountingSidecars) -> Thresholds | None:
    """What the one stand-in sidecar was last pushed (None before any push)."""
    (body,) = fleet.served.values() or (None,)
    return None if body is None else Thresholds.model_validate(body)


def pushed(cluster: Cluster) -> str | None:
    status: dict[str, Any] = policy(cluster).get("status") or {}
    return status.get("pushed")


def test_a_change_of_spec_tenants_is_derived_again_and_pushed(cluster: Cluster, operator: KopfRunner) -> None:
    fleet = CountingSidecars(cluster, 1)
    try:
        cluster.create(DEPLOYMENTS, llama_deployment())
        cluster.create(POLICIES, admission_policy(sidecar={"adminPort": fleet.port}))
        (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
        complete_job(cluster, job, compact_json(smollm2_profile()))
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready")
        run_pods(cluster, "smollm2", fleet.ips)
        eventually(lambda: pushed(cluster) == "1/1", what="the first push acknowledged")
        first = thresholds_in(cluster)
        assert first is not None
        assert first.tenants is None
        assert served(fleet) == first  # the stand-in started empty: it was pushed the first thresholds
        assert "tenantOutputWeight" not in policy(cluster)["status"]["thresholds"]

        # spec.tenants set: derived again on the same calibration, with the defaults the CRD gave.
        cluster.patch(POLICIES, "smollm2", {"spec": {"tenants": {"weights": {"acme": 3}}}})
        second = eventually(lambda: (t := thresholds_in(cluster)) and t.tenants is not None and t)
        assert second.tenants is not None
        assert second.calibration_id == first.calibration_id
        assert (second.tenants.header, second.tenants.max_tracked) == (DEFAULT_TENANT_HEADER, DEFAULT_MAX_TRACKED)
        assert second.tenants.weights == {"acme": 3.0}
        assert second.tenants.output_weight_measured
        assert second.classes == first.classes  # nothing but the tenant policy changed
        eventually(lambda: served(fleet) == second, what="the tenant policy pushed to the sidecar")
        eventually(lambda: pushed(cluster) == "1/1")
        found = eventually(lambda: (p := policy(cluster))["status"]["observedGeneration"] == 2 and p)
        assert found["status"]["thresholds"]["tenantOutputWeight"] == round(second.tenants.output_weight, 3)
        assert_status_fits_the_crd(found)

        # Only a weight changes: the thresholds differ in it alone, and are pushed again.
        puts = fleet.requests["PUT"]
        cluster.patch(POLICIES, "smollm2", {"spec": {"tenants": {"weights": {"acme": 5}, "outputWeight": 2}}})
        third = eventually(
            lambda: (t := thresholds_in(cluster)) and t.tenants and t.tenants.weights != {"acme": 3.0} and t
        )
        assert third.tenants is not None
        assert (third.tenants.weights, third.tenants.output_weight) == ({"acme": 5.0}, 2.0)
        assert not third.tenants.output_weight_measured
        eventually(lambda: served(fleet) == third, what="the new weight pushed")
        assert fleet.requests["PUT"] == puts + 1

        # Removed: the tenant policy leaves the thresholds and the sidecar.
        cluster.patch(POLICIES, "smollm2", {"spec": {"tenants": None}})
        eventually(lambda: (t := thresholds_in(cluster)) is not None and t.tenants is None, what="tenants removed")
        eventually(lambda: (s := served(fleet)) is not None and s.tenants is None, what="the removal pushed")
        eventually(lambda: "tenantOutputWeight" not in policy(cluster)["status"]["thresholds"])
        assert len(cluster.calls("POST", "jobs")) == 1  # never measured again
    finally:
        fleet.close()


def test_the_largest_tenant_map_the_crd_takes_fits_where_the_api_server_stores_it(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """1,000 tenants of 128 characters, applied as `kubectl apply` does (the whole object again
    in its last-applied annotation): calibrated and Ready, the thresholds ConfigMap carries every
    tenant, and the policy's annotations stay under the API server's 256 KiB (kopf's diff base
    once copied the spec beside kubectl's copy, and the server refused every write after)."""
    weights = {f"{i:04d}" + "t" * 124: 2 for i in range(MAX_LISTED_TENANTS)}
    body = admission_policy(tenants={"maxTracked": MAX_LISTED_TENANTS, "weights": weights})
    body["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(body)}
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, body)
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready")
    derived = thresholds_in(cluster)
    assert derived is not None
    assert derived.tenants is not None
    assert derived.tenants.weights == dict.fromkeys(weights, 2.0)
    annotations = policy(cluster)["metadata"]["annotations"]
    assert sum(len(k) + len(v) for k, v in annotations.items()) < 256 * 1024
    refused = [c for c in cluster.calls("PATCH", "admissionpolicies") if c.status == 422]
    assert refused == []
