"""Finding llama-server: the override wins, and a wrong one says what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from slogate_llama.binary import ENV_LLAMA_SERVER, ServerNotFound, find_server


def test_the_override_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    monkeypatch.setenv(ENV_LLAMA_SERVER, str(server))
    assert find_server() == server.resolve()


@pytest.mark.parametrize(("executable", "problem"), [(None, "does not exist"), (False, "is not executable")])
def test_a_wrong_override_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, executable: bool | None, problem: str
) -> None:
    server = tmp_path / "llama-server"
    if executable is not None:
        server.write_text("#!/bin/sh\n")
        server.chmod(0o644)
    monkeypatch.setenv(ENV_LLAMA_SERVER, str(server))
    with pytest.raises(ServerNotFound, match=rf"\${ENV_LLAMA_SERVER}.*{problem}.*make llama"):
        find_server()
