"""The autoscaling step of a reconcile pass: the ScaledObjects or HPAs a policy owns, applied,
pruned, and read back (``status.autoscaling`` and the AutoscalingReady condition).

The operator owns one autoscaler per target Deployment (built by autoscaling.py): it
creates the missing ones, replaces the spec of those that drifted, deletes those of
Deployments it no longer targets, of the other engine, or all of them when autoscaling is
turned off (the ones the last status recorded: a policy that never enabled autoscaling
costs no API call here). The policy's deletion takes them with it (ownerReference).
It never writes a Deployment's ``spec.replicas``: the HPA controller does.

A refusal here (KEDA not installed: 404 on keda.sh; RBAC: 403; the API down) becomes the
AutoscalingReady condition and leaves the rest of the pass, the gate, untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slogate_operator import names, pod_startup
from slogate_operator.autoscaling import (
    COMPONENT,
    AutoscalerRequest,
    autoscaler,
    contains,
    hpa_name,
    kind_of,
    scale_up_window_s,
)
from slogate_operator.builders import PolicyRef, policy_label_value
from slogate_operator.client import (
    HPAS,
    SCALED_OBJECTS,
    AlreadyExistsError,
    ApiError,
    KubeClient,
    NotFoundError,
    Resource,
)
from slogate_operator.context import Runtime
from slogate_operator.selectors import Selector
from slogate_operator.spec import AdmissionPolicySpec, AutoscalingSpec
from slogate_operator.status import Condition, ConditionType
from slogate_operator.targets import TargetScan

C = ConditionType
RESOURCES = {"ScaledObject": SCALED_OBJECTS, "HorizontalPodAutoscaler": HPAS}
INSTALL = {
    "ScaledObject": (
        "KedaNotInstalled",
        "the keda.sh/v1alpha1 ScaledObject API is not served: install KEDA (https://keda.sh/docs/latest/deploy/), "
        "or set spec.autoscaling.engine: hpa and serve slogate_demand_pods with prometheus-adapter (docs/deploy.md)",
    ),
    "HorizontalPodAutoscaler": (
        "HpaApiMissing",
        "the autoscaling/v2 HorizontalPodAutoscaler API is not served (Kubernetes 1.23 or later serves it)",
    ),
}


@dataclass(slots=True)
class AutoscalingReport:
    """What the step found: the condition (None: autoscaling off, nothing left to clean), the
    status (None: none to show) and the events of what it changed."""

    condition: Condition | None = None
    status: dict[str, Any] | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)


class RefusalError(Exception):
    """An API refusal that stops the step; it becomes AutoscalingReady=False."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def step(
    rt: Runtime,
    policy: PolicyRef,
    spec: AdmissionPolicySpec,
    scan: TargetScan,
    previous: Mapping[str, Any],
    *,
    gated: bool,
    spec_changed: bool = False,
    pods: Sequence[Mapping[str, Any]] = (),
) -> AutoscalingReport:
    """The pass's autoscaling step over its usable targets (``previous``: the policy's last
    status; ``gated``: thresholds are in force; ``spec_changed``: the first pass over a new
    generation of the spec; ``pods``: the targets' pods, whose start-up sizes the scale-up window)."""
    in_force = (previous.get("autoscaling") or {}).get("podStartupSeconds")
    startup_s = pod_startup.settled(in_force, pod_startup.median_startup_s(pods))
    return await reconcile_autoscalers(
        rt.client,
        policy,
        spec.operator.autoscaling,
        [t.name for t in scan.targets],
        gated=gated,
        prometheus_url=rt.settings.prometheus_url,
        previous=previous.get("autoscaling"),
        spec_changed=spec_changed,
        startup_s=startup_s,
    )


async def reconcile_autoscalers(
    client: KubeClient,
    policy: PolicyRef,
    spec: AutoscalingSpec,
    deployments: Sequence[str],
    *,
    gated: bool,
    prometheus_url: str,
    previous: Mapping[str, Any] | None,
    spec_changed: bool = False,
    startup_s: float | None = None,
) -> AutoscalingReport:
    """Apply the policy's autoscalers for ``deployments`` (its usable targets; ``startup_s``:
    their pods' start-up); never raises an ApiError."""
    report = AutoscalingReport()
    recorded = _recorded(previous)
    try:
        if not spec.enabled:
            # Just disabled: what the policy controls, listed, besides what the status
            # recorded (a pass that made one and failed before its status write left no
            # record). Later passes trust the record: no list per pass while disabled.
            found = await _owned(client, policy) if spec_changed else []
            await _delete(client, policy, sorted(set(recorded) | set(found)), report)
            return report
        if not gated:
            # Before the first thresholds no sidecar decides, so none prices any work: the
            # query's 0 would take the Deployment down to minReplicas while it serves ungated.
            report.status = dict(previous) if previous else None
            report.condition = Condition(
                C.AUTOSCALING_READY,
                False,
                "WaitingForThresholds",
                "the autoscalers are made once the first calibration has derived thresholds "
                "(until then no sidecar decides, so none prices any work and the demand query reads 0)",
            )
            return report
        await _apply(client, policy, spec, deployments, prometheus_url=prometheus_url, recorded=recorded,
                     report=report, startup_s=startup_s)  # fmt: skip
    except RefusalError as refusal:
        report.condition = Condition(C.AUTOSCALING_READY, False, refusal.reason, str(refusal))
        report.status = dict(previous) if previous else None  # what is known to exist, for the next pass
    return report


