"""The etcd cluster of tfcluster.demo.etcd as pytest fixtures: one for the session, its data dirs under the tests'
tmp dir. Tests that need it skip, saying why, when there is no etcd."""

from __future__ import annotations

import time

import pytest

from tfcluster.demo.etcd import INSTALL_HINT, EtcdCluster, Member, etcd_binary

__all__ = ["ETCD", "EtcdCluster", "Member", "needs_etcd", "etcd_cluster", "etcd_prefix"]

ETCD = etcd_binary()
needs_etcd = pytest.mark.skipif(ETCD is None, reason=f"{INSTALL_HINT} (.ci/run does)")


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory):
    """One three-member cluster for the session; each test uses a prefix of its own."""
    if ETCD is None:
        pytest.skip(f"{INSTALL_HINT} (.ci/run does)")
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd")).start_all()
    yield cluster
    cluster.stop_all()


@pytest.fixture
def etcd_prefix(request) -> str:
    """A key prefix no other test writes under."""
    return f"/test/{request.node.name}-{time.monotonic_ns()}"
