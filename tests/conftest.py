"""Shared fixtures: local clusters of real coordinator and agent processes (see harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import LocalCluster  # noqa: E402


@pytest.fixture
def make_cluster(tmp_path_factory):
    """A fresh cluster per test (for tests that kill daemons)."""
    made: list[LocalCluster] = []

    def make(lost_after: float = 3.0) -> LocalCluster:
        cluster = LocalCluster(root=tmp_path_factory.mktemp("cluster"), lost_after=lost_after)
        made.append(cluster)
        cluster.start_coordinator()
        return cluster
    yield make
    for cluster in made:
        cluster.teardown()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One coordinator and three agents (a: 2 GPUs, b: 2 GPUs, c: CPU only) shared by a module's tests."""
    cluster = LocalCluster(root=tmp_path_factory.mktemp("shared"))
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", gpus=2, wait=False)
        cluster.start_agent("b", gpus=2, wait=False)
        cluster.start_agent("c", gpus=0)
        for name in ("a", "b"):
            from harness import wait_until
            wait_until(lambda: cluster.node_state(name) == "READY", 30, what=f"agent {name}")
        yield cluster
    finally:
        cluster.teardown()
