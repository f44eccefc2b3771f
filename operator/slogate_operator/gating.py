"""A pass's step over its targets: claim them, keep their webhook entries, and roll their
pods onto or off the gate with the one annotation the operator writes (injector.py).

Order is what keeps every pod gated: a target's webhook entry is written, and read by the
API servers (``webhook_settle_seconds``), before its pods roll onto the gate; it is removed,
and that read too, before they roll off. Until then the template is left as it is, and the
pass asks to run again when the wait is over.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slogate_operator import builders, injector, targets, webhook
from slogate_operator.context import Runtime
from slogate_operator.injection import InjectionRecord, TargetClaimedError
from slogate_operator.outcome import Event
from slogate_operator.spec import AdmissionPolicySpec

Template = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Gating:
    """What the step did and found."""

    latest: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Deployments as this step wrote them (their new resourceVersion)."""
    problems: tuple[str, ...] = ()
    degraded: tuple[tuple[str, str], ...] = ()
    events: tuple[Event, ...] = ()
    wait_s: float | None = None
    """Run the pass again this soon: an entry is being read by the API servers."""
    waiting: tuple[str, ...] = ()
    """Targets whose pods are to roll onto the gate once the API servers have read the entry."""


async def gate_targets(
    rt: Runtime,
    policy: builders.PolicyRef,
    spec: AdmissionPolicySpec,
    scan: targets.TargetScan,
    *,
    gate: bool,
    drain: str,
    latest: Mapping[str, Mapping[str, Any]],
) -> Gating:
    """Every target gated (``gate`` and the spec injects) or not; strays released."""
    mine = builders.policy_label_value(policy.name)
    endpoint = injector.Endpoint.of(rt.settings)
    inject = gate and spec.operator.sidecar.inject
    parts: list[Gating] = []
    if inject and endpoint is None:
        parts.append(Gating(degraded=((
            "WebhookNotConfigured",
            "the operator serves no injection webhook (neither webhook_service nor webhook_url is set): "
            "no pod can get the gate",
        ),)))  # fmt: skip
    for target in scan.targets:
        key = (policy.namespace, target.name)
        current = latest.get(target.name, target.deployment)
        config = injector.sidecar_config(rt.settings, policy.name, spec, target.llama, drain)
        if inject and endpoint is not None:
            rt.gates[key] = config
            wanted: Mapping[str, Any] | None = injector.entry(
                policy.namespace, policy.name, target.deployment, endpoint, rt.settings.webhook_failure_policy
            )
        else:
            rt.gates.pop(key, None)
            wanted = None
        revision = injector.gate_revision(config) if wanted is not None else None
        wait = await _entry(rt, key, wanted, endpoint)
        parts.append(await _apply(rt, policy, current, revision, claim=mine, ready=wait is None))
        rolling = f"Deployment {target.name}: its pods roll onto the gate once its webhook entry is read"
        parts.append(Gating(wait_s=wait, waiting=(rolling,) if wait is not None and wanted is not None else ()))
    parts.append(await release(rt, policy, scan.strays))
    return _joined(parts)


async def release(rt: Runtime, policy: builders.PolicyRef, deployments: Sequence[Mapping[str, Any]]) -> Gating:
    """Take the gate off Deployments the policy claimed and no longer gates (strays, or all of
    them when it is deleted): the webhook entry goes first, and once the API servers have read
    that, the gate annotation and the claim. Until then each stays claimed, as it is."""
    mine = builders.policy_label_value(policy.name)
    endpoint = injector.Endpoint.of(rt.settings)
    parts: list[Gating] = []
    for deployment in deployments:
        key = (policy.namespace, str(deployment["metadata"]["name"]))
        rt.gates.pop(key, None)
        wait = await _entry(rt, key, None, endpoint)
        ready = wait is None
        parts.append(await _apply(rt, policy, deployment, None, claim=None if ready else mine, ready=ready))
        parts.append(Gating(wait_s=wait))
    return _joined(parts)


def _joined(parts: Sequence[Gating]) -> Gating:
    waits = [p.wait_s for p in parts if p.wait_s is not None]
    return Gating(
        latest={name: d for p in parts for name, d in p.latest.items()},
        problems=tuple(x for p in parts for x in p.problems),
        degraded=tuple(x for p in parts for x in p.degraded),
        events=tuple(x for p in parts for x in p.events),
        wait_s=min(waits) if waits else None,
        waiting=tuple(x for p in parts for x in p.waiting),
    )


async def _entry(
    rt: Runtime, key: tuple[str, str], wanted: Mapping[str, Any] | None, endpoint: injector.Endpoint | None
) -> float | None:
    """Write (or remove) the target's entry; how long the API servers still need to read it (None: done)."""
    if endpoint is None:
        return None  # no webhook: nothing to write, nothing to wait for
    name = injector.entry_name(*key)
    changed = await webhook.write_entries(rt.client, rt.settings.webhook_configuration, {name: wanted})
    now = time.monotonic()
    if changed:
        rt.entries[key] = now
    waited, settle = now - rt.entries.get(key, -math.inf), rt.settings.webhook_settle_seconds
    return None if waited >= settle else settle - waited


async def _apply(
    rt: Runtime,
    policy: builders.PolicyRef,
    deployment: Mapping[str, Any],
    revision: str | None,
    *,
    claim: str | None,
    ready: bool = True,
) -> Gating:
    """The template at ``revision`` (left as it is unless ``ready``) and the claim; events for what changed."""

    def desired(template: Template) -> dict[str, Any]:
        return injector.gated_template(template, revision) if ready else dict(template)

    name = str(deployment["metadata"]["name"])
    try:
        changed = await targets.apply_template(rt.client, policy.namespace, deployment, desired, claim=claim)
    except TargetClaimedError as error:
        return Gating(problems=(f"Deployment {name}: {error}",))
    if changed is None:
        return Gating()
    before, after = _template(deployment), _template(changed)
    was, now = injector.gate_of(before), injector.gate_of(after)
    events: list[Event] = []
    if InjectionRecord.of(before) is not None and InjectionRecord.of(after) is None:
        events.append(("Normal", "SidecarMigrated", f"Deployment {name}: its template is the user's again; "
                       "its pods get the gate at admission"))  # fmt: skip
    if was is None and now is not None:
        events.append(("Normal", "SidecarInjected", f"Deployment {name}: its pods roll onto the gate"))
    elif was is not None and now is None:
        events.append(("Normal", "SidecarRemoved", f"Deployment {name}: its pods roll off the gate"))
    elif was != now:
        events.append(("Normal", "SidecarUpdated", f"Deployment {name}: its pods roll to new sidecar settings"))
    return Gating(latest={name: changed}, events=tuple(events))


def _template(deployment: Mapping[str, Any]) -> Template:
    return (deployment.get("spec") or {}).get("template") or {}
