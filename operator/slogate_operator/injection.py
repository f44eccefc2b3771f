"""Pure builders of the sidecar injection: the pod template with the sidecar (``sidecar.py``)
and without it, the claim on a Deployment, and the JSON patch between two states.

Three promises, each a defect a real cluster showed (docs/operator.md, "Injection"):

- The Service keeps reaching llama-server in every state. The sidecar takes over the
  *name* of the llama.cpp container's port (``http``, say) and that port keeps its number
  but loses the name; removal gives it back. A Service that targets the port by name
  reaches the gate while it is injected, and llama-server directly before the first
  calibration and after removal.
- Removal takes out exactly what the injection put in. The injection records, in an
  annotation of the pod template, the container and volumes it added and the port and
  probes it renamed; a user's own container or volume that shares a name is never touched.
- Idempotent against a real API server. The server adds defaults the operator never
  writes (terminationMessagePath, probe timeouts, a volume's defaultMode...); a template
  is compared on what the operator owns only, and a value it wrote counts as unchanged
  when the stored one holds it with defaults around it.
- Rolling restarts lose nothing (``stopping.py``): the llama.cpp container gets the drain
  hook unless it has a preStop of its own, the pod a grace period of at least Kubernetes'
  default, recorded like the port so that removal gives back the pod's own.

Patches replace ``/spec/template`` after a ``test`` of the resourceVersion, so a concurrent
change makes them fail (409/422) instead of losing someone's edit; the caller re-reads.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from slogate_operator import names, stopping
from slogate_operator.builders import PROBES, policy_label_value

# SidecarConfig is imported from here too (the chart's tests, e2e): it is what injection takes.
from slogate_operator.sidecar import OUR_VOLUMES, SidecarConfig, sidecar_container, sidecar_volumes

QUANTITY_SUFFIXES = tuple(
    (suffix, Decimal(base) ** power)
    for suffix, base, power in (
        ("Ki", 1024, 1),
        ("Mi", 1024, 2),
        ("Gi", 1024, 3),
        ("Ti", 1024, 4),
        ("m", "0.001", 1),
        ("k", 1000, 1),
        ("M", 1000, 2),
        ("G", 1000, 3),
        ("T", 1000, 4),
    )
)
"""Kubernetes quantity suffixes, two-letter ones first (``Mi`` before ``M``)."""


class TargetClaimedError(ValueError):
    """The Deployment is gated by another policy, or holds something the injection would clash with."""


@dataclass(frozen=True, slots=True)
class InjectionRecord:
    """What one injection added and changed, kept on the pod template (ANNOTATION_INJECTION)."""

    policy: str
    container: str = names.SIDECAR_CONTAINER
    volumes: tuple[str, ...] = OUR_VOLUMES
    llama: str | None = None
    """The llama.cpp container whose port lost its name to the sidecar."""
    port: int | None = None
    port_name: str | None = None
    probes: tuple[str, ...] = field(default=())
    """The llama.cpp container's probes whose named port was rewritten to the number."""
    prestop: bool = False
    """The llama.cpp container got the drain hook (it had no preStop of its own)."""
    grace_set: int | None = None
    """terminationGracePeriodSeconds the injection set; None: it kept the pod's own (as long or longer)."""
    grace_was: int | None = None
    """The pod's own terminationGracePeriodSeconds before that (None: unset), which removal restores."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def of(cls, template: Mapping[str, Any]) -> InjectionRecord | None:
        """The record of an injected template; None if the operator injected nothing.

        A template injected by an older operator has the policy label but no record: it
        gets the old fixed names (the only things that version ever added).
        """
        meta = template.get("metadata") or {}
        policy = (meta.get("labels") or {}).get(names.LABEL_POLICY)
        raw = (meta.get("annotations") or {}).get(names.ANNOTATION_INJECTION)
        if raw:
            try:
                data = json.loads(raw)
                return cls(
                    policy=str(data["policy"]),
                    container=str(data.get("container") or names.SIDECAR_CONTAINER),
                    volumes=tuple(str(v) for v in data.get("volumes") or ()),
                    llama=data.get("llama"),
                    port=data.get("port"),
                    port_name=data.get("port_name"),
                    probes=tuple(str(p) for p in data.get("probes") or ()),
                    prestop=bool(data.get("prestop")),
                    grace_set=stopping.seconds(data.get("grace_set")),
                    grace_was=stopping.seconds(data.get("grace_was")),
                )
            except (ValueError, KeyError, TypeError):
                pass  # a mangled record: fall back to the label, as for an old injection
        return cls(policy=str(policy)) if policy is not None else None


def claimed_by(template: Mapping[str, Any]) -> str | None:
    """The policy label of an injected pod template, if any."""
    labels = (template.get("metadata") or {}).get("labels") or {}
    value = labels.get(names.LABEL_POLICY)
    return str(value) if value is not None else None


def deployment_claim(deployment: Mapping[str, Any]) -> str | None:
    """The policy that gates a Deployment: its claim annotation, else an injected template's label."""
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    claim = annotations.get(names.ANNOTATION_CLAIM)
    if claim:
        return str(claim)
    return claimed_by((deployment.get("spec") or {}).get("template") or {})


