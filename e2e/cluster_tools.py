"""Small, dependency-free helpers of the end-to-end suite: commands, waits, port-forwards, HTTP,
metrics. Every failure says what ran, what came back, and where to look next."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")
TAIL_LINES = 25


class CommandError(AssertionError):
    """A command failed; the message carries its output tail and a hint."""


class WaitTimeoutError(AssertionError):
    """A condition did not come true within its (generous) bound."""


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(
    args: Sequence[str],
    *,
    hint: str,
    timeout_s: float = 600,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise CommandError naming it, its output and `hint`."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s,
                              input=input_text, env=dict(env) if env is not None else None, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise CommandError(f"`{' '.join(args)}` did not finish within {timeout_s:g} s.\nLook at: {hint}") from None
    except FileNotFoundError:
        raise CommandError(f"`{args[0]}` is not installed.\nLook at: {hint}") from None
    if check and done.returncode != 0:
        raise CommandError(
            f"`{' '.join(args)}` failed with exit code {done.returncode}.\n"
            f"stderr:\n{tail(done.stderr)}\nstdout:\n{tail(done.stdout)}\nLook at: {hint}"
        )
    return done


@dataclass(frozen=True)
class Kube:
    """kubectl bound to one kubeconfig (the suite never touches the user's own)."""

    kubeconfig: Path

    def __call__(self, *args: str, hint: str, timeout_s: float = 300, input_text: str | None = None) -> str:
        return run(["kubectl", f"--kubeconfig={self.kubeconfig}", *args], hint=hint, timeout_s=timeout_s,
                   input_text=input_text).stdout  # fmt: skip

    def json(self, *args: str, hint: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self(*args, "-o", "json", hint=hint))
        return loaded

    def apply(self, namespace: str, documents: Sequence[Mapping[str, Any]], *, hint: str) -> str:
        """`kubectl apply` of these objects (as one JSON List) in `namespace`."""
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(documents)})
        return self("-n", namespace, "apply", "-f", "-", hint=hint, input_text=body)

    def maybe_json(self, *args: str) -> dict[str, Any] | None:
        """The object, or None when kubectl cannot get it (not there yet)."""
        done = run(["kubectl", f"--kubeconfig={self.kubeconfig}", *args, "-o", "json"], hint="", check=False)
        if done.returncode != 0:
            return None
        loaded: dict[str, Any] = json.loads(done.stdout)
        return loaded


