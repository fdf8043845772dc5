"""Memory limits kept by the kernel: a cgroup (v2) per task, made in the cgroup systemd delegates to the agent
(its unit's Delegate=yes), with memory.max at the task's limit and memory.oom.group set, so the kernel kills the
whole task when it passes its limit and counts it in memory.events (oom_kill).

The layout under the agent's delegated cgroup D: the agent and its shims live in D/agent, where systemd starts
it (the unit's DelegateSubgroup=agent, systemd 254 on: cgroup v2 lets only leaves hold processes once D hands
the memory controller down, and a restarted agent must land in a leaf again), and each task in
D/tasks/<attempt>. A shim
steps into its task's cgroup just to start the task, and steps back out, so the task and everything it starts
are inside from their first instruction while the shim's own memory is never counted against the task.

Where this cannot be (cgroup v1, no delegation, no memory controller), `why_not` says so and the shims keep
the limit by watching the tree (treewatch.py).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
AGENT_LEAF = "agent"
TASKS = "tasks"


def own_cgroup(pid: str = "self", root: Path = ROOT) -> Path:
    """The cgroup v2 directory of a process (the `0::` line of /proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    raise OSError("no cgroup v2 entry in /proc/self/cgroup")


class TaskCgroups:
    """The agent's delegated cgroup, ready for task cgroups; or why there is none (why_not)."""

    def __init__(self, root: Path = ROOT):
        self.delegated: Path | None = None
        self.why_not = ""
        try:
            self._prepare(root)
        except OSError as e:
            self.delegated, self.why_not = None, f"cannot set up task cgroups: {e.strerror or e}"

    def _prepare(self, root: Path) -> None:
        if not (root / "cgroup.controllers").exists():
            self.why_not = f"no cgroup v2 hierarchy at {root} (this kernel mounts cgroup v1)"
            return
        own = own_cgroup(root=root)
        delegated = own.parent
        if own.name != AGENT_LEAF or not delegated.name.endswith(".service"):
            self.why_not = f"the agent's cgroup is {own}, not the {AGENT_LEAF} subgroup of its systemd service " \
                           f"(its unit's Delegate=yes and DelegateSubgroup={AGENT_LEAF}, systemd 254 or later)"
            return
        if "memory" not in (delegated / "cgroup.controllers").read_text().split():
            self.why_not = f"the memory controller is not given to {delegated} (run the agent from its systemd " \
                           f"unit, which has Delegate=yes)"
            return
        if not os.access(delegated / "cgroup.subtree_control", os.W_OK):
            self.why_not = f"{delegated} is not delegated to the agent (its systemd unit needs Delegate=yes)"
            return
        _enable_memory(delegated)
        (delegated / TASKS).mkdir(exist_ok=True)
        _enable_memory(delegated / TASKS)
        self.delegated = delegated

    def make(self, name: str, limit_bytes: int) -> str:
        """A task's cgroup with its limit (swap included: the limit is memory the task may hold); its path."""
        assert self.delegated is not None
        path = self.delegated / TASKS / name
        path.mkdir(exist_ok=True)
        (path / "memory.max").write_text(str(limit_bytes))
        if (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
        (path / "memory.oom.group").write_text("1")
        return str(path)


def _enable_memory(path: Path) -> None:
    if "memory" not in (path / "cgroup.subtree_control").read_text().split():
        (path / "cgroup.subtree_control").write_text("+memory")


# ---- the shim's side -----------------------------------------------------------------------------

def enter(cgroup: str) -> Path:
    """Moves this process into the task's cgroup; returns the cgroup to come back to."""
    home = own_cgroup()
    (Path(cgroup) / "cgroup.procs").write_text("0")
    return home


def leave(home: Path) -> None:
    (home / "cgroup.procs").write_text("0")


def oom_kills(cgroup: str) -> int:
    """How many processes of the task the kernel killed for passing memory.max."""
    try:
        for line in (Path(cgroup) / "memory.events").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def peak_bytes(cgroup: str) -> int:
    """The most memory the task's cgroup held (memory.peak, Linux 5.19 on); 0 where the kernel does not say."""
    try:
        return int((Path(cgroup) / "memory.peak").read_text())
    except (OSError, ValueError):
        return 0


def remove(cgroup: str) -> None:
    """Once the task's processes are gone (a cgroup with none can be removed)."""
    try:
        os.rmdir(cgroup)
    except OSError:
        pass