def injected_template(template: Mapping[str, Any], config: SidecarConfig) -> dict[str, Any]:
    """The pod template with our sidecar, volumes, label and record (replacing an older injection)."""
    mine = policy_label_value(config.policy)
    owner = claimed_by(template)
    if owner is not None and owner != mine:
        raise TargetClaimedError(f"its pod template is already gated by policy {owner!r}")
    desired = removed_template(template)
    spec = desired["spec"]
    containers = spec["containers"]
    if any(c.get("name") == names.SIDECAR_CONTAINER for c in containers):
        raise TargetClaimedError(
            f"its pod template has a container of its own named {names.SIDECAR_CONTAINER!r}: "
            "rename it, or run your own sidecar with spec.sidecar.inject: false"
        )
    clash = sorted({v.get("name") for v in spec.get("volumes") or ()} & set(OUR_VOLUMES))
    if clash:
        raise TargetClaimedError(f"its pod template has volumes of its own named {clash}: rename them")
    llama, port_name, probes = _hand_over_port(containers, config)
    prestop = stopping.hook_the_drain(containers, llama, config.admin_port, config.drain_token)
    own_grace = stopping.seconds(spec.get("terminationGracePeriodSeconds"))
    grace = stopping.grace_period(own_grace)
    raised = grace != own_grace
    if raised:
        spec["terminationGracePeriodSeconds"] = grace
    containers.append(sidecar_container(config, port_name or names.CLIENT_PORT_NAME, grace))
    spec["volumes"] = [*spec.get("volumes", []), *sidecar_volumes(config)]
    record = InjectionRecord(
        policy=mine, llama=llama, port=config.upstream_port if port_name else None, port_name=port_name,
        probes=probes, prestop=prestop, grace_set=grace if raised else None, grace_was=own_grace if raised else None,
    )  # fmt: skip
    meta = desired.setdefault("metadata", {})
    meta.setdefault("labels", {})[names.LABEL_POLICY] = mine
    meta.setdefault("annotations", {})[names.ANNOTATION_INJECTION] = record.to_json()
    return desired


def _hand_over_port(
    containers: list[dict[str, Any]], config: SidecarConfig
) -> tuple[str | None, str | None, tuple[str, ...]]:
    """Take the name off the llama.cpp container's port (the Service targets it) for the sidecar.

    Its probes that named that port now name the number, which stays valid.
    """
    llama = next(
        (c for c in containers if config.llama_container is None or c.get("name") == config.llama_container), None
    )
    if llama is None:
        return None, None, ()
    entry = next((p for p in llama.get("ports") or () if p.get("containerPort") == config.upstream_port), None)
    if entry is None or not entry.get("name"):
        return str(llama.get("name")), None, ()
    port_name = str(entry.pop("name"))
    rewritten = []
    for probe in PROBES:
        action = _probe_action(llama.get(probe))
        if action is not None and action.get("port") == port_name:
            action["port"] = config.upstream_port
            rewritten.append(probe)
    return str(llama.get("name")), port_name, tuple(rewritten)


def _probe_action(probe: object) -> dict[str, Any] | None:
    if not isinstance(probe, dict):
        return None
    for kind in ("httpGet", "tcpSocket", "grpc"):
        action = probe.get(kind)
        if isinstance(action, dict):
            return action
    return None


