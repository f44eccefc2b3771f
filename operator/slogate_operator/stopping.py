"""How an injected pod stops without losing a stream: hooks, grace period, drain deadline.

Pure, like ``injection`` which applies it (docs/operator.md, "Stopping without losing a
stream"). When a pod is deleted, or the kubelet restarts its llama.cpp container, the
kubelet first runs each container's preStop hook, then sends SIGTERM, and kills what is
left when the pod's grace period is over (hooks included: the countdown starts before them).

- The llama.cpp container: ``GET /slogate/v1/drain`` on the sidecar's admin port. The
  sidecar stops admitting and answers once no admitted stream remains (or at its drain
  deadline), so llama-server gets its SIGTERM with nothing running.
- The sidecar's container: a short sleep (``SIDECAR_STOP_DELAY_SECONDS``), then its SIGTERM,
  which makes the drain final: it exits once drained.
- The grace period: Kubernetes' default (30 s), or the pod's own if longer; the sidecar's
  drain deadline is that less ``DRAIN_MARGIN_SECONDS``. One number, the grace period,
  decides both, so the drain always ends before the kubelet's kill.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slogate_admission import drain_token

DRAIN_PATH = "/slogate/v1/drain"
"""The sidecar's drain endpoint: the llama.cpp container's preStop hook (docs/sidecar.md, "Draining")."""
GRACE_SECONDS = 30
"""The pod's terminationGracePeriodSeconds when its own is unset or shorter: Kubernetes' default."""
DRAIN_MARGIN_SECONDS = 5
"""What the grace period keeps beyond the sidecar's drain deadline: for llama-server to exit
after its hook answered, and the sidecar after its drain."""
SIDECAR_STOP_DELAY_SECONDS = 5
"""The sidecar container's preStop sleep. The llama.cpp container's hook has started the
drain at the same moment, so the sidecar already refuses (429) and is not ready; it keeps
its ports open while endpoints controllers and proxies take the pod out, so that a late
request is refused with an answer rather than a reset. At most the margin: the sidecar's
SIGTERM comes after it, and the drain it makes final still ends within the grace period."""


def seconds(value: object) -> int | None:
    """A whole number of seconds as the API holds one; None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def grace_period(own: object) -> int:
    """The pod's terminationGracePeriodSeconds with the sidecar: its own if at least Kubernetes' default."""
    mine = seconds(own)
    return mine if mine is not None and mine >= GRACE_SECONDS else GRACE_SECONDS


def drain_deadline(grace: int) -> int:
    """The sidecar's --drain-deadline in a pod of this grace period (25 s with Kubernetes' default)."""
    return grace - DRAIN_MARGIN_SECONDS


def drain_hook(admin_port: int, token: str | None = None) -> dict[str, Any]:
    """The llama.cpp container's preStop. The admin port by number: the kubelet resolves a
    hook's port name among the hooked container's own ports, and this one is the sidecar's.
    ``token``: the drain token of the pod's admin token, in the header the sidecar checks."""
    action: dict[str, Any] = {"path": DRAIN_PATH, "port": admin_port}
    if token:
        action["httpHeaders"] = [{"name": drain_token.HEADER, "value": token}]
    return {"httpGet": action}


def sidecar_lifecycle() -> dict[str, Any]:
    """The sidecar container's preStop. exec, not the sleep action, which needs Kubernetes 1.30
    (1.29 behind a feature gate); an image without ``sleep`` fails the hook, and the sidecar
    then gets its SIGTERM at once: the drain still holds, without the delay."""
    return {"preStop": {"exec": {"command": ["sleep", str(SIDECAR_STOP_DELAY_SECONDS)]}}}


def hook_the_drain(
    containers: Sequence[dict[str, Any]], llama: str | None, admin_port: int, token: str | None = None
) -> bool:
    """Give the llama.cpp container the drain hook (ours again, if an older one of ours is there),
    unless it has a preStop of its own (kept as it is: a pod cannot have two). True if given."""
    target = next((c for c in containers if llama is not None and c.get("name") == llama), None)
    if target is None:
        return False
    existing = (target.get("lifecycle") or {}).get("preStop")
    if existing is not None and (existing.get("httpGet") or {}).get("path") != DRAIN_PATH:
        return False
    target["lifecycle"] = {**(target.get("lifecycle") or {}), "preStop": drain_hook(admin_port, token)}
    return True


def unhook_the_drain(containers: Sequence[dict[str, Any]], llama: str | None) -> None:
    """Take the drain hook off the llama.cpp container; a preStop the user put there since stays."""
    target = next((c for c in containers if c.get("name") == llama), None)
    lifecycle = (target or {}).get("lifecycle")
    if target is None or not isinstance(lifecycle, dict):
        return
    if ((lifecycle.get("preStop") or {}).get("httpGet") or {}).get("path") != DRAIN_PATH:
        return
    del lifecycle["preStop"]
    if not lifecycle:
        del target["lifecycle"]


def give_grace_back(spec: dict[str, Any], grace_set: int | None, grace_was: int | None) -> None:
    """Restore the pod's own grace period, if the one there is still the one the injection set
    (a value changed since is the user's: it stays)."""
    if grace_set is None or spec.get("terminationGracePeriodSeconds") != grace_set:
        return
    if grace_was is None:
        spec.pop("terminationGracePeriodSeconds", None)
    else:
        spec["terminationGracePeriodSeconds"] = grace_was
