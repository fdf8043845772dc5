"""How often agents heartbeat and how long a silent node has before it is LOST, stretched in steps as the cluster
grows (Pace). Pure; the node table (node_table.py) keeps one."""

from __future__ import annotations

import logging

log = logging.getLogger("tfcluster.coordinator")

# The intervals a stretched pace takes, as multiples of the configured one (and ten, a hundred... times these): each
# at most a third longer than the one before. The agents already registered are told a new pace only when the
# cluster outgrows a step: a handful of messages to each while thousands of nodes register, none for a node that
# joins within a step, and none once the cluster stops growing. A pace fitted to each node was told to every
# agent again 10 s after the last node joined: 5,000 messages within a second, which held up `status` after each
# cold start of 5,000 (bench/storm.py).
PACE_STEPS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)


class Pace:
    """How often agents heartbeat, and how long a silent node has before it is LOST: as configured, stretched in
    step once the cluster is so large that its heartbeats would come more often than max_per_second (Nomad's
    servers stretch their clients' heartbeat TTL the same way), so the coordinator's work for heartbeats stays
    bounded however many nodes there are. It only stretches while this coordinator runs: no agent told a longer
    interval is ever judged by a shorter timeout."""

    def __init__(self, interval: float, lost_after: float, max_per_second: float = 0.0):
        self.base_interval, self.base_lost_after = interval, lost_after
        self.interval, self.lost_after = interval, lost_after
        self.max_per_second = max_per_second  # 0: no bound
        self.told = interval  # the interval the registered agents were last told

    def fit(self, nodes: int) -> None:
        """The cluster has this many nodes: stretch the pace to the first step (PACE_STEPS) at which their
        heartbeats come no more often than the bound, if they would come too often now."""
        if not self.max_per_second or nodes / self.max_per_second <= self.interval:
            return
        self.interval = self.base_interval * _step_at_least(nodes / self.max_per_second / self.base_interval)
        self.lost_after = self.base_lost_after * self.interval / self.base_interval

    def to_tell(self) -> float | None:
        """The interval to tell the agents registered so far, when the pace moved to a longer step since they were
        last told; else None. Until they are told they beat faster than needed, which costs no node its liveness."""
        if self.interval <= self.told:
            return None
        self.told = self.interval
        log.info("agents heartbeat every %.1f s from now on, and a node is lost after %.1f s of silence (at most %g "
                 "heartbeats a second)", self.interval, self.lost_after, self.max_per_second)
        return self.interval


def _step_at_least(ratio: float) -> float:
    """The smallest of PACE_STEPS, or of ten, a hundred... times them, that is not below ratio."""
    decade = 1.0
    while True:
        for step in PACE_STEPS:
            if step * decade >= ratio * (1 - 1e-9):  # 5,000 nodes at 1,000 a second: 5.0, not the step above
                return step * decade
        decade *= 10
