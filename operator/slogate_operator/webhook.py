"""Injection at pod admission, the I/O half: the HTTPS server the API server calls for each
pod of a gated target, this replica's CA in the configuration's bundle, and the entries the
reconcile passes write.

Every replica serves (kopf's peering pauses only the active work of the standby): the API
server reaches them through one Service. The active replica answers from the sidecar
settings its last pass of the policy computed (``Runtime.gates``); a replica without them
(the standby, or any replica before its first pass) reads the policy, the Deployment and the
admin token, three GETs, and answers the same. It keeps what it read for the pods that
follow while they carry the same gate revision (the digest of those settings, on the pod
template: a policy change makes a new one) and for LOADED_SECONDS at most: the standby
answered about half of a 200-pod rollout with three GETs each before it kept them.

A pod the webhook cannot inject (the policy or its token missing, a container of ours by
name) is refused with the reason: the ReplicaSet reports it (FailedCreate) and retries,
and no pod of a gated target ever starts without its gate.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import ssl
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from slogate_admission.drain_token import drain_token
from slogate_operator import builders, certificates, injector
from slogate_operator.client import (
    DEPLOYMENTS,
    POLICIES,
    SECRETS,
    WEBHOOK_CONFIGURATIONS,
    ApiError,
    ConflictError,
    KubeClient,
)
from slogate_operator.context import Runtime, utc_now
from slogate_operator.fingerprint import ContainerNotFoundError, llama_container
from slogate_operator.injection import TargetClaimedError, deployment_claim
from slogate_operator.sidecar import SidecarConfig
from slogate_operator.spec import SpecError, parse_spec
from slogate_operator.status import DegradedError

log = logging.getLogger("slogate.operator.webhook")


class RefusedError(Exception):
    """Why a pod cannot be admitted now (the ReplicaSet retries)."""


CONFLICT_RETRIES = 5
LOADED_SECONDS = 30.0
"""How long a replica without passes reuses the settings it read for a target: bounds how
late it sees what the gate revision leaves out (the sidecar image, for the next rollout)."""
BUNDLE_CHECK_SECONDS = 30.0
"""How often a replica checks that the bundle still holds its CA (a restart of another
replica, or a reinstall of the chart, may have replaced it) and renews its certificate."""


async def write_entries(
    client: KubeClient, configuration: str, entries: Mapping[str, Mapping[str, Any] | None], ca: bytes | None = None
) -> bool:
    """Set (a mapping) or remove (None) entries of the configuration, and add ``ca`` to its
    bundle; whether that changed it. Re-reads and retries when another writer was first."""
    for _ in range(CONFLICT_RETRIES):
        current = await client.get(WEBHOOK_CONFIGURATIONS, None, configuration)
        if current is None and ca is None and not any(entries.values()):
            return False  # only removals, and nothing to remove them from
        if current is None:
            raise DegradedError(
                "WebhookConfigurationMissing",
                f"MutatingWebhookConfiguration {configuration} does not exist: the chart creates it "
                "(operator.webhook), and no pod can be injected without it",
            )
        bundle = injector.ca_bundle_of(current)
        if ca is not None and not certificates.trusts(bundle, ca):
            bundle = certificates.bundle_with(bundle, ca, utc_now())
        ops = injector.configuration_patch(current, entries, bundle)
        if not ops:
            return False
        try:
            await client.json_patch(WEBHOOK_CONFIGURATIONS, None, configuration, ops)
            return True
        except ConflictError:
            continue
    raise ConflictError(409, "Conflict", f"MutatingWebhookConfiguration {configuration} kept changing")


class Webhook:
    """One replica's webhook: its certificate, its server, its CA kept in the bundle."""

    def __init__(self, rt: Runtime, endpoint: injector.Endpoint) -> None:
        self.rt = rt
        self.endpoint = endpoint
        self.certificate = certificates.issue(endpoint.hosts(), utc_now())
        self.context: ssl.SSLContext = self.certificate.ssl_context()
        self._runner: web.AppRunner | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._loaded: dict[tuple[str, str], tuple[float, SidecarConfig]] = {}
        """Per target, what ``load`` read and until when it may be reused."""

    async def start(self) -> None:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post(injector.GATE_PATH + "/{namespace}/{policy}/{deployment}", self.review)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        settings = self.rt.settings
        site = web.TCPSite(self._runner, settings.webhook_address, settings.webhook_port, ssl_context=self.context)
        await site.start()
        try:
            await self.trust()
        except (ApiError, DegradedError) as error:  # retried every BUNDLE_CHECK_SECONDS; passes say why too
            log.warning("the webhook's CA is not trusted yet: %s", error)
        self._keeper = asyncio.create_task(self.keep(), name="slogate-webhook-ca")

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if self._runner is not None:
            await self._runner.cleanup()

    async def trust(self) -> None:
        """Put this replica's CA into the configuration's bundle (and every entry's)."""
        await write_entries(self.rt.client, self.rt.settings.webhook_configuration, {}, self.certificate.ca_pem)

    async def keep(self) -> None:
        """Keep this replica trusted and its certificate fresh, for as long as it serves."""
        while True:
            await asyncio.sleep(BUNDLE_CHECK_SECONDS)
            try:
                await self.check()
            except Exception as error:  # a failed check is tried again at the next one
                log.warning("could not keep the webhook's CA in %s: %s", self.rt.settings.webhook_configuration, error)

    async def check(self) -> None:
        """Renew the certificate after RENEW_AFTER (the new CA trusted first, the server's
        certificate swapped once every API server has read it); the CA back if it is gone."""
        if utc_now() - self.certificate.issued >= certificates.RENEW_AFTER:
            renewed = certificates.issue(self.endpoint.hosts(), utc_now())
            await write_entries(self.rt.client, self.rt.settings.webhook_configuration, {}, renewed.ca_pem)
            await asyncio.sleep(self.rt.settings.webhook_settle_seconds)
            certificates.load(self.context, renewed)
            self.certificate = renewed
        await self.trust()

    async def review(self, request: web.Request) -> web.Response:
        """One AdmissionReview: the pod back with the gate, or refused with the reason."""
        try:
            review = await request.json()
            ask = review["request"]
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "not an AdmissionReview"}, status=400)
        answer: dict[str, Any] = {"uid": ask.get("uid"), "allowed": True}
        namespace, policy, deployment = (request.match_info[k] for k in ("namespace", "policy", "deployment"))
        pod = ask.get("object") or {}
        try:
            config = self.rt.gates.get((namespace, deployment)) or await self.reuse_or_load(
                namespace, policy, deployment, injector.gate_of(pod)
            )
            ops = injector.pod_patch(pod, config)
        except (RefusedError, TargetClaimedError, ApiError) as error:
            # ApiError: the settings could not be read now; the ReplicaSet retries.
            message = f"slogate: pod of Deployment {namespace}/{deployment} not admitted: {error}"
            answer.update(allowed=False, status={"code": 403, "reason": "Forbidden", "message": message})
            log.warning("%s", message)
        else:
            if ops:
                answer.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(ops).encode()).decode())
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer})

    async def reuse_or_load(self, namespace: str, policy: str, deployment: str, revision: str | None) -> SidecarConfig:
        """What ``load`` read for this target before, if the pod's gate revision is that of those
        settings and they are recent; else read again."""
        now = time.monotonic()
        until, kept = self._loaded.get((namespace, deployment), (-math.inf, None))
        # A pod without a revision (its template not gated yet) matches none: read again.
        if kept is not None and now < until and kept.policy == policy and injector.gate_revision(kept) == revision:
            return kept
        config = await self.load(namespace, policy, deployment)
        self._loaded[(namespace, deployment)] = (now + LOADED_SECONDS, config)
        return config

    async def load(self, namespace: str, policy: str, deployment: str) -> SidecarConfig:
        """The sidecar settings of a target, read from the API (no pass has computed them here)."""
        client, settings = self.rt.client, self.rt.settings
        body = await client.get(POLICIES, namespace, policy)
        if body is None or body["metadata"].get("deletionTimestamp"):
            raise RefusedError(f"policy {policy} is gone: its webhook entry is being removed; retry")
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError as error:
            raise RefusedError(f"policy {policy} is invalid: {error}") from None
        target = await client.get(DEPLOYMENTS, namespace, deployment)
        if target is None or deployment_claim(target) != builders.policy_label_value(policy):
            raise RefusedError(f"Deployment {deployment} is not gated by policy {policy}")
        template_spec = ((target.get("spec") or {}).get("template") or {}).get("spec") or {}
        try:
            llama = llama_container(template_spec, spec.operator.container)
        except ContainerNotFoundError as error:
            raise RefusedError(str(error)) from None
        secret = await client.get(SECRETS, namespace, settings.admin_token_secret)
        token = builders.secret_token(secret) if secret is not None else None
        if token is None:
            raise RefusedError(f"Secret {namespace}/{settings.admin_token_secret} holds no admin token yet")
        return injector.sidecar_config(settings, policy, spec, llama, drain_token(token.encode()))
