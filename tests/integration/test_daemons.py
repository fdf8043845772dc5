"""Daemons coming and going: a killed agent turns LOST, a returning node never runs an old attempt,
a restarted agent reattaches to its tasks, a restarted coordinator loses no job, NVML-less nodes
register as CPU only."""

from __future__ import annotations

import os
import sys
import time

from harness import job_processes, kill_group, wait_until

PY = sys.executable


def start(cluster, *args) -> str:
    return cluster.cli("start", *args, check=True).stdout.strip()


def test_killed_agent_turns_lost_and_its_old_attempt_is_stopped_when_it_returns(make_cluster):
    cluster = make_cluster(lost_after=2.0)
    cluster.start_agent("a")
    cluster.start_agent("b")
    job_id = start(cluster, "--name", "lossy", "--strategy", "multi_worker_mirrored", "--workers", "2",
                   "--max-restarts", "0", "--", "sleep", "300")
    job = wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 20,
                     what="RUNNING")
    on_b = next(t for t in job["tasks"] if t["node"] == "b")
    killed = time.monotonic()
    cluster.agents["b"].kill()
    wait_until(lambda: cluster.node_state("b") == "LOST", 10, interval=0.05, what="b to be LOST")
    assert time.monotonic() - killed < 2.0 + 1.5, "LOST later than the timeout allows"
    job = cluster.wait_job(job_id, timeout=20)
    assert job["state"] == "FAILED"
    lost = next(t for t in job["tasks"] if t["node"] == "b")
    assert lost["state"] == "LOST" and "node b lost" in job["message"]
    # The task on b outlived its agent (agents never take tasks down with them) ...
    assert any(p.pid == on_b["pid"] for p in job_processes(job_id))
    # ... and when b's agent comes back, the coordinator has it stopped: that attempt is stale.
    cluster.start_agent("b")
    try:
        wait_until(lambda: job_processes(job_id) == [], 30, what="the stale task to be stopped")
    except AssertionError as e:  # which process is left, and what b's agent and the coordinator made of it
        left = [(p.pid, p.ppid(), p.cmdline()) for p in job_processes(job_id)]
        raise AssertionError(f"{e}\nleft: {left}\nagent b:\n{cluster.agents['b'].log()[-6000:]}\n"
                             f"coordinator:\n{cluster.coordinator.log()[-6000:]}") from None


def test_an_agent_killed_and_restarted_after_its_node_was_lost_costs_its_job_nothing(make_cluster):
    cluster = make_cluster(3.0, "--tasks-lost-after", "20")  # the default task grace
    cluster.start_agents({"a": {}, "b": {}})
    job_id = start(cluster, "--name", "patient", "--strategy", "multi_worker_mirrored", "--workers", "2", "--",
                   "sleep", "300")
    job = wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 30,
                     what="RUNNING")
    pids = sorted(t["pid"] for t in job["tasks"])
    cluster.agents["b"].kill()
    wait_until(lambda: cluster.node_state("b") == "LOST", 10, interval=0.05, what="b to be LOST")
    assert cluster.job(job_id)["state"] == "RUNNING", "a LOST node's tasks are given the grace"
    wait_until(lambda: "this task counts as lost in" in next(t for t in cluster.job(job_id)["tasks"]
                                                             if t["node"] == "b")["message"], 10, what="status to say so")
    cluster.start_agent("b")  # as systemd restarts it, a moment too late
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING" and job["restarts"] == 0 and sorted(t["pid"] for t in job["tasks"]) == pids
    assert [t["attempt"] for t in job["tasks"]] == [1, 1]

    # A host that dies with its tasks: the job restarts once the grace is over (no peer of a `sleep` fails).
    on_b = next(t for t in job["tasks"] if t["node"] == "b")
    cluster.agents["b"].kill()
    kill_group(os.getpgid(on_b["pid"]))  # the task's process group, its shim's
    job = wait_until(lambda: (lambda j: j if j["restarts"] == 1 and j["state"] == "RUNNING" else None)(
        cluster.job(job_id)), 60, what="the job restarted after the grace")
    assert "node b lost" in job["message"] and {t["node"] for t in job["tasks"]} == {"a"}


