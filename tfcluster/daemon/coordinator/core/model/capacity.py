"""What a node can take and where a task goes: the shapes placement (scheduling/placement.py) works with, which
the node table, the job table and the lifecycle hold too. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tfcluster.model import ROLE_TYPES, Gpu
from tfcluster.spec import JobSpec


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    address: str
    gpus: tuple[Gpu, ...]
    port_range: tuple[int, int]  # inclusive
    used_gpus: frozenset[int] = frozenset()
    used_ports: frozenset[int] = frozenset()
    unavailable: str = ""  # why the node takes no new tasks now (its agent's low disk); "": it takes them
    memory_bytes: int = 0  # the node's memory, which tasks with a memory limit are placed against
    used_memory: int = 0   # what the limits of tasks placed here add up to
    fetches_code: bool = True  # its agent fetches jobs' packed code (NodeInfo.fetches_code)
    # GPUs its agent found sick (tfcluster/conditions.py), left out of placement: (index, why), by index
    excluded_gpus: tuple[tuple[int, str], ...] = ()
    labels: frozenset[str] = frozenset()  # the kinds of machine its agent says it is (NodeInfo.labels)

    def idle(self) -> "NodeCapacity":
        return NodeCapacity(self.name, self.address, self.gpus, self.port_range, memory_bytes=self.memory_bytes,
                            fetches_code=self.fetches_code, labels=self.labels)

    def taking(self, p: "TaskPlacement") -> "NodeCapacity":
        """This node once the task placed here holds its GPUs, port and memory."""
        return replace(self, used_gpus=self.used_gpus | {g.index for g in p.gpus}, used_ports=self.used_ports | {p.port},
                       used_memory=self.used_memory + p.memory)

    @property
    def free_gpus(self) -> int:
        if self.unavailable:
            return 0
        return len(self.usable_gpus()) if self.excluded_gpus else len(self.gpus) - len(self.used_gpus)

    def usable_gpus(self) -> list[Gpu]:
        """Its GPUs neither held by a task nor excluded as sick."""
        excluded = {index for index, _ in self.excluded_gpus}
        return [g for g in self.gpus if g.index not in self.used_gpus and g.index not in excluded]

    @property
    def free_ports(self) -> int:
        return 0 if self.unavailable else self.port_range[1] - self.port_range[0] + 1 - len(self.used_ports)

    @property
    def free_memory(self) -> int:
        return 0 if self.unavailable else max(0, self.memory_bytes - self.used_memory)


@dataclass(frozen=True)
class TaskPlacement:
    type: str
    index: int
    node: str
    host: str
    port: int
    gpus: tuple[Gpu, ...]
    memory: int = 0  # bytes the task's limit holds on its node; 0: not limited

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def task_list(spec: JobSpec) -> list[tuple[str, int]]:
    return [(t, i) for t in ROLE_TYPES for i in range(spec.count(t))]
