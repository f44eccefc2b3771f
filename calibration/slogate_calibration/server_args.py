"""The llama-server settings that change speed or capacity, read from its command line.

/props reports slots and per-slot context but not threads, batch sizes or cache
types, and those decide the measured speed. Whoever starts (or describes) the server
hands its arguments over; the same settings feed the profile's fingerprint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# flag spellings -> setting name. Flags not listed do not change speed or capacity.
VALUE_FLAGS: Mapping[str, str] = {
    "-t": "threads",
    "--threads": "threads",
    "-tb": "threads_batch",
    "--threads-batch": "threads_batch",
    "-b": "batch_size",
    "--batch-size": "batch_size",
    "-ub": "ubatch_size",
    "--ubatch-size": "ubatch_size",
    "-c": "ctx_size",
    "--ctx-size": "ctx_size",
    "-np": "parallel",
    "--parallel": "parallel",
    "-ctk": "cache_type_k",
    "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v",
    "--cache-type-v": "cache_type_v",
    "-fa": "flash_attn",
    "--flash-attn": "flash_attn",
    "-ngl": "gpu_layers",
    "--n-gpu-layers": "gpu_layers",
}
SWITCH_FLAGS: Mapping[str, tuple[str, str]] = {
    "--kv-unified": ("kv_unified", "true"),
    "-kvu": ("kv_unified", "true"),
    "--no-kv-unified": ("kv_unified", "false"),
    "--cont-batching": ("cont_batching", "true"),
    "-cb": ("cont_batching", "true"),
    "--no-cont-batching": ("cont_batching", "false"),
    "-nocb": ("cont_batching", "false"),
}


def speed_settings(args: Sequence[str]) -> dict[str, str]:
    """Map a llama-server argument list to the settings that matter, by name.

    Accepts ``--flag value`` and ``--flag=value``; the last occurrence wins, as in
    llama-server itself. Unknown flags are ignored (they do not change speed).
    """
    settings: dict[str, str] = {}
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        flag, eq, inline = arg.partition("=")
        if flag in VALUE_FLAGS:
            if eq:
                settings[VALUE_FLAGS[flag]] = inline
            elif i + 1 < len(items):
                settings[VALUE_FLAGS[flag]] = items[i + 1]
                i += 1
            else:
                raise ValueError(f"llama-server flag {flag} has no value")
        elif arg in SWITCH_FLAGS:
            name, value = SWITCH_FLAGS[arg]
            settings[name] = value
        i += 1
    return settings
