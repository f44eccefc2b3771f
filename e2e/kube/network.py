"""The cluster's network on this machine: one bridge for pods, one dummy link for Services,
and rules that keep every packet of theirs on this machine.

Addresses come from 198.18.0.0/15 (RFC 2544, reserved for benchmarking networks, never routed
on the Internet):
  198.18.0.0/24   pods, on the bridge `slogate0`; the host (node, API server) is 198.18.0.1
  198.19.0.0/16   Services (ClusterIPs); routed onto the bridge too (this kernel has no dummy
                  links): what kube-proxy's DNAT did not send to a pod finds no neighbour there
  the rest of 198.18.0.0/15 is a blackhole route
Forwarding is on (a pod reaching a Service is routed through the host), so a rule drops
anything from the bridge that would leave by another link, and anything from another link to
the bridge: no pod reaches past this machine, whatever its default route says. It sits first
in the mangle table's FORWARD chain, which runs before the filter table's: kube-proxy inserts
its own ACCEPTs at the top of filter's FORWARD (for connections it marked for NAT), and would
otherwise come before it. Pods get a resolv.conf naming 127.0.0.1 (their own
loopback, where nothing answers): no DNS query leaves a pod either.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "slogate0"
HOST_IP = "198.18.0.1"
POD_CIDR = "198.18.0.0/24"
SERVICE_CIDR = "198.19.0.0/16"
API_SERVICE_IP = "198.19.0.1"
"""The `kubernetes` Service's ClusterIP: the first address of SERVICE_CIDR."""
RESERVED = "198.18.0.0/15"
ISOLATION_CHAIN = "SLOGATE-ISOLATION"
SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
}
"""Set while the cluster runs (kube-proxy's Service NAT needs both) and restored after."""


class NetworkError(RuntimeError):
    pass


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def link_exists(name: str) -> bool:
    return sh("ip", "link", "show", name, check=False).returncode == 0


