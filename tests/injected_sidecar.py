"""What the operator's injected sidecar container runs with: its args through the real CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slogate_cli import sidecar_command
from slogate_cli.arguments import OneLineParser
from slogate_operator import names
from slogate_sidecar.settings import SidecarSettings


def sidecar_settings(container: dict[str, Any], tmp_path: Path) -> SidecarSettings:
    """The settings `slogate sidecar` runs with, given the container's args (the token file,
    which the kubelet mounts, stands in at a path of this test's)."""
    token = tmp_path / "token"
    token.write_text("t")
    args = [str(token) if arg == f"{names.TOKEN_DIR}/{names.TOKEN_KEY}" else arg for arg in container["args"]]
    parser = OneLineParser(prog="slogate")
    sidecar_command.add_parser(parser.add_subparsers(dest="command", parser_class=OneLineParser))
    return sidecar_command.settings_from(parser.parse_args(args))
