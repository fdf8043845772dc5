"""One attempt of one task on this node as the agent knows it (TaskRecord), its exit as the agent reports it,
made from the shim's record of it in one place (exit_of), and whether its shim still runs (is_shim).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tfcluster import layout
from tfcluster.checkpoints import latest_checkpoint
from tfcluster.daemon.agent.shim.runner import process_start
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile, ShimStatus
from tfcluster.daemon.agent.tasks import handback
from tfcluster.model import Attempt, TaskExit, TaskReport
from tfcluster.states import Phase

TaskKey = tuple[str, str, int]  # job id, task type, task index


@dataclass(eq=False)
class TaskRecord:
    """One attempt of one task on this node, as the agent knows it."""
    attempt: Attempt
    dir: Path
    phase: str = Phase.STARTING
    pid: int = 0
    shim_pid: int = 0
    shim_started: int = 0  # when the shim started (ShimStatus.shim_started); 0: unknown
    port: int = 0
    checkpoint_dir: str = ""
    gpus: str = ""  # its CUDA_VISIBLE_DEVICES: the node's GPUs it holds (GPU metrics name the task by it)
    summary_dir: str = ""  # an evaluator's TFCLUSTER_SUMMARY_DIR: its agent reports the summaries written there
    group: int = -1  # the job's group on this node, which may read the control file; -1: the agent's own
    uid: int | None = None  # the task's user: the agent reads only files of its (handback.py); None: the agent's own
    started_at: float = field(default_factory=time.time)  # summaries older than this are not its own
    listening: bool = False
    detail: str = ""  # what it waits for before it starts ("building environment"), since detail_since (monotonic)
    detail_since: float = 0.0
    exit: TaskExit | None = None
    finished_at: float = 0.0
    exited: threading.Event = field(default_factory=threading.Event)
    hooks_finished: int = -1  # the agent's session in which every hook finished with the ended attempt (agent.py)

    @property
    def key(self) -> TaskKey:
        return (self.attempt.job_id, self.attempt.type, self.attempt.index)

    @property
    def events_path(self) -> Path:
        """Where the task appends its events (evaluation results), one JSON object a line."""
        return self.dir / layout.EVENTS_NAME

    @property
    def control_path(self) -> Path:
        """What the coordinator tells the task while it runs (training finished, final checkpoint)."""
        return self.dir / layout.CONTROL_NAME

    @property
    def name(self) -> str:
        return str(self.attempt)

    @classmethod
    def from_files(cls, directory: Path, launch: LaunchFile, status: ShimStatus) -> TaskRecord:
        """The record of an attempt a previous agent process started, from its files (its phase and exit are
        the caller's to set: whether it still runs is not in the files)."""
        return cls(launch.attempt, directory, pid=status.pid, shim_pid=status.shim_pid,
                   shim_started=status.shim_started, port=launch.port,
                   checkpoint_dir=launch.env.get(layout.CHECKPOINT_DIR, ""),
                   gpus=launch.env.get(layout.CUDA_VISIBLE_DEVICES, ""),
                   summary_dir=launch.env.get(layout.SUMMARY_DIR, ""), started_at=status.started,
                   group=-1 if launch.file_group is None else launch.file_group, uid=launch.uid)

    def report(self) -> TaskReport:
        """The attempt's report to the coordinator (wire/nodes.py sends it)."""
        return TaskReport(self.attempt, self.phase, pid=self.pid, listening=self.listening, exit=self.exit)


def exit_of(status: ShimStatus, checkpoint_dir: str, owner: int | None = None) -> TaskExit:
    """The exit its shim recorded, as the agent reports it: with the task's final checkpoint when it succeeded
    (the agent, not the shim, knows where checkpoints go)."""
    exit = status.exit or TaskExit(message="ended without a record of how")
    newest = newest_checkpoint(checkpoint_dir, owner) if exit.succeeded else ""
    return dataclasses.replace(exit, final_checkpoint=newest)


def newest_checkpoint(directory: str, owner: int | None = None) -> str:
    """The newest committed checkpoint in a task's checkpoint dir, relative to it ("" if none), from a state file
    of owner's (the task's user: handback.py)."""
    state = handback.read_state(directory, owner) if directory else None
    newest = latest_checkpoint(directory, state) if state is not None else None
    return os.path.relpath(newest, directory) if newest else ""


def is_shim(pid: int, attempt_dir: Path, started: int = 0) -> bool:
    """True when pid is still the shim of this attempt (pids are reused): the process that started at `started`,
    or, for a shim of an earlier release that did not record it, one whose command line names the attempt dir."""
    if not pid:
        return False
    if started:
        return process_start(pid) == started
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    # Those shims were started as `python -m tfcluster.daemon.agent.taskrunner DIR` (0.3 to 0.7).
    return "tfcluster.daemon.agent.taskrunner" in cmdline and str(attempt_dir) in cmdline
