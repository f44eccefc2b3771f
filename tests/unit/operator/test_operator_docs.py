"""docs/operator.md says what the code does: its settings and RBAC tables are the code's own."""

from __future__ import annotations

from project_files import ROOT
from slogate_operator import rbac, settings

DOC = (ROOT / "docs" / "operator.md").read_text()


def test_the_settings_table_is_the_settings_dataclass() -> None:
    assert settings.markdown_table() in DOC


def test_the_rbac_table_is_the_permission_list() -> None:
    assert "## RBAC: what the operator calls" in DOC
    assert rbac.markdown_table() in DOC


def test_every_example_and_cli_flag_is_mentioned() -> None:
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        assert example.name in DOC, example.name
    for flag in ("--namespace", "--all-namespaces", "--peering", "--standalone", "--priority", "--image", "--metrics-port",
                 "--liveness-port", "--log-format", "--verbose"):  # fmt: skip
        assert flag in DOC, flag
