"""Several hosts for real: three network namespaces with their own IPs on a bridge, one agent on each,
the coordinator on the bridge address. Real TensorFlow jobs cross the veth links; TF_CONFIG carries the
hosts' IPs. Needs root (CI runs as root)."""

from __future__ import annotations

import importlib.util
import json
import textwrap
import time
from pathlib import Path

import pytest

from harness import LocalCluster, ROOT, job_processes, running_cluster, wait_until
from tfcluster.demo.hosts import TestHosts, unavailable

WHY_NOT = unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or ""),
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EXAMPLES = ROOT / "examples"
HOSTS = 3
CHIEF_WORKER_EVALUATOR_ON_THREE_HOSTS = """
    [roles.chief]
    nodes = ["h1"]
    [roles.worker]
    count = 1
    nodes = ["h2"]
    [roles.evaluator]
    nodes = ["h3"]
    entrypoint = "tfcluster.demo.digits:evaluation"
"""


@pytest.fixture(scope="module")
def hosts():
    with TestHosts(HOSTS) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory):
    agents = {f"h{i}": {"host_prefix": hosts.prefix(i)} for i in range(1, HOSTS + 1)}
    with running_cluster(tmp_path_factory.mktemp("multihost"), agents,
                         coordinator_host=hosts.coordinator_ip) as cluster:
        yield cluster


def write_spec(tmp_path: Path, example: str, extra_roles: str = "", checkpoint_dir: bool = True,
               epochs: int = 3, replace_roles: bool = False) -> Path:
    """The example's spec, run from examples/, with checkpoints in tmp_path (shared: every test host
    sees this machine's files) or host-local (no checkpoint_dir)."""
    lines = [f'checkpoint_dir = "{tmp_path / "ckpt"}"' if checkpoint_dir else ""]
    for line in (EXAMPLES / f"{example}.toml").read_text().splitlines():
        if line.startswith("[roles.") and replace_roles:
            break
        if line.startswith("env"):
            line = f'env = {{ EPOCHS = "{epochs}" }}'
        lines.append(line)
    spec = tmp_path / f"{example}.toml"
    spec.write_text(f'workdir = "{EXAMPLES}"\nstop_grace_seconds = 5\n' + "\n".join(lines) + "\n"
                    + textwrap.dedent(extra_roles))
    return spec


def run(cluster: LocalCluster, spec: Path) -> dict:
    result = cluster.cli("start", str(spec), "--wait", timeout=420)
    job_id = result.stdout.strip()
    job = cluster.job(job_id)
    assert result.returncode == 0 and job["state"] == "SUCCEEDED", f"{job['state']}: {job['message']}"
    wait_until(lambda: job_processes(job_id) == [], 10, what="no process of the job left")
    return job


def check_addresses(hosts: TestHosts, job: dict) -> None:
    ips = {hosts.ip(i) for i in range(1, HOSTS + 1)}
    for task in job["tasks"]:
        host, _, port = task["address"].rpartition(":")
        assert host in ips, f"{task['type']}:{task['index']} at {task['address']}: not a host IP"
        for addresses in json.loads(task["tf_config"])["cluster"].values():
            for address in addresses:
                assert address.rpartition(":")[0] in ips, f"TF_CONFIG names {address}"


def test_agents_advertise_their_own_host_addresses(hosts, cluster):
    nodes = {n["name"]: n for n in cluster.status()["nodes"]}
    assert {name: n["address"] for name, n in nodes.items()} == {f"h{i}": hosts.ip(i) for i in range(1, HOSTS + 1)}


def test_multi_worker_mirrored_across_hosts_with_evaluator_on_a_third(hosts, cluster, tmp_path):
    spec = write_spec(tmp_path, "mwms_fit", replace_roles=True, extra_roles=CHIEF_WORKER_EVALUATOR_ON_THREE_HOSTS)
    job = run(cluster, spec)
    placed = {f"{t['type']}:{t['index']}": t for t in job["tasks"]}
    assert {k: t["node"] for k, t in placed.items()} == {"chief:0": "h1", "worker:0": "h2", "evaluator:0": "h3"}
    assert placed["chief:0"]["address"].startswith(hosts.ip(1) + ":")
    check_addresses(hosts, job)
    assert Path(job["evaluation"]["latest"]["checkpoint"]).name == "ckpt-3"


