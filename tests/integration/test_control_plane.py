"""The control plane with real processes: a coordinator and three agents on loopback, driven by the CLI."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import grpc
import pytest

from harness import job_processes, wait_until
from tfcluster import grpc_settings
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc, control_pb2, control_pb2_grpc
from tfcluster.api.v1 import types_pb2 as pb

PY = sys.executable


def write_spec(tmp_path, text: str, name: str = "job.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def start(cluster, *args) -> str:
    result = cluster.cli("start", *args, check=True)
    job_id = result.stdout.strip()
    assert job_id and "\n" not in job_id, f"stdout must be the job id alone, got {result.stdout!r}"
    return job_id


def test_agents_register_with_their_inventory(shared_cluster):
    result = shared_cluster.cli("status", "--json", check=True)
    status = json.loads(result.stdout)
    nodes = {n["name"]: n for n in status["nodes"]}
    assert set(nodes) == {"a", "b", "c"}
    for name, count in (("a", 2), ("b", 2), ("c", 0)):
        node = nodes[name]
        assert node["state"] == "READY"
        assert node["address"] == "127.0.0.1"
        assert node["gpus"] == [{"index": i, "uuid": f"GPU-{name}-{i}", "name": "Test GPU", "memory_mib": 16384}
                                for i in range(count)]
        assert node["cpu_count"] >= 1 and node["memory_bytes"] > 0
        assert node["agent_version"]


def test_status_table_renders_nodes(shared_cluster):
    result = shared_cluster.cli("status", check=True)
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.strip()}
    assert rows["NODE"][:3] == ["NODE", "ADDRESS", "STATE"]
    for name in ("a", "b", "c"):
        assert rows[name][2] == "READY", result.stdout
    assert "READY" in result.stdout


def test_job_lifecycle_with_environment_and_placement(shared_cluster, tmp_path):
    spec = write_spec(tmp_path, f"""
        name = "envcheck"
        strategy = "multi_worker_mirrored"
        command = ["{PY}", "-c", "import os, json; print(json.dumps({{k: v for k, v in os.environ.items() if k.startswith(('TF', 'CUDA', 'EXTRA', 'GRPC'))}}))"]
        env = {{ EXTRA = "yes" }}
        [roles.worker]
        count = 2
        gpus = 1
    """)
    job_id = start(shared_cluster, str(spec))
    job = shared_cluster.wait_job(job_id)
    assert job["state"] == "SUCCEEDED", job
    assert job["strategy"] == "multi_worker_mirrored"
    tasks = {f"{t['type']}:{t['index']}": t for t in job["tasks"]}
    assert set(tasks) == {"worker:0", "worker:1"}
    used = set()
    for key, task in tasks.items():
        assert task["state"] == "SUCCEEDED" and task["exit_code"] == 0 and task["attempt"] == 1
        assert task["node"] in ("a", "b"), "GPU tasks only go to nodes with GPUs"
        assert len(task["gpus"]) == 1
        used.add((task["node"], task["gpus"][0]["index"]))
    assert len(used) == 2, "one GPU is never given to two tasks"
    cluster_addresses = [tasks["worker:0"]["address"], tasks["worker:1"]["address"]]
    for key, task in tasks.items():
        out = shared_cluster.cli("logs", job_id, key, check=True).stdout
        env = json.loads(out)
        tf_config = json.loads(env["TF_CONFIG"])
        assert tf_config == {"cluster": {"worker": cluster_addresses}, "task": {"type": "worker", "index": task["index"]}}
        assert env["CUDA_VISIBLE_DEVICES"] == task["gpus"][0]["uuid"]
        assert env["TF_USE_LEGACY_KERAS"] == "1"
        assert env["TFCLUSTER_JOB_ID"] == job_id
        assert env["TFCLUSTER_TASK_TYPE"] == "worker" and env["TFCLUSTER_TASK_INDEX"] == str(task["index"])
        assert env["TFCLUSTER_ATTEMPT"] == "1"
        assert env["TFCLUSTER_CHECKPOINT_DIR"].endswith(f"/jobs/{job_id}/checkpoints")
        assert env["TFCLUSTER_MODEL_DIR"] == env["TFCLUSTER_CHECKPOINT_DIR"]
        assert env["EXTRA"] == "yes"
        # The agent's own gRPC settings (tfcluster/grpc_settings.py) are not the task's: a program that forks
        # without exec keeps gRPC's fork handlers.
        assert not set(env) & set(grpc_settings.SETTINGS), env
    # Ports and GPUs are released once the tasks end.
    nodes = {n["name"]: n for n in shared_cluster.status()["nodes"]}
    assert all(n["running_tasks"] == 0 for n in nodes.values())


def test_logs_are_exact_with_tail_and_follow(shared_cluster):
    script = ("import sys, time\n"
              "for i in range(5): print(f'line {i}', flush=True)\n"
              "sys.stderr.write('to stderr\\n'); sys.stderr.flush()\n"
              "sys.stdout.write('no newline at end'); sys.stdout.flush()\n"
              "time.sleep(2)\n")
    job_id = start(shared_cluster, "--name", "logs", "--strategy", "mirrored", "--workers", "1", "--", PY, "-c", script)
    follow = shared_cluster.cli("logs", job_id, "worker:0", "-f", check=True)
    expected = "line 0\nline 1\nline 2\nline 3\nline 4\nto stderr\nno newline at end"
    assert follow.stdout == expected
    assert shared_cluster.job(job_id)["state"] in ("SUCCEEDED", "STOPPING")
    assert shared_cluster.cli("logs", job_id, "worker:0", check=True).stdout == expected
    assert shared_cluster.cli("logs", job_id, "worker:0", "--tail", "2", check=True).stdout == \
        "to stderr\nno newline at end"


def test_failed_task_fails_job_with_cause_and_stops_the_rest(shared_cluster):
    script = ("import os, sys, time\n"
              "if os.environ['TFCLUSTER_TASK_INDEX'] == '1':\n"
              "    print('giving up', flush=True); sys.exit(3)\n"
              "time.sleep(60)\n")
    job_id = start(shared_cluster, "--name", "fails", "--strategy", "multi_worker_mirrored", "--workers", "2",
                   "--max-restarts", "0", "--", PY, "-c", script)
    job = shared_cluster.wait_job(job_id, timeout=60)
    assert job["state"] == "FAILED"
    assert "worker:1" in job["message"] and "exited with code 3" in job["message"]
    tasks = {t["index"]: t for t in job["tasks"]}
    assert tasks[1]["state"] == "FAILED" and tasks[1]["exit_code"] == 3
    assert tasks[0]["state"] == "STOPPED"
    assert job_processes(job_id) == []


def test_failed_group_restarts_and_resumes(shared_cluster, tmp_path):
    marker = tmp_path / "failed-once"
    script = ("import os, sys, pathlib\n"
              f"m = pathlib.Path({str(marker)!r})\n"
              "print('attempt', os.environ['TFCLUSTER_ATTEMPT'], flush=True)\n"
              "if os.environ['TFCLUSTER_TASK_INDEX'] == '1' and not m.exists():\n"
              "    m.touch(); sys.exit(1)\n")
    job_id = start(shared_cluster, "--name", "restarts", "--strategy", "multi_worker_mirrored", "--workers", "2",
                   "--max-restarts", "1", "--", PY, "-c", script)
    job = shared_cluster.wait_job(job_id, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    assert job["restarts"] == 1
    for task in job["tasks"]:
        assert task["attempt"] == 2
    out = shared_cluster.cli("logs", job_id, "worker:1", "--attempt", "1", check=True).stdout
    assert out == "attempt 1\n"


def test_stop_kills_the_process_group_after_the_grace_period(shared_cluster, tmp_path):
    # The task ignores SIGTERM and leaves a grandchild: only SIGKILL to the group ends both.
    spec = write_spec(tmp_path, """
        name = "stubborn"
        strategy = "mirrored"
        command = ["sh", "-c", "trap '' TERM; sleep 300 & echo started; wait"]
        stop_grace_seconds = 1
        [roles.worker]
        count = 1
    """)
    job_id = start(shared_cluster, str(spec))
    wait_until(lambda: shared_cluster.cli("logs", job_id, "worker:0").stdout == "started\n", 20,
               what="the task to start")
    assert len(job_processes(job_id)) >= 2
    began = time.monotonic()
    result = shared_cluster.cli("stop", job_id, check=True)
    assert "STOPPED" in result.stderr
    assert time.monotonic() - began >= 1.0, "SIGKILL came before the grace period"
    assert shared_cluster.job(job_id)["state"] == "STOPPED"
    assert job_processes(job_id) == []


def test_job_waits_pending_until_it_fits(shared_cluster):
    hold = start(shared_cluster, "--name", "hold", "--strategy", "multi_worker_mirrored", "--workers", "2",
                 "--gpus-per-task", "2", "--", "sleep", "3")
    waiting = start(shared_cluster, "--name", "waiting", "--strategy", "mirrored", "--workers", "1",
                    "--gpus-per-task", "2", "--", "true")
    job = shared_cluster.job(waiting)
    assert job["state"] == "PENDING"
    assert "waiting for resources" in job["message"]
    assert shared_cluster.wait_job(hold)["state"] == "SUCCEEDED"
    assert shared_cluster.wait_job(waiting)["state"] == "SUCCEEDED"


def test_roles_pinned_to_nodes_and_role_overrides(shared_cluster, tmp_path):
    spec = write_spec(tmp_path, f"""
        name = "pinned"
        strategy = "multi_worker_mirrored"
        command = ["{PY}", "-c", "import os, time; print(os.environ['WHO'], flush=True); time.sleep(1.5)"]
        env = {{ WHO = "job" }}
        [roles.chief]
        nodes = ["b"]
        gpus = 1
        env = {{ WHO = "chief" }}
        [roles.worker]
        count = 1
        gpus = 1
        nodes = ["a"]
        [roles.evaluator]
        nodes = ["c"]
        gpus = 0
        command = ["{PY}", "-c", "import os, json; print(json.loads(os.environ['TF_CONFIG'])['task']['type'])"]
    """)
    job_id = start(shared_cluster, str(spec))
    job = shared_cluster.wait_job(job_id)
    assert job["state"] == "SUCCEEDED", job
    nodes = {f"{t['type']}:{t['index']}": t["node"] for t in job["tasks"]}
    assert nodes == {"chief:0": "b", "worker:0": "a", "evaluator:0": "c"}
    assert shared_cluster.cli("logs", job_id, "chief:0", check=True).stdout == "chief\n"
    assert shared_cluster.cli("logs", job_id, "worker:0", check=True).stdout == "job\n"
    assert shared_cluster.cli("logs", job_id, "evaluator:0", check=True).stdout == "evaluator\n"


def test_plan_shows_placement_and_tf_configs_without_launching(shared_cluster, tmp_path):
    spec = write_spec(tmp_path, """
        name = "planned"
        strategy = "multi_worker_mirrored"
        command = ["true"]
        [roles.worker]
        count = 2
        [roles.evaluator]
    """)
    result = shared_cluster.cli("plan", str(spec), "--json", check=True)
    plan = json.loads(result.stdout)
    assert plan["fits"] and plan["strategy"] == "multi_worker_mirrored"
    by_key = {f"{t['type']}:{t['index']}": t for t in plan["tasks"]}
    assert set(by_key) == {"worker:0", "worker:1", "evaluator:0"}
    workers = [by_key["worker:0"]["address"], by_key["worker:1"]["address"]]
    assert by_key["evaluator:0"]["tf_config"] == {"cluster": {"worker": workers},
                                                  "task": {"type": "evaluator", "index": 0}}
    assert not any(j["name"] == "planned" for j in shared_cluster.status()["jobs"])
    table = shared_cluster.cli("plan", str(spec), check=True).stdout
    assert "worker:1" in table and "TF_CONFIG" in table


@pytest.mark.parametrize("toml, needle", [
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["true"]\ncolour = 1\n', "colour: unknown key"),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["true"]\n[roles.worker]\ncount = "two"\n',
     'roles.worker.count: expected an integer, or "MIN..MAX" for an elastic worker count, got a string (\'two\')'),
    ('name = "x"\nstrategy = "mirrored"\ncommand = ["true"]\n[roles.ps]\ncount = 1\n', "roles.ps: ps tasks only"),
    ('name = "x"\nstrategy = "nope"\n', "strategy: expected one of"),
    ('name = "x"\nstrategy = [\n', "not valid TOML"),
])
def test_bad_spec_is_one_clear_line(shared_cluster, tmp_path, toml, needle):
    spec = tmp_path / "bad.toml"
    spec.write_text(toml)
    result = shared_cluster.cli("start", str(spec))
    assert result.returncode == 2
    assert result.stdout == ""
    assert needle in result.stderr and str(spec) in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


BASE = 'name = "x"\nstrategy = "mirrored"\n'


@pytest.mark.parametrize("content, needle", [
    (b'name = "x\xff"\nstrategy = "mirrored"\ncommand = ["true"]\n', "not UTF-8"),
    ((BASE + 'command = ["true"]\ncheckpoint_dir = "/ck\\u0000pt"\n').encode(), "checkpoint_dir: must not contain"),
    ((BASE + 'command = ["tr\\u0001ue"]\n').encode(), "command: must not contain control characters"),
    ((BASE + 'command = ["true"]\nenv = { A = "x\\u0000y" }\n').encode(), "env.A: must not contain"),
    ((BASE + 'command = ["true"]\nworkdir = "/tmp\\n"\n').encode(), "workdir: must not contain"),
    ((BASE + 'command = ["true"]\nstop_grace_seconds = nan\n').encode(), "stop_grace_seconds: expected a number"),
    ((BASE + 'command = ["true"]\n[restart]\nbackoff_seconds = inf\n').encode(), "restart.backoff_seconds"),
    (b'name = "x\\n"\nstrategy = "mirrored"\ncommand = ["true"]\n', "name: expected lowercase"),
    ((BASE + 'command = ["true"]\n[roles.worker]\nnodes = ["n1\\n"]\n').encode(), "roles.worker.nodes"),
])
def test_bad_bytes_and_values_in_a_spec_are_one_line(shared_cluster, tmp_path, content, needle):
    spec = tmp_path / "bad.toml"
    spec.write_bytes(content)
    for command in ("start", "plan"):
        result = shared_cluster.cli(command, str(spec))
        assert result.returncode == 2, result.stderr
        assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("args, needle", [
    (("logs", "x-1", "worker:99999999999"), "TYPE:INDEX"),
    (("logs", "x-1", "worker:0", "--tail", "99999999999"), "--tail"),
    (("start", "--name", "x", "--strategy", "mirrored", "-e", "A=b\x01", "--", "true"), "env.A"),
    (("start", "--name", "x", "--strategy", "mirrored", "--checkpoint-dir", "/a\nb", "--", "true"), "--checkpoint-dir"),
    (("start", "--name", "x", "--strategy", "mirrored", "--workers", "lots", "--", "true"), "--workers"),
    (("token", "create", "--ttl", "soon"), "--ttl"),
    (("token", "create", "--ttl", "0"), "--ttl"),
    (("token", "create", "--ttl", "90d"), "ttl_seconds"),
    (("token", "create", "--node", "two words"), "--node"),
    (("node", "remove", "bad\nname"), "NAME"),
    (("ca", "issue", "--dir", "/nonexistent", "--name", "bob", "--out", "/tmp/x"), "cannot read"),
    (("ca", "init", "--dir", "/tmp/x", "--san", "a b"), "--san"),
    (("agent", "--coordinator", "h:1", "--peer-quota", "lots"), "--peer-quota"),
    (("coordinator", "--insecure", "--node-cert-lifetime", "1s"), "--node-cert-lifetime"),
    (("stat",), "No such command"),
])
def test_bad_flags_are_one_line_and_exit_2(shared_cluster, args, needle):
    result = shared_cluster.cli(*args)
    assert result.returncode == 2, (args, result.stderr)
    assert needle in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_impossible_job_fails_at_once_with_the_reason(shared_cluster):
    result = shared_cluster.cli("start", "--name", "huge", "--strategy", "multi_worker_mirrored", "--workers", "2",
                                "--gpus-per-task", "8", "--", "true")
    assert result.returncode == 1 and result.stdout == ""
    assert "cannot ever be placed" in result.stderr and "8 GPUs" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_job_and_bad_task_names(shared_cluster):
    for args in (("status", "nope-1"), ("stop", "nope-1"), ("logs", "nope-1", "worker:0")):
        result = shared_cluster.cli(*args)
        assert result.returncode == 1, args
        assert "unknown job 'nope-1'" in result.stderr and "Traceback" not in result.stderr
    result = shared_cluster.cli("logs", "nope-1", "boss:0")
    assert result.returncode == 2 and "TYPE:INDEX" in result.stderr


def test_unreachable_coordinator_is_one_line(tmp_path):
    from harness import LocalCluster, free_port
    cluster = LocalCluster(root=tmp_path, address=f"127.0.0.1:{free_port()}", tls=False)
    result = cluster.cli("status")
    assert result.returncode == 1
    assert "cannot reach the coordinator" in result.stderr and "Traceback" not in result.stderr


def test_bad_rpc_fields_get_invalid_argument_and_the_coordinator_lives_on(shared_cluster):
    def job(**fields):
        return pb.JobSpec(**{"name": "x", "strategy": "mirrored", "command": ["true"], "workdir": "/tmp", **fields})
    with shared_cluster.channel() as channel, shared_cluster.channel("node", "z") as node_channel:
        control = control_pb2_grpc.ControlServiceStub(channel)
        agents = agent_pb2_grpc.AgentServiceStub(node_channel)
        bad_specs = [
            (job(command=[]), "roles.worker.command"),
            (job(name="Bad Name"), "name"),
            (job(name="x\n"), "name"),
            (job(roles={"boss": pb.RoleSpec(count=1)}), "roles.boss"),
            (job(strategy="multi_worker_mirrored", env={"TF_CONFIG": "{}"}, roles={"worker": pb.RoleSpec(count=1)}),
             "env.TF_CONFIG"),
            (job(workdir=""), "workdir"),
            (job(workdir="../.."), "workdir"),
            (job(checkpoint_dir="/ck\0pt"), "checkpoint_dir"),
            (job(command=["true", "a\0b"]), "command"),
            (job(env={"A": "x\0y"}), "env.A"),
            (job(stop_grace_seconds=float("nan")), "stop_grace_seconds"),
            (job(evaluator_deadline_seconds=float("inf")), "evaluator_deadline_seconds"),
            (job(restart=pb.RestartPolicy(max_restarts=3, hang_seconds=float("inf"))), "restart.hang_seconds"),
        ]
        for spec, field in bad_specs:
            with pytest.raises(grpc.RpcError) as info:
                control.SubmitJob(control_pb2.SubmitJobRequest(spec=spec), timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert f": {field}: " in info.value.details(), (field, info.value.details())

        def node(**fields):
            return pb.NodeInfo(**{"name": "z", "address": "127.0.0.2", "port_range_start": 30000,
                                  "port_range_end": 30099, "state_dir": "/var/lib/z", **fields})
        bad_nodes = [
            (node(port_range_start=9, port_range_end=2), "port_range"),
            (node(address="not an ip/../x"), "node.address"),
            (node(address="0.0.0.0"), "node.address"),
            (node(address="fd00::7"), "only IPv4"),
            (node(name="two\nlines"), "node.name"),
            (node(name="n" * 1_000_000), "node.name"),
            (node(peer_port=70000), "node.peer_port"),
            (node(state_dir=""), "node.state_dir"),
            (node(gpus=[pb.Gpu(index=i) for i in range(100_000)]), "node.gpus"),
            (node(gpus=[pb.Gpu(index=0), pb.Gpu(index=0)]), "node.gpus"),
        ]
        for info_msg, field in bad_nodes:
            with pytest.raises(grpc.RpcError) as info:
                agents.Register(agent_pb2.RegisterRequest(node=info_msg), timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert field in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            control.StreamLogs(control_pb2.StreamLogsRequest(job_id="x"), timeout=5).next()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert shared_cluster.coordinator.alive
    assert "z" not in {n["name"] for n in shared_cluster.status()["nodes"]}
    assert shared_cluster.cli("status", check=True).returncode == 0


def test_command_that_cannot_start_is_reported(shared_cluster):
    job_id = start(shared_cluster, "--name", "nocmd", "--strategy", "mirrored", "--workers", "1",
                   "--max-restarts", "0", "--", "/nonexistent/program")
    job = shared_cluster.wait_job(job_id)
    assert job["state"] == "FAILED"
    assert "/nonexistent/program" in job["message"]


def test_start_wait_exit_code_follows_the_job(shared_cluster):
    ok = shared_cluster.cli("start", "--name", "waitok", "--strategy", "mirrored", "--wait", "--", "true")
    assert ok.returncode == 0 and ok.stdout.strip().startswith("waitok-")
    bad = shared_cluster.cli("start", "--name", "waitbad", "--strategy", "mirrored", "--max-restarts", "0",
                             "--wait", "--", "false")
    assert bad.returncode == 1 and "FAILED" in bad.stderr


def test_status_watch_of_a_finished_job_prints_and_returns(shared_cluster):
    job_id = start(shared_cluster, "--name", "watched", "--strategy", "mirrored", "--", "true")
    shared_cluster.wait_job(job_id)
    result = shared_cluster.cli("status", job_id, "--watch", timeout=30, check=True)
    assert job_id in result.stdout and "SUCCEEDED" in result.stdout


def test_spec_flags_do_not_mix_with_a_spec_file(shared_cluster, tmp_path):
    spec = write_spec(tmp_path, 'name = "mixed"\nstrategy = "mirrored"\ncommand = ["true"]\n')
    result = shared_cluster.cli("start", str(spec), "--workers", "3")
    assert result.returncode == 2
    assert "--workers" in result.stderr and "spec file" in result.stderr
    ok = shared_cluster.cli("start", str(spec), "--wait")
    assert ok.returncode == 0, ok.stderr
