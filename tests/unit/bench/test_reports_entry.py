"""`python -m slogate_bench.reports`: one entry point renders any published report from its JSON."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slogate_bench.reports.__main__ import ALL, REPORTS, main

ROOT = Path(__file__).resolve().parents[3]


def test_an_unknown_name_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["fleet", "nope"])
    assert exited.value.code == 2
    assert "no report named nope; the reports are benchmarks, fleet" in capsys.readouterr().err


def test_every_report_but_the_uncommitted_one_is_rendered_by_default() -> None:
    assert set(ALL) == set(REPORTS) - {"reject"}


def test_a_named_report_is_rendered_from_the_committed_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    shutil.copy(ROOT / "docs/bench/tenants-simulated.json", tmp_path / "docs/bench/tenants-simulated.json")
    monkeypatch.chdir(tmp_path)
    main(["tenants-simulated"])
    assert (tmp_path / "docs/bench/tenants-simulated.png").stat().st_size > 0
    assert capsys.readouterr().out == "rendered tenants-simulated\n"
