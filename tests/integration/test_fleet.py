"""A real coordinator with a few hundred fake agents (tests/fleet.py: the real wire API over real gRPC, one
connection each): all READY, status answers in bounded pages, and a submitted job reaches its agents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness import ROOT, Daemon, free_port, kill_group, wait_until
from tfcluster.api.v1 import control_pb2, control_pb2_grpc
from tfcluster.security import Credentials

AGENTS = 300


def start_fleet(address: str, count: int, cluster, *options: str) -> tuple[subprocess.Popen, list[dict]]:
    """tests/fleet.py with count agents given address; the events it prints, as they come."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fleet.py"), address, "0", str(count),
                             "--exit-after", "0.5", "--ca-dir", str(cluster.ca_dir), *options],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    events: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            events.append(json.loads(line))
    threading.Thread(target=read, daemon=True).start()
    return proc, events


@pytest.fixture
def fleet(make_cluster):
    cluster = make_cluster()
    proc, events = start_fleet(cluster.address, AGENTS, cluster)
    try:
        yield cluster, events
    finally:
        kill_group(proc.pid)
        proc.wait()


def registered_with(events: list[dict]) -> dict:
    """How many of the fleet's agents last registered with each coordinator (none: not named), as it last said."""
    return ([e["registered_with"] for e in list(events) if "registered_with" in e] or [{}])[-1]


def summary(cluster) -> dict:
    return cluster.status()["summary"]


def test_hundreds_of_agents_become_ready_and_status_stays_bounded(fleet):
    cluster, _ = fleet
    wait_until(lambda: summary(cluster)["nodes_by_state"].get("READY") == AGENTS, 60, interval=0.2,
               what=f"{AGENTS} fake agents READY")
    overview = cluster.status()
    assert overview["summary"]["gpus_total"] == AGENTS * 8 and overview["summary"]["gpus_allocated"] == 0
    assert len(overview["nodes"]) == 50, "the overview lists the first nodes, not all of them"
    with Credentials.from_dir(cluster.admin_dir).channel(cluster.address) as channel:
        control = control_pb2_grpc.ControlServiceStub(channel)
        for _ in range(20):  # answers while the fleet heartbeats
            control.GetStatus(control_pb2.GetStatusRequest(), timeout=5)
        pages = []
        token = ""
        while True:
            page = control.ListNodes(control_pb2.ListNodesRequest(page_size=128, page_token=token), timeout=5)
            pages.append([n.name for n in page.nodes])
            token = page.next_page_token
            if not token:
                break
    assert [len(p) for p in pages] == [128, 128, 44]
    assert sum(pages, []) == sorted(f"fleet-{i:05d}" for i in range(AGENTS))
    everything = json.loads(cluster.cli("status", "--all", "--json", check=True).stdout)
    assert len(everything["nodes"]) == AGENTS and everything["summary"]["nodes_by_state"] == {"READY": AGENTS}
    table = cluster.cli("status", check=True).stdout
    assert f"showing 50 of {AGENTS} nodes" in table and "--all" in table


