"""TensorBoard event files on their way from the tasks that write them to the coordinator, and on to clients.

A task writes summaries into its summary dir (TFCLUSTER_SUMMARY_DIR); its agent sends each event file's new
bytes up as they are written (agent/hooks/summary_upload.py), the coordinator keeps them per job and task
(coordinator/store/summaries.py) and serves them through a TensorBoard of its own at `/tensorboard/<JOB>[+<JOB>...]/`
(coordinator/web/boards.py), where each task is the run `JOB/TASK`; `tfcluster tensorboard --local` reads them
back instead (ReadSummaries) into a logdir of the caller's. Event files only grow, so a file is carried as (offset, bytes).
Standard library only: the agent, the coordinator and the CLI all use it.
"""

from __future__ import annotations

from dataclasses import dataclass

EVENT_FILE_MARK = ".tfevents."  # TensorBoard's event files: events.out.tfevents.<time>.<host>...
MAX_CHUNK_BYTES = 256 * 1024  # one message's data, well under gRPC's 4 MiB
MAX_PATH = 1024
MAX_DEPTH = 8  # TensorBoard's Keras callback writes train/ and validation/ below the summary dir
# What a job's summaries may take at the coordinator, all its tasks together: the agents send no more, and the
# coordinator keeps no more. Kept until retention lets the job go.
MAX_JOB_BYTES = 256 * 1024 * 1024
BOARD_PREFIX = "/tensorboard/"
BOARD_MAX_JOBS = 50  # shown side by side by one TensorBoard


def board_path(job_ids: list[str]) -> str:
    """The address of the coordinator's TensorBoard over these jobs: one per set of jobs, whatever their order
    (job ids hold no `+`)."""
    return f"{BOARD_PREFIX}{'+'.join(sorted(set(job_ids)))}/"


@dataclass(frozen=True)
class SummaryChunk:
    """Bytes of one event file of one task, from offset on."""
    job_id: str
    task_type: str
    task_index: int
    path: str  # below the task's summary dir, "/"-separated
    offset: int
    data: bytes

    @property
    def task(self) -> str:
        return task_key(self.task_type, self.task_index)

    @property
    def key(self) -> str:
        """How a client names the file it has: `<type>:<index>/<path>` (ReadSummariesRequest.have)."""
        return f"{self.task}/{self.path}"


def task_key(task_type: str, task_index: int) -> str:
    """A task as the CLI names it, and as its TensorBoard run is named below the job: `worker:0`."""
    return f"{task_type}:{task_index}"


def split_key(key: str) -> tuple[str, int, str]:
    """(task type, task index, path) of a SummaryChunk.key; ValueError when key is not one."""
    task, _, path = key.partition("/")
    task_type, _, index = task.partition(":")
    if not task_type or not index.isdigit() or path_problem(path):
        raise ValueError(f"expected <task type>:<task index>/<event file path>, got {key[:200]!r}")
    return task_type, int(index), path


def path_problem(path: str) -> str:
    """Why path cannot name an event file below a summary dir ("": it can): it must stay below that dir."""
    if not path or len(path) > MAX_PATH:
        return f"expected 1 to {MAX_PATH} characters, got {len(path)}"
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        return "must not contain control characters"
    parts = path.split("/")
    if len(parts) > MAX_DEPTH or any(part in ("", ".", "..") for part in parts):
        return f"expected a relative path of at most {MAX_DEPTH} parts without '', '.' or '..', got {path[:200]!r}"
    if EVENT_FILE_MARK not in parts[-1]:
        return f"not a TensorBoard event file (its name holds {EVENT_FILE_MARK!r}): {path[:200]!r}"
    return ""
