"""The launch, status and stop files of an attempt dir: what this release writes reads back the same, what
0.3 wrote still reads (a shim outlives an agent upgrade), and bad content is refused naming file and field."""

from __future__ import annotations

import json
import os
import time

import pytest

from tfcluster import layout
from tfcluster.daemon.agent.shim import taskfiles
from tfcluster.daemon.agent.tasks.supervisor import FINISHED_KEPT_SECONDS, Supervisor
from tfcluster.daemon.agent.shim.taskfiles import (FORMAT, LaunchFile, ShimStatus, TaskFileError, UsageFile, read_stop_grace,
                                              write_json_atomic, write_stop)
from tfcluster.model import Attempt, Phase, TaskExit, TaskReport

ATTEMPT = Attempt("job-1", "worker", 1, 3)

# Files as the agent and the shim of 0.3 wrote them, field for field.
LAUNCH_0_3 = {"job_id": "job-1", "task_type": "worker", "task_index": 1, "attempt": 3,
              "command": ["python", "train.py"], "env": {"TF_CONFIG": "{}"}, "workdir": "/work", "port": 20001,
              "stop_grace_seconds": 30.0, "log_limit_bytes": 1024, "user": {"uid": 1500, "gid": 1500},
              "task_dirs": ["/ckpt"], "private_tmp": "/state/jobs/job-1/tmp", "private_tmp_unavailable": ""}
STATUS_0_3 = {
    "running": {"shim_pid": 10, "attempt": 3, "phase": "RUNNING", "pid": 11, "pgid": 11, "started": 100.5},
    "exited": {"shim_pid": 10, "attempt": 3, "phase": "EXITED", "pid": 11, "pgid": 11, "started": 100.5,
               "finished": 200.25, "log_tail": ["a", "b"], "stopped": False, "exit_code": 3},
    "killed": {"shim_pid": 10, "attempt": 3, "phase": "EXITED", "pid": 11, "pgid": 11, "started": 100.5,
               "finished": 200.25, "log_tail": [], "stopped": True, "signal": 9},
    "never_ran": {"shim_pid": 10, "attempt": 3, "phase": "FAILED_TO_START", "message": "cannot start command",
                  "finished": 100.5},
}


def test_a_launch_file_reads_back_as_written_and_as_0_3_wrote_it(tmp_path):
    launch = LaunchFile(ATTEMPT, ("python", "train.py"), {"TF_CONFIG": "{}"}, "/work", 20001, 30.0, 1024,
                        uid=1500, gid=1500, task_dirs=("/ckpt",), private_tmp="/state/jobs/job-1/tmp")
    launch.write(tmp_path)
    assert LaunchFile.read(tmp_path) == launch
    assert json.loads((tmp_path / layout.LAUNCH_FILE).read_text())["format"] == FORMAT
    (tmp_path / layout.LAUNCH_FILE).write_text(json.dumps(LAUNCH_0_3))
    assert LaunchFile.read(tmp_path) == launch


def test_a_launch_file_without_a_user_or_the_optional_fields_reads_with_their_defaults(tmp_path):
    minimal = {k: LAUNCH_0_3[k] for k in ("job_id", "task_type", "task_index", "attempt", "command", "env")}
    (tmp_path / layout.LAUNCH_FILE).write_text(json.dumps({**minimal, "user": None}))
    launch = LaunchFile.read(tmp_path)
    assert (launch.uid, launch.gid, launch.workdir, launch.port, launch.task_dirs) == (None, None, "", 0, ())
    assert launch.stop_grace_seconds == 30.0 and LaunchFile.read(tmp_path / "nothing") is None


@pytest.mark.parametrize("name, expected", [
    ("running", ShimStatus(Phase.RUNNING, 3, 10, pid=11, pgid=11, started=100.5)),
    ("exited", ShimStatus(Phase.EXITED, 3, 10, 11, 11, 100.5, 200.25, exit=TaskExit(exit_code=3, log_tail=("a", "b")))),
    ("killed", ShimStatus(Phase.EXITED, 3, 10, 11, 11, 100.5, 200.25, stopped=True, exit=TaskExit(signal=9))),
    ("never_ran", ShimStatus(Phase.FAILED_TO_START, 3, 10, finished=100.5,
                             exit=TaskExit(message="cannot start command"))),
])
def test_a_status_file_reads_back_as_written_and_as_0_3_wrote_it(tmp_path, name, expected):
    (tmp_path / layout.STATUS_FILE).write_text(json.dumps(STATUS_0_3[name]))
    assert ShimStatus.read(tmp_path) == expected
    expected.write(tmp_path)
    assert ShimStatus.read(tmp_path) == expected
    written = json.loads((tmp_path / layout.STATUS_FILE).read_text())
    assert {k: v for k, v in written.items() if k in STATUS_0_3[name]} == STATUS_0_3[name], \
        "the fields 0.3 wrote keep their names and places: a 0.3 agent reads this release's files too"


