"""A long queue drains as docs/policy.md says, across a coordinator killed with SIGKILL.

Ten people with real user certificates (some in groups that raise or lower their classes) submit 200 short
jobs through the client library while a job of a class nobody may preempt holds the only GPU. Once that job
is stopped, the queue drains one job at a time; after about a third has run (the next job holds the queue
until told) the coordinator is killed -9 and started again on the same store and policy, and the agent comes
back by itself. Then every acknowledged job exists once, ran exactly once (attempt 1, no restart: a coordinator
restart costs running jobs nothing), succeeded, and the jobs started in the documented order: class first, then
fair share (the owner who has used the fewest GPU-seconds), then age. The start times are the agent's own (each
attempt's status.json)."""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from harness import LocalCluster, wait_until
from tfcluster import pki
from tfcluster.client import Client
from tfcluster.credentials import Credentials
from tfcluster.specfile import parse_spec
from tfcluster.states import JobState

POLICY = """\
[classes]  # nobody preempts the job holding the GPU while all are submitted: it is of the highest class
low = { value = 10, preemptible = true }
normal = { value = 50, preemptible = true }
high = { value = 100, preemptible = false }

[groups.vision]
max_class = "high"

[groups.interns]
class = "low"
max_class = "low"

[defaults]
class = "normal"
"""

VISION, INTERNS = ("ada", "bo", "cy"), ("hal", "ivy")
PEOPLE = (*VISION, "dee", "eli", "fay", "gus", *INTERNS, "jo")
JOBS_EACH = 20
KILL_AFTER = 60  # jobs ended when the coordinator is killed
RANKS = {"low": 10, "normal": 50, "high": 100}
SLACK_GPU_SECONDS = 0.05  # the decay of fair share over a minute, and rounding; a job is worth >= 0.1 s


def groups_of(person: str) -> tuple[str, ...]:
    return ("vision",) if person in VISION else ("interns",) if person in INTERNS else ()


