"""Memory as a placed resource: a task's limit is held on its node like its GPUs and port, a job that can never
fit is refused with the reason, one that does not fit now waits, and memory frees when its task ends."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from tfcluster import wire
from tfcluster.daemon.coordinator.core.cluster import Unplaceable
from tfcluster.daemon.coordinator.core.scheduling.placement import NodeCapacity, Unfit, place
from tfcluster.specfile import parse_spec, spec_from_flags
from tfcluster.states import JobState
from tests.unit.coresim import Sim, info, launches, make_spec

GIB = 1 << 30


def spec(memory=None, **roles):
    table = {r: (v if isinstance(v, dict) else {"count": v}) for r, v in roles.items()}
    data = {"name": "j", "strategy": "multi_worker_mirrored", "command": ["python", "t.py"], "roles": table}
    if memory is not None:
        data["memory"] = memory
    return parse_spec(data)


def node(name, memory_gib, used_gib=0.0, ports=(20000, 20009)):
    return NodeCapacity(name, f"10.0.0.{name[-1]}", (), ports, memory_bytes=int(memory_gib * GIB),
                        used_memory=int(used_gib * GIB))


def test_tasks_go_where_their_memory_fits_and_hold_it():
    result = place(spec("24G", worker=2), [node("a", 32), node("b", 64, used_gib=16)])
    assert not isinstance(result, Unfit), result
    assert sorted(p.node for p in result) == ["a", "b"]  # a has room for one 24 GiB task, b (48 free) for two
    assert all(p.memory == 24 * GIB for p in result)


def test_two_tasks_share_a_node_only_when_both_fit():
    result = place(spec("20G", worker=2), [node("a", 48)])
    assert not isinstance(result, Unfit), result
    assert [p.node for p in result] == ["a", "a"]
    result = place(spec("20G", worker=3), [node("a", 48)])
    assert isinstance(result, Unfit)
    assert "no node left for worker:2 (needs a port and 20 GiB of memory)" in result.reason
    assert "a: 0 of 0 GPUs and 48 GiB of 48 GiB memory free" in result.reason  # before this job


def test_a_role_of_its_own_takes_its_own_limit():
    s = spec("4G", chief=1, worker={"count": 1, "memory": "30G"})
    result = place(s, [node("a", 32), node("b", 8)])
    assert not isinstance(result, Unfit), result
    assert {(p.type, p.node, p.memory) for p in result} == {("chief", "b", 4 * GIB), ("worker", "a", 30 * GIB)}


def test_a_task_bigger_than_every_node_says_so_with_the_nodes_memory():
    result = place(spec("16G", worker=1), [node("a", 8), node("b", 12)])
    assert isinstance(result, Unfit)
    assert result.reason == ("worker tasks need 16 GiB of memory each, more than any ready node has "
                             "(memory per node: a: 8 GiB, b: 12 GiB)")


def test_without_a_limit_memory_is_not_looked_at():
    result = place(spec(worker=3), [node("a", 0)])
    assert not isinstance(result, Unfit), result
    assert all(p.memory == 0 for p in result)


def test_a_busy_node_gives_its_free_memory_only():
    assert node("a", 64, used_gib=60).free_memory == 4 * GIB
    assert node("a", 64, used_gib=60).idle().free_memory == 64 * GIB
    assert replace(node("a", 64), unavailable="low disk").free_memory == 0


def test_a_large_job_short_of_memory_in_all_is_refused_before_searching():
    result = place(spec("10G", worker=100), [node(f"n{i}", 64, ports=(20000, 20099)) for i in range(10)])
    assert isinstance(result, Unfit)
    assert result.reason.startswith("cannot place all 100 tasks at once: they need 0 GPUs, 100 ports and "
                                    "1000 GiB of memory, and the 10 nodes they may use have 0 GPUs, 1000 ports "
                                    "and 640 GiB of memory free")


# ---- through the cluster: submit, wait, free ----------------------------------------------------

def sim_with_memory(*gib):
    return Sim(*(replace(info(f"n{i}"), memory_bytes=g * GIB) for i, g in enumerate(gib, 1)))


def test_submit_refuses_a_job_no_node_can_ever_hold():
    sim = sim_with_memory(16, 16)
    with pytest.raises(Unplaceable, match=r"worker tasks need 32 GiB of memory each, more than any ready node has"):
        sim.submit(replace(make_spec(worker=1), memory=32 * GIB))


def test_a_job_waits_for_memory_and_starts_when_it_frees():
    sim = sim_with_memory(16)
    first, actions = sim.submit(replace(make_spec(worker=1), memory=12 * GIB), name="first")
    assert len(launches(actions)) == 1
    sim.running(first, actions)
    assert sim.c.capacity(sim.now)[0].free_memory == 4 * GIB
    second, actions = sim.submit(replace(make_spec(worker=1), memory=8 * GIB), name="second")
    assert launches(actions) == [] and second.state == JobState.PENDING
    assert "8 GiB of memory" in second.message and "4 GiB of 16 GiB memory free" in second.message
    actions = sim.exit(first, "worker:0", code=0)
    assert [a.attempt.job_id for a in launches(actions)] == [second.id]
    assert launches(actions)[0].memory_bytes == 8 * GIB


def test_a_task_killed_for_its_memory_is_a_failure_that_charges_the_restart_budget():
    sim = sim_with_memory(16)
    job, actions = sim.submit(replace(make_spec(worker=2, restart={"max_restarts": 1}), memory=2 * GIB))
    sim.running(job, actions)
    message = "worker:1 exceeded its memory limit of 2 GiB (peak 2.1 GiB)"
    sim.exit_stopped(job, sim.exit(job, "worker:1", code=None, signal=9, message=message,
                                   peak_rss_bytes=int(2.1 * GIB), cpu_seconds=12.5))
    assert job.restarts == 1
    assert job.last_failure.exit.message == message and job.last_failure.task == "worker:1"
    assert wire.job_status(job).last_failure.message == message  # what `tfcluster status` shows


def test_start_flags_give_every_task_a_limit_and_a_bad_size_names_the_flag():
    data = spec_from_flags(name="j", strategy="multi_worker_mirrored", workers=2, chief=False, ps=0,
                           evaluator=False, gpus_per_task=0, checkpoint_dir=None, command=["python"], memory="200M")
    assert parse_spec(data).memory_for("worker") == 200 << 20
    result = subprocess.run([sys.executable, "-m", "tfcluster.cli", "start", "--name", "j", "--strategy",
                             "multi_worker_mirrored", "--memory", "lots", "--", "python"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "flags: --memory: expected a size such as" in result.stderr
