"""The limits and checks every field arriving from the network passes (the rest of the package uses them)."""

from __future__ import annotations

import math
from typing import Any

from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.model import Attempt, control_character
from tfcluster.states import Phase

MAX_TEXT = 4096        # a message, a path, a name of a GPU
MAX_LOG_TAIL_LINES = 50
MAX_TASKS_PER_NODE = 10_000  # task reports with a registration, progress entries with a heartbeat
MAX_JOB_IDS = 1000           # asked about in one EndedJobs call
MAX_HEARTBEAT_INTERVAL_SECONDS = 3600.0  # what a coordinator may tell an agent (Pace)
MAX_PROBE_TARGETS = 64           # ports one agent connects to for `tfcluster doctor`
MAX_PROBE_LISTEN_SECONDS = 60.0
PHASES = {Phase.RUNNING: pb.TASK_PHASE_RUNNING, Phase.EXITED: pb.TASK_PHASE_EXITED,
          Phase.FAILED_TO_START: pb.TASK_PHASE_FAILED_TO_START}
PHASE_NAMES = {v: k for k, v in PHASES.items()}


def checked_text(value: str, field: str, limit: int = MAX_TEXT) -> str:
    if len(value) > limit:
        raise ValueError(f"{field}: expected at most {limit} characters, got {len(value)}")
    bad = control_character(value)
    if bad:
        raise ValueError(f"{field}: must not contain control characters, found {bad} in {value[:80]!r}")
    return value


def attempt_from(msg, field: str) -> Attempt:
    return Attempt(checked_text(msg.job_id, f"{field}.job_id", 256), checked_text(msg.task_type, f"{field}.task_type", 32),
                   msg.task_index, msg.attempt)


def attempt_fields(a: Attempt) -> dict[str, Any]:
    return {"job_id": a.job_id, "task_type": a.type, "task_index": a.index, "attempt": a.number}


def measured_seconds(value: float) -> float:
    """A duration an agent measured: never negative, infinite or NaN."""
    return max(0.0, value) if math.isfinite(value) else 0.0
