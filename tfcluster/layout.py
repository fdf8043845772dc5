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
CODE_DIR = "TFCLUSTER_CODE_DIR"  # the job's code as fetched, read-only: the task's cwd is a writable dir over it
EVENTS_FILE = "TFCLUSTER_EVENTS_FILE"    # the task appends its events (evaluations) here
CONTROL_FILE = "TFCLUSTER_CONTROL_FILE"  # the agent tells the task that training has finished here
SUMMARY_DIR = "TFCLUSTER_SUMMARY_DIR"    # where the task writes TensorBoard summaries (its agent sends them up)
STOP_SIGNAL = "TFCLUSTER_STOP_SIGNAL"    # the signal a stop, preemption or drain sends first ("SIGTERM")
STOP_GRACE = "TFCLUSTER_STOP_GRACE_SECONDS"  # and how long after it SIGKILL follows
DATA_SERVICE = "TFCLUSTER_DATA_SERVICE"  # the tf.data service's dispatcher, "grpc://host:port" (a job with one)
ADDRESS = "TFCLUSTER_ADDRESS"  # the task's own "host:port", as other tasks reach it
DATA_SERVICE_SUBDIR = "tf_data_service"  # under the checkpoint dir: the dispatcher's journal (its work_dir)
# The evaluator's summary dir unless its role sets summary_dir: this folder under the model dir.
EVAL_SUMMARY_SUBDIR = "eval"
# Set by tfcluster for every task; a spec may not override them.
RESERVED_ENV = (TF_CONFIG, CUDA_VISIBLE_DEVICES)
RESERVED_ENV_PREFIX = "TFCLUSTER_"

# ---- client and daemon settings -----------------------------------------------------------------
COORDINATOR_ENV = "TFCLUSTER_COORDINATOR"
TOKEN_FILE_ENV = "TFCLUSTER_TOKEN_FILE"
TLS_DIR_ENV = "TFCLUSTER_TLS_DIR"  # a credentials directory: ca.crt, client.crt, client.key
DEFAULT_COORDINATOR = "localhost:7070"

# ---- files on a node (under the agent's state dir) ----------------------------------------------
# <state>/tls/                                              the node's key and certificate (root's alone)
# <state>/code/<sha256 hex>{/,.tar.gz}                      the node's cache of jobs' code (root's alone)
# <state>/envs/<key>/                                       jobs' virtualenvs, one per what they ask for
# <state>/.overlay-probe/                                   made and removed at start: can overlays be mounted?
# <state>/jobs/<job>/checkpoints/                         host-local checkpoint dir of the job
# <state>/jobs/<job>/.incoming-<id>/                      checkpoint files being received from a peer
# <state>/jobs/<job>/summaries/<type>-<index>/            a task's TFCLUSTER_SUMMARY_DIR (not the evaluator's)
# <state>/jobs/<job>/tasks/<type>-<index>/attempt-<n>/    one attempt: the files below
LAUNCH_FILE = "launch.json"    # what to run (written by the agent)
STATUS_FILE = "status.json"    # pids, phase, exit (written by the shim)
OUTPUT_FILE = "output.log"     # the task's stdout and stderr, as written: its first bytes (the head)
# Output past the head goes to tail segments, each named after its first byte's offset in the whole output;
# the oldest are deleted to bound the attempt's log, so the offsets also say how many bytes were dropped.
OUTPUT_TAIL_PREFIX = "output.tail-"
OUTPUT_TAIL_SUFFIX = ".log"
STOP_FILE = "stop.json"        # the grace period of a requested stop
USAGE_FILE = "usage.json"      # the running task's CPU seconds and memory (written by the shim)
SHIM_LOG_FILE = "shim.log"     # the shim's own errors
EVENTS_NAME = "events.jsonl"
CONTROL_NAME = "control.json"
INCOMING_PREFIX = ".incoming-"
# <state>/jobs/<job>/ended.json: the coordinator said the job is over (so `tfcluster gc` knows it offline)
ENDED_MARKER = "ended.json"
ATTEMPT_DIR_PREFIX = "attempt-"
TASKS_NAME = "tasks"  # a job's dir's folder of its tasks' attempts

# ---- files of the coordinator (under its state dir) ---------------------------------------------
COORDINATOR_DB = "coordinator.sqlite3"
# <state>/summaries/<job>/<type>-<index>/<path>: the event files the job's tasks wrote, as their agents sent them
SUMMARIES_NAME = "summaries"


def jobs_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "jobs"


def job_dir(state_dir: str | Path, job_id: str) -> Path:
    return jobs_dir(state_dir) / job_id


def host_checkpoint_dir(state_dir: str, job_id: str) -> str:
    """A job's host-local checkpoint dir on a node whose agent keeps its files in state_dir.

    A string built with posixpath: the coordinator computes it for nodes it is not running on."""
    return posixpath.join(state_dir, "jobs", job_id, "checkpoints")


def attempt_dir(state_dir: str | Path, job_id: str, task_type: str, task_index: int, attempt: int) -> Path:
    return tasks_dir(state_dir, job_id) / task_name(task_type, task_index) / f"{ATTEMPT_DIR_PREFIX}{attempt}"


def task_summary_dir(state_dir: str | Path, job_id: str, task_type: str, task_index: int) -> str:
    """A task's TFCLUSTER_SUMMARY_DIR on its node (every attempt's): the evaluator's is its role's own instead."""
    return posixpath.join(str(state_dir), "jobs", job_id, SUMMARIES_NAME, task_name(task_type, task_index))


def task_name(task_type: str, task_index: int) -> str:
    """A task's folder name, on a node and in the coordinator's summaries: `<type>-<index>`."""
    return f"{task_type}-{task_index}"


def tasks_dir(state_dir: str | Path, job_id: str) -> Path:
    """Where a job's attempts live on a node: one folder per task (`<type>-<index>`), one per attempt inside."""
    return job_dir(state_dir, job_id) / TASKS_NAME


def tls_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "tls"


def code_cache_dir(state_dir: str | Path) -> Path:
    """The node's cache of jobs' code (the agent's), or the coordinator's archives (under its own state dir)."""
    return Path(state_dir) / "code"


def environments_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "envs"


def overlay_probe_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / ".overlay-probe"


# <attempt dir>/code/{cwd,tree,upper,work,sha256}: an attempt's working dir over its job's code (workspace.py)
ATTEMPT_CODE_DIR = "code"


def output_tail_name(offset: int) -> str:
    """The tail segment of a task's output whose first byte is byte `offset` of everything it wrote."""
    return f"{OUTPUT_TAIL_PREFIX}{offset:016d}{OUTPUT_TAIL_SUFFIX}"


def output_tail_offset(name: str) -> int | None:
    """The offset in a tail segment's name; None when name is not one."""
    if not (name.startswith(OUTPUT_TAIL_PREFIX) and name.endswith(OUTPUT_TAIL_SUFFIX)):
        return None
    digits = name[len(OUTPUT_TAIL_PREFIX):-len(OUTPUT_TAIL_SUFFIX)]
    return int(digits) if digits.isdigit() else None
