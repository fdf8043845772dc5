"""The plan of `tfcluster up` for one host, from what its probe found: a host as it should be gets no step, and
each difference gets the step that removes it and no other."""

from __future__ import annotations

import hashlib

from tfcluster.bringup.desired import (AGENT_UNIT, COORDINATOR_UNIT, ENV_FILE, JOIN_TOKEN_FILE, UNIT_DIR, desired,
                                       env_file)
from tfcluster.bringup.inventory import parse
from tfcluster.bringup.plan import HostPlan, plan_down, plan_up, probed_dirs, with_token

INVENTORY = parse({"software": {"extras": []}, "coordinators": [{"host": "10.0.0.1"}],
                   "nodes": [{"host": "10.0.0.11", "gpus": 0, "port_range": "21000-21099"}]})
COORDINATOR, AGENT = INVENTORY.hosts
CA = {name: name.encode() for name in ("ca.crt", "ca.key", "coordinator.crt", "coordinator.key")}
SOFTWARE = "0.8.0+abc"


def settled(host) -> dict:
    """What the probe finds on a host that `up` brought up."""
    wanted = desired(INVENTORY, host, CA)
    return {"software": SOFTWARE, "files": {p: hashlib.sha256(f.data).hexdigest() for p, f in wanted.files.items()},
            "running": {s: True for s in wanted.services}, "joined": True,
            "dirs": {d: True for d in probed_dirs(INVENTORY.software)}}


def plan(host, facts):
    return plan_up(host, desired(INVENTORY, host, CA), facts, INVENTORY.software, SOFTWARE)


def test_a_host_as_it_should_be_gets_no_step():
    for host in INVENTORY.hosts:
        assert plan(host, settled(host)).changes == []


def test_a_bare_agent_gets_the_software_its_files_a_start_and_a_token():
    p = plan(AGENT, {"files": {}, "running": {}, "joined": False})
    kinds = [s.action["kind"] for s in p.steps]
    assert kinds == ["install", "write", "write", "write", "start"] and p.needs_wheelhouse and p.needs_token
    assert p.steps[0].action["requirement"] == "tfcluster==0.8.0"
    steps = with_token(p, "secret")
    assert [s.action["kind"] for s in steps][-2:] == ["write", "start"]
    assert steps[-2].action["path"] == JOIN_TOKEN_FILE and steps[-2].action["mode"] == "600"
    assert all("secret" not in s.name for s in steps), "the token is never printed"


def test_a_changed_env_file_is_rewritten_and_restarts_what_reads_it():
    facts = settled(AGENT)
    facts["files"][ENV_FILE] = "0" * 64
    p = plan(AGENT, facts)
    assert [s.name for s in p.steps] == [f"rewrite {ENV_FILE} (600)",
                                        f"start {AGENT_UNIT} ({ENV_FILE} changed)"]


def test_a_stopped_service_is_started_and_nothing_else():
    facts = settled(COORDINATOR)
    facts["running"][COORDINATOR_UNIT] = False
    assert plan(COORDINATOR, facts).changes == [f"start {COORDINATOR_UNIT} (it was not running)"]


def test_the_coordinator_alone_gets_the_ca_key_and_files_are_root_only():
    coordinator, agent = desired(INVENTORY, COORDINATOR, CA), desired(INVENTORY, AGENT, CA)
    assert coordinator.files["/etc/tfcluster/ca/ca.key"].mode == 0o600
    assert not any("ca.key" in path for path in agent.files)
    assert agent.files[ENV_FILE].mode == 0o600
    env = env_file(INVENTORY, AGENT).decode()
    assert "TFCLUSTER_JOIN_TOKEN_FILE=/etc/tfcluster/join-token" in env and "TFCLUSTER_GPU_INVENTORY=none" in env
    assert "PATH=/opt/tfcluster/bin:" in env and "TFCLUSTER_COORDINATOR=10.0.0.1:7070" in env


def test_down_stops_removes_and_keeps_the_state_unless_purged():
    facts = settled(AGENT)
    kept = plan_down(AGENT, [AGENT_UNIT], facts, INVENTORY.software, purge=False)
    assert kept.changes == [f"stop {AGENT_UNIT}", f"remove {UNIT_DIR}/{AGENT_UNIT}, /opt/tfcluster"]
    purged = plan_down(AGENT, [AGENT_UNIT], facts, INVENTORY.software, purge=True)
    assert purged.steps[-1].action["paths"][-3:] == ["/etc/tfcluster", "/var/lib/tfcluster", "/var/log/tfcluster"]
    gone = {"files": {}, "running": {}, "dirs": {}}
    assert plan_down(AGENT, [AGENT_UNIT], gone, INVENTORY.software, purge=True).changes == []


def test_a_coordinator_host_that_is_a_node_starts_its_agent_only_once_it_can_join():
    from tfcluster.bringup.plan import Step, until_agent_starts  # noqa: I001
    plan = HostPlan(None, steps=[Step("install", {"kind": "install"}), Step("write env", {"kind": "write"}),
                                 Step("start coordinator", {"kind": "start", "service": COORDINATOR_UNIT}),
                                 Step("start agent", {"kind": "start", "service": AGENT_UNIT})])
    now, later = until_agent_starts(plan)
    assert [s.name for s in now] == ["install", "write env", "start coordinator"]
    assert [s.name for s in later] == ["start agent"]
    assert until_agent_starts(HostPlan(None, steps=now)) == (now, [])