def test_parameter_server_across_hosts(hosts, cluster, tmp_path):
    spec = write_spec(tmp_path, "parameter_server_fit", replace_roles=True, extra_roles="""
        [roles.chief]
        nodes = ["h1"]
        [roles.worker]
        count = 2
        nodes = ["h2", "h3"]
        [roles.ps]
        count = 1
        nodes = ["h3"]
    """)
    job = run(cluster, spec)
    check_addresses(hosts, job)
    assert {t["node"] for t in job["tasks"] if t["type"] == "worker"} <= {"h2", "h3"}


def test_host_local_checkpoints_are_shipped_to_the_evaluators_host(hosts, cluster, tmp_path):
    spec = write_spec(tmp_path, "mwms_fit", checkpoint_dir=False, replace_roles=True, extra_roles=CHIEF_WORKER_EVALUATOR_ON_THREE_HOSTS)
    job = run(cluster, spec)
    source = cluster.agent_state_dir("h1") / "jobs" / job["id"] / "checkpoints"
    copy = cluster.agent_state_dir("h3") / "jobs" / job["id"] / "checkpoints"
    latest = job["evaluation"]["latest"]
    assert latest["checkpoint"] == str(copy / "ckpt-3"), "the evaluator read its own host's copy"
    for name in ("ckpt-3.index", "ckpt-3.data-00000-of-00001"):
        assert (copy / name).read_bytes() == (source / name).read_bytes()
    assert list((copy / "eval").glob("events.out.tfevents.*")), "summaries on the evaluator's host"
    assert not (cluster.agent_state_dir("h2") / "jobs" / job["id"] / "checkpoints" / "ckpt-1.index").exists(), \
        "nothing is shipped where no one needs it"


def test_cut_link_makes_the_host_lost_and_the_job_recovers_on_the_others(hosts, cluster, tmp_path):
    # Host-local checkpoints: the group that restarts elsewhere gets the chief's dir copied first.
    spec = write_spec(tmp_path, "mwms_fit", epochs=6, checkpoint_dir=False, replace_roles=True, extra_roles="""
        [roles.worker]
        count = 2
    """)
    spec.write_text(spec.read_text().replace('EPOCHS = "6"', 'EPOCHS = "6", EPOCH_PAUSE_SECONDS = "1.5"'))
    job_id = cluster.cli("start", str(spec), check=True).stdout.strip()
    job = wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 120,
                     what="RUNNING")
    chief_node = next(t["node"] for t in job["tasks"] if (t["type"], t["index"]) == ("worker", 0))
    chief_dir = cluster.agent_state_dir(chief_node) / "jobs" / job_id / "checkpoints"
    wait_until(lambda: (chief_dir / "ckpt-2.index").exists(), 240, interval=0.2, what="checkpoint 2")
    cut = next(int(t["node"][1:]) for t in job["tasks"] if (t["type"], t["index"]) == ("worker", 1))
    hosts.link(cut, up=False)
    try:
        cut_at = time.monotonic()
        wait_until(lambda: cluster.node_state(f"h{cut}") == "LOST", 15, interval=0.05, what="LOST")
        assert time.monotonic() - cut_at <= cluster.lost_after + 1.5
        job = cluster.wait_job(job_id, timeout=300)
        assert job["state"] == "SUCCEEDED", job["message"]
        assert job["restarts"] == 1 and f"node h{cut} lost" in job["last_failure"]["description"]
        assert all(t["node"] != f"h{cut}" for t in job["tasks"]), "re-placed on the hosts left"
        check_addresses(hosts, job)
        assert f"copying checkpoints from {chief_node}" in cluster.coordinator.log()
        metrics = json.loads((chief_dir / "metrics.json").read_text())
        assert metrics["replicas"] == 2 and metrics["accuracy"] > 0.8
    finally:
        hosts.link(cut, up=True)
    # The host comes back: its agent re-registers and the stale attempt it still runs is stopped.
    wait_until(lambda: cluster.node_state(f"h{cut}") == "READY", 30, what="the host back")
    wait_until(lambda: job_processes(job_id) == [], 30, what="the stale attempt stopped")
