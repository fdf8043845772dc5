"""Whether agents are registering in a storm: a cold start of the whole fleet, a coordinator's restart, an upgrade
of many agents at once. Pure: time is passed in.

While many agents register at once the coordinator's loop, its gRPC door and the network are busy with them, and
the heartbeats of the nodes already READY arrive late: cold starts of 5,000 agents declared dozens to hundreds of
nodes lost that never stopped beating (bench/storm.py). As with a mass silence (node_table.py), the silence is
more likely the coordinator's than the nodes', so while a storm lasts no READY node's silence grows (Nodes.expire
forgives it), for at most STORM_PATIENCE_SECONDS: a node that really died meanwhile is found --lost-after after
the storm, or after the patience runs out.
"""

from __future__ import annotations

import logging
from collections import deque

log = logging.getLogger("tfcluster.coordinator")

STORM_REGISTRATIONS = 50  # registrations within --lost-after that make a storm
STORM_PATIENCE_SECONDS = 120.0  # the longest a storm keeps silences from counting


class RegistrationStorm:
    def __init__(self) -> None:
        self.registered_at: deque[float] = deque()  # the times of the registrations within the last window
        self.since = 0.0  # when the storm under way began; 0: none

    def registered(self, now: float) -> None:
        self.registered_at.append(now)

    def under_way(self, now: float, window: float) -> bool:
        """True while STORM_REGISTRATIONS or more agents registered within the last `window` seconds, for no longer
        than STORM_PATIENCE_SECONDS in a row."""
        while self.registered_at and self.registered_at[0] < now - window:
            self.registered_at.popleft()
        if len(self.registered_at) < STORM_REGISTRATIONS:
            if self.since:
                log.info("the registration storm is over after %.0f s: silent nodes count as lost again",
                         now - self.since)
            self.since = 0.0
            return False
        if not self.since:
            self.since = now
            log.warning("%d agents registered within %.1f s: the heartbeats of the nodes already READY may come "
                        "late meanwhile, so their silence does not count for up to %.0f s", len(self.registered_at),
                        window, STORM_PATIENCE_SECONDS)
        return now - self.since < STORM_PATIENCE_SECONDS
