"""Gang placement: every task of a job gets a node, its GPUs and a port, all at once or not at all. Pure.

A job is checked twice: against the nodes as if idle (can it *ever* fit? if not it fails at once with the
reason) and against what is free now (if not, it waits PENDING). Roles pinned to nodes and tasks with
GPUs are placed first; a bounded search backtracks when a greedy choice blocks a later task.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from tfcluster.spec import ROLE_TYPES, JobSpec

SEARCH_BUDGET = 20_000  # placement attempts before giving up on a job (jobs are tens of tasks)


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str = ""
    name: str = ""
    memory_mib: int = 0


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    address: str
    gpus: tuple[Gpu, ...]
    port_range: tuple[int, int]  # inclusive
    used_gpus: frozenset[int] = frozenset()
    used_ports: frozenset[int] = frozenset()

    def idle(self) -> "NodeCapacity":
        return NodeCapacity(self.name, self.address, self.gpus, self.port_range)


@dataclass(frozen=True)
class TaskPlacement:
    type: str
    index: int
    node: str
    host: str
    port: int
    gpus: tuple[Gpu, ...]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Unfit:
    reason: str


@dataclass
class _Free:
    gpus: list[Gpu]
    ports: list[int]
    tasks: int = 0


def task_list(spec: JobSpec) -> list[tuple[str, int]]:
    return [(t, i) for t in ROLE_TYPES for i in range(spec.count(t))]


def place(spec: JobSpec, nodes: list[NodeCapacity],
          previous: dict[tuple[str, int], tuple[str, int]] | None = None,
          only: set[tuple[str, int]] | None = None) -> list[TaskPlacement] | Unfit:
    """Places every task of spec (or only those named) on nodes, or says why it cannot.

    previous (task -> (node, port)) is tried first, so a restarted group lands where it was, on the same
    addresses when they are free."""
    previous = previous or {}
    by_name = {n.name: n for n in nodes}
    for role_type in ROLE_TYPES if only is None else ():  # re-placing a task uses the pinned nodes left
        for pinned in spec.role(role_type).nodes:
            if pinned not in by_name:
                known = ", ".join(sorted(by_name)) or "none"
                return Unfit(f"roles.{role_type}.nodes names {pinned!r}, which is not a ready node (ready: {known})")
    if not nodes:
        return Unfit("no ready nodes")

    free = {n.name: _Free(gpus=[g for g in n.gpus if g.index not in n.used_gpus],
                          ports=[p for p in range(n.port_range[0], n.port_range[1] + 1) if p not in n.used_ports])
            for n in nodes}

    def candidates(role_type: str) -> list[str]:
        pinned = spec.role(role_type).nodes
        return [n for n in pinned if n in by_name] if pinned else [n.name for n in nodes]

    tasks = [t for t in task_list(spec) if only is None or t in only]
    # Most constrained first: pinned roles, then GPU-hungry ones; keep index order within a role.
    tasks.sort(key=lambda t: (len(candidates(t[0])), -spec.gpus_for(t[0])))

    for role_type, _ in tasks:
        need = spec.gpus_for(role_type)
        if not any(len(by_name[n].gpus) >= need for n in candidates(role_type)):
            return Unfit(_no_node_reason(spec, role_type, [by_name[n] for n in candidates(role_type)], free, total=True))

    assignment: dict[tuple[str, int], TaskPlacement] = {}
    budget = [SEARCH_BUDGET]
    deepest = [0, tasks[0] if tasks else None]

    def order(task: tuple[str, int]) -> list[str]:
        role_type = task[0]
        names = candidates(role_type)
        preferred = previous.get(task, ("", 0))[0]
        # Keep off nodes that tasks not placed yet were on (they go back there: a task moved off a lost node
        # must not push a survivor off its own), spread a job across nodes, then prefer the node with the
        # most GPUs left (fewer strands).
        theirs = {n for t, (n, _) in previous.items() if t != task and t not in assignment}
        names.sort(key=lambda n: (n != preferred, n in theirs, free[n].tasks, -len(free[n].gpus), n))
        return names

    def search(i: int) -> bool:
        if i == len(tasks):
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return False
        task = tasks[i]
        if i >= deepest[0]:
            deepest[0], deepest[1] = i, task
        need = spec.gpus_for(task[0])
        for name in order(task):
            slot = free[name]
            if len(slot.gpus) < need or not slot.ports:
                continue
            old_node, old_port = previous.get(task, ("", 0))
            port = old_port if name == old_node and old_port in slot.ports else slot.ports[0]
            gpus = slot.gpus[:need]
            del slot.gpus[:need]
            slot.ports.remove(port)
            slot.tasks += 1
            assignment[task] = TaskPlacement(task[0], task[1], name, by_name[name].address, port, tuple(gpus))
            if search(i + 1):
                return True
            del assignment[task]
            slot.tasks -= 1
            bisect.insort(slot.ports, port)
            slot.gpus[:0] = gpus
        return False

    if search(0):
        return [assignment[t] for t in task_list(spec) if t in assignment]
    if budget[0] < 0:
        return Unfit(f"no placement found within {SEARCH_BUDGET} tries for {len(tasks)} tasks")
    stuck = deepest[1]
    return Unfit(_no_node_reason(spec, stuck[0], [by_name[n] for n in candidates(stuck[0])], free, total=False,
                                 task=f"{stuck[0]}:{stuck[1]}"))


def _no_node_reason(spec: JobSpec, role_type: str, nodes: list[NodeCapacity], free: dict[str, _Free],
                    total: bool, task: str = "") -> str:
    need = spec.gpus_for(role_type)
    what = f"{need} GPU{'s' if need != 1 else ''}" if need else "a port"
    if total:
        sizes = ", ".join(f"{n.name}: {len(n.gpus)}" for n in nodes)
        where = "the nodes it may use" if spec.role(role_type).nodes else "any ready node"
        return f"{role_type} tasks need {what} each, more than {where} has (GPUs per node: {sizes})"
    gpus_needed = sum(spec.gpus_for(t) for t, _ in task_list(spec))
    state = ", ".join(f"{n.name}: {len(n.gpus) - len(n.used_gpus)} of {len(n.gpus)} GPUs free" for n in nodes)
    return (f"cannot place all {len(task_list(spec))} tasks at once ({gpus_needed} GPUs in all); "
            f"no node left for {task} (needs {what}); {state}")


def choose_strategy(spec: JobSpec, nodes: list[NodeCapacity]) -> JobSpec:
    """Resolves `auto` from the hardware: ps asked for -> parameter_server; the training GPUs fit on one
    node -> mirrored (one task with all of them); otherwise multi_worker_mirrored across nodes."""
    if spec.strategy != "auto":
        return spec
    if spec.count("ps"):
        return replace(spec, strategy="parameter_server")
    if spec.training_task_count == 1:
        return replace(spec, strategy="mirrored")
    total = sum(spec.gpus_for(r) * spec.count(r) for r in ("chief", "worker"))
    allowed = set(spec.role("worker").nodes) or {n.name for n in nodes}
    if total and any(n.name in allowed and len(n.gpus) - len(n.used_gpus) >= total for n in nodes):
        worker = spec.role("worker")
        single = replace(worker, count=1, gpus=total)
        roles = {"worker": single, **({"evaluator": spec.role("evaluator")} if spec.count("evaluator") else {})}
        return replace(spec, strategy="mirrored", roles=roles)
    return replace(spec, strategy="multi_worker_mirrored")
