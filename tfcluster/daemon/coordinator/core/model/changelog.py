"""What the core changed that the store has not written yet, as domain changes. Pure.

The core appends to one log: a job added, ended, amended after its end or removed, a node added or removed, a trust record
(join token, certificate holder, removal) added, a join token dropped, job numbers issued, a usage ledger entry
recorded or dropped, a sweep added. A change to a field of a stored record needs no entry: the record marks
itself unsaved (job.py's Record), and tells the writer, which tracks every stored record (jobs and their tasks,
nodes, trust records, sweeps), when it does: a write looks at what changed.
The writer (records.py) drains the log into store documents; the store is written before the commands
the same changes produced are sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from tfcluster.daemon.coordinator.core.model.accounting import Entry
from tfcluster.daemon.coordinator.core.model.job import Job, Record
from tfcluster.daemon.coordinator.core.model.node import Node


@dataclass(frozen=True)
class JobAdded:
    job: Job  # submitted or loaded


@dataclass(frozen=True)
class JobEnded:
    job: Job  # its documents change no more once written: the writer stops looking at it after that


@dataclass(frozen=True)
class EndedJobAmended:
    job: Job  # an ended job took one more change (a late evaluation): written once more, then left again


@dataclass(frozen=True)
class JobRemoved:
    job: Job  # retention forgot it: its documents go


@dataclass(frozen=True)
class NodeAdded:
    node: Node  # registered or loaded


@dataclass(frozen=True)
class NodeRemoved:
    name: str


@dataclass(frozen=True)
class TrustAdded:
    kind: str  # token, holder or removal (trust.py)
    key: str   # the token's id, or the node's name
    record: Record


@dataclass(frozen=True)
class TokenDropped:
    token_id: str  # an expired join token, forgotten


@dataclass(frozen=True)
class JobsNumbered:
    next_number: int  # the next job number to issue: none below it is ever issued again


@dataclass(frozen=True)
class UsageRecorded:
    entry: Entry  # an ended job's entry in the usage ledger: written once, never changed


@dataclass(frozen=True)
class SweepAdded:
    sweep: Record  # started or loaded (model/sweep.py): the writer writes it whenever it is unsaved


@dataclass(frozen=True)
class UsageDropped:
    job_id: str  # its ledger entry is older than the ledger keeps


Change = Union[JobAdded, JobEnded, EndedJobAmended, JobRemoved, NodeAdded, NodeRemoved, TrustAdded, TokenDropped, JobsNumbered,
               UsageRecorded, UsageDropped, SweepAdded]


class ChangeLog:
    def __init__(self) -> None:
        self.entries: list[Change] = []

    def append(self, change: Change) -> None:
        self.entries.append(change)

    def drain(self) -> list[Change]:
        entries, self.entries = self.entries, []
        return entries

    def put_back(self, entries: list[Change]) -> None:
        """A write failed: its entries go first in the next one, in their order."""
        self.entries[:0] = entries
