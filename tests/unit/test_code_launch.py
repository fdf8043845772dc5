"""A job that brought its code: every launch names the archive and the job's environment, and the peers
where the job's tasks already run, which hold the archive, so that a relaunch fetches it from them."""

from __future__ import annotations

from dataclasses import replace

from coresim import Sim, info, launches, make_spec

from tfcluster.daemon.coordinator.launch import code_sources, launch
from tfcluster.model import EnvironmentSpec

CODE = "sha256:" + "c0" * 32


def with_peers(*names):
    return Sim(*(replace(info(name), peer_port=7000 + i) for i, name in enumerate(names)))


def test_launches_carry_the_archive_the_environment_and_the_peers_that_hold_it():
    sim = with_peers("n1", "n2", "n3")
    spec = replace(make_spec(worker=3), code_sha256=CODE, environment=EnvironmentSpec("requirements.txt"))
    job, actions = sim.submit(spec)
    first = launches(actions)
    assert {(a.code_sha256, a.environment.requirements, a.code_sources) for a in first} == \
        {(CODE, "requirements.txt", ())}, "nothing runs yet: every node fetches from the coordinator"
    sim.report(job, "worker", 0, "RUNNING")
    sim.report(job, "worker", 1, "RUNNING")
    w0, w1, w2 = (job.task("worker", i) for i in range(3))
    assert code_sources(job, w2) == (w0.peer, w1.peer) and w0.peer.startswith("10.0.0.")
    assert code_sources(job, w0) == (w1.peer,), "not its own node"
    assert launch(job, w2).code_sources == (w0.peer, w1.peer)


def test_a_job_on_shared_storage_names_no_archive():
    sim = with_peers("n1", "n2")
    job, actions = sim.submit(make_spec(worker=2))
    sim.running(job, actions)
    assert {(a.code_sha256, a.code_sources) for a in launches(actions)} == {("", ())}
    assert code_sources(job, job.task("worker", 0)) == ()


def test_the_launch_goes_over_the_wire_whole():
    from tfcluster import wire

    sim = with_peers("n1", "n2")
    spec = replace(make_spec(worker=2), code_sha256=CODE, environment=EnvironmentSpec("", True, "."))
    job, actions = sim.submit(spec)
    sim.report(job, "worker", 0, "RUNNING")
    sent = launch(job, job.task("worker", 1))
    back = wire.command_from_proto(wire.command_to_proto(sent), sent.node)
    assert (back.code_sha256, back.code_sources, back.environment) == \
        (CODE, (job.task("worker", 0).peer,), EnvironmentSpec("", True, "."))
    assert back == sent
