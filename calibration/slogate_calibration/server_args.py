"""The llama-server settings that change speed or capacity, read from its command line.

/props reports slots and per-slot context but not threads, batch sizes or cache
types, and those decide the measured speed. Whoever starts (or describes) the server
hands its arguments over; the same settings feed the profile's fingerprint.

The arguments are read as llama-server reads them (``slogate_llama.flags.read_settings``,
from the table generated from its ``--help``): every spelling of an option, ``_`` for
``-`` in long flags, switches and their negations, the last occurrence winning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slogate_llama.flags import FlagTable, flag_table, read_settings

SPEED_SETTINGS: Mapping[str, str] = {
    "--threads": "threads",
    "--threads-batch": "threads_batch",
    "--batch-size": "batch_size",
    "--ubatch-size": "ubatch_size",
    "--ctx-size": "ctx_size",
    "--parallel": "parallel",
    "--cache-type-k": "cache_type_k",
    "--cache-type-v": "cache_type_v",
    "--flash-attn": "flash_attn",
    "--gpu-layers": "gpu_layers",
    "--kv-unified": "kv_unified",
    "--cont-batching": "cont_batching",
}
"""llama-server option (its canonical flag) -> setting name. Other options do not change
speed or capacity. The names and their values (a switch's "true"/"false") enter every
profile's fingerprint: changing them invalidates every cached profile."""


def speed_settings(args: Sequence[str], table: FlagTable | None = None) -> dict[str, str]:
    """Map a llama-server argument list to the settings that matter, by name.

    Accepts ``--flag value`` and ``--flag=value``; the last occurrence wins, as in
    llama-server itself. Flags that do not change speed are skipped with their values;
    unknown ones are ignored. A flag without its value raises ValueError (llama-server
    would not start).
    """
    table = table or flag_table()
    settings = read_settings({}, args, table)
    if settings.missing_value:
        flag = settings.missing_value[0]
        found = table.lookup(flag)
        count = f" (it takes {found[0].values})" if found is not None and found[0].values > 1 else ""
        raise ValueError(f"llama-server flag {flag} has no value{count}: llama-server would not start with it")
    speed: dict[str, str] = {}
    for name, key in SPEED_SETTINGS.items():
        value = settings.get(name)
        if value is not None:
            speed[key] = ("true" if value else "false") if isinstance(value, bool) else value
    return speed
