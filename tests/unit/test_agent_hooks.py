"""The agent's per-task features are hooks listed in one place: each is called on every attempt's exit
before the exit is reported, polled while connected, told of each registration, and handed the commands it
carries out; one hook's failure reaches no other hook and no report."""

from __future__ import annotations

import json
import time

import pytest

from tfcluster import wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.commands import SetPace, ShipCheckpoints, SyncCheckpoints
from tfcluster.daemon.agent.agent import Agent, AgentConfig
from tfcluster.daemon.agent.hooks import events as events_hook
from tfcluster.daemon.agent.hooks.api import TaskHook
from tfcluster.daemon.agent.hooks.copies import CopiesHook
from tfcluster.daemon.agent.hooks.events import EventsHook
from tfcluster.daemon.agent.hooks.shipping import ShippingHook
from tfcluster.daemon.agent.hooks.summaries import SummariesHook
from tfcluster.daemon.agent.hooks.summary_upload import SummaryUploadHook
from tfcluster.daemon.agent.session.discovery import HostInfo
from tfcluster.daemon.agent.tasks.record import TaskRecord
from tfcluster.daemon.agent.tasks.supervisor import FINISHED_KEPT_SECONDS
from tfcluster.model import Attempt, Phase, SyncResult, TaskExit

ATTEMPT = Attempt("job-1", "evaluator", 0, 1)


def evaluation(checkpoint: str, step: int) -> bytes:
    return json.dumps({"kind": "evaluation", "checkpoint": checkpoint, "step": step, "time": 5.0,
                       "metrics": {"loss": 0.5}}).encode() + b"\n"


class Recording(TaskHook):
    """Writes down what it is called with; fails where told to."""
    commands = (SyncCheckpoints,)

    def __init__(self, calls: list, fail: bool = False):
        self.calls, self.fail = calls, fail

    def on_exit(self, record) -> None:
        self.calls.append(("exit", record.attempt))
        if self.fail:
            raise RuntimeError("broken hook")

    def handle(self, command) -> None:
        self.calls.append(("handle", command))


@pytest.fixture
def agent(tmp_path):
    return Agent(AgentConfig(coordinator="127.0.0.1:1", name="n1", address="127.0.0.1", port_range=(20000, 20099),
                             gpus=(), host=HostInfo("n1", 1, 1 << 30), state_dir=tmp_path / "state"))


def sent(agent) -> list:
    out = []
    while not agent.session.outbound.empty():
        out.append(agent.session.outbound.get_nowait())
    return out


def test_events_are_sent_once_whole_lines_at_a_time_and_all_again_after_a_registration(tmp_path):
    messages, reporting = [], []
    hook = EventsHook(messages.append, reports_itself=reporting.append)
    record = TaskRecord(ATTEMPT, tmp_path)
    record.events_path.write_bytes(evaluation("ckpt-1", 1) + b'{"kind": "evaluation", "checkpoint"')
    hook.on_poll(record)
    hook.on_poll(record)
    assert [m.evaluation.checkpoint for m in messages] == ["ckpt-1"] and reporting == [ATTEMPT]
    with open(record.events_path, "ab") as f:  # the line being written is finished, a malformed one follows
        f.write(b': "ckpt-2", "step": 2, "time": 6.0, "metrics": {}}\nnot json\n')
    hook.on_exit(record)
    assert [m.evaluation.checkpoint for m in messages] == ["ckpt-1", "ckpt-2"]
    hook.on_register()
    hook.on_poll(record)
    assert [m.evaluation.checkpoint for m in messages] == ["ckpt-1", "ckpt-2", "ckpt-1", "ckpt-2"]



def test_an_ended_attempts_events_file_is_read_once_a_registration(tmp_path, monkeypatch):
    """Its task writes no more: polls leave its file alone until a registration asks for everything again."""
    messages = []
    hook = EventsHook(messages.append)
    record = TaskRecord(ATTEMPT, tmp_path)
    record.events_path.write_bytes(evaluation("ckpt-1", 1))
    record.exited.set()
    hook.on_exit(record)
    opened = []
    real_read = events_hook.read_bytes
    monkeypatch.setattr(events_hook, "read_bytes", lambda path, *a: opened.append(path) or real_read(path, *a))
    hook.on_poll(record)
    hook.on_poll(record)
    assert opened == [] and len(messages) == 1
    hook.on_register()
    hook.on_poll(record)
    hook.on_poll(record)
    assert opened == [record.events_path] and [m.evaluation.checkpoint for m in messages] == ["ckpt-1", "ckpt-1"]

