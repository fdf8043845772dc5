"""`tfcluster up` onto a host whose init is systemd (a Debian container booted by systemd-nspawn, reached over
SSH: systemdhost.py), from a wheelhouse built from this checkout: the coordinator and the agent run as the units
`up` writes, enabled and started with systemctl. What only systemd shows is checked there: the agent says READY=1
and its status line (Type=notify), keeps its watchdog fed past WatchdogSec, is restarted by systemd after kill -9
(Restart=on-failure) and by `systemctl restart`, and a running task outlives both (KillMode=process); a second
`up` changes nothing and `down` disables and stops the units."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import wait_until
from sshhosts import SSH_OPTIONS, host_wheelhouse
from systemdhost import SystemdHost, unavailable

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, systemd-nspawn)"),
              pytest.mark.skipif(os.geteuid() == 0 and unavailable() is not None, reason=str(unavailable())),
              pytest.mark.timeout(900),
              pytest.mark.alone]

TFCLUSTER = str(Path(sys.executable).parent / "tfcluster")
ADDRESS = "10.79.0.2"
UNITS = ("tfcluster-coordinator.service", "tfcluster-agent.service")
WATCHDOG_SECONDS = 30  # the agent unit's WatchdogSec
SLEEPER = "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.5)"
JOB = ("import json\nfrom tfcluster import Cluster\nwith Cluster() as c:\n    job = c.jobs(name='sleeper')[-1]\n"
       "    print(json.dumps({'id': job.id, 'state': job.state, 'restarts': job.restarts, 'ready': sum(n.state == 'READY' for n in "
       "c.nodes()), 'tasks': [(t.name, t.state, t.attempt, t.pid) for t in job.tasks]}))")


def inventory(key: Path) -> str:
    options = ", ".join(f'"{o}"' for o in SSH_OPTIONS)
    return (f'[ssh]\nuser = "root"\nidentity_file = "{key}"\noptions = [{options}]\n\n[software]\nextras = []\n\n'
            f'[[coordinators]]\nhost = "{ADDRESS}"\n\n[[nodes]]\nhost = "{ADDRESS}"\nport_range = "21000-21099"\n'
            f'gpus = 0\n')


def agent_unit(host: SystemdHost) -> dict[str, str]:
    shown = host.ssh(["systemctl", "show", UNITS[1], "-p", "Type", "-p", "WatchdogUSec", "-p", "StatusText", "-p",
                      "MainPID", "-p", "NRestarts", "-p", "ActiveState"])
    assert shown.returncode == 0, shown.stderr
    return dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)


def test_up_runs_the_daemons_as_systemd_units(tmp_path, request):
    host_wheelhouse()
    with SystemdHost(tmp_path, ADDRESS) as host:
        cluster = tmp_path / "cluster.toml"
        cluster.write_text(inventory(host.key))
        admin = {"TFCLUSTER_TLS_DIR": str(tmp_path / "cluster.tfcluster" / "ca" / "admin"),
                 "TFCLUSTER_COORDINATOR": f"{ADDRESS}:7070"}

        def tfcluster(*args: str) -> subprocess.CompletedProcess:
            # From /, which the host has too: a job's workdir is where `start` runs.
            return host.operator([TFCLUSTER, *args], capture_output=True, text=True, timeout=400, cwd="/",
                                 env={**os.environ, "NO_COLOR": "1", **admin})

        def journal() -> str:
            return host.ssh(["journalctl", "--no-pager", "-n", "60", "-u", UNITS[0], "-u", UNITS[1]]).stdout

        def job() -> dict:
            done = host.operator([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=60,
                                 env={**os.environ, **admin})
            assert done.returncode == 0, done.stdout + done.stderr
            return json.loads(done.stdout)

        first = tfcluster("up", str(cluster))
        assert first.returncode == 0, first.stdout + first.stderr + journal()
        assert "no systemd runs" not in first.stdout, first.stdout
        rows = [r.split()[:3] for r in first.stdout.splitlines() if len(r.split()) == 6 and r.startswith(ADDRESS)]
        assert rows == [[ADDRESS, "coordinator+agent", "READY"]], first.stdout
        for check in ("is-active", "is-enabled"):
            said = host.ssh(["systemctl", check, *UNITS]).stdout.split()
            assert said == (["active"] * 2 if check == "is-active" else ["enabled"] * 2), (check, said)
        unit = agent_unit(host)
        assert unit["Type"] == "notify" and unit["WatchdogUSec"] == f"{WATCHDOG_SECONDS}s", unit
        assert unit["StatusText"], f"the agent told systemd no status line: {unit}"

        start = tfcluster("start", "--name", "sleeper", "--strategy", "multi_worker_mirrored", "--workers", "1",
                          "--", "python3", "-c", SLEEPER)
        assert start.returncode == 0, start.stdout + start.stderr
        try:
            wait_until(lambda: job()["tasks"] and all(t[1] == "RUNNING" for t in job()["tasks"]), 60,
                       what="the sleeper's task RUNNING")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{job()}\n{tfcluster('describe', 'sleeper').stdout}\n{journal()}") from None
        before = job()

        # kill -9: systemd restarts the agent (Restart=on-failure); the task, outside its kill (KillMode=process),
        # keeps running and the new agent reattaches to it.
        killed = host.ssh(["kill", "-9", unit["MainPID"]])
        assert killed.returncode == 0, killed.stderr
        wait_until(lambda: agent_unit(host)["NRestarts"] == "1" and agent_unit(host)["ActiveState"] == "active", 30,
                   what="systemd to restart the killed agent")
        wait_until(lambda: job()["ready"] == 1, 30, what="the restarted agent READY")
        after_kill = job()
        assert after_kill["state"] == "RUNNING" and after_kill["restarts"] == 0, after_kill
        assert after_kill["tasks"] == before["tasks"], (before, after_kill)  # same attempt, same pid

        # An operator's restart (a config change, an upgrade): the same.
        restarted = host.ssh(["systemctl", "restart", UNITS[1]])
        assert restarted.returncode == 0, restarted.stderr + journal()
        since = time.monotonic()
        pid = agent_unit(host)["MainPID"]
        wait_until(lambda: job()["ready"] == 1 and job()["tasks"] == before["tasks"], 30,
                   what="the agent back after systemctl restart, the task kept")

        # The watchdog: past WatchdogSec with nothing restarted, so the agent kept telling systemd it is alive.
        time.sleep(max(0.0, WATCHDOG_SECONDS + 5 - (time.monotonic() - since)))
        unit = agent_unit(host)
        # (systemd counts automatic restarts since the last one an operator asked for: none.)
        assert unit["MainPID"] == pid and unit["NRestarts"] == "0" and unit["ActiveState"] == "active", \
            f"{unit}\n{journal()}"
        assert job()["restarts"] == 0

        again = tfcluster("up", str(cluster))
        assert again.returncode == 0 and "nothing to change: 1 host(s)" in again.stdout, again.stdout + again.stderr

        assert tfcluster("stop", job()["id"]).returncode == 0
        gone = tfcluster("down", str(cluster))
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert host.ssh(["systemctl", "is-active", *UNITS]).stdout.split() == ["inactive"] * 2
        assert host.ssh(["ls", "/etc/systemd/system/"]).stdout.split().count(UNITS[0]) == 0, "down left a unit"
        assert host.ssh(["systemctl", "cat", UNITS[1]]).returncode != 0, "down left a unit systemd still knows"
        assert host.ssh(["pgrep", "-f", "tfcluster"]).stdout == ""
