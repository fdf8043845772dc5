"""Both daemons' /metrics, scraped over HTTPS with a viewer certificate while a real TensorFlow job runs, and
parsed with prometheus-client's own parser."""

from __future__ import annotations

import importlib.util

import pytest

from harness import digits_spec, free_port, scrape, value, wait_until

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]


def test_metrics_of_both_daemons_during_a_real_job(make_cluster, tmp_path):
    coordinator_http = f"127.0.0.1:{free_port()}"
    agent_http = f"127.0.0.1:{free_port()}"
    cluster = make_cluster(3.0, "--http-listen", coordinator_http)
    cluster.start_agent("a", gpus=2, extra=["--http-listen", agent_http])
    viewer = cluster.credentials("viewer", "prometheus")
    files = tmp_path / "viewer"
    files.mkdir()
    for name, pem in (("ca", viewer.ca), ("cert", viewer.cert), ("key", viewer.key)):
        (files / name).write_bytes(pem)
    creds = {name: str(files / name) for name in ("ca", "cert", "key")}

    spec = digits_spec(tmp_path, "metered", epochs=8)
    job_id = cluster.cli("start", str(spec), check=True).stdout.strip()
    wait_until(lambda: cluster.job(job_id)["state"] in ("RUNNING", "SUCCEEDED", "FAILED"), 120, what="RUNNING")

    seen = {}

    def scraped_while_running() -> bool:
        agent = scrape(f"https://{agent_http}/metrics", creds)
        held = [labels for labels, v in agent.get("tfcluster_gpu_allocated", []) if v == 1]
        # CPU time counts in the kernel's 10 ms ticks: a task scraped in its first moments has used none yet.
        if held and value(agent, "tfcluster_task_resident_memory_bytes", job_id=job_id, task="worker:0") and \
                value(agent, "tfcluster_task_cpu_seconds", job_id=job_id, task="worker:0"):
            seen["agent"] = agent
            seen["coordinator"] = scrape(f"https://{coordinator_http}/metrics", creds)
            return True
        assert cluster.job(job_id)["state"] == "RUNNING", "the job ended before its task showed in /metrics"
        return False
    wait_until(scraped_while_running, 120, interval=0.5, what="the worker in the agent's metrics")

    agent, coordinator = seen["agent"], seen["coordinator"]
    assert value(agent, "tfcluster_tasks_running") >= 1
    assert value(agent, "tfcluster_task_cpu_seconds", job_id=job_id, task="worker:0") > 0
    assert value(agent, "tfcluster_task_threads", job_id=job_id, task="worker:0") >= 1
    held = [labels for labels, v in agent["tfcluster_gpu_allocated"] if v == 1]
    assert held == [{"gpu": held[0]["gpu"], "uuid": f"GPU-a-{held[0]['gpu']}", "job_id": job_id, "task": "worker:0"}]
    assert value(agent, "tfcluster_disk_free_bytes") > 0
    assert value(agent, "tfcluster_state_dir_bytes") > 0

    assert value(coordinator, "tfcluster_nodes", state="READY") == 1
    assert value(coordinator, "tfcluster_gpus") == 2
    assert value(coordinator, "tfcluster_gpus_allocated") == 1
    assert value(coordinator, "tfcluster_jobs", state="RUNNING", strategy="mirrored") == 1
    assert value(coordinator, "tfcluster_tasks", state="RUNNING") >= 1
    assert 0 <= value(coordinator, "tfcluster_node_heartbeat_age_seconds", node="a") < 3.0
    assert value(coordinator, "tfcluster_rpc_requests", method="Register", code="OK") >= 1
    assert value(coordinator, "tfcluster_job_placement_wait_seconds", le="+Inf") == 1
    assert value(coordinator, "tfcluster_store_write_seconds", le="+Inf") >= 1

    assert cluster.wait_job(job_id, timeout=300)["state"] == "SUCCEEDED"
    after = scrape(f"https://{coordinator_http}/metrics", creds)
    assert value(after, "tfcluster_job_duration_seconds", le="+Inf", strategy="mirrored", state="SUCCEEDED") == 1
    assert value(after, "tfcluster_evaluation", job_id=job_id, metric="step") > 0
    assert value(after, "tfcluster_evaluation", job_id=job_id, metric="accuracy") > 0.5
    for cause in ("failure", "preemption", "port_conflict", "node_lost", "hang"):
        assert value(after, "tfcluster_job_restarts", cause=cause) == 0
