"""`tfcluster up` over real SSH: private hosts (own files, own address) each running OpenSSH's sshd, brought up
from a wheelhouse built from this checkout (extras = [], so no TensorFlow) with no index reachable from them: one
coordinator and two agents READY, a job that runs on them, a second `up` that changes nothing, `--check` after a
host was added, and `down` leaving no tfcluster process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sshhosts import SSH_OPTIONS, SshHosts, unavailable

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd)"),
              pytest.mark.skipif(os.geteuid() == 0 and unavailable() is not None, reason=str(unavailable())),
              pytest.mark.timeout(600)]

TFCLUSTER = str(Path(sys.executable).parent / "tfcluster")
HOSTS = {"coord": "10.77.0.1", "node1": "10.77.0.11", "node2": "10.77.0.12", "node3": "10.77.0.13"}


def inventory(key: Path, nodes: list[str]) -> str:
    options = ", ".join(f'"{o}"' for o in SSH_OPTIONS)
    text = (f'[ssh]\nuser = "root"\nidentity_file = "{key}"\noptions = [{options}]\n\n'
            f'[software]\nextras = []\n\n[[coordinators]]\nhost = "{HOSTS["coord"]}"\n')
    for name in nodes:
        text += f'\n[[nodes]]\nhost = "{HOSTS[name]}"\nport_range = "21000-21099"\ngpus = 0\n'
    return text


def logs(hosts: SshHosts) -> str:
    """The daemons' logs on every host, for a failure's message."""
    return "".join(f"\n--- {name}:\n" + hosts.on(name, ["sh", "-c", "tail -n 30 /var/log/tfcluster/*.log"],
                                                 capture_output=True, text=True).stdout for name in hosts.hosts)


def tfcluster_processes(hosts: SshHosts) -> list[str]:
    found = []
    for pid in hosts.private.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "tfcluster" in cmdline and "sshd" not in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.fixture(scope="module")
def built_wheelhouse():
    """The wheelhouse `up` would build, built here where the operator's package index is reachable (the hosts'
    network reaches none) into the cache `up` looks in first."""
    from tfcluster.bringup.inventory import Software
    from tfcluster.bringup.wheelhouse import wheelhouse

    host_python = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    return wheelhouse(Software(extras=()), host_python, os.uname().machine)


def test_up_brings_a_cluster_up_over_ssh_and_down_takes_it_away(tmp_path, built_wheelhouse):
    with SshHosts(tmp_path, HOSTS) as hosts:
        cluster = tmp_path / "cluster.toml"
        cluster.write_text(inventory(hosts.key, ["node1", "node2"]))

        def tfcluster(*args: str, **env: str) -> subprocess.CompletedProcess:
            return hosts.operator([TFCLUSTER, *args], capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "NO_COLOR": "1", **env})

        first = tfcluster("up", str(cluster))
        assert first.returncode == 0, first.stdout + first.stderr + logs(hosts)
        rows = [r for r in (line.split() for line in first.stdout.splitlines()) if len(r) == 6 and r[0] in HOSTS.values()]
        assert [(r[0], r[1], r[2]) for r in rows] == [(HOSTS["coord"], "coordinator", "SERVING"),
                                                      (HOSTS["node1"], "agent", "READY"),
                                                      (HOSTS["node2"], "agent", "READY")], first.stdout
        assert "no systemd runs" in first.stdout and "background daemons" in first.stdout

        # The CA's key is on the coordinator alone, root-only; the join tokens are gone once used.
        assert hosts.on("coord", ["stat", "-c", "%a", "/etc/tfcluster/ca/ca.key"], capture_output=True,
                        text=True).stdout.strip() == "600"
        assert hosts.on("node1", ["test", "-e", "/etc/tfcluster/ca"]).returncode != 0
        assert hosts.on("node1", ["test", "-e", "/etc/tfcluster/join-token"]).returncode != 0
        assert hosts.on("node1", ["test", "-e", "/var/lib/tfcluster/agent/tls/node.crt"]).returncode == 0

        admin = {"TFCLUSTER_TLS_DIR": str(tmp_path / "cluster.tfcluster" / "ca" / "admin"),
                 "TFCLUSTER_COORDINATOR": f"{HOSTS['coord']}:7070"}
        job = tfcluster("start", "--name", "hello", "--strategy", "multi_worker_mirrored", "--workers", "2", "--wait",
                        "--", "python", "-c", "import os; print(os.environ['TF_CONFIG'])", **admin)
        assert job.returncode == 0, job.stdout + job.stderr

        again = tfcluster("up", str(cluster))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "nothing to change: 3 host(s)" in again.stdout, again.stdout

        cluster.write_text(inventory(hosts.key, ["node1", "node2", "node3"]))
        check = tfcluster("up", "--check", str(cluster))
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"{HOSTS['node1']} (agent): as it should be" in check.stdout
        assert f"{HOSTS['node3']} (agent): \n  install tfcluster in /opt/tfcluster" in check.stdout, check.stdout
        assert hosts.on("node3", ["test", "-e", "/opt/tfcluster"]).returncode != 0, "--check changed something"

        cluster.write_text(inventory(hosts.key, ["node1", "node2"]))
        gone = tfcluster("down", str(cluster))
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert tfcluster_processes(hosts) == []
        assert hosts.on("node1", ["test", "-e", "/opt/tfcluster"]).returncode != 0
        assert hosts.on("node1", ["test", "-e", "/var/lib/tfcluster/agent/tls/node.crt"]).returncode == 0, \
            "down keeps the state without --purge"
