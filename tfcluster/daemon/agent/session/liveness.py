"""What the agent tells systemd: READY=1, a status line, and watchdog beats that prove its loops still turn.

A beat from a thread of its own would prove only that this thread runs. Instead the loops the node depends
on stamp a monotonic time each time they come round, and a beat is sent only while every stamp is younger
than the watchdog timeout; when one loop wedges, the beats stop and systemd restarts the agent (its tasks
keep running under their shims, and the new agent reattaches to them). The loops:

- "connection": while connected, the heartbeat generator of the stream (it wakes at least every
  STAMP_EVERY_SECONDS); while not, the reconnect loop (each try: a register call of at most 10 s, then a
  backoff of at most 3 s, or a search for the leader of at most 10 s: new_leader.py). One stamp for both, since
  exactly one of them runs at a time.
- "events": the loop that forwards the tasks' evaluation results.

Both wait on the supervisor's lock now and then, so a deadlock there stops the beats too. The beats are
sent from the agent's main loop (agent/main.py), which reads no lock, so a wedged loop cannot hang it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from tfcluster.daemon.notify import Notifier
from tfcluster.states import Phase

log = logging.getLogger("tfcluster.agent")

# Stamp at least this often while connected, whatever heartbeat interval the coordinator asks for.
STAMP_EVERY_SECONDS = 1.0
# An agent whose coordinator is away still starts: its tasks run, and it keeps trying by itself. Waiting
# for a registration longer would hold up whatever is ordered after the unit at boot.
READY_WITHOUT_COORDINATOR_SECONDS = 10.0


class Liveness:
    """When each essential loop last came round; every loop counts as having started at creation, so one
    that never starts is noticed too."""

    def __init__(self, loops: Iterable[str], clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.stamps = dict.fromkeys(loops, clock())

    def stamp(self, loop: str) -> None:
        self.stamps[loop] = self.clock()

    def stalled(self, limit: float) -> list[str]:
        """The loops that have not come round for longer than limit seconds."""
        now = self.clock()
        return [loop for loop, at in list(self.stamps.items()) if now - at > limit]


class SystemdReporter:
    """Called from the agent's main loop (tick) to send READY=1, status changes and watchdog beats."""

    def __init__(self, agent, notifier: Notifier, clock: Callable[[], float] = time.monotonic):
        self.agent, self.notifier, self.clock = agent, notifier, clock
        self.started = clock()
        self.ready = False
        self.last_status = ""
        self.last_beat = float("-inf")
        self.stalled: list[str] = []

    def tick(self) -> None:
        if not self.notifier.enabled:
            return
        now, line = self.clock(), status_line(self.agent)
        if not self.ready and (self.agent.registered.is_set()
                               or now - self.started >= READY_WITHOUT_COORDINATOR_SECONDS):
            self.notifier.ready(line)
            self.ready = True
        elif line != self.last_status:
            self.notifier.status(line)
        self.last_status = line
        if self.notifier.watchdog_seconds and now - self.last_beat >= self.notifier.beat_interval:
            self._beat(now)

    def _beat(self, now: float) -> None:
        stalled = self.agent.liveness.stalled(self.notifier.watchdog_seconds)
        if stalled != self.stalled:  # said once per change, so the journal tells why systemd restarted it
            if stalled:
                log.error("not feeding systemd's watchdog: the %s %s stopped", " and ".join(stalled),
                          "loops have" if len(stalled) > 1 else "loop has")
            else:
                log.info("feeding systemd's watchdog again: every loop is turning")
            self.stalled = stalled
        if not stalled:
            self.notifier.watchdog()
            self.last_beat = now

    def stopping(self) -> None:
        refused = self.agent.refused
        self.notifier.stopping(f"refused by the coordinator: {refused}" if refused else "stopping")


def status_line(agent) -> str:
    """"registered with 10.0.0.1:7070, 2 tasks running", or why not. Reads the task table without the
    supervisor's lock (a wedged lock must stop the beats, not this line)."""
    records = list(agent.supervisor.tasks.values())
    running = sum(1 for r in records if r.phase == Phase.RUNNING and not r.exited.is_set())
    tasks = f"{running} task{'' if running == 1 else 's'} running"
    coordinator = agent.config.coordinator
    if agent.connected.is_set():
        return f"registered with {coordinator}, {tasks}"
    if agent.trouble:
        return f"{agent.trouble}, retrying; {tasks}"
    return f"registering with {coordinator}; {tasks}"
