"""Fixtures of the operator tests: a kmock cluster, and the real operator against it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kopf.testing import KopfRunner

from operator_harness import Cluster, running_operator


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    yield made
    made.close()


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    with running_operator(cluster) as runner:
        yield runner
