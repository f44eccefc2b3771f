"""Certificates for one run of the cluster, made with the openssl command: a CA, the API
server's serving certificate, the clients (admin, the node, the API server towards the
kubelet), the kubelet's serving certificate, and the ServiceAccount signing key.
All new each run, so no credential outlives the cluster it was made for."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"


def openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def create(self, *, server_ips: list[str], server_names: list[str], node: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", "/CN=slogate-test-ca",
                "-keyout", str(self.key("ca")), "-out", str(self.ca),
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
        sans = ",".join([*(f"IP:{ip}" for ip in server_ips), *(f"DNS:{n}" for n in server_names)])
        self._issue("apiserver", "/CN=kube-apiserver", server=True, sans=sans)
        self._issue("kubelet-serving", f"/CN={node}", server=True, sans=f"IP:{server_ips[0]},DNS:{node}")
        self._issue("admin", "/O=system:masters/CN=slogate-test-admin")
        self._issue("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
        self._issue("node", f"/O=system:nodes/CN=system:node:{node}")
        self._issue("kube-proxy", "/CN=system:kube-proxy")
        openssl("genrsa", "-out", str(self.service_account_key), "2048")
        openssl("rsa", "-in", str(self.service_account_key), "-pubout", "-out", str(self.service_account_pub))

    def _issue(self, name: str, subject: str, *, server: bool = False, sans: str = "") -> None:
        csr = self.directory / f"{name}.csr"
        openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                "-keyout", str(self.key(name)), "-out", str(csr))  # fmt: skip
        extensions = self.directory / f"{name}.ext"
        usage = "serverAuth" if server else "clientAuth"
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
                 f"extendedKeyUsage={usage}"]  # fmt: skip
        if sans:
            lines.append(f"subjectAltName={sans}")
        extensions.write_text("\n".join(lines) + "\n")
        openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.key("ca")),
                "-CAcreateserial", "-days", DAYS, "-extfile", str(extensions),
                "-out", str(self.cert(name)))  # fmt: skip
        csr.unlink()
        extensions.unlink()


def kubeconfig(pki: Pki, *, server: str, user: str, cert: Path | None = None, key: Path | None = None,
               token: str | None = None) -> str:  # fmt: skip
    """A kubeconfig for one identity: a client certificate or a bearer token."""
    if token is not None:
        credentials = f"    token: {token}\n"
    else:
        credentials = f"    client-certificate: {cert}\n    client-key: {key}\n"
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: slogate-test\n  cluster:\n    server: {server}\n    certificate-authority: {pki.ca}\n"
        f"users:\n- name: {user}\n  user:\n{credentials}"
        f"contexts:\n- name: slogate-test\n  context:\n    cluster: slogate-test\n    user: {user}\n"
        "current-context: slogate-test\n"
    )