async def _apply(
    client: KubeClient,
    policy: PolicyRef,
    spec: AutoscalingSpec,
    deployments: Sequence[str],
    *,
    prometheus_url: str,
    recorded: list[tuple[str, str]],
    report: AutoscalingReport,
    startup_s: float | None,
) -> None:
    kind = kind_of(spec.engine)
    resource = RESOURCES[kind]
    url = spec.prometheus.server_address or prometheus_url
    wanted = {r.name: r for r in (AutoscalerRequest(policy, d, spec, url, startup_s) for d in deployments)}
    query = _theirs(policy).query()
    listed = await _call(kind, "list", client.list(resource, policy.namespace, label_selector=query))
    mine = {str(o["metadata"]["name"]): o for o in listed if _controlled_by(o, policy)}
    # The listing is the truth for this engine's kind; of the other kind (the engine changed)
    # only what the last status recorded as ours is deleted, by name.
    stale = [(kind, name) for name in mine if name not in wanted] + [(k, n) for k, n in recorded if k != kind]
    await _delete(client, policy, stale, report)
    taken: list[str] = []
    blocked: list[str] = []
    objects: list[dict[str, Any]] = []
    for name, request in sorted(wanted.items()):
        body = autoscaler(request)
        current = mine.get(name)
        if current is None:
            try:
                current = await _call(kind, "create", client.create(resource, policy.namespace, body))
            except AlreadyExistsError:
                taken.append(f"{kind} {name} exists and is not this policy's (ownerReference): rename one of them")
                continue
            report.events.append(
                ("Normal", "AutoscalerCreated", f"{kind} {name} scales Deployment {request.deployment}")
            )
        else:
            current = await _update(client, resource, kind, current, body, report=report)
        hpa = current if kind == "HorizontalPodAutoscaler" else await _call(
            "HorizontalPodAutoscaler", "get", client.get(HPAS, policy.namespace, hpa_name(spec.engine, name))
        )  # fmt: skip
        hpa_status = (hpa or {}).get("status") or {}
        blocked += cannot_scale(hpa_name(spec.engine, name), hpa_status)
        objects.append(
            _without_none(
                {
                    "deployment": request.deployment,
                    "kind": kind,
                    "name": name,
                    "hpa": hpa_name(spec.engine, name) if hpa else None,
                    "desiredReplicas": hpa_status.get("desiredReplicas"),
                    "currentReplicas": hpa_status.get("currentReplicas"),
                }
            )
        )
    report.status = _summary(spec, objects, startup_s)
    report.condition = _judged(spec, kind, objects, taken, targeted=bool(deployments), blocked=blocked)


async def _update(
    client: KubeClient,
    resource: Resource,
    kind: str,
    current: Mapping[str, Any],
    body: Mapping[str, Any],
    *,
    report: AutoscalingReport,
) -> Mapping[str, Any]:
    """Replace the spec where it drifted (defaults added beside ours are no drift), and
    merge our labels, annotation and ownerReference back if someone removed them."""
    meta, name, namespace = body["metadata"], str(body["metadata"]["name"]), str(body["metadata"]["namespace"])
    if not contains(current.get("spec"), body["spec"]):
        ops = [{"op": "replace" if "spec" in current else "add", "path": "/spec", "value": body["spec"]}]
        current = await _call(kind, "patch", client.json_patch(resource, namespace, name, ops))
        report.events.append(("Normal", "AutoscalerUpdated", f"{kind} {name} follows spec.autoscaling"))
    wanted_meta = {k: meta[k] for k in ("labels", "annotations", "ownerReferences")}
    if not contains(current.get("metadata"), wanted_meta):
        current = await _call(kind, "patch", client.merge_patch(resource, namespace, name, {"metadata": wanted_meta}))
    return current


async def _delete(
    client: KubeClient, policy: PolicyRef, objects: Sequence[tuple[str, str]], report: AutoscalingReport
) -> None:
    """Delete each (kind, name); one already gone, or whose API is gone, counts as deleted."""
    for kind, name in objects:
        if kind not in RESOURCES:
            continue
        if await _call(kind, "delete", client.delete(RESOURCES[kind], policy.namespace, name)):
            report.events.append(("Normal", "AutoscalerDeleted", f"{kind} {name} deleted"))


async def _call(kind: str, verb: str, call: Any) -> Any:
    """Await one API call; a 404 of the API itself, a 403 or another failure becomes a RefusalError."""
    try:
        return await call
    except AlreadyExistsError:
        raise  # the caller's to judge: a name taken
    except NotFoundError as error:
        # A missing object is None from get and False from delete: a 404 here is the API's own.
        raise RefusalError(*INSTALL[kind]) from error
    except ApiError as error:
        if error.status == 403:
            resource = RESOURCES[kind]
            raise RefusalError(
                "Forbidden",
                f"{error}: grant the operator's service account get, list, create, patch and delete on "
                f"{resource.plural}.{resource.group} (the chart's RBAC does: upgrade the release)",
            ) from error
        raise RefusalError("ApiError", f"{verb} {kind}: {error}") from error


