"""What every reconcile pass shares: settings, the API client, the HTTP session for pushes,
the clock, and the wake-up events that let watched changes cut a pass's wait short."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from slogate_operator import builders, names
from slogate_operator.client import EVENTS, ApiError, KubeClient
from slogate_operator.push import PushSettings, PushTracker
from slogate_operator.settings import OperatorSettings
from slogate_operator.sidecar import SidecarConfig

log = logging.getLogger("slogate.operator")


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(eq=False)
class Runtime:
    """Shared by the handlers of one operator process (kept in kopf's memo)."""

    settings: OperatorSettings
    client: KubeClient
    http: aiohttp.ClientSession
    clock: Callable[[], datetime] = utc_now
    instance: str = field(default_factory=socket.gethostname)
    calibration_starts: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while counting the running calibration Jobs and starting one (max_calibrations)."""
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    interests: dict[tuple[str, str], Callable[[Mapping[str, Any]], bool]] = field(default_factory=dict)
    """Per policy: whether a Deployment concerns it (named, selected, or claimed by it)."""
    seen: dict[str, tuple[object, ...]] = field(default_factory=dict)
    """Per Deployment, pod or policy: what of it a pass reads, as last seen (status writes
    of what no pass reads wake nothing)."""
    trackers: dict[tuple[str, str], PushTracker] = field(default_factory=dict)
    gates: dict[tuple[str, str], SidecarConfig] = field(default_factory=dict)
    """Per gated target (namespace, Deployment): the sidecar its pods get at admission, as the
    policy's last pass computed it (the webhook reads the API for a target not in here)."""
    entries: dict[tuple[str, str], float] = field(default_factory=dict)
    """Per target: when (monotonic) this process wrote or removed its webhook entry; its pods
    roll once webhook_settle_seconds have passed since."""

    @property
    def push_settings(self) -> PushSettings:
        s = self.settings
        return PushSettings(
            attempts=s.push_attempts, backoff_s=s.push_backoff_seconds, timeout_s=s.push_timeout_seconds,
            retry_max_s=s.resync_seconds,
        )  # fmt: skip

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        """The event a policy's loop waits on between passes."""
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def poke(self, namespace: str, name: str | None = None) -> None:
        """Run the named policy's next pass now (or every policy of the namespace)."""
        for (ns, policy), event in self.wakeups.items():
            if ns == namespace and (name is None or policy == name):
                event.set()

    def push_tracker(self, namespace: str, name: str) -> PushTracker:
        """The policy's pushes, kept between passes."""
        return self.trackers.setdefault((namespace, name), PushTracker())

    def forget(self, namespace: str, name: str) -> None:
        """A policy's loop ended: drop what was kept for it."""
        self.wakeups.pop((namespace, name), None)
        self.interests.pop((namespace, name), None)
        tracker = self.trackers.pop((namespace, name), None)
        if tracker is not None:
            tracker.cancel()

    def deployment_changed(self, kind: str | None, deployment: Mapping[str, Any]) -> None:
        """Wake the policies a Deployment event concerns; ignore status-only writes.

        The Deployment controller writes status every few seconds during a rollout; only
        a new generation (spec), labels, annotations (the claim) or deletion can change
        what a policy does.
        """
        meta = deployment.get("metadata") or {}
        namespace, uid = str(meta.get("namespace") or ""), str(meta.get("uid") or meta.get("name"))
        if kind == "DELETED":
            self.seen.pop(uid, None)
        else:
            relevant = (
                meta.get("generation"),
                tuple(sorted((meta.get("labels") or {}).items())),
                tuple(sorted((meta.get("annotations") or {}).items())),
                meta.get("deletionTimestamp"),
            )
            if self.seen.get(uid) == relevant:
                return
            self.seen[uid] = relevant
        for (ns, policy), concerns in list(self.interests.items()):
            event = self.wakeups.get((ns, policy))
            if ns == namespace and event is not None and concerns(deployment):
                event.set()

    def policy_changed(self, kind: str | None, policy: Mapping[str, Any]) -> None:
        """Wake a policy when what a pass reads of it changed: its spec (generation), the
        recalibrate annotation, its deletion. Not its status: each pass's own status write
        woke the next pass (a rollout's ~60 status writes were ~60 more passes)."""
        meta = policy.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        key = f"policy/{meta.get('uid') or namespace + '/' + name}"
        if kind == "DELETED":
            self.seen.pop(key, None)
        else:
            relevant = (
                meta.get("generation"),
                (meta.get("annotations") or {}).get(names.ANNOTATION_RECALIBRATE),
                meta.get("deletionTimestamp"),
            )
            if self.seen.get(key) == relevant:
                return
            self.seen[key] = relevant
        self.poke(namespace, name)

    def pod_changed(self, kind: str | None, pod: Mapping[str, Any]) -> None:
        """Wake the policy a pod (injected, or a calibration Job's) belongs to, when what a pass
        reads of it changed: phase, address, deletion, each container's state and restarts,
        whether it is scheduled. Kubelets write pod status for much else (probe times, Ready
        flips): 200 such writes during a rollout were 124 passes, each listing every pod."""
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        uid = str(meta.get("uid") or meta.get("name"))
        if kind == "DELETED":
            self.seen.pop(uid, None)
        else:
            containers = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
            relevant = (
                status.get("phase"),
                status.get("podIP"),
                meta.get("deletionTimestamp"),
                tuple((c.get("name"), c.get("restartCount"), json.dumps(c.get("state"), sort_keys=True))
                      for c in containers),
                tuple((c.get("status"), c.get("reason"), c.get("message"))
                      for c in status.get("conditions") or () if c.get("type") == "PodScheduled"),
            )  # fmt: skip
            if self.seen.get(uid) == relevant:
                return
            self.seen[uid] = relevant
        label = (meta.get("labels") or {}).get(names.LABEL_POLICY)
        if label is not None:
            self.poke_label(str(meta.get("namespace") or ""), str(label))

    def poke_label(self, namespace: str, label: str) -> None:
        """Wake the policy whose label value (``slogate.dev/policy``) an object carries."""
        for ns, policy in list(self.wakeups):
            if ns == namespace and builders.policy_label_value(policy) == label:
                self.wakeups[(ns, policy)].set()

    async def post_event(self, policy: builders.PolicyRef, kind: str, reason: str, message: str) -> None:
        """Post an Event about a policy; a failure to post is logged, never fatal."""
        now = self.clock()
        body = builders.event(policy, kind=kind, reason=reason, message=message, now=now, instance=self.instance)
        try:
            await self.client.create(EVENTS, policy.namespace, body)
        except ApiError as error:
            log.warning("could not post event %s for %s/%s: %s", reason, policy.namespace, policy.name, error)