def test_fields_a_newer_release_adds_are_ignored(tmp_path):
    (tmp_path / layout.STATUS_FILE).write_text(json.dumps({**STATUS_0_3["exited"], "format": FORMAT + 1,
                                                            "energy_joules": 12.5}))
    assert ShimStatus.read(tmp_path).exit == TaskExit(exit_code=3, log_tail=("a", "b"))


@pytest.mark.parametrize("content, named", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({**STATUS_0_3["exited"], "exit_code": "3"}), "field 'exit_code': expected int"),
    (json.dumps({**STATUS_0_3["exited"], "exit_code": True}), "field 'exit_code': expected int"),
    (json.dumps({**STATUS_0_3["exited"], "log_tail": [1]}), "field 'log_tail': expected a list of strings"),
    (json.dumps({**STATUS_0_3["running"], "phase": "DANCING"}), "field 'phase': expected RUNNING"),
    (json.dumps({"pid": 3}), "field 'phase' is missing"),
])
def test_bad_status_content_is_refused_naming_the_file_and_the_field(tmp_path, content, named):
    (tmp_path / layout.STATUS_FILE).write_text(content)
    with pytest.raises(TaskFileError, match=named) as refused:
        ShimStatus.read(tmp_path)
    assert str(refused.value).startswith(str(tmp_path / layout.STATUS_FILE))


@pytest.mark.parametrize("change, named", [
    ({"env": {"A": 1}}, "field 'env'"), ({"user": {"uid": "root"}}, "field 'uid'"),
    ({"command": "python train.py"}, "field 'command': expected list"), ({"job_id": None}, "field 'job_id'"),
])
def test_bad_launch_content_is_refused_naming_the_file_and_the_field(tmp_path, change, named):
    (tmp_path / layout.LAUNCH_FILE).write_text(json.dumps({**LAUNCH_0_3, **change}))
    with pytest.raises(TaskFileError, match=named):
        LaunchFile.read(tmp_path)


def test_the_stop_file_carries_the_latest_grace_period(tmp_path):
    assert read_stop_grace(tmp_path) is None
    write_stop(tmp_path, 2.5)
    assert read_stop_grace(tmp_path) == 2.5
    (tmp_path / layout.STOP_FILE).write_text(json.dumps({"grace_seconds": 7}))  # as 0.3 wrote it
    assert read_stop_grace(tmp_path) == 7.0


def test_an_upgraded_agent_picks_up_the_exit_a_0_3_shim_recorded(tmp_path):
    directory = layout.attempt_dir(tmp_path, ATTEMPT.job_id, ATTEMPT.type, ATTEMPT.index, ATTEMPT.number)
    directory.mkdir(parents=True)
    (directory / layout.LAUNCH_FILE).write_text(json.dumps(LAUNCH_0_3))
    (directory / layout.STATUS_FILE).write_text(json.dumps({**STATUS_0_3["exited"], "finished": time.time()}))
    supervisor = Supervisor(tmp_path, lambda record: None)
    assert supervisor.adopt_running() == 0, "nothing runs"
    [record] = supervisor.snapshot()
    assert record.report() == TaskReport(ATTEMPT, Phase.EXITED, pid=11, exit=TaskExit(exit_code=3, log_tail=("a", "b")))
    assert (record.port, record.group) == (20001, 1500)


def test_a_restarted_agent_reads_no_more_than_the_status_of_an_attempt_that_ended_long_ago(tmp_path, monkeypatch):
    """A node keeps days of ended attempts: a restart that read both files of every one took seconds. One of a job
    marked over that still runs (started as its job ended) is reattached to all the same."""
    for job_id, finished in (("old-1", time.time() - 2 * FINISHED_KEPT_SECONDS), ("recent-2", time.time())):
        directory = layout.attempt_dir(tmp_path, job_id, "worker", 0, 1)
        directory.mkdir(parents=True)
        (directory / layout.LAUNCH_FILE).write_text(json.dumps({**LAUNCH_0_3, "job_id": job_id}))
        (directory / layout.STATUS_FILE).write_text(json.dumps({**STATUS_0_3["exited"], "finished": finished}))
    (layout.job_dir(tmp_path, "old-1") / layout.ENDED_MARKER).write_text("{}")
    read = []
    real_read_bytes = taskfiles.read_bytes
    monkeypatch.setattr(taskfiles, "read_bytes", lambda path, *a: read.append(path) or real_read_bytes(path, *a))
    supervisor = Supervisor(tmp_path, lambda record: None)
    assert supervisor.adopt_running() == 0
    assert [r.attempt.job_id for r in supervisor.snapshot()] == ["recent-2"]
    assert [path.name for path in read if "old-1" in str(path)] == [layout.STATUS_FILE]


