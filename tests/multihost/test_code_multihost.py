"""A job's code reaches hosts that share nothing but the network: three network-namespace hosts, each agent
with a state dir of its own, fetch the archive the coordinator holds (over their veth links), run from it,
and then serve it from their caches to the node the coordinator sends there, and to no other. No TensorFlow
needed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile

import pytest

from harness import running_cluster
from tfcluster import layout
from tfcluster.codechunks import CodeError
from tfcluster.daemon.agent.code.fetch import Fetcher
from tfcluster.demo.hosts import TestHosts, unavailable
from tfcluster.spec import JobSpec, RoleSpec

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
HOSTS = 3
MAIN = b"import json, os\nprint(json.dumps({'cwd': os.getcwd(), 'code': os.environ['TFCLUSTER_CODE_DIR'], " \
       b"'data': len(open('blob.bin', 'rb').read())}))\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with TestHosts(HOSTS) as hosts:
        agents = {f"h{i}": {"host_prefix": hosts.prefix(i)} for i in range(1, HOSTS + 1)}
        with running_cluster(tmp_path_factory.mktemp("code-hosts"), agents,
                             coordinator_host=hosts.coordinator_ip) as cluster:
            cluster.hosts = hosts
            yield cluster


def test_three_hosts_fetch_the_code_once_each_and_serve_it_to_others(cluster, tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in (("blob.bin", os.urandom(2 << 20)), ("main.py", MAIN)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    (cluster.root / "coordinator" / "code").mkdir(parents=True, exist_ok=True)
    (cluster.root / "coordinator" / "code" / f"{digest}.tar.gz").write_bytes(buffer.getvalue())
    nodes = tuple(f"h{i}" for i in range(1, HOSTS + 1))
    spec = JobSpec(name="code", strategy="multi_worker_mirrored", command=("python3", "main.py"), workdir="/",
                   roles={"worker": RoleSpec(count=HOSTS, nodes=nodes)}, code_sha256=f"sha256:{digest}")
    with cluster.client() as client:
        job_id = client.submit(spec)
    job = cluster.wait_job(job_id, timeout=120)
    assert job["state"] == "SUCCEEDED", job
    for task in job["tasks"]:
        found = json.loads(cluster.cli("logs", job_id, f"worker:{task['index']}", check=True).stdout.splitlines()[-1])
        assert found["data"] == 2 << 20
        attempt = layout.attempt_dir(cluster.agent_state_dir(task["node"]), job_id, "worker", task["index"],
                                     task["attempt"])
        assert found["code"] == str(attempt / "code" / "tree"), "the job's own view of the node's cached code"
        assert (cluster.agent_state_dir(task["node"]) / "code" / digest / "main.py").is_file()
    for node in nodes:
        assert cluster.agents[node].log().count("code: fetched sha256:") == 1
    # The node the first launch's tree sent to another takes the code from that one's cache, across the hosts'
    # network, the coordinator's copy gone; a node no task of the job needs gets nothing there.
    (cluster.root / "coordinator" / "code" / f"{digest}.tar.gz").unlink()
    fetcher, holder = re.search(rf"{job_id}: (h\d) may fetch its code from (h\d)", cluster.coordinator.log()).groups()
    peer = f"{cluster.hosts.ip(int(holder[1:]))}:{cluster.port_ranges[holder][0]}"
    Fetcher(cluster.address, lambda: cluster.credentials("node", fetcher))(digest, job_id, (peer,), tmp_path / "copy")
    assert hashlib.sha256((tmp_path / "copy").read_bytes()).hexdigest() == digest
    with pytest.raises(CodeError, match="this node holds no code"):
        Fetcher(cluster.address, lambda: cluster.credentials("node", "h4"))(digest, job_id, (peer,), tmp_path / "no")