def test_an_agent_stopped_for_a_restart_says_so_and_is_waited_for_longer(make_cluster):
    cluster = make_cluster(3.0, "--tasks-lost-after", "2")  # the grace of an unannounced silence, made short
    cluster.start_agent("a")
    job_id = start(cluster, "--name", "upgrade", "--strategy", "mirrored", "--", "sleep", "300")
    job = wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 30,
                     what="RUNNING")
    cluster.agents["a"].terminate()  # SIGTERM, as systemd stops the unit: the agent says it leaves its tasks running
    wait_until(lambda: "node a's agent is stopping and leaves its 1 task(s) running" in cluster.coordinator.log(), 10,
               what="the coordinator to hear it")
    wait_until(lambda: cluster.node_state("a") == "LOST", 10, what="a LOST")
    time.sleep(3.0 + 2.0 + 1.0)  # past --lost-after and --tasks-lost-after
    assert cluster.job(job_id)["state"] == "RUNNING", "an announced restart is waited for longer"
    cluster.start_agent("a")
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING" and job["restarts"] == 0 and job["tasks"][0]["attempt"] == 1


def test_restarted_agent_reattaches_and_reports_the_exit(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agent("a")
    gate = tmp_path / "go"
    script = (f"import pathlib, time, sys\n"
              f"print('waiting', flush=True)\n"
              f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)\n"
              f"print('done', flush=True); sys.exit(7)\n")
    job_id = start(cluster, "--name", "reattach", "--strategy", "mirrored", "--max-restarts", "0", "--",
                   PY, "-c", script)
    job = wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 20,
                     what="RUNNING")
    pid = job["tasks"][0]["pid"]
    cluster.agents["a"].kill()
    gate.touch()  # the task ends while no agent watches it
    wait_until(lambda: not any(p.pid == pid for p in job_processes(job_id)), 10, what="the task to end")
    cluster.start_agent("a")
    job = cluster.wait_job(job_id, timeout=20)
    assert job["state"] == "FAILED"
    task = job["tasks"][0]
    assert task["exit_code"] == 7 and task["attempt"] == 1 and task["pid"] == pid
    assert cluster.cli("logs", job_id, "worker:0", check=True).stdout == "waiting\ndone\n"


def test_restarted_coordinator_keeps_jobs_and_tasks(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agent("a")
    gate = tmp_path / "go"
    script = (f"import pathlib, time\n"
              f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)\n")
    job_id = start(cluster, "--name", "survivor", "--strategy", "mirrored", "--", PY, "-c", script)
    job = wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 20,
                     what="RUNNING")
    pid = job["tasks"][0]["pid"]
    cluster.coordinator.kill()
    cluster.start_coordinator()
    wait_until(lambda: cluster.node_state("a") == "READY", 20, what="the agent to re-register")
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING" and job["tasks"][0]["pid"] == pid and job["tasks"][0]["attempt"] == 1
    gate.touch()
    job = cluster.wait_job(job_id, timeout=20)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 0 and job["tasks"][0]["attempt"] == 1


def test_a_node_lost_for_longer_than_the_setting_is_forgotten_across_a_coordinator_restart(make_cluster):
    """`--forget-lost-nodes-after`: a LOST node leaves `status` once it has been lost that long, counted from its
    loss even when the coordinator restarted meanwhile; one an admin drained stays; the forgotten node's agent,
    started again, registers anew."""
    forget = ("--forget-lost-nodes-after", "8s")
    cluster = make_cluster(2.0, *forget)
    cluster.start_agents({"a": {}, "b": {}, "c": {}})
    cluster.cli("node", "drain", "c", "--reason", "PSU swap", check=True)
    cluster.lose_node("b")
    cluster.lose_node("c")
    wait_until(lambda: cluster.node_state("b") == cluster.node_state("c") == "LOST", 10, interval=0.05,
               what="b and c to be LOST")
    lost = time.monotonic()
    cluster.coordinator.kill()
    cluster.start_coordinator(*forget)
    wait_until(lambda: cluster.node_state("a") == "READY", 20, what="a to register again")
    assert cluster.node_state("b") == "LOST", "what it knew of b outlived the restart"
    wait_until(lambda: "b" not in {n["name"] for n in cluster.status()["nodes"]}, 20, interval=0.2,
               what="b to be forgotten")
    assert time.monotonic() - lost > 8 - 1, "not before its time"
    nodes = {n["name"]: n for n in cluster.status()["nodes"]}
    assert nodes["a"]["state"] == "READY" and nodes["c"]["state"] == "LOST", "the drained node stays"
    assert nodes["c"]["drain"]["reason"] == "PSU swap" and nodes["c"]["last_seen_seconds_ago"] < 60
    assert "node b forgotten: LOST for" in cluster.coordinator.log()
    cluster.start_agent("b")
    wait_until(lambda: cluster.node_state("b") == "READY", 20, what="b's agent to register anew")


