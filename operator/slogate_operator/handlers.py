"""kopf wiring, kept thin: login, startup/cleanup, one loop per policy, deletion, wake-ups.

Each AdmissionPolicy gets a kopf daemon that runs ``reconcile`` (a level-triggered,
idempotent pass) and then waits for the resync interval, or less when something it
depends on changes: the policy itself, a Deployment of its namespace, one of its
calibration Jobs or pods (watched here only to cut the wait short). Deleting a policy
stops its loop, then the deletion handler takes the sidecar out of its Deployments
before kopf releases the finalizer; the Jobs, ConfigMap and Secret go with the policy
through their ownerReferences.

Run with `slogate operator` (peering, scope and ports from OperatorSettings), or
`kopf run -m slogate_operator.handlers` (settings from SLOGATE_OPERATOR_* variables).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
import prometheus_client

from slogate_operator import builders, gating, injector, metrics, names
from slogate_operator.client import DEPLOYMENTS, KubeClient
from slogate_operator.context import Runtime
from slogate_operator.injection import deployment_claim
from slogate_operator.reconcile import reconcile
from slogate_operator.selectors import labelled
from slogate_operator.settings import OperatorSettings
from slogate_operator.webhook import Webhook

RESOURCE = (names.GROUP, names.VERSION, names.PLURAL)
DIFFBASE_IGNORED = ("spec", "metadata.labels", "metadata.annotations")
"""All of what kopf would copy into the last-handled-configuration annotation: no handler
here reads a diff, and a copy of a policy's spec or annotations could pass the API server's
256 KiB for all of an object's annotations (kopf then loops on the refusal)."""


def configured(memo: Any) -> OperatorSettings:
    """Settings the CLI put in the memo, else from the environment (``kopf run``)."""
    settings = getattr(memo, "config", None)
    if isinstance(settings, OperatorSettings):
        return settings
    settings = OperatorSettings.from_env(os.environ)
    memo.config = settings
    return settings


