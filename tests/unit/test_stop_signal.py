"""The stop signal and the preemption save through the coordinator's core with fake time (coresim.Sim): what a
job's [preemption] table puts in its launches, and how a save's exit code and step reach the job's message."""

from __future__ import annotations

from dataclasses import replace

from coresim import Sim, info, keys, launches, make_spec, stops

from tfcluster import layout
from tfcluster.model import PREEMPTION_SAVED_LINE, TaskExit
from tfcluster.states import JobState

SAVED = ("step 6", PREEMPTION_SAVED_LINE.format(step=7), "Exception ignored in atexit callback")


def running_job(stop_signal="SIGUSR1"):
    sim = Sim(info("n1"), info("n2"))
    job, actions = sim.submit(replace(make_spec(worker=2), stop_signal=stop_signal, stop_grace_seconds=90.0))
    sim.running(job, actions)
    return sim, job, launches(actions)


def test_launches_carry_the_stop_signal_and_tell_the_task():
    _, _, started = running_job()
    assert {(l.stop_signal, l.stop_grace_seconds) for l in started} == {("SIGUSR1", 90.0)}
    assert {(l.env[layout.STOP_SIGNAL], l.env[layout.STOP_GRACE]) for l in started} == {("SIGUSR1", "90")}


def test_a_stop_answered_by_preemption_saves_ends_stopped_uncharged_and_says_the_step():
    sim, job, _ = running_job()
    stop = sim.c.stop(job.id, sim.now)
    assert keys(stops(stop)) == ["worker:0", "worker:1"] and {s.grace_seconds for s in stops(stop)} == {90.0}
    sim.exit(job, "worker:0", 42, log_tail=SAVED)
    sim.exit(job, "worker:1", 42, log_tail=SAVED)
    assert job.state == JobState.STOPPED and (job.restarts, job.preemptions) == (0, 0)
    assert job.message == "stopped by user; saved at step 7", job.message


def test_a_save_on_a_signal_from_elsewhere_restarts_the_group_for_free_naming_the_step():
    sim, job, _ = running_job()
    stop = sim.exit(job, "worker:0", 42, log_tail=SAVED)
    assert keys(stop) == ["worker:1"] and job.message.endswith("preemption checkpoint saved at step 7"), job.message
    assert keys(launches(sim.exit(job, "worker:1", 42, log_tail=SAVED))) == ["worker:0", "worker:1"]
    assert (job.restarts, job.preemptions) == (0, 1)


def test_the_saved_step_is_read_only_from_a_preemption_exit():
    assert TaskExit(exit_code=42, log_tail=SAVED).saved_step == 7
    assert TaskExit(exit_code=1, log_tail=SAVED).saved_step is None
    assert TaskExit(exit_code=42, log_tail=("saved",)).saved_step is None
