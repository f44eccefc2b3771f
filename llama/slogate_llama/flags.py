"""llama-server's settings, read the way llama-server reads them.

llama-server takes each setting from a flag or from its environment variable; a flag
beats its variable, the last occurrence of a flag wins, and every option has several
spellings (``-t``/``--threads``, ``-np``/``--parallel``, ``-nocb``/``--no-cont-batching``).
The spellings, value counts and variables come from ``llama_server_flags.json``,
generated from the real binary's ``--help`` by ``python -m slogate_llama.flags_table``
(the operator runs without the binary). The operator reads a pod spec with it
(``slogate_operator.fingerprint``); calibration reads the arguments it is handed
(``slogate_calibration.server_args``).

``read_settings`` folds all of that into one mapping, canonical flag (an option's first
long spelling) -> value, or True/False for a switch: so ``-t 2``, ``--threads 2``,
``--threads=2`` and ``LLAMA_ARG_THREADS=2`` are all ``{"--threads": "2"}``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

TABLE_FILE = "llama_server_flags.json"

Setting = str | bool
"""A value as written (two-value options: both, space-separated), or a switch's state."""

# llama.cpp's common_arg_utils::is_truthy / is_falsey (case-sensitive, as there).
TRUTHY = frozenset({"on", "enabled", "true", "1"})
FALSEY = frozenset({"off", "disabled", "false", "0"})


@dataclass(frozen=True, slots=True)
class ServerFlag:
    """One llama-server option: its spellings, value count and variable."""

    flags: tuple[str, ...]
    """Spellings that set it (for a switch: turn it on)."""
    negations: tuple[str, ...]
    """Spellings that turn a switch off (``--no-xxx``)."""
    values: int
    """Words that follow it: 0 for a switch, 1, or 2."""
    env: str | None
    """The environment variable that sets it (``LLAMA_ARG_THREADS``), if it has one."""

    @property
    def name(self) -> str:
        """The canonical spelling: the first long one."""
        return next((flag for flag in self.flags if flag.startswith("--")), self.flags[0])

    @property
    def negated_env(self) -> str | None:
        """``LLAMA_ARG_NO_XXX``: set to anything, it turns a negatable switch off.

        Not in ``--help``; llama.cpp's common_arg::get_value_from_env derives it.
        """
        if not self.negations or self.env is None or not self.env.startswith("LLAMA_ARG_"):
            return None
        return "LLAMA_ARG_NO_" + self.env.removeprefix("LLAMA_ARG_")

    @property
    def classic_name(self) -> str:
        """Its last long spelling: llama.cpp lists new names first, so this is the longest-standing
        one (``--n-gpu-layers``, not ``--gpu-layers``), which other parsers know too."""
        return next((flag for flag in reversed(self.flags) if flag.startswith("--")), self.flags[0])

    def negation(self) -> str:
        """The spelling that turns it off (its last long one, as ``classic_name``)."""
        return next((flag for flag in reversed(self.negations) if flag.startswith("--")), self.negations[0])


