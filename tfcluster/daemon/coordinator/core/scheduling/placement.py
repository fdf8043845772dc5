"""Gang placement: every task of a job gets a node, its GPUs and a port, all at once or not at all. Pure.

A job is checked twice: against the nodes as if idle (can it *ever* fit? if not it fails at once with the
reason) and against what is free now (if not, it waits PENDING). Roles pinned to nodes and tasks with
GPUs are placed first; a bounded search backtracks when a greedy choice blocks a later task.

With thousands of nodes nothing here walks every node's ports: a node's free slots are worked out only
when the search looks at it, and candidates come lazily in preference order, so placing a small job costs
about one sort of the node names.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from tfcluster.daemon.coordinator.core.model.capacity import NodeCapacity, TaskPlacement, task_list
from tfcluster.labels import missing
from tfcluster.model import ROLE_TYPES, size_text
from tfcluster.spec import JobSpec

SEARCH_BUDGET = 20_000  # placement attempts before giving up on a job (jobs are tens of tasks)
SHOWN_NODES = 8         # nodes named in a reason; beyond that, a summary
# A bigger job is first checked against the cluster's free GPUs and ports in all: its search could otherwise
# spend the whole budget proving it does not fit. A small job's search is cheap, and when it fails it names
# the task that found no room.
SMALL_JOB_TASKS = 64


@dataclass
class Unfit:
    reason: str


class _Slot:
    """What is still free on one node during one placement."""

    def __init__(self, node: NodeCapacity):
        self.gpus = node.usable_gpus() if not node.unavailable else []
        self.first, self.last = node.port_range if not node.unavailable else (1, 0)  # no port to take
        self.taken = {p for p in node.used_ports if self.first <= p <= self.last}
        self.memory = node.free_memory
        self.tasks = 0  # tasks of this job placed here

    def has_port(self) -> bool:
        return len(self.taken) <= self.last - self.first

    def take_port(self, preferred: int) -> int | None:
        if self.first <= preferred <= self.last and preferred not in self.taken:
            port = preferred
        else:
            port = next((p for p in range(self.first, self.last + 1) if p not in self.taken), None)
        if port is not None:
            self.taken.add(port)
        return port


def place(spec: JobSpec, nodes: list[NodeCapacity],
          previous: dict[tuple[str, int], tuple[str, int]] | None = None,
          only: set[tuple[str, int]] | None = None,
          prefer: Mapping[str, int] | None = None) -> list[TaskPlacement] | Unfit:
    """Places every task of spec (or only those named) on nodes, or says why it cannot.

    previous (task -> (node, port)) is tried first, so a restarted group lands where it was, on the same
    addresses when they are free. prefer (node -> score, higher first) replaces the nodes' free GPUs as the
    order nodes are tried in (the queue holds capacity where GPUs are free now, not on idle nodes)."""
    too_old = {}
    if spec.code_sha256 or spec.environment:  # only agents that can fetch the code and build the environment
        too_old = {n.name for n in nodes if not n.fetches_code}
        nodes = [n for n in nodes if n.fetches_code]
    by_name = {n.name: n for n in nodes}
    for role_type in ROLE_TYPES if only is None else ():  # re-placing a task uses the pinned nodes left
        for pinned in spec.role(role_type).nodes:
            if pinned in too_old:
                return Unfit(f"roles.{role_type}.nodes names {pinned!r}, whose agent is too old to fetch the "
                             f"job's code: upgrade it")
            if pinned not in by_name:
                return Unfit(f"roles.{role_type}.nodes names {pinned!r}, which is not a ready node "
                             f"(ready: {_names(sorted(by_name)) or 'none'})")
    if not nodes:
        return Unfit(f"no ready node's agent can fetch the job's code (upgrade the agents on "
                     f"{_names(sorted(too_old))})" if too_old else "no ready nodes")
    return _Search(spec, nodes, by_name, previous or {}, only, prefer).run()


def needs(spec: JobSpec) -> tuple:
    """What place() reads of a spec, as one value: two specs with equal needs place alike on the same nodes (the
    queue tries a long run of look-alike jobs once: queue.QueuePass). Worked out once per spec: a spec never
    changes (a resize makes a new one), and each pass asks it of every waiting job."""
    known = _NEEDS.get(id(spec))
    if known is not None and known[0] is spec:  # the spec itself is kept with it: its id is not reused meanwhile
        return known[1]
    roles = tuple((t, r.count, r.gpus, r.memory, r.nodes, r.labels, r.min_count, r.max_count)
                  for t, r in sorted(spec.roles.items()))
    value = spec.gpus, spec.memory, bool(spec.code_sha256 or spec.environment), roles
    if len(_NEEDS) >= NEEDS_KEPT:
        _NEEDS.clear()
    _NEEDS[id(spec)] = (spec, value)
    return value


NEEDS_KEPT = 10_000  # specs whose needs are kept (a queue longer than this works some of them out again)
_NEEDS: dict[int, tuple[JobSpec, tuple]] = {}


class _Search:
    """A depth-first search over the tasks, most constrained first, each on the first node in its preference
    order that has room; a task that fits nowhere sends the search back to move the one before it. Bounded by
    SEARCH_BUDGET, and iterative, so a job of thousands of tasks needs no deep recursion."""

    def __init__(self, spec: JobSpec, nodes: list[NodeCapacity], by_name: dict[str, NodeCapacity],
                 previous: dict[tuple[str, int], tuple[str, int]], only: set[tuple[str, int]] | None,
                 prefer: Mapping[str, int] | None = None):
        self.spec, self.by_name, self.previous = spec, by_name, previous
        self.slots: dict[str, _Slot] = {}
        all_names = sorted(by_name)
        # A pinned role goes on its nodes that are ready, none of them when none is (never elsewhere); a role
        # that asks for labels, only on nodes holding all of them.
        self.candidates = {r: _allowed(spec, r, by_name, all_names) for r in ROLE_TYPES}
        self.tasks = [t for t in task_list(spec) if only is None or t in only]
        # Most constrained first: pinned roles, then GPU-hungry ones, then memory-hungry ones; keep index order
        # within a role.
        self.tasks.sort(key=lambda t: (len(self.candidates[t[0]]), -spec.gpus_for(t[0]), -spec.memory_for(t[0])))
        # Nodes in preference order for a task no other task of the job is on yet: most GPUs free, then by
        # name (a stable sort of names already in order).
        free = prefer if prefer is not None else {n.name: n.free_gpus for n in nodes}
        self.base = {r: sorted(self.candidates[r], key=lambda n: -free[n]) for r in {t[0] for t in self.tasks}}
        self.assignment: dict[tuple[str, int], TaskPlacement] = {}

    def run(self) -> list[TaskPlacement] | Unfit:
        for role_type in dict.fromkeys(t[0] for t in self.tasks):
            if not self.candidates[role_type]:
                return Unfit(_no_candidate_reason(self.spec, role_type, self.by_name))
            too_big = _too_big_reason(self.spec, role_type, [self.by_name[n] for n in self.candidates[role_type]])
            if too_big:
                return Unfit(too_big)
        short = self._short_in_all() if len(self.tasks) > SMALL_JOB_TASKS else ""
        if short:
            return Unfit(short)
        choices: list[Iterator[str] | None] = [None] * len(self.tasks)
        i, budget, deepest = 0, SEARCH_BUDGET, 0
        while 0 <= i < len(self.tasks):
            task = self.tasks[i]
            if choices[i] is None:
                budget -= 1
                if budget < 0:
                    return Unfit(f"no placement found within {SEARCH_BUDGET} tries for {len(self.tasks)} tasks")
                deepest = max(deepest, i)
                choices[i] = self._order(task)
            else:
                self._unplace(task)  # back here from a dead end further on: try its next node
            if self._place_next(task, choices[i]):
                i += 1
                if i < len(self.tasks):
                    choices[i] = None
            else:
                choices[i] = None
                i -= 1
        if i < 0:
            stuck = self.tasks[deepest]
            return Unfit(_no_room_reason(self.spec, stuck, [self.by_name[n] for n in self.candidates[stuck[0]]]))
        return [self.assignment[t] for t in task_list(self.spec) if t in self.assignment]

    def _short_in_all(self) -> str:
        """Why the tasks cannot fit however they are spread, when their GPUs or ports outnumber what is free on
        the nodes they may use (so a hopeless search does not spend its whole budget)."""
        names = set().union(*(self.candidates[r] for r in {t[0] for t in self.tasks}))
        nodes = [self.by_name[n] for n in names]
        gpus = sum(self.spec.gpus_for(t[0]) for t in self.tasks)
        memory = sum(self.spec.memory_for(t[0]) for t in self.tasks)
        free_gpus = sum(n.free_gpus for n in nodes)
        free_ports = sum(n.free_ports for n in nodes)
        free_memory = sum(n.free_memory for n in nodes) if memory else 0
        if gpus <= free_gpus and len(self.tasks) <= free_ports and memory <= free_memory:
            return ""
        needed, free = [f"{gpus} GPUs", f"{len(self.tasks)} ports"], [f"{free_gpus} GPUs", f"{free_ports} ports"]
        if memory:
            needed.append(f"{size_text(memory)} of memory")
            free.append(f"{size_text(free_memory)} of memory")
        need, free_text = _listed(needed), _listed(free)
        return (f"cannot place all {len(self.tasks)} tasks at once: they need {need}, and the {len(nodes)} nodes "
                f"they may use have {free_text} free{_unavailable(nodes)}")

    def _slot(self, name: str) -> _Slot:
        if name not in self.slots:
            self.slots[name] = _Slot(self.by_name[name])
        return self.slots[name]

    def _order(self, task: tuple[str, int]) -> Iterator[str]:
        """Where to try a task: its previous node; nodes where tasks not placed yet were (they go back there:
        a task moved off a lost node must not push a survivor off its own) come last; spread the job, and
        prefer the node with the most GPUs left (fewer strands)."""
        preferred = self.previous.get(task, ("", 0))[0]
        theirs = {n for t, (n, _) in self.previous.items() if t != task and t not in self.assignment}
        allowed = set(self.candidates[task[0]]) if _restricted(self.spec, task[0]) else None
        if preferred in self.by_name and (allowed is None or preferred in allowed):
            yield preferred
        used = {name for name, s in self.slots.items() if s.tasks and (allowed is None or name in allowed)}
        for name in self.base[task[0]]:
            if name != preferred and name not in theirs and name not in used:
                yield name
        theirs_allowed = {n for n in theirs if n in self.by_name and (allowed is None or n in allowed)}
        rest = [n for n in used | theirs_allowed if n != preferred]
        rest.sort(key=lambda n: (n in theirs, self._slot(n).tasks, -len(self._slot(n).gpus), n))
        yield from rest

    def _place_next(self, task: tuple[str, int], choices: Iterator[str]) -> bool:
        """Puts the task on the next node among its choices that has room; False when none is left."""
        need, memory = self.spec.gpus_for(task[0]), self.spec.memory_for(task[0])
        for name in choices:
            s = self._slot(name)
            if len(s.gpus) < need or not s.has_port() or s.memory < memory:
                continue
            old_node, old_port = self.previous.get(task, ("", 0))
            port = s.take_port(old_port if name == old_node else 0)
            gpus = tuple(s.gpus[:need])
            del s.gpus[:need]
            s.tasks += 1
            s.memory -= memory
            self.assignment[task] = TaskPlacement(task[0], task[1], name, self.by_name[name].address, port, gpus,
                                                  memory)
            return True
        return False

    def _unplace(self, task: tuple[str, int]) -> None:
        p = self.assignment.pop(task)
        s = self.slots[p.node]
        s.tasks -= 1
        s.taken.discard(p.port)
        s.gpus[:0] = p.gpus
        s.memory += p.memory


def _restricted(spec: JobSpec, role_type: str) -> bool:
    """The role may use only some nodes: those it names, or those holding its labels."""
    return bool(spec.role(role_type).nodes or spec.role(role_type).labels)


def _allowed(spec: JobSpec, role_type: str, by_name: dict[str, NodeCapacity], all_names: list[str]) -> list[str]:
    """The ready nodes the role may use, by name: those it names (all when it names none), less those lacking
    one of its labels."""
    role = spec.role(role_type)
    names = [n for n in role.nodes if n in by_name] if role.nodes else all_names
    if role.labels:
        names = [n for n in names if not missing(role.labels, by_name[n].labels)]
    return names


def _no_candidate_reason(spec: JobSpec, role_type: str, by_name: dict[str, NodeCapacity]) -> str:
    """Why no ready node may take the role's tasks: none it names is ready, or none has all its labels."""
    role = spec.role(role_type)
    pinned = [n for n in role.nodes if n in by_name]
    if role.nodes and not pinned:
        return f"roles.{role_type}.nodes: none of {', '.join(role.nodes)} is a ready node"
    wanted = " and ".join(role.labels) if len(role.labels) <= 1 else "all of " + ", ".join(role.labels)
    among = f"none of {_names(pinned)} (roles.{role_type}.nodes)" if role.nodes else "no ready node"
    held = sorted(set().union(*(by_name[n].labels for n in pinned or by_name)))
    seen = f"labels there: {_names(held)}" if held else "none has labels"
    return f"roles.{role_type}.labels: {among} has {wanted} ({seen})"


