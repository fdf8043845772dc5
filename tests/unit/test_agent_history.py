"""An agent that ran many short tasks (a sweep of small trials, a crash loop): what it keeps of the ended ones, and
what it sends of them when it registers, stay bounded, and nothing the coordinator needs is left out."""

from __future__ import annotations

import os
import time

import pytest

from tfcluster import layout, security, wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.checkpoints import final_checkpoint
from tfcluster.daemon.agent import agent as agent_module
from tfcluster.daemon.agent.agent import Agent, AgentConfig
from tfcluster.daemon.agent.session.discovery import HostInfo
from tfcluster.daemon.agent.shim.tasklog import MAX_LINE_CHARS
from tfcluster.daemon.agent.tasks import supervisor as supervisor_module
from tfcluster.daemon.agent.tasks.record import TaskRecord
from tfcluster.model import Attempt, Phase, TaskExit

CHATTY_TAIL = tuple("x" * MAX_LINE_CHARS for _ in range(20))  # the most last lines an exit carries: 80 KB


@pytest.fixture
def agent(tmp_path):
    return Agent(AgentConfig(coordinator="127.0.0.1:1", name="n1", address="127.0.0.1", port_range=(20000, 20099),
                             gpus=(), host=HostInfo("n1", 1, 1 << 30), state_dir=tmp_path / "state"))


def keep(agent, tmp_path, number: int, ended_at: float | None, message: str = "it failed") -> TaskRecord:
    record = TaskRecord(Attempt(f"job-{number}", "worker", 0, 1), tmp_path / f"attempt-{number}")
    if ended_at is None:
        record.phase, record.pid = Phase.RUNNING, 1000 + number
    else:
        record.phase, record.finished_at = Phase.EXITED, ended_at
        record.exit = TaskExit(exit_code=1, message=message, log_tail=CHATTY_TAIL)
        record.exited.set()
    agent.supervisor.keep(record)
    return record


def test_a_node_that_kept_hundreds_of_chatty_exits_still_registers_and_reports_every_attempt(agent, tmp_path):
    """300 exits of 80 KB each came to 24 MB: past the 16 MiB the coordinator takes, so the node could not
    register again after a coordinator restart, for as long as it kept them (an hour), and its running tasks were
    counted lost."""
    now = time.time()
    running = [keep(agent, tmp_path, n, None) for n in range(3)]
    ended = [keep(agent, tmp_path, n, now - 1000 + n, message="m" * 1000) for n in range(3, 303)]
    request = agent_pb2.RegisterRequest(node=wire.node_info_to_proto(agent.node_info()), tasks=agent.task_reports())
    assert request.ByteSize() < security.NODE_MESSAGE
    reports = [wire.task_report_from_proto(r) for r in request.tasks]
    assert {r.attempt for r in reports} == {r.attempt for r in running + ended}, "every attempt, running or ended"
    assert [r.attempt for r in reports[:3]] == [r.attempt for r in running]
    newest_first = reports[3:]
    assert [r.attempt for r in newest_first] == [r.attempt for r in reversed(ended)]
    full = [r for r in newest_first if r.exit.log_tail]
    assert 10 < len(full) < 100 and newest_first[:len(full)] == full, "the newest exits keep their last lines"
    assert all(r.exit.log_tail == CHATTY_TAIL and r.exit.message == "m" * 1000 for r in full)
    short = newest_first[len(full):]
    assert all(r.exit.exit_code == 1 and r.exit.message == "m" * agent_module.SHORT_MESSAGE_CHARS and
               not r.exit.log_tail for r in short)


def test_the_supervisor_keeps_the_newest_ended_attempts_and_every_running_one(agent, tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor_module, "FINISHED_KEPT", 5)
    forgotten = []
    agent.supervisor.on_forget = forgotten.extend
    now = time.time()
    running = keep(agent, tmp_path, 0, None)
    for n in (4, 1, 8, 2, 6, 3, 7, 5):  # kept in another order than they ended
        keep(agent, tmp_path, n, now - 100 + n)
    kept = agent.supervisor.snapshot()
    assert sorted(r.attempt.job_id for r in kept) == ["job-0", "job-4", "job-5", "job-6", "job-7", "job-8"]
    assert running in kept and sorted(r.attempt.job_id for r in forgotten) == ["job-1", "job-2", "job-3"]
    assert agent.supervisor.snapshot() == kept and len(forgotten) == 3