def class_asked(person: str, rng: random.Random) -> str:
    """The class a job asks for ("": the owner's default, low for interns, normal for the others)."""
    if person in INTERNS:
        return ""
    classes, weights = (("high", "normal", "low"), (3, 5, 2)) if person in VISION else (("", "low"), (7, 3))
    return rng.choices(classes, weights)[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("drain")
    (root / "policy.toml").write_text(POLICY)
    (root / "work").mkdir(mode=0o777)
    cluster = LocalCluster(root=root)
    try:
        cluster.start_coordinator("--policy", str(root / "policy.toml"))
        cluster.start_agents({"a": {"gpus": 1}})  # one GPU: jobs run one at a time, in the order placed
        ca = pki.Authority.load(cluster.ca_dir, with_key=True)
        for person in (*PEOPLE, "ops"):
            pki.write_credentials(ca, root / "people" / person, person, "user",
                                  groups_of(person) if person != "ops" else ("vision",))
        yield cluster
    finally:
        cluster.teardown()


def client_of(cluster: LocalCluster, person: str) -> Client:
    return Client(cluster.address, Credentials.from_dir(cluster.root / "people" / person))


def spec(cluster: LocalCluster, name: str, command: list[str], priority: str):
    doc = {"name": name, "strategy": "mirrored", "command": command, "workdir": str(cluster.root / "work"),
           "gpus": 1}
    return parse_spec({**doc, "priority": priority} if priority else doc)


def submit_all(cluster: LocalCluster, gate: Path) -> list[dict]:
    """The 200 jobs, in a shuffled order of submission; what each submission acknowledged. Each runs 0.1 s and
    adds a line to the file gate; the one that adds line KILL_AFTER + 1 runs on until the file gate.open exists.
    The jobs hold the queue themselves, so that however slow this process is, the coordinator is killed while
    that job runs with the rest of the queue behind it."""
    rng = random.Random(17)
    order = [person for person in PEOPLE for _ in range(JOBS_EACH)]
    rng.shuffle(order)
    clients = {person: client_of(cluster, person) for person in PEOPLE}
    command = ["/bin/sh", "-c", f"sleep 0.1; echo >> {gate}; [ $(wc -l < {gate}) -ne {KILL_AFTER + 1} ] && exit; "
                                f"while [ ! -e {gate}.open ]; do sleep 0.05; done"]
    submitted = []
    try:
        for number, person in enumerate(order):
            asked = class_asked(person, rng)
            job_id = clients[person].submit(spec(cluster, f"q{number}", command, asked))
            submitted.append({"id": job_id, "owner": person, "number": number,
                              "priority": asked or ("low" if person in INTERNS else "normal")})
    finally:
        for client in clients.values():
            client.close()
    return submitted


def every_job(cluster: LocalCluster) -> dict[str, dict]:
    from tfcluster.views import job_doc
    with cluster.client() as client:
        return {j.id: job_doc(j) for j in client.all_jobs()}


def attempts_on_agent(cluster: LocalCluster, job_id: str) -> list[dict]:
    """Every attempt the agent ran of the job's tasks: its directory's name and its status.json."""
    found = []
    for status in sorted(cluster.agent_state_dir("a").glob(f"jobs/{job_id}/tasks/*/attempt-*/status.json")):
        found.append({"dir": status.parent.name, **json.loads(status.read_text())})
    return found


def check_queue_order(cluster: LocalCluster, submitted: list[dict]) -> int:
    """`tfcluster queue --json` lists class, then fair share, then age. The owners' GPU-seconds are read just
    before and just after (they only grow), so the share each had when the queue was listed lies between.
    Returns how many were listed."""
    number = {s["id"]: s["number"] for s in submitted}
    with cluster.client() as client:
        before = {u.name: u.gpu_seconds for u in client.usage().users}
        queue = json.loads(cluster.cli("queue", "--json", check=True).stdout)
        after = {u.name: u.gpu_seconds for u in client.usage().users}
    jobs = queue["jobs"]
    assert queue["total"] == len(jobs) > 20 and [j["position"] for j in jobs] == list(range(1, len(jobs) + 1))
    for first, second in zip(jobs, jobs[1:]):
        assert first["rank"] >= second["rank"], (first, second)
        if first["rank"] != second["rank"]:
            continue
        low = (before.get(first["owner"], 0.0), after.get(first["owner"], 0.0))
        high = (before.get(second["owner"], 0.0), after.get(second["owner"], 0.0))
        fewer = low[0] < high[1] + SLACK_GPU_SECONDS  # the first owner may have used less
        tied = low[0] <= high[1] + SLACK_GPU_SECONDS and high[0] <= low[1] + SLACK_GPU_SECONDS
        older = number[first["id"]] < number[second["id"]]
        assert (first["owner"] != second["owner"] and fewer) or (tied and older), (first, second, before, after)
    return len(jobs)


class Waiting:
    """What a wait is for, and when a message is made of it (it timed out), the jobs not ended with their tasks'
    states and the end of each daemon's log: where the queue stands."""

    def __init__(self, cluster: LocalCluster, what: str):
        self.cluster, self.what = cluster, what

    def __str__(self) -> str:
        jobs = every_job(self.cluster).values()
        not_ended = "; ".join(f"{j['id']} {j['state']} {[t['state'] for t in j['tasks']]}" for j in jobs
                              if not JobState(j["state"]).ended)
        logs = "".join(f"\n--- the end of {daemon.log_path.name}:\n" + "".join(daemon.log().splitlines(True)[-15:])
                       for daemon in (self.cluster.coordinator, *self.cluster.agents.values()))
        return f"{self.what}; jobs not ended: {not_ended[:2000]}{logs}"


def kill_and_restart_coordinator(cluster: LocalCluster) -> None:
    cluster.coordinator.kill()
    cluster.coordinator.start()
    wait_until(cluster._reachable, 30, what="the coordinator to come back")


def check_fair_share(runs: list[dict]) -> None:
    """Each job started while its owner had used no more GPU-seconds than anyone else waiting with a job of
    its class; one GPU: every earlier job had ended, and counted, when it was placed."""
    used: dict[str, float] = defaultdict(float)
    for i, run in enumerate(runs):
        waiting = {r["owner"] for r in runs[i + 1:] if r["priority"] == run["priority"]} - {run["owner"]}
        for other in waiting:
            assert used[run["owner"]] <= used[other] + SLACK_GPU_SECONDS, \
                f"{run['id']} of {run['owner']} ({used[run['owner']]:.2f} GPU-s) started before a " \
                f"{run['priority']} job of {other} ({used[other]:.2f} GPU-s)"
        used[run["owner"]] += run["gpu_seconds"]


def test_two_hundred_jobs_drain_in_order_across_a_coordinator_kill(cluster):
    ops = client_of(cluster, "ops")
    blocker = ops.submit(spec(cluster, "blocker", ["sleep", "600"], "high"))
    wait_until(lambda: cluster.job(blocker)["state"] == "RUNNING", 30, what="the blocker to run")
    began = time.monotonic()
    gate = cluster.root / "work" / "gate"
    gate.touch()
    gate.chmod(0o666)  # each job runs as a UID of its own
    submitted = submit_all(cluster, gate)
    submit_seconds = time.monotonic() - began
    ids = [s["id"] for s in submitted]
    assert len(set(ids)) == len(ids) == len(PEOPLE) * JOBS_EACH
    ops.stop(blocker, graceful=False)
    ops.close()

    drained = time.monotonic()
    ended = lambda: sum(every_job(cluster)[i]["state"] == "SUCCEEDED" for i in ids)  # noqa: E731
    wait_until(lambda: ended() >= KILL_AFTER - 10, 120, interval=0.5, what=f"{KILL_AFTER - 10} jobs to end")
    listed = check_queue_order(cluster, submitted)
    wait_until(lambda: ended() >= KILL_AFTER, 60, interval=0.2, what=f"{KILL_AFTER} jobs to end")
    held = wait_until(lambda: [i for i, j in every_job(cluster).items() if j["state"] == "RUNNING"], 30,
                      what=Waiting(cluster, "a job running when the coordinator is killed"))
    assert ended() == KILL_AFTER, "the job after them holds the queue"
    killed_at = time.time()
    kill_and_restart_coordinator(cluster)
    Path(f"{gate}.open").touch()
    wait_until(lambda: ended() == len(ids), 240, interval=1.0, what="every job to end")
    drain_seconds = time.monotonic() - drained

    jobs = every_job(cluster)
    assert set(jobs) == {*ids, blocker}  # nothing lost, nothing made twice
    runs = []
    for s in submitted:
        job = jobs[s["id"]]
        assert (job["state"], job["owner"], job["priority"]) == ("SUCCEEDED", s["owner"], s["priority"]), job
        assert (job["restarts"], job["preemptions"], [t["attempt"] for t in job["tasks"]]) == (0, 0, [1]), job
        attempts = attempts_on_agent(cluster, s["id"])
        assert [a["dir"] for a in attempts] == ["attempt-1"], attempts  # launched once, never again
        runs.append({**s, "started": attempts[0]["started"], "finished": attempts[0]["finished"],
                     "gpu_seconds": job["usage"]["gpu_seconds"]})
    runs.sort(key=lambda r: r["started"])
    # The job running at the kill ran on undisturbed: the restarted coordinator took it over, not relaunched it.
    assert [r["id"] for r in runs if r["started"] < killed_at < r["finished"]] == held
    for earlier, later in zip(runs, runs[1:]):  # one GPU: a job started only once the one before it ended
        assert earlier["finished"] <= later["started"] + 0.01, (earlier, later)

    # Class first: every job was submitted before the first started, so the classes come in order.
    classes = [r["priority"] for r in runs]
    assert [RANKS[c] for c in classes] == sorted((RANKS[c] for c in classes), reverse=True), classes
    # Then fair share, then age: one person's jobs of one class start in the order they were submitted.
    by_owner_and_class = defaultdict(list)
    for r in runs:
        by_owner_and_class[r["owner"], r["priority"]].append(r["number"])
    assert all(numbers == sorted(numbers) for numbers in by_owner_and_class.values()), by_owner_and_class
    check_fair_share(runs)
    normal = [r["owner"] for r in runs if r["priority"] == "normal"]
    print(f"submitted {len(ids)} jobs in {submit_seconds:.1f} s; drained in {drain_seconds:.1f} s; "
          f"{listed} listed by `tfcluster queue` before the kill; running at the kill: {held}; "
          f"classes {dict(Counter(classes))}; owners of the normal jobs in the order they started: {normal}")
