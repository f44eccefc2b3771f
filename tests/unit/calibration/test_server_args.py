"""speed_settings reads llama-server's arguments with the generated flag table.

Its names and values enter every calibration profile's fingerprint (and ServerInfo), so
for every argument list the hand-written reader it replaced understood, it must say
exactly what that reader said; the reader is kept here as the reference. What it newly
understands (aliases, negations and ``_`` spellings the hand table lacked) is listed
separately.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate_calibration.server_args import SPEED_SETTINGS, speed_settings
from slogate_llama.flags import flag_table

# -- the reference: the hand-written reader speed_settings used to be ---------------------------------

OLD_VALUE_FLAGS: Mapping[str, str] = {
    "-t": "threads", "--threads": "threads", "-tb": "threads_batch", "--threads-batch": "threads_batch",
    "-b": "batch_size", "--batch-size": "batch_size", "-ub": "ubatch_size", "--ubatch-size": "ubatch_size",
    "-c": "ctx_size", "--ctx-size": "ctx_size", "-np": "parallel", "--parallel": "parallel",
    "-ctk": "cache_type_k", "--cache-type-k": "cache_type_k", "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v",
    "-fa": "flash_attn", "--flash-attn": "flash_attn", "-ngl": "gpu_layers", "--n-gpu-layers": "gpu_layers",
}  # fmt: skip
OLD_SWITCH_FLAGS: Mapping[str, tuple[str, str]] = {
    "--kv-unified": ("kv_unified", "true"), "-kvu": ("kv_unified", "true"), "--no-kv-unified": ("kv_unified", "false"),
    "--cont-batching": ("cont_batching", "true"), "-cb": ("cont_batching", "true"),
    "--no-cont-batching": ("cont_batching", "false"), "-nocb": ("cont_batching", "false"),
}  # fmt: skip


def old_speed_settings(args: Sequence[str]) -> dict[str, str]:
    """The replaced implementation, verbatim but for its tables' names."""
    settings: dict[str, str] = {}
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        flag, eq, inline = arg.partition("=")
        if flag in OLD_VALUE_FLAGS:
            if eq:
                settings[OLD_VALUE_FLAGS[flag]] = inline
            elif i + 1 < len(items):
                settings[OLD_VALUE_FLAGS[flag]] = items[i + 1]
                i += 1
            else:
                raise ValueError(f"llama-server flag {flag} has no value")
        elif arg in OLD_SWITCH_FLAGS:
            name, value = OLD_SWITCH_FLAGS[arg]
            settings[name] = value
        i += 1
    return settings


# -- the same answers where the old reader understood the arguments -----------------------------------