def connection_info(config: OperatorSettings, kopf_settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """Where the API server is and how to authenticate: override, service account, kubeconfig."""
    if config.kube_api:
        return kopf.ConnectionInfo(server=config.kube_api, priority=100)
    info = kopf.login_with_service_account(settings=kopf_settings) or kopf.login_with_kubeconfig(settings=kopf_settings)
    if info is None:
        raise kopf.LoginError(
            "no service account token and no kubeconfig; run in a pod, set KUBECONFIG, "
            "or set SLOGATE_OPERATOR_KUBE_API (e.g. behind `kubectl proxy`)"
        )
    return info


@kopf.on.login()
def login(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """kopf and the operator's own client use the same credentials."""
    return connection_info(configured(memo), settings)


@kopf.on.startup()
async def startup(memo: kopf.Memo, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    config = configured(memo)
    # kopf keeps its handler progress and diff base in annotations under our own prefix;
    # the status belongs to the operator alone. No handler reads the diff (the daemon
    # reconciles from the spec itself, on.delete needs none): see DIFFBASE_IGNORED.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration", ignored_fields=DIFFBASE_IGNORED
    )
    settings.persistence.finalizer = f"{names.GROUP}/operator"
    # Server-side filters: only the Jobs and pods the operator made or injected are sent
    # (the handlers' label filters below run client-side, after the transfer).
    ours = labelled(names.LABEL_POLICY).query()
    settings.watching.label_selectors["batch", "v1", "jobs"] = ours
    settings.watching.label_selectors["", "v1", "pods"] = ours
    settings.peering.lifetime = config.peering_lifetime_seconds
    client = KubeClient(
        lambda: connection_info(config, settings), retries=config.api_retries, backoff_s=config.api_backoff_seconds
    )
    await client.__aenter__()
    runtime = memo.runtime = Runtime(settings=config, client=client, http=aiohttp.ClientSession())
    endpoint = injector.Endpoint.of(config)
    if endpoint is not None:
        # Serving before kopf's first listing: a pass may write an entry at once.
        memo.webhook = Webhook(runtime, endpoint)
        await memo.webhook.start()
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port, registry=metrics.REGISTRY)
    scope = ",".join(config.namespaces) or "all namespaces"
    logger.info(f"slogate operator serving {scope}; default image {config.image}")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    hook: Webhook | None = getattr(memo, "webhook", None)
    if hook is not None:
        await hook.stop()
    runtime: Runtime | None = getattr(memo, "runtime", None)
    if runtime is not None:
        await runtime.client.close()
        await runtime.http.close()


@kopf.daemon(*RESOURCE, cancellation_timeout=10.0)
async def policy_loop(
    name: str, namespace: str | None, memo: Any, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """Reconcile, then wait (resync, a backoff's end, or a wake-up); forever, until deleted."""
    assert namespace is not None  # AdmissionPolicy is namespaced
    rt: Runtime = memo.runtime
    wakeup = rt.wakeup(namespace, name)
    error_backoff = rt.settings.error_backoff_seconds
    # A restarted operator starts every policy's loop at once: spread their first passes.
    # Not cut short by wake-ups: kopf's first listing pokes every policy at the same moment.
    await _sleep(asyncio.Event(), stopped, random.uniform(0, rt.settings.startup_jitter_seconds))
    try:
        while not stopped:
            wakeup.clear()
            delay = rt.settings.resync_seconds
            try:
                result = await reconcile(rt, namespace, name)
            except Exception as error:  # never let one bad pass end the loop
                metrics.reconciles.labels(namespace, name, "error").inc()
                logger.warning(f"reconcile failed, retrying in {error_backoff:g} s: {error}", exc_info=True)
                delay, error_backoff = error_backoff, min(error_backoff * 2, rt.settings.resync_seconds)
            else:
                metrics.reconciles.labels(namespace, name, "error" if result.failed else "ok").inc()
                if result.gone:
                    return
                if result.failed:  # the status says why; try again sooner than a resync, backing off
                    delay, error_backoff = error_backoff, min(error_backoff * 2, rt.settings.resync_seconds)
                else:
                    error_backoff = rt.settings.error_backoff_seconds
                if result.wake_at is not None:
                    delay = min(delay, max(0.0, (result.wake_at - rt.clock()).total_seconds()) + 0.05)
            if await _sleep(wakeup, stopped, delay):  # woken by a change: let the ones after it come too
                await _sleep(asyncio.Event(), stopped, rt.settings.coalesce_seconds)
    finally:
        rt.forget(namespace, name)


async def _sleep(wakeup: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> bool:
    """Wait for the delay, a wake-up or the stop; whether a wake-up ended it."""
    waits = [asyncio.ensure_future(wakeup.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        return wakeup.is_set() and not stopped
    finally:
        for wait in waits:
            wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await wait


@kopf.on.delete(*RESOURCE, backoff=5.0)
async def policy_deleted(name: str, namespace: str | None, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    """Release every Deployment this policy claimed, its pods rolled off the gate (kopf retries on failure).

    As a pass releases a stray (gating.release): its webhook entry goes first, and the API
    servers are given time to read that, so no pod of the rollout is injected with the
    thresholds ConfigMap about to go; then the gate annotation (and a template injection of an
    older operator) leaves the template. Here the handler waits that time out itself.
    """
    assert namespace is not None
    rt: Runtime = memo.runtime
    policy = builders.PolicyRef(name=name, namespace=namespace, uid="")
    mine = builders.policy_label_value(name)
    claimed: list[Mapping[str, Any]] = [
        d for d in await rt.client.list(DEPLOYMENTS, namespace) if deployment_claim(d) == mine
    ]
    while claimed:
        done = await gating.release(rt, policy, claimed)
        for event in done.events:
            logger.info(event[2])
        if done.problems:
            raise kopf.TemporaryError("; ".join(done.problems), delay=5.0)
        if done.wait_s is None:
            break
        await asyncio.sleep(done.wait_s)
        claimed = [done.latest.get(str(d["metadata"]["name"]), d) for d in claimed]
    metrics.forget(namespace, name)


@kopf.on.event(*RESOURCE)
def policy_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _runtime(memo).policy_changed(type, body)


@kopf.on.event("apps", "v1", "deployments")
def deployment_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _runtime(memo).deployment_changed(type, body)


@kopf.on.event("batch", "v1", "jobs", labels={names.LABEL_POLICY: kopf.PRESENT})
def job_event(namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    if namespace is not None:
        _runtime(memo).poke_label(namespace, labels[names.LABEL_POLICY])


@kopf.on.event("", "v1", "pods", labels={names.LABEL_POLICY: kopf.PRESENT})
def pod_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _runtime(memo).pod_changed(type, body)


class _NoRuntime:
    def poke(self, namespace: str, name: str | None = None) -> None:
        """Events can arrive before startup has finished: nothing to wake yet."""

    def poke_label(self, namespace: str, label: str) -> None:
        """As poke."""

    def deployment_changed(self, kind: str | None, deployment: Any) -> None:
        """As poke."""

    def policy_changed(self, kind: str | None, policy: Any) -> None:
        """As poke."""

    def pod_changed(self, kind: str | None, pod: Any) -> None:
        """As poke."""


def _runtime(memo: Any) -> Runtime | _NoRuntime:
    runtime = getattr(memo, "runtime", None)
    return runtime if isinstance(runtime, Runtime) else _NoRuntime()