def removed_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template without what an injection recorded; unchanged if none was made."""
    desired = copy.deepcopy(dict(template))
    record = InjectionRecord.of(desired)
    if record is None:
        return desired
    spec = desired.setdefault("spec", {})
    spec["containers"] = [c for c in spec.get("containers", []) if c.get("name") != record.container]
    volumes = [v for v in spec.get("volumes", []) if v.get("name") not in record.volumes]
    if volumes:
        spec["volumes"] = volumes
    else:
        spec.pop("volumes", None)
    _give_port_back(spec["containers"], record)
    if record.prestop:
        stopping.unhook_the_drain(spec["containers"], record.llama)
    stopping.give_grace_back(spec, record.grace_set, record.grace_was)
    meta = desired.get("metadata") or {}
    for key, owned in (("labels", names.LABEL_POLICY), ("annotations", names.ANNOTATION_INJECTION)):
        found = meta.get(key)
        if found is not None:
            found.pop(owned, None)
            if not found and key == "annotations":
                meta.pop(key)
    return desired


def _give_port_back(containers: Sequence[dict[str, Any]], record: InjectionRecord) -> None:
    if record.port_name is None:
        return
    llama = next((c for c in containers if c.get("name") == record.llama), None)
    if llama is None:
        return
    entry = next((p for p in llama.get("ports") or () if p.get("containerPort") == record.port), None)
    if entry is not None and not entry.get("name"):
        entry["name"] = record.port_name
    for probe in record.probes:
        action = _probe_action(llama.get(probe))
        if action is not None and action.get("port") == record.port:
            action["port"] = record.port_name


# ------------------------------------------------------------------------------ comparing and patching


def owned_state(template: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator owns in a pod template: compared, never the rest (server defaults)."""
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    containers = spec.get("containers") or ()
    volumes = spec.get("volumes") or ()
    return {
        "label": (meta.get("labels") or {}).get(names.LABEL_POLICY),
        "record": (meta.get("annotations") or {}).get(names.ANNOTATION_INJECTION),
        "gate": (meta.get("annotations") or {}).get(names.ANNOTATION_GATE),
        "containers": [c.get("name") for c in containers],
        "volumes": [v.get("name") for v in volumes],
        "ports": [[(p.get("containerPort"), p.get("name")) for p in c.get("ports") or ()] for c in containers],
        "probes": [[(probe, (_probe_action(c.get(probe)) or {}).get("port")) for probe in PROBES] for c in containers],
        "prestops": [(c.get("lifecycle") or {}).get("preStop") for c in containers],
        "grace": spec.get("terminationGracePeriodSeconds"),
        "sidecar": next((c for c in containers if c.get("name") == names.SIDECAR_CONTAINER), None),
        "our_volumes": {v.get("name"): v for v in volumes if v.get("name") in OUR_VOLUMES},
    }


def covers(stored: object, wanted: object) -> bool:
    """Whether ``stored`` holds everything of ``wanted`` (extra keys are server defaults).

    Resource quantities compare by value: the API server writes "0.5" back as "500m".
    """
    if isinstance(wanted, Mapping):
        return isinstance(stored, Mapping) and all(k in stored and covers(stored[k], v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(stored, list | tuple)
            and len(stored) == len(wanted)
            and all(covers(s, w) for s, w in zip(stored, wanted, strict=True))
        )
    if isinstance(wanted, str) and isinstance(stored, str) and wanted != stored:
        return _quantity(wanted) is not None and _quantity(wanted) == _quantity(stored)
    return stored == wanted


def _quantity(text: str) -> Decimal | None:
    for suffix, factor in QUANTITY_SUFFIXES:
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], factor
            break
    else:
        number, scale = text, Decimal(1)
    try:
        return Decimal(number) * scale
    except InvalidOperation:
        return None


def same_owned(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether two templates agree on everything the operator owns."""
    have, want = owned_state(stored), owned_state(desired)
    exact = ("label", "record", "gate", "containers", "volumes", "ports", "probes")
    return (
        all(have[k] == want[k] for k in exact)
        and covers(have["sidecar"], want["sidecar"])
        and covers(have["our_volumes"], want["our_volumes"])
        and covers(have["prestops"], want["prestops"])  # the server adds the drain hook's scheme: HTTP
        and (want["grace"] is None or have["grace"] == want["grace"])  # unset: the server's default (30) is fine
    )


def deployment_patch(
    deployment: Mapping[str, Any], desired_template: Mapping[str, Any], claim: str | None
) -> list[dict[str, Any]]:
    """JSON-patch ops giving the Deployment ``desired_template`` and the claim (None: no claim); [] when so."""
    ops: list[dict[str, Any]] = []
    current = (deployment.get("spec") or {}).get("template") or {}
    if not same_owned(current, desired_template):
        ops.append({"op": "replace", "path": "/spec/template", "value": copy.deepcopy(dict(desired_template))})
    annotations = dict((deployment.get("metadata") or {}).get("annotations") or {})
    if annotations.get(names.ANNOTATION_CLAIM) != claim:
        if claim is None:
            annotations.pop(names.ANNOTATION_CLAIM, None)
        else:
            annotations[names.ANNOTATION_CLAIM] = claim
        ops.append({"op": "add", "path": "/metadata/annotations", "value": annotations})
    if not ops:
        return []
    version = (deployment.get("metadata") or {}).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]


def template_patch(deployment: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``deployment_patch`` keeping the Deployment's claim as it is."""
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    return deployment_patch(deployment, desired, annotations.get(names.ANNOTATION_CLAIM))
