"""Fixtures of the tests against a real kube-apiserver (envtest's way: etcd and the API server, no
controllers, no node; tests/api_server.py): a cluster view per test, and the real operator in kopf's thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kopf.testing import KopfRunner

from api_cluster import Cluster
from kopf_thread import MARKER, only_when_marked, running_operator


@pytest.fixture(autouse=True)
def kopf_thread_only_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that runs kopf in a thread and is not marked ``kopf_thread`` fails."""
    with only_when_marked(request.node.nodeid, request.node.get_closest_marker(MARKER) is not None):
        yield


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    yield made
    made.close()


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    with running_operator(cluster) as runner:
        yield runner
