"""A sweep as the coordinator keeps it: a plain record the store saves (one document per sweep), whose trials are
ordinary jobs of its owner's (each Job names its sweep and its parameters). What a sweep does next is decided by
core/scheduling/sweeps.py; core/sweep_events.py carries it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfcluster.daemon.coordinator.core.model.job import Record
from tfcluster.spec import JobSpec
from tfcluster.states import SweepState
from tfcluster.sweepspec import SweepSpec


@dataclass(eq=False)
class Sweep(Record):
    id: str
    spec: JobSpec                 # every trial's, before its parameters are put in
    sweep: SweepSpec
    parameters: tuple[dict[str, str], ...] = ()  # each trial's, in trial order (expanded once, when started)
    number: int = 0               # the sweep number (its id's): orders sweeps
    owner: str = ""               # as a job's: the name in the starter's certificate
    groups: tuple[str, ...] = ()
    request_id: str = ""          # the client's id for the start: a retry returns this sweep
    created: float = 0.0
    state: SweepState = SweepState.RUNNING
    jobs: tuple[str, ...] = ()    # the job of each trial submitted so far, in trial order
    stopped_early: tuple[str, ...] = ()  # trials' jobs the early-stopping rule stopped
    finished: float = 0.0
    message: str = ""             # why it failed or stopped

    def __post_init__(self) -> None:
        self.state = SweepState(self.state)  # a value read back from the store becomes a member

    def __str__(self) -> str:
        return f"sweep {self.id}"

    def trial_request_id(self, index: int) -> str:
        """The request id of a trial's submission: submitting it again (after a failover) finds the same job."""
        return f"{self.id}/{index}"


@dataclass
class Sweeps:
    """Every sweep the coordinator keeps, by id."""
    by_id: dict[str, Sweep] = field(default_factory=dict)

    def next_number(self) -> int:
        return max((s.number for s in self.by_id.values()), default=0) + 1

    def by_request(self, request_id: str) -> Sweep | None:
        if not request_id:
            return None
        return next((s for s in self.by_id.values() if s.request_id == request_id), None)
