"""Waiting for something the code under test does in its own time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy; fail with its last value after ``timeout``.
    The timeout is a guard against hangs, never an assertion about speed."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, KeyError, TypeError, IndexError) as problem:
            last = problem
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"never happened{': ' + what if what else ''}; last seen: {last!r}")
