"""A node's conditions: the problems its agent finds on its GPUs (node/gpu_health.py reads them through NVML), one
per problem, sent with its registration and every heartbeat. Shared by the agent, the coordinator and the status
they give: which kinds exist, and which of them keep a GPU out of placement.

A GPU that is sick (a hardware Xid error, uncorrectable ECC errors, memory pages or rows waiting to be retired or
remapped, a GPU lost from the bus) is left out of placement until its condition clears; a throttled one, or one
whose program raised an Xid error of its own, is only shown. A condition on the node as a whole (gpu None) is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

XID = "xid"                                # an Xid error NVIDIA names a hardware or driver fault
APPLICATION_XID = "application-xid"        # an Xid error a program's own fault raises (13, 31, 43, 45)
ECC_UNCORRECTABLE = "ecc-uncorrectable"    # uncorrectable ECC errors since the driver loaded
RETIRED_PAGES_PENDING = "retired-pages-pending"  # memory pages waiting to be retired at the next GPU reset
ROW_REMAP_PENDING = "row-remap-pending"    # memory rows waiting to be remapped at the next GPU reset
ROW_REMAP_FAILED = "row-remap-failed"      # a row could not be remapped: the GPU needs service
GPU_LOST = "gpu-lost"                      # the GPU no longer answers, or fell off the bus
THROTTLED = "throttled"                    # its clocks are slowed for heat or power
NVML_UNAVAILABLE = "nvml-unavailable"      # the node's NVML stopped answering (gpu None)

KINDS = (XID, APPLICATION_XID, ECC_UNCORRECTABLE, RETIRED_PAGES_PENDING, ROW_REMAP_PENDING, ROW_REMAP_FAILED,
         GPU_LOST, THROTTLED, NVML_UNAVAILABLE)
EXCLUDING = frozenset({XID, ECC_UNCORRECTABLE, RETIRED_PAGES_PENDING, ROW_REMAP_PENDING, ROW_REMAP_FAILED, GPU_LOST})
MAX_CONDITIONS = 64       # per node on the wire: a few per GPU at most
MAX_CONDITION_MESSAGE = 200  # characters, as a drain's reason: shown in status tables


@dataclass(frozen=True)
class NodeCondition:
    gpu: int | None   # the GPU's index on its node; None: the node as a whole
    kind: str         # one of KINDS
    message: str      # what was read, in words
    since: float      # unix seconds: when the agent first found it

    @property
    def excludes(self) -> bool:
        """Whether the GPU is left out of placement while this holds."""
        return self.gpu is not None and self.kind in EXCLUDING

    def words(self, node: str) -> str:
        where = f"GPU {self.gpu} of node {node}" if self.gpu is not None else f"node {node}"
        return f"{where} excluded: {self.message}" if self.excludes else f"{where}: {self.message}"


def excluded_gpus(conditions: tuple[NodeCondition, ...] | list[NodeCondition]) -> dict[int, str]:
    """GPU index -> the message of the first condition that keeps it out of placement."""
    excluded: dict[int, str] = {}
    for c in conditions:
        if c.excludes and c.gpu not in excluded:
            excluded[c.gpu] = c.message
    return excluded