def test_agent_without_nvml_registers_cpu_only(make_cluster):
    cluster = make_cluster()
    state = cluster.root / "agents" / "plain"
    state.mkdir(parents=True)
    from harness import Daemon, port_block
    base = port_block()
    daemon = Daemon("plain", ["agent", "--coordinator", cluster.address, "--name", "plain", "--port-range",
                              f"{base}-{base + 9}", "--state-dir", str(state), *cluster.agent_trust_args()],
                    cluster.root / "agent-plain.log")
    cluster.agents["plain"] = daemon.start(env={"LD_LIBRARY_PATH": ""})
    wait_until(lambda: cluster.node_state("plain") == "READY", 20, what="registration")
    node = next(n for n in cluster.status()["nodes"] if n["name"] == "plain")
    assert node["gpus"] == []
    assert node["address"] == "127.0.0.1", "the address that reaches the coordinator is advertised"
    nvml_lines = [line for line in daemon.log().splitlines() if "NVML" in line]
    assert len(nvml_lines) == 1 and "CPU only" in nvml_lines[0]


def test_agent_rejects_bad_flags_with_one_line(make_cluster, tmp_path):
    cluster = make_cluster()
    bad_inventory = tmp_path / "gpus.json"
    bad_inventory.write_text('[{"index": 0, "memory": 5}]')
    for args, needle in (
        (["--port-range", "9000"], "--port-range"),
        (["--gpu-inventory", str(bad_inventory)], "unknown key 'memory'"),
        (["--gpu-inventory", str(tmp_path / "missing.json")], "cannot read GPU inventory"),
        (["--advertise-address", "not-an-ip"], "--advertise-address"),
    ):
        result = cluster.cli("agent", "--coordinator", cluster.address, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr


def test_coordinator_down_longer_than_the_node_timeout_loses_nothing(make_cluster, tmp_path):
    cluster = make_cluster(lost_after=2.0)
    cluster.start_agent("a")
    gate = tmp_path / "go"
    script = (f"import pathlib, time\n"
              f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)\n")
    job_id = start(cluster, "--name", "outage", "--strategy", "multi_worker_mirrored", "--workers", "2", "--",
                   PY, "-c", script)
    wait_until(lambda: cluster.job(job_id)["state"] == "RUNNING", 20, what="RUNNING")
    cluster.coordinator.kill()
    time.sleep(5)  # agents retry with backoff meanwhile; their tasks keep running
    gate.touch()   # and the tasks finish while nobody coordinates
    cluster.start_coordinator()
    job = cluster.wait_job(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED", job
    assert job["restarts"] == 0 and all(t["attempt"] == 1 for t in job["tasks"])


def test_port_taken_by_another_program_moves_the_task(make_cluster):
    import socket
    cluster = make_cluster()
    from harness import port_block
    base = port_block()
    blocker = socket.socket()
    blocker.bind(("0.0.0.0", base + 1))  # the first task port (the agent's own comes before it)
    blocker.listen()
    try:
        cluster.start_agent("a", ports=(base, base + 5))
        job_id = start(cluster, "--name", "busy", "--strategy", "mirrored", "--max-restarts", "0", "--",
                       PY, "-c", "import os; print(os.environ['TFCLUSTER_PORT'])")
        job = cluster.wait_job(job_id)
        assert job["state"] == "SUCCEEDED", job
        assert job["restarts"] == 0
        port = int(cluster.cli("logs", job_id, "worker:0", check=True).stdout)
        assert base + 1 < port <= base + 5
        assert job["tasks"][0]["address"] == f"127.0.0.1:{port}"
    finally:
        blocker.close()


def test_hang_watchdog_restarts_a_silent_job_then_gives_up(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    spec_path = cluster.root / "hang.toml"
    spec_path.write_text(f'name = "hangs"\nstrategy = "mirrored"\nstop_grace_seconds = 1\n'
                         f'command = ["{PY}", "-c", "import time; print(1, flush=True); time.sleep(600)"]\n'
                         f'[restart]\nmax_restarts = 1\nhang_seconds = 2\n')
    job_id = cluster.cli("start", str(spec_path), check=True).stdout.strip()
    job = cluster.wait_job(job_id, timeout=30)
    assert job["state"] == "FAILED" and job["restarts"] == 1
    assert "hung" in job["message"] and "hang_seconds = 2" in job["message"]
    assert job["last_failure"]["task"] == "job"
    assert job_processes(job_id) == []


def test_last_failure_shows_the_task_its_exit_and_its_last_lines(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    job_id = start(cluster, "--name", "crash", "--strategy", "mirrored", "--max-restarts", "0", "--",
                   PY, "-c", "import sys\nfor i in range(30): print('line', i)\nsys.exit('boom: bad input')")
    job = cluster.wait_job(job_id)
    failure = job["last_failure"]
    assert failure["task"] == "worker:0" and failure["node"] == "a" and failure["exit_code"] == 1
    assert failure["log_tail"][-1] == "boom: bad input" and failure["log_tail"][-2] == "line 29"
    assert failure["description"] == "worker:0 on a exited with code 1"
    table = cluster.cli("status", job_id, check=True).stdout
    assert "last failure: worker:0 on a exited with code 1" in table and "boom: bad input" in table


def test_parameter_server_worker_killed_restarts_alone(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agent("a")
    cluster.start_agent("b")
    gate = tmp_path / "go"
    server = ("import os, socket, time\n"
              "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              "s.bind(('0.0.0.0', int(os.environ['TFCLUSTER_PORT']))); s.listen()\n"
              "print('serving attempt', os.environ['TFCLUSTER_ATTEMPT'], flush=True)\n"
              "time.sleep(600)\n")
    chief = f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)\n"
    spec_path = tmp_path / "ps.toml"
    spec_path.write_text(f'name = "psw"\nstrategy = "parameter_server"\nstop_grace_seconds = 1\n'
                         f'command = ["{PY}", "-c", "{chief.encode("unicode_escape").decode()}"]\n'
                         f'[roles.chief]\n[roles.ps]\ncount = 1\n'
                         f'command = ["{PY}", "-c", "{server.encode("unicode_escape").decode()}"]\n'
                         f'[roles.worker]\ncount = 2\n'
                         f'command = ["{PY}", "-c", "{server.encode("unicode_escape").decode()}"]\n')
    job_id = cluster.cli("start", str(spec_path), check=True).stdout.strip()
    job = wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 30,
                     what="RUNNING")
    before = {f"{t['type']}:{t['index']}": (t["attempt"], t["pid"]) for t in job["tasks"]}
    import os
    import signal
    os.kill(before["worker:1"][1], signal.SIGKILL)
    def worker_back():
        job = cluster.job(job_id)
        worker = next(t for t in job["tasks"] if (t["type"], t["index"]) == ("worker", 1))
        running = worker["attempt"] == 2 and all(t["state"] == "RUNNING" for t in job["tasks"])
        return job if running and job["state"] == "RUNNING" else None
    job = wait_until(worker_back, 30, what="worker:1 to run again")
    after = {f"{t['type']}:{t['index']}": (t["attempt"], t["pid"]) for t in job["tasks"]}
    assert after["worker:1"][0] == 2
    assert {k: v for k, v in after.items() if k != "worker:1"} == \
        {k: v for k, v in before.items() if k != "worker:1"}, "nothing else was restarted"
    assert job["restarts"] == 1 and "restarting worker:1 alone" in job["message"]
    gate.touch()
    assert cluster.wait_job(job_id)["state"] == "SUCCEEDED"
    assert job_processes(job_id) == []