SAME: list[tuple[list[str], dict[str, str]]] = [
    (["-t", "2", "-np", "4", "-c", "8192"], {"threads": "2", "parallel": "4", "ctx_size": "8192"}),
    (["--threads", "2", "--parallel", "4", "--ctx-size", "8192"], {"threads": "2", "parallel": "4", "ctx_size": "8192"}),
    (["--threads=3", "--cache-type-k", "q8_0", "-ctv", "q8_0"], {"threads": "3", "cache_type_k": "q8_0", "cache_type_v": "q8_0"}),
    (["-t=3", "-fa=on", "-ngl=0"], {"threads": "3", "flash_attn": "on", "gpu_layers": "0"}),  # llama-server refuses these
    (["--threads=", "--ctx-size=a=b"], {"threads": "", "ctx_size": "a=b"}),
    (["-tb", "4", "--threads-batch", "6"], {"threads_batch": "6"}),
    (["-b", "512", "--batch-size", "1024", "-ub", "256", "--ubatch-size", "128"], {"batch_size": "1024", "ubatch_size": "128"}),
    (["-ctk", "q4_0", "--cache-type-k", "q8_0", "--cache-type-v", "f16"], {"cache_type_k": "q8_0", "cache_type_v": "f16"}),
    (["-fa", "auto", "--flash-attn", "off"], {"flash_attn": "off"}),
    (["-ngl", "99", "--n-gpu-layers", "0"], {"gpu_layers": "0"}),
    (["--model", "/m.gguf", "--port", "8080", "--metrics"], {}),
    ([], {}),
    (["-t", "2", "--threads", "4"], {"threads": "4"}),  # the last one wins, as in llama-server
    (["--threads", "4", "-t", "2"], {"threads": "2"}),
    (["--no-kv-unified", "-b", "512", "-ub", "256"], {"kv_unified": "false", "batch_size": "512", "ubatch_size": "256"}),
    (["-kvu"], {"kv_unified": "true"}),
    (["--kv-unified", "--no-kv-unified"], {"kv_unified": "false"}),
    (["--no-kv-unified", "-kvu"], {"kv_unified": "true"}),
    (["-cb"], {"cont_batching": "true"}),
    (["--cont-batching", "-nocb"], {"cont_batching": "false"}),
    (["--no-cont-batching", "--cont-batching"], {"cont_batching": "true"}),
    (["--kv-unified=true", "-cb=0"], {}),  # switches take no value; llama-server refuses these
    (["-t", "--kv-unified"], {"threads": "--kv-unified"}),  # a value is the next word, whatever it is
    (["--shiny", "-t", "2", "x"], {"threads": "2"}),  # unknown words are skipped one by one
    (
        ["-m", "/m.gguf", "--host", "0.0.0.0", "--port", "8080", "-a", "smol", "--metrics", "--no-slots",
         "-t", "2", "-tb", "2", "-b", "256", "-ub", "128", "-c", "4096", "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0",
         "-fa", "on", "-ngl", "0", "-kvu", "-nocb"],
        {"threads": "2", "threads_batch": "2", "batch_size": "256", "ubatch_size": "128", "ctx_size": "4096",
         "parallel": "2", "cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on", "gpu_layers": "0",
         "kv_unified": "true", "cont_batching": "false"},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("args", "expected"), SAME)
def test_the_same_settings_as_the_hand_written_reader(args: list[str], expected: dict[str, str]) -> None:
    assert old_speed_settings(args) == expected
    assert speed_settings(args) == expected


VALUES = ["2", "512", "-1", "", "q8_0", "on", "a=b", "/m.gguf", "--kv-unified", "-nocb", "-t"]
# Options the hand table did not list, with their value: it skipped both words, and so does the table.
OTHER_OPTIONS = [["--port", "8080"], ["-m", "/m.gguf"], ["--host", "0.0.0.0"], ["-a", "smol"], ["--lora", "x.gguf"],
                 ["--metrics"], ["--no-slots"], ["--shiny"], ["x"], ["--control-vector-layer-range", "1", "5"]]  # fmt: skip
value_flag = st.sampled_from(sorted(OLD_VALUE_FLAGS))
unit = st.one_of(
    st.tuples(value_flag, st.sampled_from(VALUES)).map(list),
    st.tuples(value_flag, st.sampled_from(VALUES)).map(lambda p: [f"{p[0]}={p[1]}"]),
    st.sampled_from(sorted(OLD_SWITCH_FLAGS)).map(lambda s: [s]),
    st.sampled_from(OTHER_OPTIONS),
)


@settings(max_examples=300, deadline=None)
@given(units=st.lists(unit, max_size=12), dangling=st.one_of(st.none(), value_flag))
def test_the_same_settings_as_the_hand_written_reader_on_any_such_command_line(
    units: list[list[str]], dangling: str | None
) -> None:
    args = [word for u in units for word in u] + ([dangling] if dangling else [])
    try:
        expected = old_speed_settings(args)
    except ValueError:
        assert dangling is not None
        with pytest.raises(ValueError, match=f"flag {dangling} has no value"):
            speed_settings(args)
    else:
        assert speed_settings(args) == expected


# -- what the hand table did not know ------------------------------------------------------------------

NEW: list[tuple[list[str], dict[str, str]]] = [
    (["--gpu-layers", "0"], {"gpu_layers": "0"}),
    (["-no-kvu"], {"kv_unified": "false"}),
    (["--ctx_size", "512", "--cache_type_k=q8_0", "--n_gpu_layers", "0"], {"ctx_size": "512", "cache_type_k": "q8_0", "gpu_layers": "0"}),
    (["--threads-batch=4", "-ctv=q8_0"], {"threads_batch": "4", "cache_type_v": "q8_0"}),
    # A value of an option the hand table did not know is that option's, as in llama-server.
    (["--alias", "-t", "-t", "2"], {"threads": "2"}),
    # Spellings of other options that only look alike stay out.
    (["-td", "4", "--threads-draft", "4", "-ctkd", "q8_0", "-ngld", "0", "--kv-unified-per-slot", "2"], {}),
]  # fmt: skip


@pytest.mark.parametrize(("args", "expected"), NEW)
def test_what_the_table_adds(args: list[str], expected: dict[str, str]) -> None:
    assert speed_settings(args) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads"], "llama-server flag --threads has no value"),
        (["-t", "2", "-c"], "llama-server flag -c has no value"),
        (["--gpu-layers"], "llama-server flag --gpu-layers has no value"),
        (["--metrics", "--port"], "llama-server flag --port has no value"),  # llama-server would not start either
        (["--control-vector-layer-range", "1"], r"flag --control-vector-layer-range has no value \(it takes 2\)"),
    ],
)
def test_a_flag_without_its_value_is_an_error(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        speed_settings(args)


def test_every_setting_is_an_option_of_the_table() -> None:
    table = flag_table()
    for name in SPEED_SETTINGS:
        assert table.option(name).name == name
    assert set(SPEED_SETTINGS.values()) == {*OLD_VALUE_FLAGS.values(), *(name for name, _ in OLD_SWITCH_FLAGS.values())}
    for spelling, name in OLD_VALUE_FLAGS.items():
        found = table.lookup(spelling)
        assert found is not None, spelling
        assert found[0].values == 1
        assert SPEED_SETTINGS[found[0].name] == name
    for spelling, (name, value) in OLD_SWITCH_FLAGS.items():
        found = table.lookup(spelling)
        assert found is not None, spelling
        assert found[0].values == 0
        assert (SPEED_SETTINGS[found[0].name], "true" if found[1] else "false") == (name, value)
