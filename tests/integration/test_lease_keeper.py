"""The leader lease renewed from the keeper process (ha/lease_keeper.py), on a real three-member etcd: the leadership
holds while the keeper renews, the keeper stops when the leadership steps down (etcd then lets the key go), and a
keeper that dies leaves the renewals to the coordinator's own thread."""

from __future__ import annotations

import threading
import time

import pytest

from etcdcluster import needs_etcd
from harness import wait_until
from tfcluster.daemon.coordinator.ha.leadership import LeaderInfo, Leadership
from tfcluster.daemon.coordinator.ha.lease_keeper import LeaseKeeper
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdGateway

pytestmark = needs_etcd


def lease_ttl(gateway: EtcdGateway, lease: int) -> int:
    """What etcd has left of that lease (-1: it no longer knows it)."""
    return int(gateway.call("/v3/lease/timetolive", {"ID": str(lease)}).get("TTL", -1))


@pytest.fixture
def kept(etcd_cluster, etcd_prefix):
    """A leading Leadership whose renewals a keeper process sends, and its gateway."""
    gateway = EtcdGateway([m.endpoint for m in etcd_cluster.members])
    keeper = LeaseKeeper(gateway)
    leadership = Leadership(gateway, etcd_prefix, LeaderInfo("127.0.0.1:1", ""), keeper=keeper)
    assert leadership.campaign(threading.Event())
    yield leadership, gateway
    leadership.resign()
    keeper.close()


def test_the_keeper_process_holds_the_lease_and_lets_it_go_when_the_leadership_steps_down(kept, etcd_prefix):
    leadership, gateway = kept
    lease = leadership.lease
    time.sleep(3.0)  # longer than the 2 s lease: only renewals keep it
    assert leadership.holds() and not leadership.lost and lease_ttl(gateway, lease) > 0
    leadership.step_down()
    wait_until(lambda: lease_ttl(gateway, lease) == -1, 5, what="etcd to let the lease go")
    other = Leadership(gateway, etcd_prefix, LeaderInfo("127.0.0.1:2", ""))
    assert other.campaign(threading.Event()), "the key is free for another coordinator"
    other.resign()


def test_when_the_keeper_process_dies_the_coordinator_renews_the_lease_itself(kept):
    leadership, gateway = kept
    leadership.keeper.process.kill()
    wait_until(lambda: leadership.keeper is None, 5, what="the leadership to notice")
    time.sleep(3.0)
    assert leadership.holds() and lease_ttl(gateway, leadership.lease) > 0
