"""Shared fixtures: local clusters of real coordinator and agent processes (see harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import LocalCluster, running_cluster  # noqa: E402


@pytest.fixture
def make_cluster(tmp_path_factory):
    """A fresh cluster per test (for tests that kill daemons)."""
    made: list[LocalCluster] = []

    def make(lost_after: float = 3.0, *coordinator_args: str, tls: bool = True) -> LocalCluster:
        cluster = LocalCluster(root=tmp_path_factory.mktemp("cluster"), lost_after=lost_after, tls=tls)
        made.append(cluster)
        cluster.start_coordinator(*coordinator_args)
        return cluster
    yield make
    for cluster in made:
        cluster.teardown()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One coordinator and three agents (a: 2 GPUs, b: 2 GPUs, c: CPU only) shared by a module's tests."""
    with running_cluster(tmp_path_factory.mktemp("shared"), {"a": {"gpus": 2}, "b": {"gpus": 2}, "c": {}}) as cluster:
        yield cluster
