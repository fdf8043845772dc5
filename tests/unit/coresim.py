"""The coordinator's core driven the way agents drive it, with fake time: a Cluster and helpers that play
the agents' part (shared by the core's unit tests)."""

from __future__ import annotations

from dataclasses import replace

from tfcluster import __version__
from tfcluster.commands import Launch, Stop
from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.model import Attempt, Gpu, NodeInfo, TaskExit, TaskReport
from tfcluster.specfile import parse_spec

PORTS = (20000, 20099)


def gpus(node: str, n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, uuid=f"GPU-{node}-{i}", name="A100", memory_mib=40000) for i in range(n))


def info(name: str, n_gpus: int = 0, ports=PORTS) -> NodeInfo:
    return NodeInfo(name=name, address=f"10.0.0.{name[-1]}", port_range=ports, gpus=gpus(name, n_gpus),
                    state_dir=f"/state/{name}", agent_version=__version__)


def make_spec(strategy="multi_worker_mirrored", gpus=0, env=None, restart=None, name="job", **roles):
    table = {r: (v if isinstance(v, dict) else {"count": v}) for r, v in roles.items()}
    data = {"name": name, "strategy": strategy, "command": ["python", "train.py"], "gpus": gpus,
            "roles": table, "workdir": "/work/job"}
    if env:
        data["env"] = env
    if restart:
        data["restart"] = restart
    return parse_spec(data, "test")


def report(job_id, task_type, index, attempt, phase, pid=0, listening=False, **exit) -> TaskReport:
    """A report as an agent sends it; exit fields (exit_code, signal, message, ...) for ended attempts."""
    if "log_tail" in exit:
        exit["log_tail"] = tuple(exit["log_tail"])
    return TaskReport(Attempt(job_id, task_type, index, attempt), phase, pid=pid, listening=listening,
                      exit=TaskExit(**exit) if phase != "RUNNING" else None)


class Sim:
    """A Cluster plus fake time and helpers that play the agents' part."""
    current: "Sim | None" = None

    def __init__(self, *nodes: NodeInfo, lost_after: float = 3.0, task_grace: float = 0.0):
        # task_grace 0: a node's tasks are lost with it, as most tests of what follows a loss want
        self.c = Cluster(lost_after_seconds=lost_after, task_grace_seconds=task_grace)
        self.now = 100.0
        self.pid = 1000
        Sim.current = self
        for n in nodes:
            assert self.c.register(n, [], f"session-{n.name}", self.now) == []

    def submit(self, spec, name="job"):
        """Submits spec under the job name given (its id is name-N)."""
        return self.c.submit(replace(spec, name=name), self.now)

    def report(self, job, task_type, index, phase, attempt=None, node=None, **kw) -> list:
        task = job.task(task_type, index)
        if phase == "RUNNING" and "pid" not in kw:
            self.pid += 1
            kw["pid"] = self.pid
        if phase == "RUNNING":
            kw.setdefault("listening", True)  # as agents report servers once they accept connections
        r = report(job.id, task_type, index, task.attempt if attempt is None else attempt, phase, **kw)
        return self.c.report(node or task.node, r, self.now)

    def running(self, job, actions) -> list:
        """Every launched task reports RUNNING; returns the actions that come back."""
        out = []
        for a in launches(actions):
            out += self.report(job, a.attempt.type, a.attempt.index, "RUNNING", attempt=a.attempt.number, node=a.node)
        return out

    def exit(self, job, key, code=0, signal=None, **kw) -> list:
        t, i = key.split(":")
        return self.report(job, t, int(i), "EXITED", exit_code=code, signal=signal, **kw)

    def exit_stopped(self, job, actions) -> list:
        """Every task told to stop exits by SIGTERM."""
        out = []
        for s in stops(actions):
            out += self.report(job, s.attempt.type, s.attempt.index, "EXITED", attempt=s.attempt.number, node=s.node,
                               exit_code=None, signal=15)
        return out

    def heartbeat_all(self, *except_nodes):
        for name, n in self.c.nodes.items():
            if name not in except_nodes:
                self.c.heartbeat(name, n.seen.session_id, self.now)

    def free(self):
        """node -> (free GPU indices, used ports)."""
        return {n.name: (sorted(g.index for g in n.gpus if g.index not in n.used_gpus), sorted(n.used_ports))
                for n in self.c.capacity(self.now)}


def task_of(action):
    """The task an action is about."""
    return Sim.current.c.jobs[action.attempt.job_id].task(action.attempt.type, action.attempt.index)


def launches(actions):
    return [a for a in actions if isinstance(a, Launch)]


def stops(actions):
    return [a for a in actions if isinstance(a, Stop)]


def keys(actions):
    return sorted(a.attempt.task_key for a in actions)


def check_held(c: Cluster) -> None:
    """What the cluster keeps as held on each node (core/model/held.py) equals it added up from every live job's
    tasks: those running or launching, and those placed and waiting to launch there."""
    gpus: dict[str, list[int]] = {}
    ports: dict[str, list[int]] = {}
    memory: dict[str, int] = {}
    for job in c.jobs.live.values():
        for task in job.tasks:
            if task.node and job.holds(task):
                gpus.setdefault(task.node, []).extend(g.index for g in task.gpus)
                ports.setdefault(task.node, []).append(task.port)
                memory[task.node] = memory.get(task.node, 0) + job.spec.memory_for(task.type)
    assert {n: sorted(held.elements()) for n, held in c.held.gpus().items()} == \
        {n: sorted(g) for n, g in gpus.items() if g}
    assert {n: sorted(held.elements()) for n, held in c.held.ports().items()} == {n: sorted(p) for n, p in ports.items()}
    assert dict(c.held.memory()) == {n: m for n, m in memory.items() if m}
