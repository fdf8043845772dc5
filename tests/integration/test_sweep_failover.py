"""A sweep carries on across a failover: three coordinators on a real three-member etcd, a grid sweep of four
trials two at a time, kill -9 of the leader while trials run. The new leader goes on with the sweep: every trial
is submitted once, and the sweep ends SUCCEEDED with its table sorted by the metric."""

from __future__ import annotations

from etcdcluster import needs_etcd
from harness import wait_until
from sweeptrials import sweep_file
from tfcluster import Cluster, Sweep

pytestmark = needs_etcd


def test_a_sweep_goes_on_under_the_new_leader_after_kill_9_of_the_old(ha, tmp_path):
    ha.start_agents({"a": {}, "b": {}})
    sweep_id = ha.cli("sweep", "start", str(sweep_file(tmp_path, "ha-grid", 6, "[10, 30]")), check=True,
                      env={"XDG_CACHE_HOME": str(tmp_path / "cache")}).stdout.strip()
    wait_until(lambda: any(j["state"] == "RUNNING" and j.get("sweep") == sweep_id for j in ha.status()["jobs"]),
               60, what="a trial RUNNING")
    old, term = ha.leader(), ha.etcd.raft_term()
    ha.leading().kill()
    new = ha.new_leader(old, 10, etcd_term=term)
    with Cluster(new, ha.admin_dir) as c:
        ended = Sweep(c, sweep_id).wait(timeout=120, poll_seconds=0.5)
        trials = [c.job(t.job_id).status() for t in ended.trials]
    assert ended.state == "SUCCEEDED" and [t.state for t in ended.trials] == ["SUCCEEDED"] * 4, ended
    assert len({t.id for t in trials}) == 4 and all(t.restarts == 0 for t in trials), "each trial submitted once"
    assert [t.best for t in ended.ranked()] == [0.6, 0.3, 0.2, 0.1]