async def _owned(client: KubeClient, policy: PolicyRef) -> list[tuple[str, str]]:
    """(kind, name) of every autoscaler the policy controls, of each kind whose API is served."""
    query = _theirs(policy).query()
    found = []
    for kind, resource in RESOURCES.items():
        try:
            listed = await client.list(resource, policy.namespace, label_selector=query)
        except NotFoundError:
            continue  # that API is not installed (no KEDA): nothing of that kind can exist
        found += [(kind, str(o["metadata"]["name"])) for o in listed if _controlled_by(o, policy)]
    return found


def _theirs(policy: PolicyRef) -> Selector:
    """The autoscalers the policy made carry its label and the component's."""
    return Selector.of({names.LABEL_POLICY: policy_label_value(policy.name), names.LABEL_COMPONENT: COMPONENT})


def _controlled_by(obj: Mapping[str, Any], policy: PolicyRef) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(r.get("controller") and r.get("uid") == policy.uid for r in refs)


def _recorded(previous: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(kind, name) of the autoscalers the last status recorded."""
    return [(str(o.get("kind")), str(o.get("name"))) for o in (previous or {}).get("objects") or () if o.get("name")]


def _without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _summary(spec: AutoscalingSpec, objects: Sequence[Mapping[str, Any]], startup_s: float | None) -> dict[str, Any]:
    """status.autoscaling: replicas summed over the targets, once every HPA has reported them;
    the scale-up window in force, and the measured start-up it was derived from."""
    summed = {
        key: sum(int(o[key]) for o in objects) if objects and all(key in o for o in objects) else None
        for key in ("desiredReplicas", "currentReplicas")
    }
    return _without_none(
        {
            "engine": spec.engine,
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "podStartupSeconds": round(startup_s, 1) if startup_s is not None else None,
            "scaleUpStabilizationSeconds": scale_up_window_s(spec, startup_s),
            **summed,
            "objects": [dict(o) for o in objects],
        }
    )


HPA_CAN_SCALE = ("AbleToScale", "ScalingActive")
"""The HPA controller's own verdicts on an HPA: False is an HPA that does not scale (no metric,
the target's scale subresource unreadable, or AmbiguousSelector: a second HPA on the same pods,
which since Kubernetes 1.26 disables both)."""


def cannot_scale(name: str, hpa_status: Mapping[str, Any]) -> list[str]:
    """The HPA controller's reasons this HPA does not scale, one line each (none: it may)."""
    return [
        f"HPA {name}: {c.get('type')} {c.get('reason')}: {c.get('message', '')}".rstrip(": ")
        for c in hpa_status.get("conditions") or ()
        if c.get("type") in HPA_CAN_SCALE and c.get("status") == "False"
    ]


def _judged(
    spec: AutoscalingSpec,
    kind: str,
    objects: Sequence[Mapping[str, Any]],
    taken: Sequence[str],
    *,
    targeted: bool,
    blocked: Sequence[str] = (),
) -> Condition:
    if taken:
        return Condition(C.AUTOSCALING_READY, False, "NameTaken", "; ".join(taken))
    if not targeted:
        return Condition(C.AUTOSCALING_READY, False, "NoTarget", "no usable target Deployment to scale")
    if blocked:
        return Condition(C.AUTOSCALING_READY, False, "HpaCannotScale", "; ".join(blocked))
    waiting = [o for o in objects if "currentReplicas" not in o]
    if waiting:
        who = ", ".join(str(o["name"]) for o in waiting)
        why = (
            "KEDA has not made its HPA (keda-hpa-<name>) or it has not reported yet: is KEDA's operator running?"
            if spec.engine == "keda"
            else "the HPA controller has not reported yet"
        )
        return Condition(C.AUTOSCALING_READY, False, "HpaPending", f"{kind} {who}: {why}")
    replicas = "; ".join(f"{o['deployment']}: {o['currentReplicas']} -> {o['desiredReplicas']}" for o in objects)
    return Condition(
        C.AUTOSCALING_READY, True, "Scaling", f"{kind} per target, replicas current -> desired: {replicas}"
    )


def previous_conditions(previous: Mapping[str, Any]) -> tuple[Condition, ...]:
    """AutoscalingReady as the ``previous`` status had it (for a pass that failed before the step)."""
    for found in previous.get("conditions") or ():
        if found.get("type") == C.AUTOSCALING_READY.value:
            status, reason, message = found.get("status") == "True", str(found.get("reason")), str(found.get("message"))
            return (Condition(C.AUTOSCALING_READY, status, reason, message),)
    return ()


def kept(previous: Mapping[str, Any]) -> tuple[ConditionType, ...]:
    """AutoscalingReady, if the ``previous`` status shows autoscalers (an invalid spec keeps them)."""
    return (C.AUTOSCALING_READY,) if previous.get("autoscaling") else ()
