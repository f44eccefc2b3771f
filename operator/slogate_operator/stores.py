"""The two objects the operator keeps per policy or namespace, read and written idempotently.

- The admin token Secret (one per namespace): created with a random token if missing;
  every policy that uses it is listed among its owners.
- The thresholds ConfigMap (one per policy): ``thresholds.json`` for the sidecars and
  ``profile.json``, the calibration it was derived from, so a policy change re-derives
  without measuring again. Annotations say which container fingerprint the profile
  describes and which policy the thresholds were derived for.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_operator import builders, names
from slogate_operator.client import CONFIGMAPS, SECRETS, AlreadyExistsError, ConflictError, KubeClient
from slogate_operator.fingerprint import FINGERPRINT_VERSION, LlamaContainer, container_digest
from slogate_operator.status import DegradedError

log = logging.getLogger("slogate.operator")


async def ensure_token(client: KubeClient, policy: builders.PolicyRef, secret_name: str) -> str:
    """The namespace's admin token, creating the Secret or adding this policy as an owner."""
    for _ in range(5):
        secret = await client.get(SECRETS, policy.namespace, secret_name)
        if secret is None:
            body = builders.admin_token_secret(policy.namespace, secret_name, secrets.token_urlsafe(32), [policy])
            try:
                secret = await client.create(SECRETS, policy.namespace, body)
            except AlreadyExistsError:
                continue  # another writer was first: read theirs
        token = builders.secret_token(secret)
        if token is None:
            raise DegradedError(
                "AdminTokenInvalid",
                f"Secret {policy.namespace}/{secret_name} has no usable {names.TOKEN_KEY!r} key: no sidecar can "
                f"accept a push; put a token there (or delete the Secret and the operator makes one)",
            )
        labels = secret["metadata"].get("labels") or {}
        owners = secret["metadata"].get("ownerReferences") or []
        if labels.get(names.LABEL_MANAGED_BY) != names.MANAGED_BY or any(o.get("uid") == policy.uid for o in owners):
            # A Secret the user made stays theirs: no owner reference, or it would be
            # garbage-collected with the last policy that uses it.
            return token
        owners = [*owners, policy.owner_reference(controller=False)]
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": secret["metadata"].get("resourceVersion")},
            {"op": "add", "path": "/metadata/ownerReferences", "value": owners},
        ]
        try:
            await client.json_patch(SECRETS, policy.namespace, secret_name, ops)
        except ConflictError:
            continue
        return token
    raise ConflictError(409, "Conflict", f"Secret {policy.namespace}/{secret_name} kept changing")


def policy_digest(policy: Policy) -> str:
    """Identifies the policy thresholds were derived for."""
    return names.short_hash(policy.model_dump_json(by_alias=True), 16)


@dataclass(frozen=True, slots=True)
class StoredCalibration:
    """What the thresholds ConfigMap holds."""

    profile: CalibrationProfile | None = None
    container_fingerprint: str | None = None
    fingerprint_version: str | None = None
    """The algorithm that made ``container_fingerprint`` (None: before versions were kept, "1")."""
    container_digest: str | None = None
    """fingerprint.container_digest of the container measured (None before it was kept)."""
    job: str = ""
    recalibrate: str = ""
    thresholds: Thresholds | None = None
    policy_digest: str | None = None


def read_stored(configmap: dict[str, Any] | None) -> StoredCalibration:
    """Parse the ConfigMap; an unreadable document counts as absent (and is logged)."""
    if configmap is None:
        return StoredCalibration()
    data = configmap.get("data") or {}
    notes = configmap["metadata"].get("annotations") or {}
    profile = thresholds = None
    try:
        if names.PROFILE_KEY in data:
            profile = CalibrationProfile.model_validate_json(data[names.PROFILE_KEY])
        if names.THRESHOLDS_KEY in data:
            thresholds = Thresholds.model_validate_json(data[names.THRESHOLDS_KEY])
    except ValidationError as invalid:
        log.warning("ConfigMap %s holds an invalid document, ignored: %s", configmap["metadata"]["name"], invalid)
    return StoredCalibration(
        profile=profile,
        container_fingerprint=notes.get(names.ANNOTATION_CONTAINER_FINGERPRINT) if profile else None,
        fingerprint_version=notes.get(names.ANNOTATION_FINGERPRINT_VERSION) if profile else None,
        container_digest=notes.get(names.ANNOTATION_CONTAINER_DIGEST) if profile else None,
        job=notes.get(names.ANNOTATION_CALIBRATION_JOB, ""),
        recalibrate=notes.get(names.ANNOTATION_RECALIBRATE, ""),
        thresholds=thresholds,
        policy_digest=notes.get(names.ANNOTATION_POLICY_DIGEST) if thresholds else None,
    )