def wait_until(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    hint: str,
    interval_s: float = 3.0,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll `probe` until it returns something truthy; a bounded wait, never a measurement.

    `probe` may raise CommandError while things settle (an object not there yet): the
    last error is reported if the wait runs out.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            found = probe()
        except CommandError as error:
            found, last = None, error
        else:
            last = found
        if found:
            return found
        if time.monotonic() > deadline:
            state = describe() if describe else repr(last)
            raise WaitTimeoutError(
                f"{what}: not within {timeout_s:g} s.\nLast seen: {tail(str(state))}\nLook at: {hint}"
            )
        time.sleep(interval_s)


_FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")


def parse_forwarding(line: str) -> int | None:
    """The local port of a `kubectl port-forward` announcement line, else None."""
    match = _FORWARDING.search(line)
    return int(match.group(1)) if match else None


@contextmanager
def port_forward(kube: Kube, namespace: str, target: str, remote_port: int, *, hint: str) -> Iterator[str]:
    """`kubectl port-forward` to a free local port; yields http://127.0.0.1:<port>."""
    process = subprocess.Popen(
        ["kubectl", f"--kubeconfig={kube.kubeconfig}", "-n", namespace, "port-forward", "--address", "127.0.0.1",
         target, f":{remote_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    found: list[int] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            port = parse_forwarding(line)
            if port is not None and not found:
                found.append(port)
                ready.set()
        ready.set()  # stdout closed: the forward died

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(60) or not found:
            process.kill()
            _, err = process.communicate(timeout=10)
            raise CommandError(f"kubectl port-forward {namespace}/{target} :{remote_port} failed: {tail(err)}\n"
                               f"Look at: {hint}")  # fmt: skip
        yield f"http://127.0.0.1:{found[0]}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = field(repr=False)

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    method: str, url: str, body: object | None = None, *, headers: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> Reply:  # fmt: skip
    """One HTTP exchange; HTTP errors are replies, not exceptions."""
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Reply(response.status, dict(response.headers.items()), response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, dict(error.headers.items()), error.read())
    except (OSError, HTTPException) as error:  # URLError is an OSError
        # No HTTP answer at all (refused, reset, a port-forward dropping the connection):
        # status 0, so the caller reports it with the others instead of dying mid-burst.
        return Reply(0, {}, f"{type(error).__name__}: {error}".encode())


def header(reply: Reply, name: str) -> str | None:
    """A reply's header, whatever the case the server wrote it in."""
    wanted = name.lower()
    return next((v for k, v in reply.headers.items() if k.lower() == wanted), None)


IN_CLUSTER_HTTP = """\
import base64, json, sys, urllib.error, urllib.request
method, url, body, headers = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
request = urllib.request.Request(url, data=body.encode() if body else None, method=method, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=float(sys.argv[5])) as response:
        status, got, data = response.status, dict(response.headers.items()), response.read()
except urllib.error.HTTPError as error:
    status, got, data = error.code, dict(error.headers.items()), error.read()
except Exception as error:
    status, got, data = 0, {}, f"{type(error).__name__}: {error}".encode()
print(json.dumps({"status": status, "headers": got, "body": base64.b64encode(data).decode()}))
"""
"""One HTTP exchange from inside a pod (python -c), answered as one JSON line on stdout."""


IN_CLUSTER_LOAD = """\
import json, os, sys, time, urllib.error, urllib.request
url, body, stop, limit = sys.argv[1], sys.argv[2].encode(), sys.argv[3], float(sys.argv[4])
tally, errors = {}, []
deadline = time.monotonic() + limit
while time.monotonic() < deadline and not os.path.exists(stop):
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except Exception as error:
        status = 0
        errors.append(f"{type(error).__name__}: {error}")
    tally[str(status)] = tally.get(str(status), 0) + 1
print(json.dumps({"tally": tally, "errors": errors[:10]}))
"""
"""Requests one after another from inside a pod until a stop file appears (or a time limit),
then one JSON line: the count of each status (0: no HTTP answer) and the first errors."""


def in_cluster_load(url: str, body: object, *, stop_file: str, limit_s: float, python: str = "python") -> list[str]:
    """The command that runs IN_CLUSTER_LOAD in a pod (stop it by creating `stop_file` there)."""
    return [python, "-c", IN_CLUSTER_LOAD, url, json.dumps(body), stop_file, str(limit_s)]


def in_cluster_command(
    method: str, url: str, body: object | None = None, *, headers: Mapping[str, str] | None = None,
    timeout_s: float = 120, python: str = "python",
) -> list[str]:  # fmt: skip
    """The command that makes `http`'s exchange from inside a pod (the slogate image has Python)."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    data = json.dumps(body) if body is not None else ""
    return [python, "-c", IN_CLUSTER_HTTP, method, url, data, json.dumps(sent), str(timeout_s)]


def parse_in_cluster_reply(stdout: str) -> Reply:
    """The Reply that IN_CLUSTER_HTTP printed (its last line)."""
    lines = stdout.strip().splitlines()
    if not lines:
        raise CommandError("the in-cluster request printed nothing")
    loaded = json.loads(lines[-1])
    return Reply(int(loaded["status"]), dict(loaded["headers"]), base64.b64decode(loaded["body"]))


def burst(
    url: str, bodies: Sequence[object], *, headers: Mapping[str, str] | None = None, timeout_s: float = 300
) -> list[Reply]:
    """Send every body at once (one thread each) and collect the replies in order."""
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(lambda b: http("POST", url, b, headers=headers, timeout_s=timeout_s), bodies))


def retry_after_seconds(reply: Reply) -> int:
    """A 429's Retry-After: whole seconds, at least 1 (docs/sidecar.md)."""
    value = reply.headers.get("Retry-After") or reply.headers.get("retry-after")
    assert value is not None, f"429 without Retry-After: headers {reply.headers}"
    assert value.isdigit(), f"Retry-After {value!r} is not whole seconds >= 1"
    assert int(value) >= 1, f"Retry-After {value!r} is not whole seconds >= 1"
    return int(value)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The status condition of that type, or None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def is_true(obj: Mapping[str, Any] | None, kind: str) -> bool:
    found = condition(obj, kind) if obj else None
    return found is not None and found.get("status") == "True"


def conditions_line(obj: Mapping[str, Any] | None) -> str:
    """`Ready=False (PushPending: 1/2 acknowledged)`-style summary for failure messages."""
    if not obj:
        return "(object not found)"
    parts = [f"{c.get('type')}={c.get('status')} ({c.get('reason')}: {c.get('message', '')[:120]})"
             for c in (obj.get("status") or {}).get("conditions") or []]  # fmt: skip
    return "; ".join(parts) or "(no conditions yet)"
