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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slogate_operator import builders, injector, targets, webhook
from slogate_operator.context import Runtime
from slogate_operator.injection import InjectionRecord, TargetClaimedError
from slogate_operator.spec import AdmissionPolicySpec

Template = Mapping[str, Any]


@dataclass(slots=True)
class Gating:
    """What the step did and found."""

    latest: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Deployments as this step wrote them (their new resourceVersion)."""
    problems: list[str] = field(default_factory=list)
    degraded: list[tuple[str, str]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    wait_s: float | None = None
    """Run the pass again this soon: an entry is being read by the API servers."""
    waiting: list[str] = field(default_factory=list)
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
    done = Gating()
    mine = builders.policy_label_value(policy.name)
    endpoint = injector.Endpoint.of(rt.settings)
    inject = gate and spec.operator.sidecar.inject
    if inject and endpoint is None:
        done.degraded.append(
            (
                "WebhookNotConfigured",
                "the operator serves no injection webhook (neither webhook_service nor webhook_url is set): "
                "no pod can get the gate",
            )
        )
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
        ready = await _entry(rt, key, wanted, endpoint, done)
        await _apply(rt, policy, current, revision, claim=mine, done=done, ready=ready)
        if not ready and wanted is not None:
            done.waiting.append(f"Deployment {target.name}: its pods roll onto the gate once its webhook entry is read")
    for stray in scan.strays:
        key = (policy.namespace, str(stray["metadata"]["name"]))
        rt.gates.pop(key, None)
        ready = await _entry(rt, key, None, endpoint, done)
        await _apply(rt, policy, stray, None, claim=None if ready else mine, done=done, ready=ready)
    return done


async def _entry(
    rt: Runtime,
    key: tuple[str, str],
    wanted: Mapping[str, Any] | None,
    endpoint: injector.Endpoint | None,
    done: Gating,
) -> bool:
    """Write (or remove) the target's entry; whether the API servers have had time to read it."""
    if endpoint is None:
        return True  # no webhook: nothing to write, nothing to wait for
    name = injector.entry_name(*key)
    changed = await webhook.write_entries(rt.client, rt.settings.webhook_configuration, {name: wanted})
    now = time.monotonic()
    if changed:
        rt.entries[key] = now
    waited, settle = now - rt.entries.get(key, -math.inf), rt.settings.webhook_settle_seconds
    if waited >= settle:
        return True
    done.wait_s = min(done.wait_s or settle, settle - waited)
    return False


async def _apply(
    rt: Runtime,
    policy: builders.PolicyRef,
    deployment: Mapping[str, Any],
    revision: str | None,
    *,
    claim: str | None,
    done: Gating,
    ready: bool = True,
) -> None:
    """The template at ``revision`` (left as it is unless ``ready``) and the claim; events for what changed."""

    def desired(template: Template) -> dict[str, Any]:
        return injector.gated_template(template, revision) if ready else dict(template)

    name = str(deployment["metadata"]["name"])
    try:
        changed = await targets.apply_template(rt.client, policy.namespace, deployment, desired, claim=claim)
    except TargetClaimedError as error:
        done.problems.append(f"Deployment {name}: {error}")
        return
    if changed is None:
        return
    done.latest[name] = changed
    before, after = _template(deployment), _template(changed)
    was, now = injector.gate_of(before), injector.gate_of(after)
    if InjectionRecord.of(before) is not None and InjectionRecord.of(after) is None:
        done.events.append(("Normal", "SidecarMigrated", f"Deployment {name}: its template is the user's again; "
                            "its pods get the gate at admission"))  # fmt: skip
    if was is None and now is not None:
        done.events.append(("Normal", "SidecarInjected", f"Deployment {name}: its pods roll onto the gate"))
    elif was is not None and now is None:
        done.events.append(("Normal", "SidecarRemoved", f"Deployment {name}: its pods roll off the gate"))
    elif was != now:
        done.events.append(("Normal", "SidecarUpdated", f"Deployment {name}: its pods roll to new sidecar settings"))


def _template(deployment: Mapping[str, Any]) -> Template:
    return (deployment.get("spec") or {}).get("template") or {}
