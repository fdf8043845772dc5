"""The leader key deleted or replaced behind the leader's back, as anyone who reaches etcd could (a task on a
coordinator's host, with etcd on plain HTTP): a raw request to etcd's gateway, not tfcluster's client, on a real
three-member etcd. The leader ends its term at once from its watch on the key, not at its next write: it stops
answering as the leader within a second, no write of its lands after the deletion, another term begins, the
running job keeps running with no task launched again, and the agents follow the new leader."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.request

import grpc

from etcdcluster import needs_etcd
from hacluster import HaCluster, registrations, running, sleeper
from harness import wait_until
from tfcluster.api.v1.control_pb2 import GetStatusRequest
from tfcluster.api.v1.control_pb2_grpc import ControlServiceStub
from tfcluster.daemon.coordinator.ha.leadership import LeaderInfo, Leadership
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdGateway

pytestmark = needs_etcd


def raw_etcd(cluster, path: str, body: dict) -> dict:
    """One request to etcd's JSON gateway with the standard library alone: what anyone who reaches it can send."""
    request = urllib.request.Request(f"http://{cluster.members[0].endpoint}{path}", data=json.dumps(body).encode(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def documents_at(cluster, prefix: str, revision: int) -> dict[str, str]:
    """Every document key under prefix with its mod_revision, as etcd held them at that revision."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    answer = raw_etcd(cluster, "/v3/kv/range", {"key": b64(prefix), "range_end": b64(end), "keys_only": True,
                                                "revision": revision})
    return {kv["key"]: kv["mod_revision"] for kv in answer.get("kvs", [])}


def answers_as_leader(cluster: HaCluster, address: str) -> bool:
    with cluster.channel(address=address) as channel:
        try:
            return ControlServiceStub(channel).GetStatus(GetStatusRequest(), timeout=2).summary.leader == address
        except grpc.RpcError:  # a standby's refusal, or a port closed between terms
            return False


def test_a_leader_whose_key_is_deleted_stops_leading_at_once_and_nothing_it_writes_lands(ha, tmp_path,
                                                                                        etcd_prefix):
    ha.start_agents({"a": {}, "b": {}})
    launches = tmp_path / "launches"
    job_id = sleeper(ha, launches, "steady", 20)
    wait_until(lambda: running(ha, job_id), 30, what="the job RUNNING")
    old, leader = ha.leader(), ha.leading()
    before = {name: registrations(ha, name, old) for name in ("a", "b")}
    assert answers_as_leader(ha, old)
    deleted = raw_etcd(ha.etcd, "/v3/kv/deleterange", {"key": b64(f"{etcd_prefix}.leader")})
    deleted_at = time.monotonic()
    assert deleted.get("deleted") == "1", deleted
    revision = int(deleted["header"]["revision"])
    wait_until(lambda: not answers_as_leader(ha, old), 1.0, interval=0.01, what="the old leader to stop leading")
    stopped = time.monotonic() - deleted_at
    assert f"no longer leads: the key {etcd_prefix}.leader was deleted at revision {revision} while its lease " \
           f"held: a client of etcd deleted it" in leader.log()
    new = wait_until(ha.leader, 10, interval=0.05, what="a coordinator to lead again")
    led = time.monotonic() - deleted_at
    # Another term (a standby's, or the old leader's own after it campaigned again) holds the key now
    key = raw_etcd(ha.etcd, "/v3/kv/range", {"key": b64(f"{etcd_prefix}.leader")})["kvs"][0]
    term = int(key["create_revision"])
    assert term > revision
    # No document changed between the deletion and the next term's put: nothing the old leader sent landed
    assert documents_at(ha.etcd, f"{etcd_prefix}/", term - 1) == documents_at(ha.etcd, f"{etcd_prefix}/", revision)
    wait_until(lambda: all(registrations(ha, n, new) > (before[n] if new == old else 0) for n in ("a", "b")), 15,
               interval=0.1, what="both agents registered with the new leader")
    followed = time.monotonic() - deleted_at
    print(f"the old leader stopped answering as the leader {stopped:.2f} s after its key was deleted; "
          f"{new} led after {led:.2f} s; both agents were with it after {followed:.2f} s")
    job = ha.job(job_id)
    assert job["state"] == "RUNNING" and all(t["attempt"] == 1 for t in job["tasks"]), job
    job = ha.wait_job(job_id, timeout=60)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 0, job
    assert launches.read_text().count("launched") == 2, "each task process started once"
    for coordinator in ha.coordinators:  # said once per process, however many terms it opened a store for
        assert coordinator.log().count("WITHOUT TLS (--etcd-insecure)") == 1, coordinator.log()


def test_a_leader_whose_key_is_put_again_under_another_lease_ends_its_term_at_once(etcd_cluster, etcd_prefix):
    gateway = EtcdGateway([m.endpoint for m in etcd_cluster.members])
    leadership = Leadership(gateway, etcd_prefix, LeaderInfo("127.0.0.1:1", ""))
    lost: list[str] = []
    ended = threading.Event()
    leadership.on_lost = lambda why: (lost.append(why), ended.set())
    lease = int(raw_etcd(etcd_cluster, "/v3/lease/grant", {"TTL": 60})["ID"])
    try:
        assert leadership.campaign(threading.Event())
        put = raw_etcd(etcd_cluster, "/v3/kv/put", {"key": b64(f"{etcd_prefix}.leader"), "lease": str(lease),
                                                    "value": b64(LeaderInfo("10.9.9.9:7070", "").to_json())})
        put_at = time.monotonic()
        assert ended.wait(1.0), "the term ended"
        took = time.monotonic() - put_at
        assert leadership.lost and not leadership.holds()
        assert lost == [f"the key {etcd_prefix}.leader was put again at revision {put['header']['revision']}, "
                        f"naming 10.9.9.9:7070 (lease {lease:x})"], lost
        print(f"the term ended {took * 1000:.1f} ms after the key was put again")
    finally:
        leadership.step_down()
        raw_etcd(etcd_cluster, "/v3/lease/revoke", {"ID": str(lease)})
        gateway.close()