async def load_stored(client: KubeClient, policy: builders.PolicyRef) -> StoredCalibration:
    """Read the ConfigMap, creating it empty (so pods can mount it) if missing.

    A ConfigMap left by an earlier policy of the same name (deleted and created again
    before garbage collection ran) is adopted, so it is not collected from under us; any
    other ConfigMap of that name is the user's, and left alone (Degraded, ConfigMapNotOurs).
    """
    name = names.thresholds_configmap_name(policy.name)
    configmap = await client.get(CONFIGMAPS, policy.namespace, name)
    if configmap is not None and not owned_by(configmap, policy):
        if not left_by_namesake(configmap, policy):
            raise DegradedError(
                "ConfigMapNotOurs",
                f"ConfigMap {policy.namespace}/{name} exists and was not made by the slogate operator for this "
                "policy: rename it, or rename the policy (the operator keeps its thresholds there)",
            )
        # Left by an earlier policy of the same name (deleted and created again before
        # garbage collection ran): adopted, so it is not collected from under us.
        owners = {"metadata": {"ownerReferences": [policy.owner_reference()]}}
        configmap = await client.merge_patch(CONFIGMAPS, policy.namespace, name, owners)
    if configmap is None:
        try:
            await client.create(CONFIGMAPS, policy.namespace, builders.thresholds_configmap(policy, {}, {}))
        except AlreadyExistsError:
            configmap = await client.get(CONFIGMAPS, policy.namespace, name)
            return read_stored(configmap)
        return StoredCalibration()
    return read_stored(configmap)


def owned_by(obj: Mapping[str, Any], policy: builders.PolicyRef) -> bool:
    """Owned by this policy, and by nothing else."""
    return [o.get("uid") for o in (obj.get("metadata") or {}).get("ownerReferences") or ()] == [policy.uid]


def left_by_namesake(configmap: Mapping[str, Any], policy: builders.PolicyRef) -> bool:
    """Made by us for a policy of this name, and owned by no other live kind of object (an
    earlier policy of the same name, deleted and created again before garbage collection ran)."""
    labels = configmap["metadata"].get("labels") or {}
    ours = labels.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY and labels.get(
        names.LABEL_POLICY
    ) == builders.policy_label_value(policy.name)
    owners = configmap["metadata"].get("ownerReferences") or ()
    return ours and all(o.get("kind") == names.KIND and o.get("name") == policy.name for o in owners)


async def save_stored(client: KubeClient, policy: builders.PolicyRef, stored: StoredCalibration) -> None:
    """Write profile and thresholds together: a sidecar never mounts one without the other."""
    data: dict[str, Any] = {}
    notes: dict[str, Any] = {
        names.ANNOTATION_CONTAINER_FINGERPRINT: stored.container_fingerprint,
        names.ANNOTATION_FINGERPRINT_VERSION: stored.fingerprint_version,
        names.ANNOTATION_CONTAINER_DIGEST: stored.container_digest,
        names.ANNOTATION_CALIBRATION_JOB: stored.job or None,
        names.ANNOTATION_RECALIBRATE: stored.recalibrate or None,
        names.ANNOTATION_POLICY_DIGEST: stored.policy_digest,
    }
    if stored.profile is not None:
        data[names.PROFILE_KEY] = stored.profile.model_dump_json(by_alias=True)
    if stored.thresholds is not None:
        data[names.THRESHOLDS_KEY] = stored.thresholds.model_dump_json(by_alias=True)
    await client.merge_patch(
        CONFIGMAPS,
        policy.namespace,
        names.thresholds_configmap_name(policy.name),
        {"metadata": {"annotations": notes}, "data": data},
    )


def adopt_across_versions(stored: StoredCalibration, key: str, llama: LlamaContainer) -> StoredCalibration | None:
    """The stored calibration under today's fingerprint, if only the algorithm changed: it was
    made by another FINGERPRINT_VERSION and the container digest (algorithm-free) still matches."""
    if stored.fingerprint_version == FINGERPRINT_VERSION or stored.container_digest != container_digest(llama):
        return None
    return dataclasses.replace(stored, container_fingerprint=key, fingerprint_version=FINGERPRINT_VERSION)
