"""What `status` shows, in bounded pages, whatever the size of the cluster. Pure selection over the model.

The overview is a summary of the whole cluster plus the first nodes (LOST ones first), the active jobs and
the newest ended ones; ListNodes and ListJobs page through everything with filters. Pages end at a number
of entries or of bytes, whichever comes first, so no answer grows with the cluster; a page token is the
key of the last entry (a node's name, a job's number), so pages stay right while the cluster changes.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.model.node import Node
from tfcluster.states import JobState, NodeState

DEFAULT_PAGE = 100
MAX_PAGE = 1000
PAGE_BYTES = 1 << 20        # a page stops growing past this many encoded bytes (it holds at least one entry)
OVERVIEW_NODES = 50
OVERVIEW_LIVE_JOBS = 100
OVERVIEW_ENDED_JOBS = 20

T = TypeVar("T")


def page_size(asked: int) -> int:
    return min(asked or DEFAULT_PAGE, MAX_PAGE)


def fill(entries: Iterable[T], limit: int, encode: Callable[[T], object], key: Callable[[T], str],
         size: Callable[[object], int]) -> tuple[list, str]:
    """Encodes entries until limit entries or PAGE_BYTES; returns them and the next page's token ("" at the end)."""
    page, used, last = [], 0, None
    for entry in entries:
        if len(page) >= limit or (page and used >= PAGE_BYTES):
            return page, key(last)
        message = encode(entry)
        page.append(message)
        used += size(message)
        last = entry
    return page, ""


def nodes(cluster: Cluster, after: str = "", state: str = "", prefix: str = "") -> Iterator[Node]:
    """Nodes by name, after a page token, optionally only one state or names with a prefix."""
    for name in cluster.nodes.names[bisect.bisect_right(cluster.nodes.names, after):]:
        node = cluster.nodes[name]
        if (not state or node.state == state) and name.startswith(prefix):
            yield node


def overview_nodes(cluster: Cluster) -> list[Node]:
    """The nodes the overview lists: LOST ones first (they need attention), then by name. It reads no more nodes
    than it shows (and the LOST ones), so `status` stays cheap however large the cluster."""
    lost_names = cluster.nodes.lost()
    lost = [cluster.nodes[name] for name in heapq.nsmallest(OVERVIEW_NODES, lost_names)]
    ready = (cluster.nodes[name] for name in cluster.nodes.names if name not in lost_names)
    return lost + list(itertools.islice(ready, OVERVIEW_NODES - len(lost)))


def jobs(cluster: Cluster, after: int = 0, states: Iterable[str] = (), name: str = "", node: str = "") -> Iterator[Job]:
    """Jobs oldest first, after a page token (a job number), filtered by state, name and a node of theirs."""
    wanted = set(states)
    for job in sorted(cluster.jobs.values(), key=lambda j: j.number):
        if job.number <= after or (wanted and job.state not in wanted) or (name and job.spec.name != name):
            continue
        if node and not any(t.node == node for t in job.tasks):
            continue
        yield job


def overview_jobs(cluster: Cluster) -> list[Job]:
    """The active jobs (oldest first) and the newest ended ones."""
    live = list(cluster.jobs.live.values())[:OVERVIEW_LIVE_JOBS]
    ended = list(cluster.jobs.ended.values())[-OVERVIEW_ENDED_JOBS:]
    return sorted(live + ended, key=lambda j: j.number)


def summary(cluster: Cluster) -> dict:
    """Counts over the whole cluster: nodes by state, GPUs on READY nodes and held by live tasks, jobs by state.
    From the counts the registries keep, and the live tasks: no walk over every node or every ended job."""
    ready, lost = cluster.nodes.ready(), len(cluster.nodes) - cluster.nodes.ready()
    allocated = sum(len(t.gpus) for j in cluster.jobs.live.values() for t in j.tasks if t.live)
    jobs_by_state = cluster.jobs.by_state()
    return {"nodes_by_state": {s.value: n for s, n in ((NodeState.READY, ready), (NodeState.LOST, lost)) if n},
            "gpus_total": cluster.nodes.ready_gpus(), "gpus_allocated": allocated,
            "jobs_by_state": {s.value: jobs_by_state[s] for s in JobState if jobs_by_state[s]}}


def one_line(cluster: Cluster) -> str:
    """The cluster in one line, for `systemctl status`: "12 nodes READY, 1 LOST, 3 jobs running, 1 pending".
    Counted from the nodes and the live jobs only (never the ended ones), so it stays cheap with thousands."""
    lost = len(cluster.nodes) - cluster.nodes.ready()
    jobs_by_state = Counter(job.state for job in cluster.jobs.live.values())
    parts = [_count(len(cluster.nodes) - lost, "node", NodeState.READY)] + \
        ([f"{lost} {NodeState.LOST}"] if lost else [])
    parts.append(_count(jobs_by_state[JobState.RUNNING], "job", "running"))
    parts += [f"{jobs_by_state[state]} {state.lower()}" for state in (JobState.PENDING, JobState.STARTING,
                                                                       JobState.STOPPING)
              if jobs_by_state[state] or state == JobState.PENDING]
    return ", ".join(parts)


def _count(number: int, noun: str, what: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'} {what}"
