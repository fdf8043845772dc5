"""A task's exit takes four shapes on its way from the shim to the user: the shim's record (the status file),
the wire message (TaskReport), the coordinator's record (the task's exit, the job's last failure) and the
views (JobStatus, `status --json`). Each conversion is tested here, and the whole path keeps exit code,
signal, message, log tail, busy port and times."""

from __future__ import annotations

import dataclasses

import pytest
from coresim import Sim, info, launches, make_spec

from tfcluster import views, wire
from tfcluster.api.v1 import types_pb2
from tfcluster.daemon.agent.shim.taskfiles import ShimStatus
from tfcluster.daemon.agent.tasks.record import TaskRecord, exit_of
from tfcluster.model import Attempt, Phase, TaskExit, TaskReport

TAIL = ("step 10", "Traceback (most recent call last):", "ValueError: boom")


def test_a_return_code_becomes_an_exit_code_or_the_signal_that_killed_the_task():
    assert TaskExit.of_returncode(3, TAIL) == TaskExit(exit_code=3, log_tail=TAIL)
    assert TaskExit.of_returncode(-9) == TaskExit(signal=9)
    assert TaskExit.of_returncode(0).succeeded


def test_the_agent_adds_the_final_checkpoint_to_a_successful_exit_only(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    (tmp_path / "ckpt-7.index").write_text("")
    ended = ShimStatus(Phase.EXITED, exit=TaskExit(exit_code=0))
    assert exit_of(ended, str(tmp_path)) == TaskExit(exit_code=0, final_checkpoint="ckpt-7")
    failed = dataclasses.replace(ended, exit=TaskExit(exit_code=1))
    assert exit_of(failed, str(tmp_path)).final_checkpoint == ""


@pytest.mark.parametrize("exit", [
    TaskExit(exit_code=3, message="", log_tail=TAIL),
    TaskExit(signal=9, message="the task's supervisor process died; the task was killed"),
    TaskExit(message="port 20001 is already in use on this node", busy_port=20001),
    TaskExit(exit_code=0, final_checkpoint="ckpt-7"),
    TaskExit(message="cannot start command 'python3': not found on the task's PATH (/usr/bin)", permanent=True),
])
def test_a_report_goes_over_the_wire_and_back_unchanged(exit):
    report = TaskReport(Attempt("job-1", "worker", 1, 2), Phase.EXITED if exit.exit_code is not None or exit.signal
                        else Phase.FAILED_TO_START, pid=11, exit=exit)
    sent = wire.task_report_to_proto(report).SerializeToString()
    assert wire.task_report_from_proto(types_pb2.TaskReport.FromString(sent)) == report


def _running_job(sim: Sim):
    job, actions = sim.submit(make_spec(worker=2, restart={"max_restarts": 0}))
    launched = {}
    while launches(actions):  # in waves: worker 0 first
        launched.update({a.attempt.task_key: a for a in launches(actions)})
        actions = sim.running(job, actions) + sim.c.tick(sim.now)
    assert sorted(launched) == ["worker:0", "worker:1"] and job.state == "RUNNING"
    return job, launched


def _through_the_agent(launch, status: ShimStatus, tmp_path) -> TaskReport:
    """What the agent does with a shim's record: its task record, the report of it, the wire and back."""
    status.write(tmp_path)
    record = TaskRecord(launch.attempt, tmp_path, phase=status.phase, pid=status.pid)
    record.exit = exit_of(ShimStatus.read(tmp_path), record.checkpoint_dir)
    sent = wire.task_report_to_proto(record.report()).SerializeToString()
    return wire.task_report_from_proto(types_pb2.TaskReport.FromString(sent))


def test_a_shims_record_reaches_the_job_status_and_status_json_whole(tmp_path):
    sim = Sim(info("n1"), info("n2"))
    job, launched = _running_job(sim)
    sim.now += 5
    status = ShimStatus(Phase.EXITED, 2, 10, 11, 11, started=101.0, finished=104.5,
                        exit=TaskExit.of_returncode(-9, TAIL))
    sim.c.report(launched["worker:1"].node, _through_the_agent(launched["worker:1"], status, tmp_path), sim.now)

    task = job.task("worker", 1)
    assert task.exit == TaskExit(signal=9, log_tail=TAIL)
    assert (job.last_failure.exit, job.last_failure.time) == (task.exit, sim.now)
    doc = views.job_doc(wire.job_status(job))
    shown = next(t for t in doc["tasks"] if (t["type"], t["index"]) == ("worker", 1))
    assert (shown["exit_code"], shown["signal"]) == (None, 9)
    failure = doc["last_failure"]
    assert (failure["task"], failure["exit_code"], failure["signal"], failure["log_tail"], failure["time"]) == \
        ("worker:1", None, 9, list(TAIL), sim.now)
    assert failure["description"] == f"worker:1 on {task.node} killed by SIGKILL"
    assert failure["description"] in doc["message"], "the job's message names its last failure"


def test_a_start_failure_keeps_its_message_and_busy_port_to_the_views(tmp_path):
    sim = Sim(info("n1"), info("n2"))
    job, launched = _running_job(sim)
    worker = launched["worker:0"]
    exit = TaskExit(message="port 20001 is already in use on this node", busy_port=20001)
    report = TaskReport(worker.attempt, Phase.FAILED_TO_START, exit=exit)
    sent = wire.task_report_to_proto(report).SerializeToString()
    sim.c.report(worker.node, wire.task_report_from_proto(types_pb2.TaskReport.FromString(sent)), sim.now)
    assert job.task("worker", 0).exit == exit
    assert 20001 in sim.c.nodes[worker.node].seen.busy_ports, "the node's busy port is avoided when placing again"
    shown = next(t for t in views.job_doc(wire.job_status(job))["tasks"] if (t["type"], t["index"]) == ("worker", 0))
    assert shown["message"] == exit.message and (shown["exit_code"], shown["signal"]) == (None, None)


def test_one_codec_reads_every_shape_an_exit_was_written_in():
    exit = TaskExit(signal=9, message="m", log_tail=TAIL, cpu_seconds=1.5, peak_rss_bytes=7, permanent=True)
    assert TaskExit.from_doc(exit.to_doc()) == exit
    task_of_0_1 = {"pid": 12, "exit_code": 3, "signal": None, "message": "", "log_tail": ["x"], "busy_port": 0}
    assert TaskExit.from_doc(task_of_0_1) == TaskExit(exit_code=3, log_tail=("x",))
    assert TaskExit.from_doc({}) == TaskExit()


def test_an_exit_is_said_in_the_same_words_in_a_table_and_in_a_failure():
    from tfcluster.model import exit_words
    assert exit_words(None, 9) == "SIGKILL" and TaskExit(signal=9).describe() == "killed by SIGKILL"
    assert exit_words(3, None) == "3" and exit_words(None, None) == ""
