"""Generate the table of llama-server flags from the real binary's ``--help``.

The operator reads llama-server's settings from a pod spec without the binary at hand,
and calibration reads the arguments it is handed, both with ``flags``, so this
package ships a generated table (``slogate_llama/llama_server_flags.json``): for
each option its spellings, its negated spellings (``--no-xxx``), how many values it
takes and its environment variable. This command regenerates it; ``--check`` is the CI
diff check (an integration test runs it against the binary that `make llama` builds).

    python -m slogate_llama.flags_table           # rewrite the table
    python -m slogate_llama.flags_table --check   # fail if it is stale

``--help`` prints each option as ``-t,    --threads N`` (spellings, then the value
hints) padded to column 40 or followed by a line break, then its help lines indented
by 40 columns, the last one ``(env: LLAMA_ARG_THREADS)`` when it has a variable
(llama.cpp common/arg.cpp, ``common_arg::to_string``). Negated spellings are listed
after the positive ones: a switch whose spellings continue with ``--no-...`` after
its last positive long spelling.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slogate_llama.binary import ServerNotFound, find_server
from slogate_llama.flags import TABLE_FILE

COMMAND = "python -m slogate_llama.flags_table"
HELP_COLUMN = 40  # where llama.cpp starts the help text

_FLAG = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV = re.compile(r"^\(env: (\S+)\)$")
_PLAIN_HINT = re.compile(r"^[A-Z][A-Z0-9_]*$")  # START END: one word per value


@dataclass(frozen=True, slots=True)
class Option:
    """One option of ``llama-server --help``."""

    flags: tuple[str, ...]
    """Its spellings, as listed (for a switch: those that turn it on)."""
    negations: tuple[str, ...]
    """The ``--no-...`` spellings listed after a switch's last positive long one."""
    hint: str | None
    """The value placeholder as printed (``N``, ``START END``, ``<0|1>``); None for a switch."""
    values: int
    """Words that follow it: 0 for a switch, one per plain upper-case hint word, else 1."""
    env: str | None
    """Its variable, from the ``(env: ...)`` line of its help, if any."""

    def as_json(self) -> dict[str, object]:
        return {
            "flags": list(self.flags),
            "negations": list(self.negations),
            "hint": self.hint,
            "values": self.values,
            "env": self.env,
        }


def _option(head: str) -> Option:
    words = head.split()
    spellings: list[str] = []
    while words and words[0].endswith(",") and _FLAG.match(words[0][:-1]):
        spellings.append(words.pop(0)[:-1])
    if not words or not _FLAG.match(words[0]):
        raise ValueError(f"not an option line of llama-server --help: {head!r}")
    spellings.append(words.pop(0))
    hint = " ".join(words) or None
    values = 0 if not words else len(words) if all(_PLAIN_HINT.match(w) for w in words) else 1
    positive = [i for i, s in enumerate(spellings) if s.startswith("--") and not s.startswith("--no-")]
    split = positive[-1] + 1 if values == 0 and positive else len(spellings)
    if not any(s.startswith("--no-") for s in spellings[split:]):
        split = len(spellings)
    return Option(tuple(spellings[:split]), tuple(spellings[split:]), hint, values, None)


def parse_help(text: str) -> list[Option]:
    """The options of ``llama-server --help``, in its order."""
    options: list[Option] = []
    for line in text.splitlines():
        if line.startswith("-") and not line.startswith("-----"):
            padded = len(line) > HELP_COLUMN and line[HELP_COLUMN - 3 : HELP_COLUMN] == "   "
            head, help_text = (line[:HELP_COLUMN], line[HELP_COLUMN:]) if padded else (line, "")
            options.append(_option(head))
        elif line.startswith(" ") and options:
            help_text = line
        else:
            continue
        env = _ENV.match(help_text.strip())
        if env:
            last = options[-1]
            options[-1] = Option(last.flags, last.negations, last.hint, last.values, env.group(1))
    seen: set[str] = set()
    for option in options:
        for spelling in (*option.flags, *option.negations):
            if spelling in seen:
                raise ValueError(f"{spelling} is listed twice in llama-server --help")
            seen.add(spelling)
    if not options:
        raise ValueError("llama-server --help listed no options")
    return options


def render(options: Sequence[Option], version: str) -> str:
    """The table as JSON, one option a line (small diffs when llama.cpp changes)."""
    lines = ",\n".join(f"    {json.dumps(o.as_json())}" for o in options)
    header = json.dumps({"generated_by": COMMAND, "llama_server": version})[:-1]
    return f'{header}, "options": [\n{lines}\n]}}\n'


def generate(server: Path) -> str:
    """Run ``server --help`` and ``--version`` and return the table's text."""

    def run(flag: str) -> str:
        done = subprocess.run([str(server), flag], capture_output=True, text=True, timeout=60, check=True)
        return done.stdout + done.stderr

    version = next((line for line in run("--version").splitlines() if line.startswith("version:")), "unknown")
    return render(parse_help(run("--help")), version)


def default_table_path() -> Path:
    """The committed table, next to ``flags`` in this package."""
    return Path(__file__).with_name(TABLE_FILE)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--server", type=Path, help="llama-server binary (default: the one `make llama` built)")
    parser.add_argument("--out", type=Path, help=f"the table (default: slogate_llama/{TABLE_FILE})")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 with a diff if the table differs")
    args = parser.parse_args(argv)
    try:
        server: Path = args.server or find_server()
    except ServerNotFound as error:
        print(error, file=sys.stderr)
        return 2
    out: Path = args.out or default_table_path()
    text = generate(server)
    if not args.check:
        out.write_text(text)
        print(f"wrote {out} ({len(json.loads(text)['options'])} options)")
        return 0
    committed = out.read_text() if out.exists() else ""
    if committed == text:
        return 0
    diff = difflib.unified_diff(committed.splitlines(True), text.splitlines(True), str(out), f"{server} --help")
    sys.stdout.writelines(diff)
    print(f"\n{out} is stale: regenerate it with `{COMMAND}`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
