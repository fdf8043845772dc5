"""Rolling upgrades: hosts whose daemons run while their software changes are restarted one group at a time, so
that the cluster keeps serving and running tasks keep running.

The order: coordinators first (standbys, then the leader), since the wire API only grows and an older agent
talks to a newer coordinator; then agents `batch` at a time. An agent stopped for its upgrade says it is leaving
(SIGTERM; its tasks stay under their shims) and the coordinator gives its tasks the grace of an announced
restart; the new agent reattaches to them. Each group must be back (its coordinator serving and every node it
had READY again, its agents READY on the new release with each task they had still RUNNING in the same attempt)
before the next one stops; a job that restarted ends the upgrade there, naming the hosts left on the old
release.

Which releases may be mixed is `refusals`: checked before anything stops.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from tfcluster.bringup.inventory import COORDINATOR_PORT, Host
from tfcluster.errors import ClusterError

DEFAULT_BATCH = 2
BACK_TIMEOUT_SECONDS = 120   # below the coordinator's 120 s grace for an announced restart's tasks
POLL_SECONDS = 0.5


def release(software: str) -> str:
    """The release of a software id ("0.8.0+1a2b..." or "0.8.0 from https://... extras tf"): "0.8.0"."""
    return re.split(r"[+ ]", software.strip(), maxsplit=1)[0]


def _numbers(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(n) for n in match[1].split(".")) + (0, 0, 0) if match else (0, 0, 0)


def minor(version: str) -> tuple[int, int]:
    numbers = _numbers(version)
    return numbers[0], numbers[1]


def newer(a: str, b: str) -> bool:
    return _numbers(a)[:3] > _numbers(b)[:3]


def refusals(new: str, installed: dict[str, str], registered: dict[str, str], upgraded: set[str]) -> list[str]:
    """Why release `new` cannot replace what runs, one line per reason (none: it may).

    installed: each host's release now; registered: each node's agent release as the coordinator sees it;
    upgraded: the nodes this run upgrades. The rule (docs/operators.md#rolling-upgrades):
    - no host goes back to an older minor release (X.Y): a coordinator's store and an agent's record of its
      tasks are read by the same or a later minor release only;
    - no agent is left newer than the coordinators (a newer agent may send what an older coordinator does not
      know): every agent registered with the cluster and not upgraded here must be of `new` or older.
    """
    lines = [f"{host} runs {have}: going back to {new} crosses a minor release (from {'.'.join(map(str, minor(have)))} "
             f"to {'.'.join(map(str, minor(new)))}), whose state the older one cannot read"
             for host, have in sorted(installed.items()) if have and minor(new) < minor(have)]
    lines += [f"node {node} runs agent {have}, newer than the coordinators' {new} would be; remedy: upgrade it "
              f"too (add it to the inventory) or remove it first" for node, have in sorted(registered.items())
              if node not in upgraded and have and newer(have, new)]
    return lines


def coordinator_order(coordinators: list[Host], leader: str) -> list[Host]:
    """Standbys first, the leader (its address as status gives it, host:port) last."""
    def is_leader(host: Host) -> bool:
        return leader in (host.host, f"{host.host}:{COORDINATOR_PORT}", f"[{host.host}]:{COORDINATOR_PORT}")
    return sorted(coordinators, key=is_leader)


def batches(hosts: list[Host], size: int) -> list[list[Host]]:
    return [hosts[i:i + size] for i in range(0, len(hosts), size)]


@dataclass(frozen=True)
class Task:
    job: str
    name: str          # worker:0
    attempt: int
    pid: int


def running_tasks(client) -> dict[str, set[Task]]:
    """The RUNNING tasks of every job, by node."""
    found: dict[str, set[Task]] = {}
    for job in client.jobs(states=("RUNNING",)):
        for task in job.tasks:
            if task.state == "RUNNING" and task.node:
                found.setdefault(task.node, set()).add(Task(job.id, task.name, task.attempt, task.pid))
    return found


def lost(before: set[Task], client) -> list[str]:
    """The tasks of `before` that did not keep running: their job restarted them, or they ended unasked."""
    problems = []
    for job_id in sorted({t.job for t in before}):
        job = client.job(job_id).status()
        now = {t.name: t for t in job.tasks}
        for task in sorted((t for t in before if t.job == job_id), key=lambda t: t.name):
            after = now.get(task.name)
            if job.state in ("SUCCEEDED", "STOPPED", "STOPPING"):
                continue
            if after is None or after.attempt != task.attempt or after.state != "RUNNING":
                problems.append(f"job {job_id} task {task.name}: was RUNNING in attempt {task.attempt}, now "
                                f"{after.state if after else 'gone'} in attempt {after.attempt if after else '-'} "
                                f"(job {job.state}, {job.restarts} restart(s))")
    return problems


def wait_back(client, nodes: dict[str, str], tasks: set[Task], what: str) -> None:
    """Waits until each node (name: the release its agent must report, or "" for any) is READY and `tasks` still
    run as before. Raises TimeoutError naming what did not come back, RuntimeError when a
    task did not keep running."""
    deadline, waiting = time.monotonic() + BACK_TIMEOUT_SECONDS, dict(nodes)
    while True:
        try:
            seen = {n.name: n for n in client.nodes()}
        except ClusterError as e:
            seen, problem = {}, str(e)
        else:
            problem = ""
        waiting = {name: version for name, version in waiting.items()
                   if not (name in seen and seen[name].state == "READY"
                           and version in ("", seen[name].agent_version))}
        if not waiting and not problem:
            break
        if time.monotonic() > deadline:
            left = ", ".join(f"{n} ({seen[n].state} on {seen[n].agent_version})" if n in seen else n for n in waiting)
            raise TimeoutError(f"{what}: not back after {BACK_TIMEOUT_SECONDS} s: {left or problem}")
        time.sleep(POLL_SECONDS)
    gone = lost(tasks, client)
    if gone:
        raise RuntimeError(f"{what}: " + "; ".join(gone))