@dataclass(frozen=True, slots=True)
class FlagTable:
    """Every option of one llama-server build, indexed by spelling and by variable."""

    llama_server: str
    """The ``--version`` line of the binary the table was generated from."""
    options: tuple[ServerFlag, ...]
    """Every option, in ``--help``'s order."""

    _spellings: dict[str, tuple[ServerFlag, bool]] = field(init=False, repr=False, compare=False)
    _variables: dict[str, tuple[ServerFlag, bool]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spellings: dict[str, tuple[ServerFlag, bool]] = {}
        variables: dict[str, tuple[ServerFlag, bool]] = {}
        for option in self.options:
            for positive, group in ((True, option.flags), (False, option.negations)):
                spellings |= dict.fromkeys(group, (option, positive))
            for variable, positive in ((option.env, True), (option.negated_env, False)):
                if variable is not None:
                    variables[variable] = (option, positive)
        object.__setattr__(self, "_spellings", spellings)
        object.__setattr__(self, "_variables", variables)

    def lookup(self, spelling: str) -> tuple[ServerFlag, bool] | None:
        """The option a command-line word names, and whether it is a positive spelling.

        llama-server reads ``_`` as ``-`` in long flags (``--ctx_size``).
        """
        if spelling.startswith("--"):
            spelling = spelling.replace("_", "-")
        return self._spellings.get(spelling)

    def by_env(self, variable: str) -> tuple[ServerFlag, bool] | None:
        """The option a variable sets; False for a ``LLAMA_ARG_NO_*`` variable."""
        return self._variables.get(variable)

    def option(self, name: str) -> ServerFlag:
        """The option of a canonical name (KeyError if this build has none)."""
        found = self.lookup(name)
        if found is None or found[0].name != name:
            raise KeyError(name)
        return found[0]

    @property
    def variables(self) -> frozenset[str]:
        """Every variable llama-server reads (including the ``LLAMA_ARG_NO_*`` ones)."""
        return frozenset(self._variables)


def _flag(raw: Mapping[str, Any]) -> ServerFlag:
    env = raw.get("env")
    return ServerFlag(tuple(raw["flags"]), tuple(raw["negations"]), int(raw["values"]),
                      str(env) if env is not None else None)  # fmt: skip


@functools.cache
def flag_table() -> FlagTable:
    """The committed table (``llama_server_flags.json``), loaded once."""
    raw = json.loads(resources.files("slogate_llama").joinpath(TABLE_FILE).read_text())
    return FlagTable(str(raw["llama_server"]), tuple(_flag(o) for o in raw["options"]))


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """llama-server's settings after folding spellings, variables and repetitions."""

    values: Mapping[str, Setting]
    """Canonical flag -> value (True/False for a switch), from variables then the command line."""
    from_command_line: frozenset[str]
    """The canonical flags the command line sets (they beat their variables)."""
    unknown: tuple[str, ...]
    """Command-line words the table does not know, in order (an unknown flag's value too)."""
    joined: tuple[str, ...]
    """``--flag=value`` (or ``-f=value``) words: read here, but llama-server rejects them
    ("invalid argument")."""
    missing_value: tuple[str, ...] = ()
    """Flags at the end of the command line without their value(s): llama-server exits
    ("expected value for argument"). They are in ``unknown`` too."""

    def get(self, name: str) -> Setting | None:
        return self.values.get(name)


def _from_env(option: ServerFlag, positive: bool, value: str) -> Setting | None:
    """What llama-server makes of a variable (common_params_parse_ex)."""
    if option.values:
        return value
    if not positive:
        return False  # LLAMA_ARG_NO_*: set at all means off
    if not option.negations:
        return True if value in TRUTHY else None  # a plain switch ignores anything else
    if value in TRUTHY or value in FALSEY:
        return value in TRUTHY
    return value  # llama-server exits ("invalid boolean value"); keep it visible


def read_settings(env: Mapping[str, str], words: Sequence[str], table: FlagTable | None = None) -> ServerSettings:
    """Fold a literal environment and llama-server's command-line words into settings."""
    table = table or flag_table()
    values: dict[str, Setting] = {}
    # A LLAMA_ARG_NO_* variable beats its positive one, as in get_value_from_env.
    for variable in sorted(env, key=lambda v: (v.startswith("LLAMA_ARG_NO_"), v)):
        found = table.by_env(variable)
        if found is not None:
            setting = _from_env(*found, env[variable])
            if setting is not None:
                values[found[0].name] = setting
    command_line: set[str] = set()
    unknown: list[str] = []
    joined: list[str] = []
    missing_value: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        found, inline = table.lookup(word), None
        flag, eq, value = word.partition("=")
        if found is None and eq and word.startswith("-"):
            found, inline = table.lookup(flag), value  # a flag that takes one value only
            if found is not None and found[0].values != 1:
                found = None
        if found is None:
            unknown.append(word)
            continue
        option, positive = found
        if option.values == 0:
            values[option.name] = positive
        elif inline is not None:
            values[option.name] = inline
            joined.append(word)
        elif index + option.values <= len(words):
            values[option.name] = " ".join(words[index : index + option.values])
            index += option.values
        else:
            unknown.append(word)  # llama-server: "expected value for argument"
            missing_value.append(word)
            continue
        command_line.add(option.name)
    return ServerSettings(dict(sorted(values.items())), frozenset(command_line), tuple(unknown), tuple(joined),
                          tuple(missing_value))  # fmt: skip


def env_flags(env: Mapping[str, str], table: FlagTable | None = None) -> list[str]:
    """The flags a literal environment amounts to, in the table's order.

    For `slogate calibrate --server-args`, which reads flags only (so they are spelled
    the longest-standing way); what llama-server would refuse (a switch variable that is
    not a boolean) is left out.
    """
    table = table or flag_table()
    settings = read_settings(env, (), table).values
    flags: list[str] = []
    for option in table.options:
        value = settings.get(option.name)
        if value is True:
            flags.append(option.classic_name)
        elif value is False:
            flags.append(option.negation())
        elif value is not None and option.values:
            flags += [option.classic_name, value]
    return flags
