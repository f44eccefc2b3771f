"""The committed table of llama-server flags is the real binary's ``--help``.

The CI diff check of a generated file: regenerate from the binary `make llama` built and
fail on any difference (then run ``python -m slogate_llama.flags_table``
and commit the result).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slogate_calibration.runtime import LlamaRuntime
from slogate_llama.flags import flag_table
from slogate_llama.flags_table import COMMAND, default_table_path, generate

pytestmark = pytest.mark.integration


def test_the_committed_table_is_what_the_binary_says(llama_runtime: LlamaRuntime) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "slogate_llama.flags_table", "--check", "--server", str(llama_runtime.server)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"stale table: regenerate it with `{COMMAND}`\n{done.stdout}{done.stderr}"


def test_the_generator_finds_the_binary_make_llama_built_by_itself(llama_runtime: LlamaRuntime) -> None:
    done = subprocess.run([sys.executable, "-m", "slogate_llama.flags_table", "--check"],
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_generator_writes_what_flags_loads(llama_runtime: LlamaRuntime, tmp_path: Path) -> None:
    out = tmp_path / "flags.json"
    done = subprocess.run(
        [sys.executable, "-m", "slogate_llama.flags_table", "--server", str(llama_runtime.server),
         "--out", str(out)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert "options" in done.stdout
    assert out.read_text() == generate(llama_runtime.server)
    assert default_table_path().read_text() == out.read_text()
    table = flag_table()
    assert table.option("--threads").flags == ("-t", "--threads")
    assert table.option("--cont-batching").negations == ("-nocb", "--no-cont-batching")


def test_llama_server_reads_its_flags_as_the_table_says(llama_runtime: LlamaRuntime) -> None:
    """Two facts the table's readers rely on, asked of the binary: --flag=value (and -f=value) is rejected,
    --ctx_size is not."""
    server = str(llama_runtime.server)
    joined = subprocess.run(
        [server, "--threads=2", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert joined.returncode != 0
    assert "invalid argument: --threads=2" in joined.stdout + joined.stderr
    short = subprocess.run([server, "-t=2", "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert short.returncode != 0
    assert "invalid argument: -t=2" in short.stdout + short.stderr
    underscore = subprocess.run(
        [server, "--ctx_size", "512", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert underscore.returncode == 0, underscore.stderr
