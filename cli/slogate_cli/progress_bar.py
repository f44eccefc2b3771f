"""A rich progress bar on a terminal; nothing at all in logs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from slogate_calibration.calibrate import Progress as Hooks


@contextmanager
def progress_hooks(enabled: bool) -> Iterator[Hooks]:
    """Hooks that drive a bar on stderr when ``enabled`` and stderr is a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield Hooks()
        return
    bar = Progress(
        TextColumn("[bold]{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task("calibrate", total=None)
        yield Hooks(
            start=lambda total: bar.update(task, total=total),
            advance=lambda: bar.advance(task),
            stage=lambda name: bar.update(task, description=name),
        )
