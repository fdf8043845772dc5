"""A job whose tasks keep failing on one node is placed elsewhere (coresim.Sim, fake time): after three failures
in a row there, only for that job, saying so, and only while it fits elsewhere; a success there clears it."""

from __future__ import annotations

from dataclasses import replace

from coresim import Sim, info, launches, make_spec

from tfcluster.daemon.coordinator.core.scheduling.avoidance import AVOID_AFTER_FAILURES
from tfcluster.states import JobState


def mirrored(name="flaky", **restart):
    return replace(make_spec(strategy="mirrored", gpus=1, worker=1,
                             restart={"max_restarts": 10, "backoff_seconds": 0, **restart}), name=name)


def fail_until_moved(sim, job, commands) -> list[str]:
    """The job's first AVOID_AFTER_FAILURES launches fail at once; returns the nodes of those and of the next."""
    nodes = []
    for _ in range(AVOID_AFTER_FAILURES):
        nodes.append(launches(commands)[0].node)
        sim.running(job, commands)
        sim.now += 1
        sim.heartbeat_all()
        commands = sim.exit(job, "worker:0", code=1) + sim.c.tick(sim.now)
    nodes.append(launches(commands)[0].node)
    sim.running(job, commands)
    return nodes


def test_after_three_failures_in_a_row_on_a_node_the_job_is_placed_elsewhere_saying_so():
    sim = Sim(info("n1", 1), info("n2", 1))
    job, commands = sim.c.submit(mirrored(), sim.now)
    nodes = fail_until_moved(sim, job, commands)
    first = nodes[0]
    assert nodes[:AVOID_AFTER_FAILURES] == [first] * AVOID_AFTER_FAILURES, "restarts go back where the job was"
    assert nodes[-1] != first, "then it is placed away from the node"
    assert f"avoiding {first} (3 of this job's tasks failed there in a row)" in job.message
    other, _ = sim.c.submit(mirrored("other"), sim.now)
    assert other.state == JobState.STARTING and other.tasks[0].node == first, "another job still goes there"


def test_a_job_that_fits_nowhere_else_is_placed_there_again_and_a_success_clears_the_count():
    sim = Sim(info("n1", 1))
    job, commands = sim.c.submit(mirrored(), sim.now)
    assert set(fail_until_moved(sim, job, commands)) == {"n1"}, "it is not left waiting"
    assert job.seen.failures_on == {"n1": AVOID_AFTER_FAILURES} and job.state == JobState.RUNNING
    job.seen.task_ended("n1", failed=False)
    assert job.seen.failures_on == {}
