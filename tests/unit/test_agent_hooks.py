"""The agent's per-task features are hooks listed in one place: each is called on every attempt's exit
before the exit is reported, polled while connected, told of each registration, and handed the commands it
carries out; one hook's failure reaches no other hook and no report."""

from __future__ import annotations

import json
import time

import pytest

from tfcluster import wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.daemon.agent.agent import Agent, AgentConfig
from tfcluster.daemon.agent.hooks.api import TaskHook
from tfcluster.daemon.agent.hooks.copies import CopiesHook
from tfcluster.daemon.agent.hooks.events import EventsHook
from tfcluster.daemon.agent.hooks.shipping import ShippingHook
from tfcluster.daemon.agent.hooks.summaries import SummariesHook
from tfcluster.daemon.agent.hooks.summary_upload import SummaryUploadHook
from tfcluster.daemon.agent.session.discovery import HostInfo
from tfcluster.daemon.agent.tasks.record import TaskRecord
from tfcluster.model import Attempt, Phase, SetPace, ShipCheckpoints, SyncCheckpoints, SyncResult, TaskExit

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
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    hook.on_poll(record)
    hook.on_poll(record)
    assert opened == [] and len(messages) == 1
    hook.on_register()
    hook.on_poll(record)
    hook.on_poll(record)
    assert opened == [record.events_path] and [m.evaluation.checkpoint for m in messages] == ["ckpt-1", "ckpt-1"]

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
