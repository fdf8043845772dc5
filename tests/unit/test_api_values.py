"""The Python API's values without a cluster: a spec given in each form it takes becomes the same checked
JobSpec, bad ones raise InvalidRequest naming what was wrong, and a status message reads as its typed twin with
unset fields as None."""

from __future__ import annotations

import pytest

from tfcluster.api.v1 import control_pb2
from tfcluster.cluster import job_spec, parse_task
from tfcluster.errors import InvalidRequest
from tfcluster.model import Gpu
from tfcluster.spec import JobSpec, RoleSpec
from tfcluster.statuses import JobStatus, NodeStatus, read

TOML = 'name = "fit"\nstrategy = "mirrored"\ncommand = ["python3", "train.py"]\nworkdir = "src"\n'


def test_a_path_toml_text_a_dict_and_a_jobspec_give_the_same_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text(TOML)
    given = {"name": "fit", "strategy": "mirrored", "command": ["python3", "train.py"], "workdir": "src"}
    typed = JobSpec(name="fit", strategy="mirrored", command=("python3", "train.py"), workdir="src",
                    roles={"worker": RoleSpec(count=1)})
    forms = [tmp_path / "job.toml", "job.toml", TOML, given, typed]
    specs = [job_spec(form) for form in forms]
    assert all(s.workdir == str(tmp_path / "src") for s in specs), [s.workdir for s in specs]
    assert len({(s.name, s.strategy, s.command, s.workdir) for s in specs}) == 1


@pytest.mark.parametrize("bad, said", [
    ({"name": "x"}, "strategy: missing"),
    ('name = "x"\nstrategy = "nonsense"\n', "strategy"),
    ("no-such-file.toml", "cannot read"),
    (42, "expected a JobSpec, a dict, TOML text or a spec file's path, got int"),
])
def test_a_bad_spec_is_an_invalid_request_naming_what_was_wrong(bad, said, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidRequest, match=said) as refused:
        job_spec(bad)
    assert refused.value.exit_code == 2


def test_task_names_parse_or_are_refused():
    assert parse_task("worker:12") == ("worker", 12)
    for bad in ("worker", "boss:0", "worker:-1", "worker:x", f"worker:{2**31}"):
        with pytest.raises(InvalidRequest, match="TYPE:INDEX"):
            parse_task(bad)


def test_a_status_message_reads_as_its_typed_twin_with_unset_fields_none():
    message = control_pb2.JobStatus(id="j-1", state="RUNNING", tasks=[
        control_pb2.TaskStatus(type="worker", index=1, exit_code=0, gpus=[{"index": 2, "name": "A100"}]),
        control_pb2.TaskStatus(type="chief", state="RUNNING")],
        evaluations=[{"step": 5, "metrics": {"loss": 0.5}}])
    job = read(JobStatus, message)
    assert job.wire is message and job == read(JobStatus, message)
    assert [(t.name, t.exit_code, t.signal) for t in job.tasks] == [("worker:1", 0, None), ("chief:0", None, None)]
    assert job.tasks[0].gpus == [Gpu(index=2, name="A100")]
    assert job.last_failure is None and job.last_evaluation.metrics == {"loss": 0.5}
    node = read(NodeStatus, control_pb2.NodeStatus(name="a"))
    assert node.drain is None
    drained = read(NodeStatus, control_pb2.NodeStatus(name="a", drain={"reason": "disk", "by": "ops"}))
    assert (drained.drain.reason, drained.drain.by) == ("disk", "ops")
