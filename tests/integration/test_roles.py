"""Role behaviour with plain-Python programs (fast, no TensorFlow): the evaluator's reports and the
training-finished handshake, an evaluator known only by its TensorBoard summaries, the deadline, and
parameter_server's start order."""

from __future__ import annotations

import sys
import textwrap

from harness import job_processes

PY = sys.executable

TRAINER = """
import os, time
d = os.environ["TFCLUSTER_CHECKPOINT_DIR"]
for n in range(1, 4):
    time.sleep(0.3)
    for ext in (".index", ".data-00000-of-00001"):
        open(os.path.join(d, f"ckpt-{n}{ext}"), "w").close()
    with open(os.path.join(d, "checkpoint.tmp"), "w") as f:
        f.write(f'model_checkpoint_path: "ckpt-{n}"\\n')
    os.replace(os.path.join(d, "checkpoint.tmp"), os.path.join(d, "checkpoint"))
"""

EVALUATOR = """
import os
from tfcluster import task
for path in task.checkpoints(poll_seconds=0.05):
    step = task.checkpoint_step(path)
    task.report_evaluation(path, step * 10, {"accuracy": step / 10})
    print("evaluated", os.path.basename(path), flush=True)
"""


def spec(tmp_path, text: str):
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_evaluator_reports_and_evaluates_the_final_checkpoint_before_success(shared_cluster, tmp_path):
    job_id = shared_cluster.cli("start", spec(tmp_path, f"""
        name = "handshake"
        strategy = "multi_worker_mirrored"
        command = ["{PY}", "-c", '''{TRAINER}''']
        checkpoint_dir = "{tmp_path / 'ckpt'}"
        [roles.worker]
        count = 1
        [roles.evaluator]
        command = ["{PY}", "-c", '''{EVALUATOR}''']
    """), "--wait", check=True).stdout.strip()
    job = shared_cluster.job(job_id)
    assert job["state"] == "SUCCEEDED"
    evaluator = next(t for t in job["tasks"] if t["type"] == "evaluator")
    assert evaluator["state"] == "SUCCEEDED" and evaluator["exit_code"] == 0, "it ended by itself"
    latest = job["evaluation"]["latest"]
    assert latest["checkpoint"].endswith("/ckpt-3") and latest["step"] == 30
    assert latest["metrics"] == {"accuracy": 0.3}
    history = [e["checkpoint"].rsplit("/", 1)[1] for e in job["evaluation"]["history"]]
    assert history[-1] == "ckpt-3" and len(history) == len(set(history))
    out = shared_cluster.cli("status", job_id, check=True).stdout
    assert "latest evaluation: step 30" in out and "accuracy=0.3" in out


def test_evaluator_that_ignores_the_handshake_is_stopped_at_the_deadline(shared_cluster, tmp_path):
    job_id = shared_cluster.cli("start", spec(tmp_path, """
        name = "deadline"
        strategy = "mirrored"
        command = ["true"]
        evaluator_deadline_seconds = 1
        stop_grace_seconds = 1
        [roles.evaluator]
        command = ["sleep", "600"]
    """), "--wait", check=True).stdout.strip()
    job = shared_cluster.job(job_id)
    assert job["state"] == "SUCCEEDED"
    assert job["message"] == ("training left no checkpoint and the evaluator did not exit within "
                              "evaluator_deadline_seconds = 1; stopped it")
    evaluator = next(t for t in job["tasks"] if t["type"] == "evaluator")
    assert evaluator["state"] == "STOPPED"
    assert job_processes(job_id) == []


# Like tf-keras's SidecarEvaluator with max_evaluations=None: it writes a TensorBoard scalar for each new
# checkpoint (at the checkpoint's step) into its summary dir, reports nothing itself and never exits.
SUMMARY_WRITER = """
import os, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tfcluster import task
writer = EventFileWriter(os.path.join(task.summary_dir, "validation"))
evaluated = set()
while True:
    newest = task.latest_checkpoint(task.checkpoint_dir)
    if newest and newest not in evaluated:
        evaluated.add(newest)
        step = task.checkpoint_step(newest)
        value = summary_pb2.Summary.Value(tag="evaluation_accuracy_vs_iterations", simple_value=step / 4)
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
        writer.flush()
    time.sleep(0.05)
"""