def test_a_job_reaches_its_fake_agents_and_succeeds(fleet, tmp_path):
    cluster, events = fleet
    wait_until(lambda: summary(cluster)["nodes_by_state"].get("READY") == AGENTS, 60, interval=0.2,
               what="the fleet")
    started = time.time()
    job_id = cluster.cli("start", "--name", "wide", "--strategy", "multi_worker_mirrored", "--workers", "2",
                         "--gpus-per-task", "8", "--", "train", check=True).stdout.strip()
    job = cluster.wait_job(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED", job["message"]
    arrived = [e["launch"] for e in list(events) if "launch" in e and e["launch"][0] == job_id]
    assert sorted(launch[1] for launch in arrived) == ["worker:0", "worker:1"]
    assert len({launch[2] for launch in arrived}) == 2, "8 GPUs each: two nodes"
    assert all(launch[3] >= started for launch in arrived)
    node = arrived[0][2]
    mine = json.loads(cluster.cli("status", "--node", node, "--json", check=True).stdout)
    assert [n["name"] for n in mine["nodes"]] == [node] and [j["id"] for j in mine["jobs"]] == [job_id]
    done = json.loads(cluster.cli("status", "--state", "succeeded", "--json", check=True).stdout)
    assert [j["id"] for j in done["jobs"]] == [job_id]


def test_fake_agents_given_several_coordinators_pass_over_one_that_does_not_answer(make_cluster, tmp_path):
    cluster = make_cluster()
    silent = f"127.0.0.1:{free_port()}"  # nothing listens there
    timeline = tmp_path / "timeline.tsv"
    proc, events = start_fleet(f"{silent},{cluster.address}", 20, cluster, "--timeline", str(timeline))
    try:
        wait_until(lambda: summary(cluster)["nodes_by_state"].get("READY") == 20, 60, interval=0.2,
                   what="20 fake agents READY")
        wait_until(lambda: registered_with(events) == {cluster.address: 20}, 10,
                   what="the fleet to say where its agents registered")
    finally:
        kill_group(proc.pid)
        proc.wait()
    # Its timeline (what bench/failover.py reads) says the same, agent by agent: a registration call to the silent
    # address that failed, then one to the coordinator and the registration, in this order.
    steps: dict[str, list[tuple[str, str, str]]] = {}
    for line in timeline.read_text().splitlines():
        at, node, what, address, detail = line.split("\t")
        assert abs(float(at) - time.time()) < 120
        steps.setdefault(node, []).append((what, address, detail))
    assert sorted(steps) == [f"fleet-{i:05d}" for i in range(20)]
    for node, seen in steps.items():
        assert seen[:2] == [("register", silent, ""), ("failed", silent, "UNAVAILABLE")], node
        assert seen[-2:] == [("register", cluster.address, ""), ("registered", cluster.address, "")], node


def test_fake_agents_leave_a_coordinator_that_gives_no_pulse(make_cluster, tmp_path):
    # As real agents given several coordinators: a coordinator that keeps their connections but answers nothing
    # (paused here) gives no pulse within 3 s, and the agents go to the next one.
    cluster = make_cluster()
    other = f"127.0.0.1:{free_port()}"
    second = Daemon("coordinator-b", ["coordinator", "--listen", other, "--join-listen", f"127.0.0.1:{free_port()}",
                                      "--state-dir", str(tmp_path / "b"), "--tls-dir", str(cluster.ca_dir)],
                    tmp_path / "coordinator-b.log").start()
    proc, events = start_fleet(f"{cluster.address},{other}", 20, cluster)
    paused = cluster.coordinator.proc.pid
    try:
        wait_until(lambda: registered_with(events) == {cluster.address: 20}, 60, interval=0.2,
                   what="20 fake agents registered with the first coordinator")
        os.kill(paused, signal.SIGSTOP)
        wait_until(lambda: registered_with(events) == {other: 20}, 30, interval=0.2,
                   what="the agents registered with the second coordinator")
        # Each left because of its pulse (the fleet counts its errors once a second).
        wait_until(lambda: [e["errors"] for e in list(events) if "errors" in e][-1].get("STALLED") == 20, 5,
                   interval=0.2, what="20 agents that found the first coordinator stalled")
    finally:
        os.kill(paused, signal.SIGCONT)
        kill_group(proc.pid)
        proc.wait()
        second.kill()


def test_a_fleet_past_the_heartbeat_bound_beats_less_often_and_stays_ready(make_cluster):
    # 100 agents on a coordinator bounded to 40 heartbeats a second: it tells them 2.5 s (and waits 7.5 s before a
    # node is lost), those registered before it grew included, so the fleet sends about 40 a second, not 100, and
    # no node is lost for it.
    cluster = make_cluster(3.0, "--max-heartbeats-per-second", "40")
    proc, events = start_fleet(cluster.address, 100, cluster)
    try:
        wait_until(lambda: summary(cluster)["nodes_by_state"].get("READY") == 100, 60, interval=0.2,
                   what="100 fake agents READY")

        def beats() -> tuple[float, int]:
            # The fleet's own count and the moment it counted: a busy fleet prints late, and the test's clock
            # would then stretch or shrink the window.
            last = [e for e in list(events) if "heartbeats" in e][-1]
            return last["at"], last["heartbeats"]
        told = "agents heartbeat every 2.5 s from now on, and a node is lost after 7.5 s"
        # The coordinator tells the agents registered before each stretch to a longer step at its next tick; each
        # then keeps the new interval from its next heartbeat on.
        wait_until(lambda: told in cluster.coordinator.log(), 20, interval=0.2, what="the agents told 2.5 s")
        time.sleep(3)
        began, first = beats()
        time.sleep(8)
        ended, last = beats()
        rate = (last - first) / (ended - began)
        assert 30 < rate < 50, f"{rate:.0f} heartbeats a second over {ended - began:.1f} s; the coordinator's log " \
            f"on pace: {[line for line in cluster.coordinator.log().splitlines() if 'heartbeat' in line][-5:]}"
        assert summary(cluster)["nodes_by_state"] == {"READY": 100}
    finally:
        kill_group(proc.pid)
        proc.wait()


def test_an_agent_whose_stream_opens_after_the_pace_was_told_is_told_it_too(make_cluster):
    """An agent is given the heartbeat interval when it registers; the cluster may stretch it before the agent's
    stream opens, and the agents told the new one are those whose streams are open at the next tick. One whose
    stream opens later is told as it opens (it failed once in CI: a third of a fleet registering at once kept
    beating every second)."""
    import asyncio

    import fleet
    from tfcluster import wire
    from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
    from tfcluster.commands import SetPace

    cluster = make_cluster(3.0, "--max-heartbeats-per-second", "2")
    credentials = fleet.FleetCredentials(cluster.ca_dir)
    told = "agents heartbeat every"

    async def scenario() -> tuple[float, list]:
        nodes = [fleet.node_info(i) for i in range(6)]
        channels = [credentials.channel(cluster.address, node.name, []) for node in nodes]
        try:
            replies = [await agent_pb2_grpc.AgentServiceStub(channel).Register(
                agent_pb2.RegisterRequest(node=wire.node_info_to_proto(node)), timeout=10)
                for node, channel in zip(nodes, channels)]
            # Six nodes at two heartbeats a second: stretched past the first one's interval, and told at the next
            # tick to the streams open then, of which there are none.
            deadline = time.monotonic() + 10
            while told not in cluster.coordinator.log() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            call = agent_pb2_grpc.AgentServiceStub(channels[0]).Connect()
            await call.write(agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name=nodes[0].name,
                                                                              session_id=replies[0].session_id)))
            commands = []
            try:
                while not any(isinstance(c, SetPace) for c in commands):
                    message = await asyncio.wait_for(call.read(), 5)
                    commands.append(wire.command_from_proto(message, nodes[0].name))
            except asyncio.TimeoutError:
                pass
            call.cancel()
            return replies[0].heartbeat_interval_seconds, commands
        finally:
            for channel in channels:
                await channel.close()

    registered_with, commands = asyncio.run(scenario())
    assert told in cluster.coordinator.log()
    paces = [c.heartbeat_interval_seconds for c in commands if isinstance(c, SetPace)]
    assert registered_with == 1.0 and len(paces) == 1 and paces[0] > 1.0, (registered_with, commands)
