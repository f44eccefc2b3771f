"""The flag table: ``--help`` parsed into options (no binary needed), and the table read back.

The committed table against the real binary is tests/integration/test_server_flags_table.py;
how the operator and calibration read settings with it, tests/unit/operator/
test_operator_fingerprint.py and tests/unit/calibration/test_server_args.py.
"""

from __future__ import annotations

import json

import pytest

from slogate_llama.flags import FlagTable, ServerFlag, flag_table, read_settings
from slogate_llama.flags_table import COMMAND, Option, parse_help, render

# Lines of this build's `llama-server --help`, verbatim.
HELP = """\
----- common params -----

-t,    --threads N                      number of CPU threads to use during generation (default: -1)
                                        (env: LLAMA_ARG_THREADS)
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
                                        (env: LLAMA_ARG_FLASH_ATTN)
--control-vector-layer-range START END
                                        layer range to apply the control vector(s) to, start and end inclusive
-lv,   --verbosity, --log-verbosity N   Set the verbosity threshold. Messages with a higher verbosity will be
                                        ignored. Values:
                                         - 0: generic output
-cb,   --cont-batching, -nocb, --no-cont-batching
                                        whether to enable continuous batching (a.k.a dynamic batching)
                                        (default: enabled)
                                        (env: LLAMA_ARG_CONT_BATCHING)
"""


def test_help_lines_become_options() -> None:
    assert parse_help(HELP) == [
        Option(("-t", "--threads"), (), "N", 1, "LLAMA_ARG_THREADS"),
        Option(("-fa", "--flash-attn"), (), "[on|off|auto]", 1, "LLAMA_ARG_FLASH_ATTN"),
        Option(("--control-vector-layer-range",), (), "START END", 2, None),
        Option(("-lv", "--verbosity", "--log-verbosity"), (), "N", 1, None),
        Option(("-cb", "--cont-batching"), ("-nocb", "--no-cont-batching"), None, 0, "LLAMA_ARG_CONT_BATCHING"),
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "listed no options"),
        ("-t,    --threads N\n-t,    --threads N\n", "listed twice"),
        ("-t,    threads N\n", "not an option line"),
    ],
)
def test_help_it_cannot_read_is_an_error(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_help(text)


def test_the_rendered_table_is_what_the_reader_loads() -> None:
    text = render(parse_help(HELP), "version: 1 (test)")
    raw = json.loads(text)
    assert (raw["generated_by"], raw["llama_server"]) == (COMMAND, "version: 1 (test)")
    assert len(text.splitlines()) == 2 + len(raw["options"])  # one option a line: small diffs
    table = FlagTable(raw["llama_server"], tuple(ServerFlag(tuple(o["flags"]), tuple(o["negations"]), o["values"],
                                                            o["env"]) for o in raw["options"]))  # fmt: skip
    assert table.option("--cont-batching").negated_env == "LLAMA_ARG_NO_CONT_BATCHING"
    assert table.lookup("--log_verbosity") == (table.option("--verbosity"), True)
    settings = read_settings({"LLAMA_ARG_THREADS": "4", "LLAMA_ARG_NO_CONT_BATCHING": "1"},
                             ["-t", "2", "--control-vector-layer-range", "1", "3"], table)  # fmt: skip
    assert settings.values == {"--threads": "2", "--cont-batching": False, "--control-vector-layer-range": "1 3"}


def test_the_committed_table_ships_with_the_package() -> None:
    table = flag_table()
    assert table.llama_server.startswith("version:")
    assert table.option("--threads").env == "LLAMA_ARG_THREADS"
    assert table.option("--kv-unified").negations == ("-no-kvu", "--no-kv-unified")
