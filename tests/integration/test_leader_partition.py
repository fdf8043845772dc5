"""A leading coordinator cut off from etcd while the rest of the cluster is not: the leader reaches etcd only
through one member, the standby through the two others, and that one member is stopped (SIGSTOP: it takes
connections and answers nothing, as across a partition). The leader cannot renew its lease: it writes and sends
nothing more, says it lost the leadership and stands by; the standby takes over within seconds, the agents
follow it, and the running job's tasks are neither restarted nor launched again. Once the member answers again,
the old leader names the new one."""

from __future__ import annotations

import json
import os
import signal
import time

import grpc

from etcdcluster import needs_etcd
from hacluster import HaCluster, registrations, running, sleeper, within_takeover
from harness import wait_until
from tfcluster.api.v1.control_pb2 import GetStatusRequest
from tfcluster.api.v1.control_pb2_grpc import ControlServiceStub
from tfcluster.daemon.coordinator.store.etcd_gateway import NO_QUORUM

pytestmark = needs_etcd


def named_leader(cluster: HaCluster, address: str) -> str:
    """The leader the coordinator at address names: itself when it leads, the one its refusal names as a standby
    ("" when it names none)."""
    with cluster.channel(address=address) as channel:
        try:
            return ControlServiceStub(channel).GetStatus(GetStatusRequest(), timeout=5).summary.leader
        except grpc.RpcError as e:
            return dict(e.trailing_metadata() or ()).get("tfcluster-leader", "")


def test_a_leader_cut_off_from_etcd_stops_acting_and_the_standby_takes_over(tmp_path, etcd_cluster, etcd_prefix):
    # The member cut off is one of etcd's followers: the cluster goes on without an election of its own, so how
    # soon the standby leads is the leader lease's doing alone.
    cut = next(m for m in etcd_cluster.members if not etcd_cluster.leads(m))
    others = [m for m in etcd_cluster.members if m is not cut]
    urls = [f"etcd://{cut.endpoint}{etcd_prefix}", f"etcd://{','.join(m.endpoint for m in others)}{etcd_prefix}"]
    ha = HaCluster(root=tmp_path)
    ha.coordinators = []
    try:
        ha.start_coordinators(urls, 2, first_leads=True)
        old, standby = ha.listens
        ha.start_agents({"a": {}, "b": {}})
        launches = tmp_path / "launches"
        job_id = sleeper(ha, launches, "steady", 40)
        wait_until(lambda: running(ha, job_id), 30, what="the job RUNNING")
        term = etcd_cluster.raft_term(others[0])
        os.kill(cut.process.pid, signal.SIGSTOP)
        cut_at = time.monotonic()
        try:
            # The lease's TTL (2 s), etcd's check for expired leases (every 0.5 s) and a standby's poll.
            within_takeover(lambda: named_leader(ha, standby) == standby, "the standby to lead", 5,
                            lambda: etcd_cluster.raft_term(others[0]) != term)
            took_over = time.monotonic() - cut_at
            # The agents follow before the new leader would count them lost (--lost-after 3 s and the reconnect
            # grace, 10 s, from when it took over), whatever the old leader does meanwhile.
            wait_until(lambda: all(registrations(ha, n, standby) for n in ("a", "b")), 13, interval=0.1,
                       what="both agents registered with the new leader")
            followed = time.monotonic() - cut_at
            # Asked alone, the old leader acknowledges no change: it cannot store one (or, a moment later, it is a
            # standby already).
            refused = ha.cli("start", "--name", "refused", "--strategy", "mirrored", "--", "true",
                             env={"TFCLUSTER_COORDINATOR": old})
            assert refused.returncode == 1 and ("cannot store the change" in refused.stderr or
                                                "this coordinator is a standby" in refused.stderr), refused.stderr
            assert NO_QUORUM not in refused.stderr, "etcd has a quorum: this coordinator merely cannot reach it"
            # Then it stops claiming the leadership: `status` on it is a standby's refusal.
            wait_until(lambda: named_leader(ha, old) != old, 12, interval=0.2, what="the old leader to step down")
            stepped_down = time.monotonic() - cut_at
            later = ha.cli("start", "--name", "later", "--strategy", "mirrored", "--", "true",
                           check=True).stdout.strip()
        finally:
            os.kill(cut.process.pid, signal.SIGCONT)
        print(f"the standby led {took_over:.2f} s after the cut; the old leader stood by after {stepped_down:.2f} s; "
              f"both agents registered with the new leader after {followed:.2f} s")
        log = ha.coordinators[0].log()
        assert "this coordinator no longer leads: its lease ran out" in log and "cut off from etcd?" in log, log
        assert "etcd has no quorum" not in log, "a member that does not answer is not etcd without quorum"
        after_cut = log.split("renewing the leader lease failed", 1)[1]
        for acted in ("launch ", "registered", "later"):
            assert acted not in after_cut, f"the old leader acted while cut off: {acted!r}\n{after_cut}"
        wait_until(lambda: named_leader(ha, old) == standby, 15, what="the old leader to name the new one")
        assert ha.cli("logs", job_id, "worker:0").returncode == 0, "the CLI, given the old leader first, follows"
        assert ha.wait_job(later, timeout=30)["state"] == "SUCCEEDED"
        every = json.loads(ha.cli("status", "--all", "--json", check=True).stdout)["jobs"]
        assert sorted(j["name"] for j in every) == ["later", "steady"], "the refused submission was never stored"
        job = ha.wait_job(job_id, timeout=60)
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 0, job
        assert all(t["attempt"] == 1 for t in job["tasks"]) and launches.read_text().count("launched") == 2
    finally:
        os.kill(cut.process.pid, signal.SIGCONT)
        ha.teardown()
        wait_until(lambda: etcd_cluster.healthy(cut), 30, what="the stopped etcd member healthy again")
