"""etcd and kube-apiserver, the binaries build-binaries.sh made: the part of a cluster every
test of the Kubernetes API needs. Two users:

  cluster.py         the whole cluster (this, plus controllers, scheduler and a real node)
  tests/api_cluster  the operator's tests: this alone on 127.0.0.1, envtest's way (no
                     controllers: the tests play them, and a proxy injects faults on cue)

Certificates are made per run (pki.py). Every process runs in its own process group with
its log in the run's `logs/`, and is found again by the run's directory in its command line,
so `stop()` also cleans after a run that crashed.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pki import Pki, kubeconfig
from teardown import end_processes

HERE = Path(__file__).resolve().parent
AUDIT_LOG = "audit.log"
"""In the run's directory: every call a ServiceAccount makes (metadata only), as the API
server's audit log records it, so a test can count what the operator read and wrote."""
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""
STOP_ORDER = ("kube-apiserver", "etcd")


def versions() -> dict[str, str]:
    """versions.env's KEY=value lines (the file build-binaries.sh sources)."""
    lines = (line.strip() for line in (HERE / "versions.env").read_text().splitlines())
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("SLOGATE_KUBE_CACHE") or Path(base) / "slogate" / "kube")


@dataclass(frozen=True)
class Binaries:
    kubernetes: Path
    etcd: Path
    helm: Path
    coredns: Path

    @classmethod
    def from_cache(cls) -> Binaries:
        v, root = versions(), cache_dir()
        found = cls(*(root / f"{name}-{v[key]}" / "bin" for name, key in (
            ("kubernetes", "KUBE_VERSION"), ("etcd", "ETCD_VERSION"), ("helm", "HELM_VERSION"),
            ("coredns", "COREDNS_VERSION"))))  # fmt: skip
        missing = [str(d.parent) for d in (found.kubernetes, found.etcd, found.helm, found.coredns)
                   if not (d.parent / ".complete").exists()]  # fmt: skip
        if missing:
            raise FileNotFoundError(f"not built: {', '.join(missing)}; `make kube` builds them")
        return found

    def k8s(self, name: str) -> str:
        return str(self.kubernetes / name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], *, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.25)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:]) if log and log.exists() else ""
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s" + (f"; the end of {log}:\n{tail}" if tail else ""))


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@dataclass
class ControlPlane:
    """etcd on a free loopback port and kube-apiserver on `address:port` (RBAC, ServiceAccount
    admission, an audit log of ServiceAccounts' calls). `extra_args` are appended to the API
    server's command line; the caller makes the certificates (`pki.create`) first."""

    workdir: Path
    binaries: Binaries
    address: str
    port: int
    service_cidr: str
    extra_args: tuple[str, ...] = ()
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def pki(self) -> Pki:
        return Pki(self.workdir / "pki")

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def admin_context(self) -> ssl.SSLContext:
        """TLS to the API server as its administrator (system:masters)."""
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.cert("admin")), str(self.pki.key("admin")))
        return context

    def write_kubeconfig(self, name: str, user: str, cert: str) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        pki = self.pki
        path.write_text(kubeconfig(pki, server=self.server, user=user, cert=pki.cert(cert), key=pki.key(cert)))
        return path

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, env=env)  # fmt: skip

    def start(self) -> None:
        pki, b = self.pki, self.binaries
        self.write_kubeconfig("admin", "admin", "admin")
        etcd_port, etcd_peer = free_port(), free_port()
        self.spawn("etcd", [str(b.etcd / "etcd"), "--data-dir", str(self.workdir / "etcd"),
                            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                            "--initial-cluster", f"default=http://127.0.0.1:{etcd_peer}",
                            "--unsafe-no-fsync", "--log-level", "warn"])  # fmt: skip
        wait_for("etcd", lambda: http_ok(f"http://127.0.0.1:{etcd_port}/health"), timeout_s=60,
                 log=self.logs / "etcd.log")  # fmt: skip
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self.spawn("kube-apiserver", [
            b.k8s("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}", f"--secure-port={self.port}",
            f"--service-cluster-ip-range={self.service_cidr}",
            f"--tls-cert-file={pki.cert('apiserver')}", f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
            f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
            "--kubelet-preferred-address-types=InternalIP", "--profiling=false", "--v=1",
            f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.workdir / AUDIT_LOG}", "--audit-log-maxsize=200",
            *self.extra_args,
        ])  # fmt: skip
        wait_for("kube-apiserver", lambda: self.api_ok("/readyz"), timeout_s=120, log=self.logs / "kube-apiserver.log")

    def api_ok(self, path: str) -> bool:
        return http_ok(self.server + path, context=self.admin_context())

    def stop(self) -> None:
        """Idempotent: ends what runs from this run's directory (found by its command line)."""
        end_processes(str(self.workdir.resolve()), STOP_ORDER)
        self.processes.clear()