@dataclass
class Network:
    """Brought up before the node's processes start, taken down after they stop."""

    state_dir: Path

    def check_free(self) -> None:
        """Raises when the bridge is there already: a run that held the machine (machine_lock.py)
        was killed, or kept its cluster, and left its network."""
        if link_exists(BRIDGE):
            raise NetworkError(
                f"link {BRIDGE} exists, and no live run holds the machine: a cluster was kept or left "
                f"behind (`python3 e2e/kube/cluster.py down DIR` removes it; DIR is its run directory)"
            )

    def up(self) -> None:
        self.check_free()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        saved = {key: Path("/proc/sys", key).read_text().strip() for key in SYSCTLS}
        (self.state_dir / "sysctl.saved").write_text("".join(f"{k}={v}\n" for k, v in saved.items()))
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        sh("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE)
        sh("ip", "route", "add", "blackhole", RESERVED)
        sh("iptables", "-w", "-t", "mangle", "-N", ISOLATION_CHAIN)
        sh("iptables", "-w", "-t", "mangle", "-A", ISOLATION_CHAIN, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
        sh("iptables", "-w", "-t", "mangle", "-A", ISOLATION_CHAIN, "-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP")
        sh("iptables", "-w", "-t", "mangle", "-I", "FORWARD", "1", "-j", ISOLATION_CHAIN)
        for key, value in SYSCTLS.items():
            Path("/proc/sys", key).write_text(value)

    def holes(self) -> list[str]:
        """What of the isolation is missing while the cluster runs (empty: every packet of the
        cluster stays on this machine): the first jump of mangle's FORWARD, the chain's two drops,
        the blackhole route."""
        missing = []
        forward = sh("iptables", "-w", "-t", "mangle", "-S", "FORWARD", check=False).stdout.splitlines()
        if f"-A FORWARD -j {ISOLATION_CHAIN}" not in forward[1:2]:
            missing.append(f"FORWARD does not jump to {ISOLATION_CHAIN} first: {forward[:3]}")
        chain = sh("iptables", "-w", "-t", "mangle", "-S", ISOLATION_CHAIN, check=False).stdout.splitlines()
        for rule in (f"-A {ISOLATION_CHAIN} -i {BRIDGE} ! -o {BRIDGE} -j DROP",
                     f"-A {ISOLATION_CHAIN} ! -i {BRIDGE} -o {BRIDGE} -j DROP"):  # fmt: skip
            if rule not in chain:
                missing.append(f"no rule `{rule}`")
        if f"blackhole {RESERVED}" not in sh("ip", "route", "show", check=False).stdout:
            missing.append(f"no blackhole route for {RESERVED}")
        return missing

    def leftovers(self) -> list[str]:
        """What of the network is still there (empty after `down()`)."""
        found = [f"link {BRIDGE}"] if link_exists(BRIDGE) else []
        routes = sh("ip", "route", "show", check=False).stdout.splitlines()
        found += [
            f"route {line}" for line in routes if line.startswith(("198.18.", "198.19.", f"blackhole {RESERVED}"))
        ]
        for command in ("iptables-save", "ip6tables-save"):
            rules = sh(command, check=False).stdout.splitlines()
            found += [f"{command}: {r}" for r in rules if "KUBE-" in r or ISOLATION_CHAIN in r][:5]
        return found

    def down(self) -> None:
        """Idempotent: removes whatever of the above exists."""
        saved = self.state_dir / "sysctl.saved"
        if saved.exists():
            for line in saved.read_text().splitlines():
                key, _, value = line.partition("=")
                Path("/proc/sys", key).write_text(value)
            saved.unlink()
        while sh("iptables", "-w", "-t", "mangle", "-D", "FORWARD", "-j", ISOLATION_CHAIN, check=False).returncode == 0:
            pass
        sh("iptables", "-w", "-t", "mangle", "-F", ISOLATION_CHAIN, check=False)
        sh("iptables", "-w", "-t", "mangle", "-X", ISOLATION_CHAIN, check=False)
        sh("ip", "route", "del", "blackhole", RESERVED, check=False)
        remove_kube_chains()
        # Pods' veth ends die with their network namespaces; any left (a killed runtime) go too.
        for line in sh("ip", "-o", "link", "show", "master", BRIDGE, check=False).stdout.splitlines():
            sh("ip", "link", "del", line.split(":")[1].strip().split("@")[0], check=False)
        if link_exists(BRIDGE):
            sh("ip", "link", "del", BRIDGE)  # its routes (the Services') go with it


def service_destinations(namespace: str, service: str) -> set[str]:
    """The pod addresses (ip:port) kube-proxy's iptables rules send the Service's traffic to now.

    EndpointSlices say what the control plane decided; these rules are what a packet meets.
    kube-proxy writes them a moment later (seconds on a busy machine), and a connection whose
    first SYN goes to a pod that is gone stays pinned there by conntrack until it times out."""
    found = set()
    for rule in sh("iptables-save", "-t", "nat", check=False).stdout.splitlines():
        if not rule.startswith("-A KUBE-SEP-") or "--to-destination" not in rule:
            continue
        parts = shlex.split(rule)
        comment = parts[parts.index("--comment") + 1] if "--comment" in parts else ""
        if comment == f"{namespace}/{service}" or comment.startswith(f"{namespace}/{service}:"):
            found.add(parts[parts.index("--to-destination") + 1])
    return found


def remove_kube_chains() -> None:
    """The KUBE-* chains the kubelet and kube-proxy leave (`kube-proxy --cleanup` takes only its
    own), in every table of iptables and ip6tables, with the rules that jump to them."""
    for command in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            listed = sh(command, "-w", "-t", table, "-S", check=False)
            if listed.returncode != 0:
                continue
            rules = listed.stdout.splitlines()
            for rule in rules:
                parts = shlex.split(rule)  # comments are quoted: "kubernetes service portals"
                if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "-j" in parts and \
                        parts[parts.index("-j") + 1].startswith("KUBE-"):  # fmt: skip
                    sh(command, "-w", "-t", table, "-D", *parts[1:], check=False)
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for chain in chains:
                sh(command, "-w", "-t", table, "-F", chain, check=False)
            for chain in chains:
                sh(command, "-w", "-t", table, "-X", chain, check=False)


def cni_config(ipam_dir: Path) -> str:
    """The node's CNI network: Debian's bridge, host-local and portmap plugins."""
    return f"""{{
  "cniVersion": "1.0.0",
  "name": "slogate",
  "plugins": [
    {{"type": "bridge", "bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {{"type": "host-local", "dataDir": "{ipam_dir}",
                "ranges": [[{{"subnet": "{POD_CIDR}", "gateway": "{HOST_IP}"}}]],
                "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"""