class Polled(TaskHook):
    """Counts its polls of each attempt; finished with an ended one once told so."""

    def __init__(self):
        self.polls: dict[Attempt, int] = {}
        self.done: set[Attempt] = set()

    def on_poll(self, record) -> None:
        self.polls[record.attempt] = self.polls.get(record.attempt, 0) + 1

    def finished_with(self, record) -> bool:
        return record.attempt in self.done


def test_an_ended_attempt_is_polled_until_every_hook_is_finished_with_it_and_again_after_a_registration(agent,
                                                                                                       tmp_path):
    """A node that ran thousands of short tasks in the last hour keeps their records: polling every one of them
    five times a second took most of a core at 10,000."""
    first, second = Polled(), Polled()
    agent.hooks = [first, second]
    running = TaskRecord(Attempt("job-1", "worker", 0, 1), tmp_path)
    ended = [TaskRecord(Attempt(f"job-{n}", "worker", 0, 1), tmp_path, phase=Phase.EXITED, exit=TaskExit(exit_code=0),
                        finished_at=time.time()) for n in (2, 3)]
    for record in ended:
        record.exited.set()
    for record in [running, *ended]:
        agent.supervisor.keep(record)
    agent.on_register()
    first.done = {r.attempt for r in ended}
    second.done = {ended[0].attempt}  # still has work for the other one
    for _ in range(3):
        agent.poll_hooks_once()
    assert first.polls == second.polls == {running.attempt: 3, ended[0].attempt: 1, ended[1].attempt: 3}
    second.done.add(ended[1].attempt)
    for _ in range(2):
        agent.poll_hooks_once()
    assert first.polls == {running.attempt: 5, ended[0].attempt: 1, ended[1].attempt: 4}
    agent.on_register()  # a new coordinator may know nothing: every hook is asked for all of it again
    for _ in range(2):
        agent.poll_hooks_once()
    assert first.polls == second.polls == {running.attempt: 7, ended[0].attempt: 2, ended[1].attempt: 5}


def test_the_real_hooks_finish_with_an_ended_attempt_once_it_was_read(agent, tmp_path):
    """Each of the agent's own hooks says when it is done with an ended attempt: the evaluator's events and
    summaries read, its summary files sent."""
    directory = tmp_path / "attempt"
    directory.mkdir()
    summary_dir = tmp_path / "summaries"
    summary_dir.mkdir()
    record = TaskRecord(ATTEMPT, directory, summary_dir=str(summary_dir), phase=Phase.EXITED,
                        exit=TaskExit(exit_code=0))
    record.events_path.write_bytes(evaluation("ckpt-1", 1))
    agent.on_register()
    record.exited.set()
    assert not any(hook.finished_with(record) for hook in agent.hooks[:3])
    agent._on_task_change(record)
    assert all(hook.finished_with(record) for hook in agent.hooks)
    agent.on_register()
    assert not agent.hooks[0].finished_with(record) and not agent.hooks[2].finished_with(record)


def test_what_the_hooks_keep_for_an_attempt_goes_once_the_supervisor_forgets_it(agent, tmp_path):
    """An agent runs for months: before, each task it ran left about 500 bytes in the hooks for good."""
    events, summaries, uploads = agent.hooks[:3]
    agent.on_register()
    records = []
    for n, finished in enumerate([time.time() - FINISHED_KEPT_SECONDS - 1] * 30 + [time.time()]):
        directory = tmp_path / f"attempt-{n}"
        (directory / "summaries").mkdir(parents=True)
        (directory / "summaries" / "events.out.tfevents.1.host").write_bytes(b"scalars")
        record = TaskRecord(Attempt(f"job-{n}", "evaluator", 0, 1), directory, phase=Phase.EXITED,
                            exit=TaskExit(exit_code=0), summary_dir=str(directory / "summaries"), finished_at=finished)
        record.events_path.write_bytes(evaluation("ckpt-1", 1))
        record.exited.set()
        agent.supervisor.keep(record)
        agent._each_hook(record, "on_exit")
        records.append(record)
    assert len(events.offsets) == len(summaries.summaries.reporting) == len(uploads.tasks) == len(uploads.job_bytes) == 31
    assert agent.supervisor.snapshot() == records[-1:]  # all but the one that ended now are forgotten
    kept = records[-1].attempt
    assert list(events.offsets) == list(events.finished) == list(summaries.summaries.reporting) == [kept]
    assert list(uploads.tasks) == [records[-1].key] and list(uploads.job_bytes) == list(uploads.job_tasks) == ["job-30"]


