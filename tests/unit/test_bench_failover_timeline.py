"""Where the seconds after a leader's kill go (bench/failover_timeline.py), read from the fake agents' timelines
(tests/fleet.py --timeline) and the new leader's log, as they are written."""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

from tfcluster.daemon.logformat import LineFormatter

BENCH = Path(__file__).resolve().parents[2] / "bench"
spec = importlib.util.spec_from_file_location("failover_timeline", BENCH / "failover_timeline.py")
timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timeline)

NEW, OTHER, OLD = "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:1"


def leader_log_line(at: float, node: str) -> str:
    """The line the coordinator logs when it registers a node, formatted as its log formats it."""
    record = logging.LogRecord("tfcluster.coordinator", logging.INFO, __file__, 1,
                               "node %s registered: %s, %d GPUs, ports %d-%d, agent %s, %d tasks",
                               (node, "10.0.0.1", 8, 20001, 20999, "0.8.2", 0), None)
    record.created, record.msecs = at, (at % 1) * 1000
    return LineFormatter().format(record)


def test_each_agents_phases_after_the_kill_and_the_detours_are_read_from_its_timeline_and_the_leaders_log(tmp_path):
    killed = time.time() - 60
    lines = [
        (killed - 6, "fleet-00000", "failed", NEW, "UNAVAILABLE"),  # before the kill: not counted
        (killed - 5, "fleet-00000", "registered", OLD, ""),
        (killed + 1.0, "fleet-00000", "failed", OLD, "UNAVAILABLE"),
        (killed + 1.4, "fleet-00000", "found", OLD, NEW),  # its search named the new leader
        (killed + 1.5, "fleet-00000", "register", NEW, ""),
        (killed + 2.0, "fleet-00000", "registered", NEW, ""),
        (killed + 0.5, "fleet-00001", "failed", OLD, "UNAVAILABLE"),
        (killed + 0.6, "fleet-00001", "found", OLD, ""),  # a search that named none: not when it found the leader
        (killed + 0.8, "fleet-00001", "register", NEW, ""),  # too early: the new leader does not serve yet
        (killed + 0.9, "fleet-00001", "failed", NEW, "UNAVAILABLE"),
        (killed + 1.0, "fleet-00001", "register", OTHER, ""),
        (killed + 3.0, "fleet-00001", "refused", OTHER, NEW),  # a detour through the standby that lost
        (killed + 3.5, "fleet-00001", "register", NEW, ""),
        (killed + 6.0, "fleet-00001", "registered", NEW, ""),
        (killed + 0.7, "fleet-00002", "failed", OLD, "UNAVAILABLE"),  # never back: not among the agents
    ]
    (tmp_path / "0.tsv").write_text("".join("\t".join([f"{at:.3f}", *rest]) + "\n" for at, *rest in lines[:7]))
    (tmp_path / "500.tsv").write_text("".join("\t".join([f"{at:.3f}", *rest]) + "\n" for at, *rest in lines[7:]))
    log = "\n".join([leader_log_line(killed - 30, "fleet-00000"), "WARNING something else",
                     leader_log_line(killed + 1.8, "fleet-00000"), leader_log_line(killed + 4.25, "fleet-00001")])

    found = timeline.phases(tmp_path, log, NEW, killed)

    assert found["agents"] == 2 and found["detoured"] == 1
    assert found["noticed"] == {"p50": 1.0, "p90": 1.0, "last": 1.0}
    assert found["found"] == {"p50": 1.4, "p90": 1.4, "last": 1.4}  # one agent's search named the leader
    assert found["sent"] == {"p50": 3.5, "p90": 3.5, "last": 3.5}
    assert found["leader_registered"] == {"p50": 4.25, "p90": 4.25, "last": 4.25}
    assert found["agent_registered"] == {"p50": 6.0, "p90": 6.0, "last": 6.0}
    assert timeline.shown(found) == ("noticed 1.0/1.0/1.0 | found 1.4/1.4/1.4 | sent 3.5/3.5/3.5 | "
                                     "leader registered 4.25/4.25/4.25 | agent registered 6.0/6.0/6.0 s; "
                                     "1 of 2 agents refused by a standby first")
