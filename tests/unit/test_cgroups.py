"""Task cgroups (v2): the agent's delegated cgroup laid out for tasks, a task's limit written where the kernel
reads it, and the kernel's count of OOM kills read back. The files are a directory of plain files here; on a
kernel with cgroup v2 and a delegated service cgroup the real thing is exercised too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcluster.daemon.agent.shim import cgroups
from tfcluster.daemon.agent.shim.cgroups import TaskCgroups


def fake_hierarchy(tmp_path: Path, service: str = "tfcluster-agent.service") -> Path:
    """A unified hierarchy whose service cgroup was delegated the memory controller."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    delegated = tmp_path / "system.slice" / service
    (delegated / "agent").mkdir(parents=True)
    (delegated / "cgroup.controllers").write_text("cpu memory pids\n")
    (delegated / "cgroup.subtree_control").write_text("")
    return delegated / "agent"


def test_the_delegated_cgroup_hands_memory_down_to_the_tasks_beside_the_agents_leaf(tmp_path, monkeypatch):
    own = fake_hierarchy(tmp_path)
    monkeypatch.setattr(cgroups, "own_cgroup", lambda root: own)
    monkeypatch.setattr(Path, "mkdir", _mkdir_with_control_files(Path.mkdir))
    task_cgroups = TaskCgroups(tmp_path)
    assert task_cgroups.why_not == "" and task_cgroups.delegated == own.parent
    own = own.parent
    assert (own / "cgroup.subtree_control").read_text() == "+memory"
    assert (own / "tasks" / "cgroup.subtree_control").read_text() == "+memory"
    path = Path(task_cgroups.make("job-1.worker-1.2", 16 << 30))
    assert path == own / "tasks" / "job-1.worker-1.2"
    assert (path / "memory.max").read_text() == str(16 << 30) and (path / "memory.oom.group").read_text() == "1"
    assert (path / "memory.swap.max").read_text() == "0"
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n")
    assert cgroups.oom_kills(str(path)) == 1 and cgroups.peak_bytes(str(path)) == 0
    (path / "memory.peak").write_text(str(17 << 30))
    assert cgroups.peak_bytes(str(path)) == 17 << 30


def test_without_cgroup_v2_or_delegation_it_says_why(tmp_path, monkeypatch):
    assert "no cgroup v2 hierarchy" in TaskCgroups(tmp_path).why_not
    own = fake_hierarchy(tmp_path, service="session-3.scope")
    monkeypatch.setattr(cgroups, "own_cgroup", lambda root: own)
    assert "not the agent subgroup of its systemd service" in TaskCgroups(tmp_path).why_not
    own = fake_hierarchy(tmp_path / "other")
    (own.parent / "cgroup.controllers").write_text("cpu pids\n")
    monkeypatch.setattr(cgroups, "own_cgroup", lambda root: own)
    assert "Delegate=yes" in TaskCgroups(tmp_path / "other").why_not


def _mkdir_with_control_files(mkdir):
    """A made cgroup comes with its control files, as the kernel gives them."""
    def made(self, *args, **kwargs):
        mkdir(self, *args, **kwargs)
        for name in ("cgroup.subtree_control", "memory.swap.max"):
            if not (self / name).exists():
                (self / name).write_text("")
    return made


@pytest.mark.skipif(not Path("/sys/fs/cgroup/cgroup.controllers").exists(),
                    reason="this kernel has no cgroup v2 hierarchy at /sys/fs/cgroup (cgroup v1 only): the kernel's "
                           "own memory.max and oom_kill are not there to try")
def test_on_cgroup_v2_an_agent_outside_a_delegated_service_keeps_limits_by_watching():
    task_cgroups = TaskCgroups()
    assert task_cgroups.delegated is not None or task_cgroups.why_not
    if task_cgroups.delegated is None:
        assert "systemd" in task_cgroups.why_not or "Delegate=yes" in task_cgroups.why_not
