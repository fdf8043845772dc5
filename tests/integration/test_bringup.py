"""`tfcluster up` over real SSH: private hosts (own files, own address) each running OpenSSH's sshd, brought up
from a wheelhouse built from this checkout (extras = [], so no TensorFlow) with no index reachable from them: one
coordinator and two agents READY, a job that runs on them, a second `up` that changes nothing, `--check` after a
host was added, and `down` leaving no tfcluster process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import wait_until
from sshhosts import SSH_OPTIONS, SshHosts, host_wheelhouse, unavailable

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd)"),
              pytest.mark.skipif(os.geteuid() == 0 and unavailable() is not None, reason=str(unavailable())),
              pytest.mark.timeout(600),
              pytest.mark.alone]

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


def tfcluster_python(hosts: SshHosts, script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """script run by the operator's Python (the Python API), in the hosts' network."""
    done = hosts.operator([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def built_wheelhouse():
    return host_wheelhouse()


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


NEWER = "0.9.0"
SLEEPER = "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.5)"
JOB_STATE = ("import json, sys\nfrom tfcluster import Cluster\nwith Cluster() as c:\n"
             "    job = c.jobs(name='sleeper')[-1]\n    nodes = {n.name: n.agent_version for n in c.nodes()}\n"
             "    print(json.dumps({'state': job.state, 'restarts': job.restarts, 'agents': sorted(nodes.values()),\n"
             "                      'tasks': sorted((t.name, t.state, t.attempt, t.pid) for t in job.tasks)}))")


@pytest.fixture(scope="module")
def newer_checkout(tmp_path_factory, built_wheelhouse):
    """This checkout with its release bumped to NEWER, and its wheelhouse built (as the operator's next release).
    Run with PYTHONPATH set to it, from another directory (`python -c` looks in the current one first)."""
    from tfcluster.bringup.wheelhouse import checkout

    root, copy = checkout(), tmp_path_factory.mktemp("newer") / "src"
    shutil.copytree(root / "tfcluster", copy / "tfcluster", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, copy / name)
    for path, old in ((copy / "pyproject.toml", 'version = "'), (copy / "tfcluster" / "__init__.py", '__version__ = "')):
        text = path.read_text()
        path.write_text(text.replace(f'{old}{tfcluster_version()}"', f'{old}{NEWER}"', 1))
    host_python = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    build = subprocess.run([sys.executable, "-c", "import os, sys\nfrom tfcluster.bringup.inventory import Software\n"
                            "from tfcluster.bringup.wheelhouse import wheelhouse\n"
                            "print(wheelhouse(Software(extras=()), sys.argv[1], os.uname().machine)[1])", host_python],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(copy)}, cwd=copy)
    assert build.returncode == 0 and build.stdout.startswith(NEWER), build.stdout + build.stderr
    return copy


def agent_pid_on(hosts: SshHosts, name: str) -> str:
    return hosts.on(name, ["cat", "/run/tfcluster/tfcluster-agent.service.pid"], capture_output=True,
                    text=True).stdout.strip()


def tfcluster_version() -> str:
    from tfcluster import __version__

    return __version__


def test_upgrade_rolls_a_new_release_out_while_a_job_keeps_running(tmp_path, built_wheelhouse, newer_checkout):
    with SshHosts(tmp_path, {name: HOSTS[name] for name in ("coord", "node1", "node2")}) as hosts:
        cluster = tmp_path / "cluster.toml"
        cluster.write_text(inventory(hosts.key, ["node1", "node2"]))
        admin = {"TFCLUSTER_TLS_DIR": str(tmp_path / "cluster.tfcluster" / "ca" / "admin"),
                 "TFCLUSTER_COORDINATOR": f"{HOSTS['coord']}:7070"}

        def tfcluster(*args: str, newer: bool = False) -> subprocess.CompletedProcess:
            env = {**os.environ, "NO_COLOR": "1", **admin, **({"PYTHONPATH": str(newer_checkout)} if newer else {})}
            argv = [sys.executable, "-c", "import sys; sys.argv[0] = 'tfcluster'; from tfcluster.cli import main; "
                                          "main()", *args]
            return hosts.operator(argv, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)

        def job() -> dict:
            done = tfcluster_python(hosts, JOB_STATE, admin)
            return json.loads(done.stdout)

        first = tfcluster("up", str(cluster))
        assert first.returncode == 0, first.stdout + first.stderr + logs(hosts)
        start = tfcluster("start", "--name", "sleeper", "--strategy", "multi_worker_mirrored", "--workers", "2",
                          "--", "python", "-c", SLEEPER)
        assert start.returncode == 0, start.stdout + start.stderr
        wait_until(lambda: job()["state"] == "RUNNING" and all(t[1] == "RUNNING" for t in job()["tasks"]), 60,
                   what="the job RUNNING")
        before = job()
        agent_pid = agent_pid_on(hosts, "node1")

        check = tfcluster("upgrade", "--check", str(cluster), newer=True)
        assert check.returncode == 0 and f"rolling upgrade to {NEWER}" in check.stdout, check.stdout + check.stderr
        assert job() == before, "--check changed something"

        started = time.monotonic()
        upgraded = tfcluster("upgrade", "--batch", "1", str(cluster), newer=True)
        seconds = time.monotonic() - started
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr + logs(hosts)
        said = [line for line in upgraded.stdout.splitlines() if line.startswith("upgraded ")]
        assert [line.split()[1] for line in said] == [HOSTS["coord"], HOSTS["node1"], HOSTS["node2"]], upgraded.stdout
        assert all("2 running task(s) kept running" in line or "1 running task(s) kept running" in line
                   for line in said), upgraded.stdout
        after = job()
        assert after["state"] == "RUNNING" and after["restarts"] == 0, after
        assert after["tasks"] == before["tasks"], (before, after)   # same attempts, same PIDs
        assert after["agents"] == [NEWER, NEWER], after
        upgraded_pid = agent_pid_on(hosts, "node1")
        assert upgraded_pid != agent_pid, "the agent was not restarted"
        print(f"\nrolling upgrade of 3 hosts with a 2-task job running: {seconds:.1f} s\n{upgraded.stdout}")

        # Back across a minor release is refused before anything stops.
        back = tfcluster("upgrade", str(cluster))
        assert back.returncode == 1 and "crosses a minor release" in back.stderr + back.stdout, back.stdout + back.stderr
        assert "nothing was stopped" in back.stderr + back.stdout
        assert agent_pid_on(hosts, "node1") == upgraded_pid and job() == after
        assert tfcluster("down", str(cluster), newer=True).returncode == 0


HA_HOSTS = {"coord": HOSTS["coord"], "coord2": "10.77.0.2", "coord3": "10.77.0.3", "node1": HOSTS["node1"],
            "coord4": "10.77.0.4", "coord5": "10.77.0.5"}
MEMBERS = ("import json, ssl, urllib.request\n"
           "tls = ssl.create_default_context(cafile='/etc/tfcluster/etcd/ca.crt')\n"
           "tls.load_cert_chain('/etc/tfcluster/etcd/member.crt', '/etc/tfcluster/etcd/member.key')\n"
           "ask = urllib.request.Request('https://{address}:2379/v3/cluster/member/list', data=b'{{}}', method='POST')\n"
           "print(json.dumps(sorted(m['name'] for m in json.load(urllib.request.urlopen(ask, context=tls))['members'])))")
LEADER = ("from tfcluster import Cluster\nwith Cluster() as c:\n"
          "    print(c.status().summary.leader, sum(n.state == 'READY' for n in c.nodes()))")


def test_up_brings_three_coordinators_up_on_etcd_and_a_standby_takes_over(tmp_path, built_wheelhouse):
    with SshHosts(tmp_path, HA_HOSTS) as hosts:
        cluster = tmp_path / "cluster.toml"
        text = inventory(hosts.key, ["node1"])
        # coord3 is a node too: its agent joins once the coordinators serve, with the token they make
        cluster.write_text(text + "".join(f'\n[[coordinators]]\nhost = "{HA_HOSTS[n]}"\n'
                                          for n in ("coord2", "coord3")) +
                           f'\n[[nodes]]\nhost = "{HA_HOSTS["coord3"]}"\nport_range = "21100-21199"\ngpus = 0\n')

        def tfcluster(*args: str, **env: str) -> subprocess.CompletedProcess:
            return hosts.operator([TFCLUSTER, *args], capture_output=True, text=True, timeout=400,
                                  env={**os.environ, "NO_COLOR": "1", **env})

        started = time.monotonic()
        first = tfcluster("up", str(cluster))
        took = time.monotonic() - started
        assert first.returncode == 0, first.stdout + first.stderr + logs(hosts)
        rows = [r for r in (line.split() for line in first.stdout.splitlines())
                if len(r) == 6 and r[0] in HA_HOSTS.values()]
        assert [(r[0], r[1], r[2]) for r in rows] == [(HA_HOSTS[n], "coordinator", "SERVING")
                                                      for n in ("coord", "coord2")] + \
            [(HA_HOSTS["coord3"], "coordinator+agent", "READY"), (HA_HOSTS["node1"], "agent", "READY")], first.stdout
        addresses = ",".join(f"{HA_HOSTS[n]}:7070" for n in ("coord", "coord2", "coord3"))
        assert f"TFCLUSTER_COORDINATOR={addresses}" in first.stdout
        for name in ("coord", "coord2", "coord3"):
            modes = hosts.on(name, ["stat", "-c", "%a", "/etc/tfcluster/ca/ca.key",
                                    "/etc/tfcluster/etcd/member.key", "/var/lib/tfcluster/etcd"],
                             capture_output=True, text=True).stdout.split()
            assert modes == ["600", "600", "700"], (name, modes)
        agent_env = hosts.on("node1", ["cat", "/etc/tfcluster/tfcluster.env"], capture_output=True,
                             text=True).stdout
        assert f"TFCLUSTER_COORDINATOR={addresses}" in agent_env

        admin = {"TFCLUSTER_TLS_DIR": str(tmp_path / "cluster.tfcluster" / "ca" / "admin"),
                 "TFCLUSTER_COORDINATOR": addresses}
        job = tfcluster("start", "--name", "hello", "--strategy", "multi_worker_mirrored", "--workers", "1", "--wait",
                        "--", "python", "-c", "print(1)", **admin)
        assert job.returncode == 0 and "SUCCEEDED" in job.stdout + job.stderr, job.stdout + job.stderr

        again = tfcluster("up", str(cluster))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "nothing to change: 4 host(s)" in again.stdout, again.stdout

        leader = tfcluster_python(hosts, LEADER, admin).stdout.split()[0]
        name = next(n for n, address in HA_HOSTS.items() if leader == f"{address}:7070")
        pid = hosts.on(name, ["cat", "/run/tfcluster/tfcluster-coordinator.service.pid"], capture_output=True,
                       text=True).stdout.strip()
        killed = time.monotonic()
        os.kill(int(pid), 9)

        def answered() -> list[str]:
            done = hosts.operator([sys.executable, "-c", LEADER], capture_output=True, text=True, timeout=30,
                                  env={**os.environ, **admin})
            return done.stdout.split() if done.returncode == 0 else []
        wait_until(lambda: (answered() or [leader])[0] != leader, 60, what="another coordinator to lead")
        took_over = time.monotonic() - killed
        wait_until(lambda: answered()[1:] == ["2"], 60, what="node1 and coord3 READY with the new leader")
        status = tfcluster("status", **admin)
        assert status.returncode == 0, status.stdout + status.stderr
        print(f"\nup of 3 coordinators on etcd and 1 agent: {took:.1f} s; after kill -9 of the leader {leader} "
              f"another led within {took_over:.1f} s")
        replace_a_coordinator(hosts, cluster, tfcluster, admin)


def start_sleeper(hosts: SshHosts, tfcluster, admin: dict[str, str], workers: int):
    """Starts the sleeper job and waits until its tasks run; returns a function that reads the job's state."""
    start = tfcluster("start", "--name", "sleeper", "--strategy", "multi_worker_mirrored", "--workers", str(workers),
                      "--", "python", "-c", SLEEPER, **admin)
    assert start.returncode == 0, start.stdout + start.stderr

    def job() -> dict:  # admin is read at each call: a test may give it new coordinators' addresses
        return json.loads(tfcluster_python(hosts, JOB_STATE, admin).stdout)
    wait_until(lambda: job()["state"] == "RUNNING" and all(t[1] == "RUNNING" for t in job()["tasks"]), 60,
               what="the job RUNNING")
    return job


def replace_a_coordinator(hosts: SshHosts, cluster: Path, tfcluster, admin: dict[str, str]) -> None:
    """coord2 replaced by coord4 in the inventory while a job runs: `up` adds coord4's etcd member and starts it,
    removes coord2's and clears that host, and the job keeps its tasks; the new three then elect a leader."""
    job = start_sleeper(hosts, tfcluster, admin, workers=2)
    before = job()
    cluster.write_text(cluster.read_text().replace(f'"{HA_HOSTS["coord2"]}"', f'"{HA_HOSTS["coord4"]}"'))
    c1, c2, c3, c4 = (HA_HOSTS[n] for n in ("coord", "coord2", "coord3", "coord4"))

    def members(on: str = "coord") -> list[str]:
        done = hosts.on(on, ["python3", "-c", MEMBERS.format(address=HA_HOSTS[on])], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    check = tfcluster("up", "--check", str(cluster))
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"add {c4}'s member (https://{c4}:2380) through {c1}, then start it" in check.stdout, check.stdout
    assert members() == sorted([c1, c2, c3]), "--check changed etcd's members"

    started = time.monotonic()
    moved = tfcluster("up", str(cluster))
    took = time.monotonic() - started
    assert moved.returncode == 0, moved.stdout + moved.stderr + logs(hosts)
    assert f"{c4}: its etcd member joined and its coordinator serves as a standby" in moved.stdout, moved.stdout
    assert f"{c2}: its etcd member was removed, and etcd, the coordinator and the CA's key are off it" in moved.stdout
    assert members() == sorted([c1, c3, c4])
    for path in ("/etc/tfcluster/ca", "/etc/tfcluster/etcd", "/var/lib/tfcluster/etcd",
                 "/run/tfcluster/tfcluster-coordinator.service.pid", "/run/tfcluster/tfcluster-etcd.service.pid"):
        assert hosts.on("coord2", ["test", "-e", path]).returncode == 1, f"{path} is still on coord2"
    after = job()
    assert after["state"] == "RUNNING" and after["restarts"] == 0 and after["tasks"] == before["tasks"], (before, after)
    addresses = ",".join(f"{a}:7070" for a in (c1, c4, c3))   # coord4 where coord2 was in the inventory
    node_env = hosts.on("node1", ["cat", "/etc/tfcluster/tfcluster.env"], capture_output=True, text=True).stdout
    assert f"TFCLUSTER_COORDINATOR={addresses}" in node_env

    again = tfcluster("up", str(cluster))
    assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout + again.stderr
    print(f"coord2 replaced by coord4 with a 2-task job running: {took:.1f} s, the job kept its tasks\n{moved.stdout}")

    # coord's server dies (its sshd, etcd and coordinator killed) and coord5 replaces it: its member goes first
    for unit in ("tfcluster-coordinator.service", "tfcluster-etcd.service"):
        pid = hosts.on("coord", ["cat", f"/run/tfcluster/{unit}.pid"], capture_output=True, text=True).stdout
        os.kill(int(pid), 9)
    hosts.sshd["coord"].kill()
    hosts.sshd["coord"].wait()
    c5 = HA_HOSTS["coord5"]
    cluster.write_text(cluster.read_text().replace(f'"{c1}"', f'"{c5}"'))
    started = time.monotonic()
    moved = tfcluster("up", str(cluster))
    took = time.monotonic() - started
    assert moved.returncode == 0, moved.stdout + moved.stderr + logs(hosts)
    assert f"warning: {c1}: its etcd member was removed, but the host could not be cleared" in moved.stdout
    assert f"{c5}: its etcd member joined and its coordinator serves as a standby" in moved.stdout, moved.stdout
    assert members("coord3") == sorted([c3, c4, c5])
    after = job()
    assert after["state"] == "RUNNING" and after["restarts"] == 0 and after["tasks"] == before["tasks"], (before, after)
    print(f"dead coord replaced by coord5 with the job running: {took:.1f} s, the job kept its tasks\n{moved.stdout}")


def test_one_coordinator_becomes_three_on_etcd_and_keeps_its_jobs(tmp_path, built_wheelhouse):
    """A cluster of one coordinator (SQLite) and a node, a job done and one running; two coordinators added to the
    inventory: `up` makes the three etcd members, moves the records into etcd and starts the three coordinators
    on it; the running job keeps its task and the finished one is still there."""
    names = ("coord", "coord2", "coord3", "node1")
    with SshHosts(tmp_path, {n: HA_HOSTS[n] for n in names}) as hosts:
        cluster = tmp_path / "cluster.toml"
        cluster.write_text(inventory(hosts.key, ["node1"]))

        def tfcluster(*args: str, **env: str) -> subprocess.CompletedProcess:
            return hosts.operator([TFCLUSTER, *args], capture_output=True, text=True, timeout=400,
                                  env={**os.environ, "NO_COLOR": "1", **env})
        first = tfcluster("up", str(cluster))
        assert first.returncode == 0, first.stdout + first.stderr + logs(hosts)
        admin = {"TFCLUSTER_TLS_DIR": str(tmp_path / "cluster.tfcluster" / "ca" / "admin"),
                 "TFCLUSTER_COORDINATOR": f"{HOSTS['coord']}:7070"}
        done = tfcluster("start", "--name", "hello", "--strategy", "multi_worker_mirrored", "--workers", "1",
                         "--wait", "--", "python", "-c", "print(1)", **admin)
        assert done.returncode == 0 and "SUCCEEDED" in done.stdout + done.stderr, done.stdout + done.stderr
        job = start_sleeper(hosts, tfcluster, admin, workers=1)
        before = job()

        cluster.write_text(cluster.read_text() + "".join(f'\n[[coordinators]]\nhost = "{HA_HOSTS[n]}"\n'
                                                         for n in ("coord2", "coord3")))
        started = time.monotonic()
        grown = tfcluster("up", str(cluster))
        took = time.monotonic() - started
        assert grown.returncode == 0, grown.stdout + grown.stderr + logs(hosts)
        assert f"{HOSTS['coord']}: the cluster's records were copied from SQLite into etcd and checked" in grown.stdout
        addresses = [HA_HOSTS[n] for n in ("coord", "coord2", "coord3")]
        members = hosts.on("coord", ["python3", "-c", MEMBERS.format(address=addresses[0])], capture_output=True,
                           text=True)
        assert json.loads(members.stdout) == sorted(addresses), members.stdout + members.stderr
        admin["TFCLUSTER_COORDINATOR"] = ",".join(f"{a}:7070" for a in addresses)
        after = job()
        assert after["state"] == "RUNNING" and after["restarts"] == 0 and after["tasks"] == before["tasks"], (before, after)
        hello = tfcluster_python(hosts, "from tfcluster import Cluster\nwith Cluster() as c:\n"
                                        "    print(c.jobs(name='hello')[-1].state)", admin)
        assert hello.stdout.strip() == "SUCCEEDED", hello.stdout
        again = tfcluster("up", str(cluster))
        assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout + again.stderr
        print(f"\none coordinator became three on etcd with a job running: {took:.1f} s, the job kept its task\n"
              f"{grown.stdout}")