def _what(spec: JobSpec, role_type: str) -> str:
    need, memory = spec.gpus_for(role_type), spec.memory_for(role_type)
    what = f"{need} GPU{'s' if need != 1 else ''}" if need else "a port"
    return f"{what} and {size_text(memory)} of memory" if memory else what


def _too_big_reason(spec: JobSpec, role_type: str, nodes: list[NodeCapacity]) -> str:
    """Why no node the role may use could ever hold one of its tasks, even idle; "": some node could."""
    need, memory = spec.gpus_for(role_type), spec.memory_for(role_type)
    if any(len(n.gpus) >= need and n.memory_bytes >= memory for n in nodes):
        return ""
    where = "the nodes it may use" if _restricted(spec, role_type) else "any ready node"
    if any(len(n.gpus) >= need for n in nodes):  # the GPUs would fit: memory is what no node has
        what, per_node, text = f"{size_text(memory)} of memory", "memory per node", size_text
        amounts = [n.memory_bytes for n in nodes]
    else:
        what, per_node, text = _what(spec, role_type), "GPUs per node", str
        amounts = [len(n.gpus) for n in nodes]
    if len(nodes) <= SHOWN_NODES:
        sizes = ", ".join(f"{n.name}: {text(a)}" for n, a in zip(nodes, amounts))
    else:
        counts = Counter(amounts)
        sizes = ", ".join(f"{c} nodes with {text(a)}" for a, c in sorted(counts.items(), reverse=True))
    return f"{role_type} tasks need {what} each, more than {where} has ({per_node}: {sizes})"