def test_a_relaunched_task_is_kept_once_by_its_newest_attempt_and_its_job_goes_with_it(agent, tmp_path,
                                                                                   monkeypatch):
    """Ended attempts are forgotten from the oldest without a pass over them all: the bookkeeping must follow a
    task relaunched here (its older attempt is no longer kept, nor counted) and an older attempt ending late."""
    monkeypatch.setattr(supervisor_module, "FINISHED_KEPT", 1)
    supervisor = agent.supervisor
    first = keep(agent, tmp_path, 1, None)
    second = TaskRecord(Attempt("job-1", "worker", 0, 2), tmp_path / "attempt-1b", phase=Phase.RUNNING, pid=7)
    supervisor.keep(second)
    assert supervisor.snapshot() == [second] and list(supervisor.kept.ended) == [] and supervisor.keeps_job("job-1")
    supervisor._finish(first, Phase.EXITED, TaskExit(signal=9))  # the replaced attempt's late end: not kept
    assert list(supervisor.kept.ended) == []
    supervisor._finish(second, Phase.EXITED, TaskExit(exit_code=0))
    other = keep(agent, tmp_path, 2, time.time() + 1)
    assert supervisor.snapshot() == [other] and not supervisor.keeps_job("job-1") and supervisor.keeps_job("job-2")


def test_the_code_a_node_serves_for_a_job_goes_with_its_last_attempt_here(agent, tmp_path):
    """An agent that runs for months kept it for every job it ever ran. What it expects of a job's checkpoint
    files stays: it comes before the job's next task is launched here, while no attempt of the job may be kept."""
    serving = agent.supervisor.code.serving
    now = time.time()
    old = time.time() - supervisor_module.FINISHED_KEPT_SECONDS - 1
    for number, ended_at in ((1, old), (2, old), (3, now)):
        record = keep(agent, tmp_path, number, ended_at)
        serving.used_by(record.attempt.job_id, "ab" * 32)
        serving.serve_to(record.attempt.job_id, "n2")
        agent.expected[record.attempt.job_id] = None
    second_task = TaskRecord(Attempt("job-2", "worker", 1, 1), tmp_path / "attempt-2b", phase=Phase.RUNNING, pid=7)
    agent.supervisor.keep(second_task)  # job-2 still runs here
    agent.supervisor.snapshot()
    assert set(serving.jobs) == set(serving.fetchers) == {"job-2", "job-3"}
    assert set(agent.expected) == {"job-1", "job-2", "job-3"}


def test_a_registration_reports_no_more_tasks_than_the_coordinator_takes_the_running_ones_first(agent, tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setattr(wire, "MAX_TASKS_PER_NODE", 5)
    now = time.time()
    running = [keep(agent, tmp_path, n, None) for n in range(3)]
    ended = [keep(agent, tmp_path, n, now - 100 + n) for n in range(3, 10)]
    reports = [wire.task_report_from_proto(r) for r in agent.task_reports()]
    assert [r.attempt for r in reports] == [r.attempt for r in running] + [ended[-1].attempt, ended[-2].attempt]


def test_a_task_is_told_training_finished_through_a_control_file_its_job_reads_and_only_root_writes(agent, tmp_path,
                                                                                                    monkeypatch):
    """Written when there is something to say: a task's start writes none, and none says training runs."""
    record = keep(agent, tmp_path, 1, None)
    record.dir.mkdir(parents=True)
    record.group = 4242 if os.geteuid() == 0 else os.getgid()  # the job's group
    monkeypatch.setenv(layout.CONTROL_FILE, str(record.control_path))
    checkpoints = str(tmp_path / "checkpoints")
    assert final_checkpoint(checkpoints) is None
    agent.supervisor.finish_training(record.attempt, "ckpt-7")
    found = record.control_path.stat()
    assert (found.st_uid, found.st_gid, oct(found.st_mode & 0o777)) == (os.geteuid(), record.group, "0o640")
    assert final_checkpoint(checkpoints) == os.path.join(checkpoints, "ckpt-7")
