"""argparse with one-line errors, defaults in --help, and typed value parsers.

Operators script these commands: a bad flag must give one clear line on stderr and
exit code 2, never a usage dump or a traceback, and it must do so before anything is
started (a llama-server, a calibration run). So everything that can be checked from
the command line alone (numbers, URLs, ports, paths) is checked by the argparse type;
what only running can find, a command raises (``CommandError`` or the packages' own
errors) and ``main`` reports in the same one-line form.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import shlex
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeAlias
from urllib.parse import urlsplit

from pydantic import ValidationError

from slogate_admission.validation import first_problem

EXIT_USAGE = 2


class CommandError(Exception):
    """A mistake or failure a command reports: ``main`` prints ``slogate X: error: <message>``
    as one line on stderr and exits with ``exit_code`` (2 unless the command documents another)."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` for every flag that has a real default.

    argparse's own formatter would also print ``(default: None)`` and ``(default: False)``,
    which say nothing; help that already names its default is left alone."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, "", argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``slogate what-if: error: ...``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # argparse takes "-1x" or "-inf" for a flag ("expected one argument"); anything
        # starting like a number is a value, so the flag's type can say what is wrong.
        self._negative_number_matcher = re.compile(r"^-(\.?\d|(inf|infinity|nan)$)", re.IGNORECASE)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_USAGE)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """An unknown choice names the close ones: typos are the usual cause."""
        if action.choices is None or value in action.choices:
            return
        names = [str(choice) for choice in action.choices]
        close = difflib.get_close_matches(str(value), names, n=1)
        guess = f" (did you mean {close[0]}?)" if close else ""
        raise argparse.ArgumentError(action, f"unknown choice {value!r}{guess}; choose from {', '.join(names)}")

    def unrecognized(self, extras: list[str]) -> NoReturn:
        """Report arguments this parser does not take, suggesting the flag meant."""
        flags = [flag for action in self._actions for flag in action.option_strings]
        first = extras[0].split("=", 1)[0]
        close = difflib.get_close_matches(first, flags, n=1) if first.startswith("-") else []
        guess = f" (did you mean {close[0]}?)" if close else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{guess}")


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {text}")
    return value


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: any free one)."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (0..65535): {text}")
    return value


def http_url(text: str) -> str:
    """A server's base URL: http(s)://host[:port][/], returned without the trailing slash.

    A bare ``localhost:8080`` parses as scheme "localhost", and a path would be joined
    with every route the caller adds: both fail much later and less clearly than here."""
    example = "e.g. http://127.0.0.1:8080"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
    except ValueError as problem:
        raise argparse.ArgumentTypeError(f"not a URL: {text!r} ({problem}; {example})") from None
    if parts.scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(f"{text!r} needs http:// or https:// ({example})")
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} names no host ({example})")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise argparse.ArgumentTypeError(f"{text!r}: give the server's base URL only, no path or query ({example})")
    return f"{parts.scheme}://{parts.netloc}"


def shell_words(text: str) -> tuple[str, ...]:
    """A command line given as one string, split as a POSIX shell would."""
    try:
        return tuple(shlex.split(text))
    except ValueError as problem:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{text!r}: {str(problem).lower()}") from None


def existing_file(text: str) -> Path:
    """A readable file that exists now."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"cannot read {text}: no such file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot read {text}: it is a directory")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text}: permission denied")
    return path


def _creatable(path: Path) -> str | None:
    """Why ``path`` (or its missing parents) cannot be created, or None."""
    ancestor = path
    while not ancestor.exists():
        if ancestor.parent == ancestor:
            return "no existing parent directory"
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    return None


def output_file(text: str) -> Path:
    """A file this command will write (its missing parent directories are created)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: it is a directory")
    problem = _creatable(path.parent) if not path.exists() else None
    if problem is None and path.exists() and not os.access(path, os.W_OK):
        problem = "permission denied"
    if problem is not None:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {problem}")
    return path


STATE_DIR_HELP = "profile cache and outputs; relative to the working directory, as the default"


def state_dir(text: str) -> Path:
    """A directory this command keeps files in: existing and writable, or creatable.

    Relative paths are relative to the working directory (the default `.slogate` too):
    the messages name the absolute path, so a run elsewhere is not a silent recalibration.
    """
    path = Path(text)
    problem = _creatable(path)
    if problem is None and path.exists() and not path.is_dir():
        problem = "it is a file"
    if problem is not None:
        raise argparse.ArgumentTypeError(f"cannot use {text} as a directory: {problem}")
    return path


def check_ports_free(host: str, ports: Mapping[str, int]) -> None:
    """Raise ValueError naming the flag whose port cannot be bound on ``host``.

    Called before anything is started: a taken port found only when the gate binds,
    after llama-server started and calibrated, wastes minutes and leaves a traceback.
    (A port taken between this check and the bind is still reported, later.)"""
    seen: dict[int, str] = {}
    for flag, number in ports.items():
        if number == 0:  # any free port: nothing to check
            continue
        if number in seen:
            raise ValueError(f"{seen[number]} and {flag} are both {number}: give two different ports")
        seen[number] = flag
        try:
            addresses = socket.getaddrinfo(host, number, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as problem:
            raise ValueError(f"--host {host}: {problem.strerror}") from None
        for family, kind, proto, _name, address in addresses:
            with socket.socket(family, kind, proto) as probe:
                # As the server will bind: connections in TIME_WAIT do not make a port taken.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(address)
                except OSError as problem:
                    raise ValueError(f"{flag} {number}: cannot listen on {host}:{number}: {problem.strerror}") from None


Subcommands: TypeAlias = "argparse._SubParsersAction[OneLineParser]"
"""What each command module registers itself on."""


def one_line(error: ValidationError) -> str:
    """A pydantic error as one line: where, and what (the first problem; how many more). Every
    command's invalid document (a policy, a profile, a classes or weights flag) reads so."""
    return f"invalid input at {first_problem(error, root='top level')}"