def test_only_the_exit_is_forced_to_disk(tmp_path, monkeypatch):
    """A rebooted node's agent still reports an exit; what only the same boot reads back skips the fsync."""
    synced = []
    monkeypatch.setattr("os.fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    LaunchFile(ATTEMPT, ("true",), {}).write(tmp_path)
    ShimStatus(Phase.RUNNING, 3, 10, pid=11, pgid=11, started=100.5).write(tmp_path)
    write_stop(tmp_path, 1.0)
    assert synced == []
    ShimStatus(Phase.EXITED, 3, 10, 11, 11, 100.5, 200.25, exit=TaskExit(exit_code=3)).write(tmp_path)
    assert len(synced) == 1 and ".tmp" in synced[0]
    assert ShimStatus.read(tmp_path).exit.exit_code == 3 and LaunchFile.read(tmp_path).command == ("true",)


def test_a_memory_limit_and_an_attempts_usage_read_back_as_written_and_default_to_none(tmp_path):
    launch = LaunchFile(ATTEMPT, ("python", "train.py"), {}, memory_bytes=16 << 30, cgroup="/sys/fs/cgroup/x/t")
    launch.write(tmp_path)
    assert LaunchFile.read(tmp_path) == launch
    (tmp_path / layout.LAUNCH_FILE).write_text(json.dumps(LAUNCH_0_3))
    assert (LaunchFile.read(tmp_path).memory_bytes, LaunchFile.read(tmp_path).cgroup) == (0, "")
    ended = ShimStatus(Phase.EXITED, 3, 10, 11, 11, 100.5, 200.25, exit=TaskExit(
        signal=9, message="worker:1 exceeded its memory limit of 16 GiB (peak 16.4 GiB)", cpu_seconds=61.25,
        peak_rss_bytes=17_609_365_914))
    ended.write(tmp_path)
    assert ShimStatus.read(tmp_path) == ended
    assert UsageFile.read(tmp_path) is None
    UsageFile(1.5, 100, 200).write(tmp_path)
    assert UsageFile.read(tmp_path) == UsageFile(1.5, 100, 200)
    (tmp_path / layout.USAGE_FILE).write_text('{"cpu_seconds": "a lot"}')
    with pytest.raises(TaskFileError, match="usage.json: field 'cpu_seconds'"):
        UsageFile.read(tmp_path)


def test_a_start_no_restart_would_mend_reads_back_as_such(tmp_path):
    status = ShimStatus(Phase.FAILED_TO_START, 3, 10, finished=100.5,
                        exit=TaskExit(message="cannot enter the workdir /x", permanent=True))
    status.write(tmp_path)
    assert ShimStatus.read(tmp_path) == status
    (tmp_path / layout.STATUS_FILE).write_text(json.dumps(STATUS_0_3["never_ran"]))
    assert not ShimStatus.read(tmp_path).exit.permanent, "a file of an earlier release says nothing of it: retried"


def test_a_file_is_read_whole_from_where_the_reader_asks(tmp_path, monkeypatch):
    """Read on its descriptor, a read at a time: a file longer than one read comes whole, from the offset asked."""
    monkeypatch.setattr(taskfiles, "READ_BYTES", 7)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"0123456789" * 3)
    assert taskfiles.read_bytes(path) == b"0123456789" * 3
    assert taskfiles.read_bytes(path, 25) == b"56789"
    assert taskfiles.read_bytes(path, 30) == b""


def test_a_written_task_file_is_whole_and_replaces_the_old_one(tmp_path):
    big = {"env": {f"VAR_{i}": "x" * 1000 for i in range(300)}}  # 300 KB: more than one write may take
    write_json_atomic(tmp_path / layout.LAUNCH_FILE, {"old": True})
    write_json_atomic(tmp_path / layout.LAUNCH_FILE, big, durable=False)
    assert json.loads((tmp_path / layout.LAUNCH_FILE).read_bytes()) == big
    assert [p.name for p in tmp_path.iterdir()] == [layout.LAUNCH_FILE]  # no temporary file left behind


def test_a_status_file_that_is_not_utf8_is_named_as_not_json(tmp_path):
    (tmp_path / layout.STATUS_FILE).write_bytes(b'{"phase": "\xff\xfe"}')
    with pytest.raises(TaskFileError, match=f"{layout.STATUS_FILE}: not JSON"):
        ShimStatus.read(tmp_path)
