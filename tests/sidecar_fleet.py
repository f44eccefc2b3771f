"""Real sidecars (the in-process app of slogate_sidecar) standing in for the pods' own, next
to an emulated cluster."""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.request
from pathlib import Path
from typing import Any

from api_cluster import NS, SECRETS, Cluster
from polling import eventually
from ports import free_ports
from slogate_sidecar.app import build_sidecar, running
from slogate_sidecar.settings import SidecarSettings


class SidecarFleet:
    """One sidecar per loopback address, all on the same admin port, as pods share a
    containerPort; served on the cluster's loop.

    ``mount_token`` and ``start``'s ``thresholds_json`` do what the kubelet does with the
    Secret and ConfigMap volumes: put their content where the sidecar reads it.
    """

    def __init__(self, cluster: Cluster, upstream: str, workdir: Path) -> None:
        self.cluster = cluster
        self.upstream = upstream
        self.workdir = workdir
        (self.admin_port,) = free_ports()
        self.token_file = workdir / "token"
        self.token_file.write_text("")  # an empty token refuses every push until the Secret is mounted
        self.urls: dict[str, str] = {}
        self._stacks: list[contextlib.AsyncExitStack] = []

    def start(self, ip: str, thresholds_json: str | None = None) -> None:
        thresholds = self.workdir / f"thresholds-{ip}.json"
        if thresholds_json is not None:
            thresholds.write_text(thresholds_json)
        settings = SidecarSettings(
            upstream=self.upstream, host=ip, port=0, admin_port=self.admin_port, thresholds_file=thresholds,
            admin_token_file=self.token_file, poll_interval_s=0.5,
        )  # fmt: skip

        async def serve() -> contextlib.AsyncExitStack:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(running(build_sidecar(settings)))
            return stack

        self._stacks.append(self.cluster.loop.run(serve()))
        self.urls[ip] = f"http://{ip}:{self.admin_port}"

    def mount_token(self, secret_name: str = "slogate-admin-token", ns: str = NS) -> None:
        secret = eventually(lambda: self.cluster.get(SECRETS, secret_name, ns), what="the admin token Secret")
        self.token_file.write_text(base64.b64decode(secret["data"]["token"]).decode())

    def state(self, ip: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.urls[ip] + "/slogate/v1/state", timeout=10) as response:
            found: dict[str, Any] = json.loads(response.read())
            return found

    def close(self) -> None:
        for stack in reversed(self._stacks):
            with contextlib.suppress(Exception):
                self.cluster.loop.run(stack.aclose(), timeout=10)
