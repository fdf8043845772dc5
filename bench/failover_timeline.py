"""Where the seconds after a leader's kill go, agent by agent (bench/failover.py).

Each fake agent writes when it sent a registration, when it registered, and each failed call
(tests/fleet.py --timeline); the new leader's log has a line for each node it registered. From them, for every
agent, in seconds after the kill:
- noticed: its first failed call (the stream to the killed leader ended, or a try before it got that far);
- found: when its search for the new leader (the other coordinators asked who leads) named one;
- sent: its last registration call to the new leader, the one that succeeded;
- leader registered: the new leader's log line for it (the node is READY again from here);
- agent registered: when the agent had the answer (its own process may be slow to read it);
and how many agents asked a standby that refused them, naming the leader, before they registered (a detour).
Each as p50 / p90 / the last agent.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

REGISTERED_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO tfcluster\.coordinator: "
                             r"node (\S+) registered: ")
PHASES = ("noticed", "found", "sent", "leader_registered", "agent_registered")


def read_timelines(folder: Path, since: float) -> dict[str, list[tuple[float, str, str, str]]]:
    """Node -> its events at or after `since` (wall-clock): (time, what, coordinator, detail), in order."""
    events: dict[str, list[tuple[float, str, str, str]]] = {}
    for path in sorted(folder.glob("*.tsv")):
        for line in path.read_text().splitlines():
            at, node, what, address, detail = line.split("\t")
            if float(at) >= since:
                events.setdefault(node, []).append((float(at), what, address, detail))
    for timeline in events.values():
        timeline.sort()
    return events


def leader_registrations(log: str, since: float) -> dict[str, float]:
    """Node -> when the coordinator whose log this is last registered it, at or after `since` (wall-clock).
    The log's times are local, to the millisecond (logging's default format: tfcluster/daemon/logformat.py)."""
    registered = {}
    for line in log.splitlines():
        found = REGISTERED_LINE.match(line)
        if found:
            at = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since:
                registered[found.group(2)] = at
    return registered


def phases(folder: Path, leader_log: str, leader: str, killed: float) -> dict:
    """The seconds after the kill (wall-clock `killed`) at which each agent reached each phase, as percentiles,
    for the agents that registered with the coordinator at `leader` again; and how many took a detour."""
    events = read_timelines(folder, killed)
    by_leader = leader_registrations(leader_log, killed)
    seen: dict[str, list[float]] = {phase: [] for phase in PHASES}
    detoured = 0
    for node, timeline in events.items():
        registered = [at for at, what, address, _ in timeline if what == "registered" and address == leader]
        if not registered:
            continue
        done = registered[-1]
        failed = [at for at, what, _, _ in timeline if what in ("failed", "refused", "stalled")]
        sent = [at for at, what, address, _ in timeline if what == "register" and address == leader and at <= done]
        found = [at for at, what, _, detail in timeline if what == "found" and detail and at <= done]
        detoured += any(what == "refused" and at <= done for at, what, _, _ in timeline)
        for phase, at in (("noticed", failed[0] if failed else None),
                          ("found", found[-1] if found else None), ("sent", sent[-1] if sent else None),
                          ("leader_registered", by_leader.get(node)), ("agent_registered", done)):
            if at is not None:
                seen[phase].append(at - killed)
    return {"agents": len(seen["agent_registered"]), "detoured": detoured,
            **{phase: spread(times) for phase, times in seen.items()}}


def spread(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    if not ordered:
        return {}
    return {"p50": round(ordered[len(ordered) // 2], 2), "p90": round(ordered[int(len(ordered) * 0.9)], 2),
            "last": round(ordered[-1], 2)}


def shown(result: dict) -> str:
    """One line: each phase as p50/p90/last seconds after the kill, and the detours."""
    cells = [f"{phase.replace('_', ' ')} {p['p50']}/{p['p90']}/{p['last']}"
             for phase in PHASES if (p := result.get(phase))]
    return f"{' | '.join(cells)} s; {result['detoured']} of {result['agents']} agents refused by a standby first"
