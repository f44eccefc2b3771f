#!/usr/bin/env python3
"""Can the real cluster start here? The e2e suite asks this first, and fails (never skips)
with one line naming what is missing: `make e2e` builds and installs every part before it.

Exit 0: everything is there. Exit 1: something is missing; one line says what.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "kube"))
from cluster import Binaries, Kwok, built_images

COMMANDS = {
    "containerd": "apt-get install containerd",
    "ctr": "apt-get install containerd",
    "runc": "apt-get install runc",
    "iptables": "apt-get install iptables",
    "ip": "apt-get install iproute2",
    "openssl": "apt-get install openssl",
}
CNI_PLUGINS = Path("/usr/lib/cni")


def missing_parts() -> list[str]:
    """What is missing, each with what brings it (empty: ready)."""
    missing: list[str] = []
    if sys.platform != "linux" or os.geteuid() != 0:
        missing.append("root on Linux (the node makes network links, cgroups and mounts)")
    missing += [f"{c} ({how})" for c, how in COMMANDS.items() if shutil.which(c) is None]
    if not all((CNI_PLUGINS / p).exists() for p in ("bridge", "host-local", "portmap", "loopback")):
        missing.append(f"the CNI plugins in {CNI_PLUGINS} (apt-get install containernetworking-plugins)")
    try:
        Binaries.from_cache()
    except FileNotFoundError as error:
        missing.append(str(error))
    try:  # the fake nodes' kubelet: the 200-pod rollout (test_fleet_rollout.py) needs it
        Kwok.from_cache()
    except FileNotFoundError as error:
        missing.append(str(error))
    try:
        built_images()
    except FileNotFoundError as error:
        missing.append(str(error))
    return missing


def main() -> int:
    missing = missing_parts()
    if missing:
        print(f"the real cluster cannot start: {'; '.join(missing)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
