"""Names shared across processes, in one place: the environment a task gets and where files live.

The coordinator writes the environment, the agent and its per-task shim write the files, and
`tfcluster.task` (inside the user's program) reads both, so none of them spells a name of its own.
Standard library only: task programs import this.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

# ---- the environment of a task ------------------------------------------------------------------
TF_CONFIG = "TF_CONFIG"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
JOB_ID = "TFCLUSTER_JOB_ID"
JOB_NAME = "TFCLUSTER_JOB_NAME"
STRATEGY = "TFCLUSTER_STRATEGY"
TASK_TYPE = "TFCLUSTER_TASK_TYPE"
TASK_INDEX = "TFCLUSTER_TASK_INDEX"
ATTEMPT = "TFCLUSTER_ATTEMPT"
NUM_WORKERS = "TFCLUSTER_NUM_WORKERS"
PORT = "TFCLUSTER_PORT"
CHECKPOINT_DIR = "TFCLUSTER_CHECKPOINT_DIR"
MODEL_DIR = "TFCLUSTER_MODEL_DIR"
EVENTS_FILE = "TFCLUSTER_EVENTS_FILE"    # the task appends its events (evaluations) here
CONTROL_FILE = "TFCLUSTER_CONTROL_FILE"  # the agent tells the task that training has finished here
# Set by tfcluster for every task; a spec may not override them.
RESERVED_ENV = (TF_CONFIG, CUDA_VISIBLE_DEVICES)
RESERVED_ENV_PREFIX = "TFCLUSTER_"

# ---- client and daemon settings -----------------------------------------------------------------
COORDINATOR_ENV = "TFCLUSTER_COORDINATOR"
TOKEN_FILE_ENV = "TFCLUSTER_TOKEN_FILE"
TLS_DIR_ENV = "TFCLUSTER_TLS_DIR"  # a credentials directory: ca.crt, client.crt, client.key
DEFAULT_COORDINATOR = "localhost:7070"

# ---- files on a node (under the agent's state dir) ----------------------------------------------
# <state>/jobs/<job>/checkpoints/                         host-local checkpoint dir of the job
# <state>/jobs/<job>/.incoming-<id>/                      checkpoint files being received from a peer
# <state>/jobs/<job>/tasks/<type>-<index>/attempt-<n>/    one attempt: the files below
LAUNCH_FILE = "launch.json"    # what to run (written by the agent)
STATUS_FILE = "status.json"    # pids, phase, exit (written by the shim)
OUTPUT_FILE = "output.log"     # the task's stdout and stderr, as written
STOP_FILE = "stop.json"        # the grace period of a requested stop
SHIM_LOG_FILE = "shim.log"     # the shim's own errors
EVENTS_NAME = "events.jsonl"
CONTROL_NAME = "control.json"
INCOMING_PREFIX = ".incoming-"

# ---- files of the coordinator (under its state dir) ---------------------------------------------
COORDINATOR_DB = "coordinator.sqlite3"


def jobs_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "jobs"


def job_dir(state_dir: str | Path, job_id: str) -> Path:
    return jobs_dir(state_dir) / job_id


def host_checkpoint_dir(state_dir: str, job_id: str) -> str:
    """A job's host-local checkpoint dir on a node whose agent keeps its files in state_dir.

    A string built with posixpath: the coordinator computes it for nodes it is not running on."""
    return posixpath.join(state_dir, "jobs", job_id, "checkpoints")


def attempt_dir(state_dir: str | Path, job_id: str, task_type: str, task_index: int, attempt: int) -> Path:
    return job_dir(state_dir, job_id) / "tasks" / f"{task_type}-{task_index}" / f"attempt-{attempt}"


ATTEMPT_DIR_GLOB = "jobs/*/tasks/*/attempt-*"