def test_a_tasks_next_attempt_on_the_same_node_has_its_summaries_sent(tmp_path, monkeypatch):
    """Attempts of a task share its summary dir: the first one's end must not stop the next one's uploads."""
    monkeypatch.setattr("tfcluster.daemon.agent.hooks.summary_upload.UPLOAD_SECONDS", 0.0)
    messages = []
    hook = SummaryUploadHook(messages.append, lambda: 0)
    summary_dir = tmp_path / "summaries"
    summary_dir.mkdir()
    first = TaskRecord(Attempt("job-1", "chief", 0, 1), tmp_path, summary_dir=str(summary_dir), started_at=0.0)
    (summary_dir / "events.out.tfevents.1.host").write_bytes(b"first attempt's")
    first.exited.set()
    hook.on_exit(first)
    assert [m.summary.data for m in messages] == [b"first attempt's"] and hook.finished_with(first)
    second = TaskRecord(Attempt("job-1", "chief", 0, 2), tmp_path, summary_dir=str(summary_dir), started_at=0.0)
    (summary_dir / "events.out.tfevents.2.host").write_bytes(b"second attempt's")
    hook.on_poll(first)  # the ended attempt's polls send nothing more
    assert len(messages) == 1 and not hook.finished_with(second)
    hook.on_poll(second)
    assert [m.summary.data for m in messages] == [b"first attempt's", b"second attempt's"]


def test_every_feature_is_a_hook_listed_once_and_commands_go_to_their_hook(agent):
    assert [type(h) for h in agent.hooks] == [EventsHook, SummariesHook, SummaryUploadHook, ShippingHook, CopiesHook]
    assert agent.commands == {ShipCheckpoints: agent.hooks[3], SyncCheckpoints: agent.hooks[4]}
    calls = []
    agent.commands[SyncCheckpoints] = Recording(calls)
    order = SyncCheckpoints("n1", "job-1", 3, ("10.0.0.2:7001",), ("n2",))
    agent.handle(wire.command_to_proto(order))
    assert calls == [("handle", order)]


def test_hooks_see_an_exit_before_it_is_reported_and_a_failing_hook_stops_nothing(agent, tmp_path):
    calls = []
    agent.hooks = [Recording(calls, fail=True), Recording(calls)]
    record = TaskRecord(ATTEMPT, tmp_path, phase=Phase.EXITED, exit=TaskExit(exit_code=0))
    record.exited.set()
    agent._on_task_change(record)
    assert calls == [("exit", ATTEMPT), ("exit", ATTEMPT)]
    [report] = sent(agent)
    assert report.task.phase == wire.PHASES[Phase.EXITED] and report.task.exit_code == 0
    record.exited.clear()  # a running attempt's change is reported without the hooks
    agent._on_task_change(record)
    assert len(calls) == 2 and len(sent(agent)) == 1


def test_a_registration_tells_every_hook_and_kept_copy_answers_are_sent_again(agent):
    copies = next(h for h in agent.hooks if isinstance(h, CopiesHook))
    copies.results[("job-1", 3)] = SyncResult("job-1", 3, ok=True, bytes=10)
    agent.on_register()
    assert [m.sync_done.sync_id for m in sent(agent)] == [3]
    assert copies.jobs_in_use() == set()


def test_a_pace_from_the_coordinator_sets_the_heartbeat_interval_and_a_bad_one_is_ignored(agent):
    agent.handle(wire.command_to_proto(SetPace("n1", 5.0)))
    assert agent.session.interval == 5.0
    for bad in (0.0, -1.0, 1e9):  # logged, and the interval stays
        agent.handle(agent_pb2.CoordinatorMessage(pace=agent_pb2.Pace(heartbeat_interval_seconds=bad)))
    assert agent.session.interval == 5.0
    agent.handle(wire.command_to_proto(SetPace("n1", 0.05)))
    stream = agent.session._messages("n1", "session-1")
    assert next(stream).WhichOneof("kind") == "open" and next(stream).WhichOneof("kind") == "heartbeat"
    began = time.monotonic()
    assert [next(stream).WhichOneof("kind") for _ in range(5)] == ["heartbeat"] * 5
    assert time.monotonic() - began < 1.0, "five heartbeats at the new pace, not the registration's 1 s"
