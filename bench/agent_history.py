"""What an agent pays for the tasks it ran (a benchmark, not a test): a node that runs many short tasks keeps the
newest ended attempts (an hour's, FINISHED_KEPT at most) for its hooks and for the next registration.

With the most it keeps, each of them having ended with its 20 longest last lines, plus a few running tasks, in one
agent process (its real hooks and supervisor, no coordinator):
- the CPU of one round of the hooks' poll (five a second while connected), as a share of a core, beside the
  floor of the same round over the running tasks alone;
- the size of the registration it would send, against the 16 MiB a coordinator takes (security.NODE_MESSAGE);
- the memory the agent holds more after forgetting 20,000 more attempts (tracemalloc): what running for months
  would add up (its tables keep the size their busiest moment gave them, no more).

Prints a table and writes bench/agent_history.json. Run with `make bench` or `python bench/agent_history.py`.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tfcluster import security, wire  # noqa: E402
from tfcluster.api.v1 import agent_pb2  # noqa: E402
from tfcluster.daemon.agent.agent import Agent, AgentConfig  # noqa: E402
from tfcluster.daemon.agent.hooks.api import POLL_SECONDS  # noqa: E402
from tfcluster.daemon.agent.session.discovery import HostInfo  # noqa: E402
from tfcluster.daemon.agent.shim.tasklog import MAX_LINE_CHARS  # noqa: E402
from tfcluster.daemon.agent.tasks.record import TaskRecord  # noqa: E402
from tfcluster.daemon.agent.tasks.supervisor import FINISHED_KEPT, FINISHED_KEPT_SECONDS  # noqa: E402
from tfcluster.model import Attempt, Phase, TaskExit  # noqa: E402
from report import show_and_save  # noqa: E402  (bench/, the folder of the script run)

RUNNING = 8
ROUNDS = 50
FORGOTTEN = 20_000
TAIL = tuple("x" * MAX_LINE_CHARS for _ in range(20))


def agent_in(directory: Path) -> Agent:
    agent = Agent(AgentConfig(coordinator="127.0.0.1:1", name="n1", address="127.0.0.1", port_range=(20000, 20099),
                              gpus=(), host=HostInfo("n1", 1, 1 << 30), state_dir=directory / "state"))
    agent.session.send = lambda message: None  # no coordinator: what the hooks send goes nowhere
    agent.on_register()
    return agent


def keep(agent: Agent, directory: Path, number: int, ended_at: float | None) -> TaskRecord:
    attempt_dir = directory / f"attempt-{number}"
    (attempt_dir / "summaries").mkdir(parents=True)
    record = TaskRecord(Attempt(f"job-{number}", "worker", 0, 1), attempt_dir, summary_dir=str(attempt_dir / "summaries"))
    if ended_at is None:
        record.phase, record.pid = Phase.RUNNING, 1000 + number
    else:
        record.phase, record.finished_at = Phase.EXITED, ended_at
        record.exit = TaskExit(exit_code=1, message="it failed", log_tail=TAIL)
        record.exited.set()
        agent._each_hook(record, "on_exit")
    agent.supervisor.keep(record)
    return record


def poll_ms(agent: Agent) -> float:
    agent.poll_hooks_once()  # the first round after the exits finishes with them
    began = time.process_time()
    for _ in range(ROUNDS):
        agent.poll_hooks_once()
    return (time.process_time() - began) / ROUNDS * 1000


def forget(agent: Agent, directory: Path, numbers: range) -> None:
    """Attempts that ended longer ago than the supervisor keeps them, forgotten a thousand at a time."""
    long_ago = time.time() - FINISHED_KEPT_SECONDS - 1
    for number in numbers:
        record = TaskRecord(Attempt(f"old-{number}", "worker", 0, 1), directory, summary_dir=str(directory),
                            phase=Phase.EXITED, exit=TaskExit(exit_code=0), finished_at=long_ago)
        record.exited.set()
        agent._each_hook(record, "on_exit")
        agent.supervisor.keep(record)
        if number % 1000 == 999:
            agent.supervisor.snapshot()
    agent.supervisor.snapshot()


def forgotten_bytes(agent: Agent, directory: Path) -> int:
    """Memory held more after the supervisor forgot FORGOTTEN attempts, counted after a first round has grown the
    tables to what a thousand attempts at a time need."""
    forget(agent, directory, range(2000))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    forget(agent, directory, range(2000, 2000 + FORGOTTEN))
    gc.collect()
    grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    return grown


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-history-") as tmp:
        directory = Path(tmp)
        agent = agent_in(directory)
        for number in range(RUNNING):
            keep(agent, directory, number, None)
        floor = poll_ms(agent)
        now = time.time()
        for number in range(RUNNING, RUNNING + FINISHED_KEPT):
            keep(agent, directory, number, now - FINISHED_KEPT + number)
        with_history = poll_ms(agent)
        request = agent_pb2.RegisterRequest(node=wire.node_info_to_proto(agent.node_info()), tasks=agent.task_reports())
        grown = forgotten_bytes(agent, directory / "old")
    results = {
        "ended_attempts_kept": FINISHED_KEPT,
        "poll_ms": round(with_history, 3),
        "poll_floor_ms": round(floor, 3),
        "poll_share_of_a_core": f"{with_history / 1000 / POLL_SECONDS:.2%}",
        "registration_bytes": request.ByteSize(),
        "registration_vs_limit": round(request.ByteSize() / security.NODE_MESSAGE, 3),
        f"kib_held_after_{FORGOTTEN}_more_forgotten": round(grown / 1024, 1),
    }
    show_and_save(results, "agent_history.json")


if __name__ == "__main__":
    main()