def test_an_evaluator_that_only_writes_summaries_is_stopped_once_it_evaluated_the_final_checkpoint(shared_cluster,
                                                                                                 tmp_path):
    job_id = shared_cluster.cli("start", spec(tmp_path, f"""
        name = "summaries"
        strategy = "multi_worker_mirrored"
        command = ["{PY}", "-c", '''{TRAINER}''']
        checkpoint_dir = "{tmp_path / 'ckpt'}"
        stop_grace_seconds = 5
        [roles.worker]
        count = 1
        [roles.evaluator]
        command = ["{PY}", "-c", '''{SUMMARY_WRITER}''']
        summary_dir = "{tmp_path / 'tensorboard'}"
    """), "--wait", check=True).stdout.strip()
    job = shared_cluster.job(job_id)
    assert job["state"] == "SUCCEEDED", job
    assert job["message"] == "final evaluation of ckpt-3 done; stopped the evaluator"
    assert job["finished"] - job["created"] < 120, "ended long before evaluator_deadline_seconds (600)"
    evaluator = next(t for t in job["tasks"] if t["type"] == "evaluator")
    assert evaluator["state"] == "STOPPED" and evaluator["signal"] == 15, "SIGTERM, not SIGKILL"
    latest = job["evaluation"]["latest"]
    assert latest["checkpoint"] == str(tmp_path / "ckpt" / "ckpt-3") and latest["step"] == 3
    assert latest["metrics"] == {"accuracy": 0.75}, "tf-keras's evaluation_<metric>_vs_iterations gives <metric>"
    assert job_processes(job_id) == []


SERVER = """
import os, socket, time
time.sleep(1.0)  # slow to listen: the chief must still not start before this
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["TFCLUSTER_PORT"]))); s.listen()
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""

CHIEF = """
import json, os, socket, sys
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
assert os.environ["GRPC_FAIL_FAST"] == "use_caller"
for address in cluster["ps"] + cluster["worker"]:
    host, port = address.rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=2).close()
print("every ps and worker accepted a connection", flush=True)
"""


def test_parameter_server_chief_starts_once_ps_and_workers_listen_and_they_are_stopped_after(shared_cluster,
                                                                                            tmp_path):
    job_id = shared_cluster.cli("start", spec(tmp_path, f"""
        name = "ps-order"
        strategy = "parameter_server"
        command = ["{PY}", "-c", '''{CHIEF}''']
        stop_grace_seconds = 2
        [roles.chief]
        [roles.worker]
        count = 2
        command = ["{PY}", "-c", '''{SERVER}''']
        [roles.ps]
        count = 1
        command = ["{PY}", "-c", '''{SERVER}''']
    """), "--wait", check=True).stdout.strip()
    job = shared_cluster.job(job_id)
    assert job["state"] == "SUCCEEDED", job
    chief = next(t for t in job["tasks"] if t["type"] == "chief")
    assert chief["exit_code"] == 0 and chief["attempt"] == 1
    assert "every ps and worker accepted" in shared_cluster.cli("logs", job_id, "chief:0", check=True).stdout
    for t in job["tasks"]:
        if t["type"] in ("ps", "worker"):
            assert t["state"] == "STOPPED", t
    assert job_processes(job_id) == []


def test_auto_picks_mirrored_when_one_node_has_the_gpus_and_multi_worker_otherwise(shared_cluster, tmp_path):
    fits = shared_cluster.cli("start", "--name", "auto1", "--strategy", "auto", "--workers", "2",
                              "--gpus-per-task", "1", "--wait", "--", "true", check=True).stdout.strip()
    job = shared_cluster.job(fits)
    assert job["strategy"] == "mirrored"
    assert len(job["tasks"]) == 1 and len(job["tasks"][0]["gpus"]) == 2
    spread = shared_cluster.cli("start", "--name", "auto2", "--strategy", "auto", "--workers", "2",
                                "--gpus-per-task", "2", "--wait", "--", "true", check=True).stdout.strip()
    job = shared_cluster.job(spread)
    assert job["strategy"] == "multi_worker_mirrored"
    assert sorted(t["node"] for t in job["tasks"]) == ["a", "b"]
    out = shared_cluster.cli("status", check=True).stdout
    assert "auto1" in out and "mirrored" in out