def _no_room_reason(spec: JobSpec, task: tuple[str, int], nodes: list[NodeCapacity]) -> str:
    gpus_needed = sum(spec.gpus_for(t) for t, _ in task_list(spec))
    shown = heapq.nsmallest(SHOWN_NODES, nodes, key=lambda n: (-n.free_gpus, n.name))
    memory = spec.memory_for(task[0])
    state = ", ".join(f"{n.name}: {n.free_gpus} of {len(n.gpus)} GPUs" + (
        f" and {size_text(n.free_memory)} of {size_text(n.memory_bytes)} memory" if memory else "") + " free"
        for n in shown)
    if len(nodes) > len(shown):
        state += f" (the {len(shown)} with the most free of {len(nodes)} nodes)"
    return (f"cannot place all {len(task_list(spec))} tasks at once ({gpus_needed} GPUs in all); "
            f"no node left for {task[0]}:{task[1]} (needs {_what(spec, task[0])}); {state}"
            f"{_unavailable(nodes)}")


def _unavailable(nodes: list[NodeCapacity]) -> str:
    """The nodes among these that take no new tasks, and the GPUs left out as sick, and why."""
    shown = [n for n in nodes if n.unavailable][:SHOWN_NODES]
    sick = [(n.name, index, why) for n in nodes if not n.unavailable for index, why in n.excluded_gpus]
    return "".join(f"; {n.name} takes no new tasks: {n.unavailable}" for n in shown) + "".join(
        f"; GPU {index} of node {name} excluded: {why}" for name, index, why in sick[:SHOWN_NODES])


def _listed(items: list[str]) -> str:
    """`a and b`, `a, b and c`."""
    return ", ".join(items[:-1]) + f" and {items[-1]}"


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_NODES])
    return shown + (f" and {len(names) - SHOWN_NODES} more" if len(names) > SHOWN_NODES else "")
