"""The end of a job with an evaluator, in the coordinator's pure core with fake time: training finishes, the
final checkpoint is evaluated, the evaluator exits or is stopped, and the job succeeds within seconds; or the
evaluator never evaluates the final checkpoint and the deadline ends it, saying so."""

from __future__ import annotations

import posixpath
from dataclasses import replace

from coresim import Sim, info, keys, make_spec, stops

from tfcluster import layout
from tfcluster.commands import FinishTraining
from tfcluster.daemon.coordinator.core.lifecycle.completion import EVALUATOR_EXIT_SECONDS
from tfcluster.daemon.coordinator.core.lifecycle.launch import launch
from tfcluster.model import Evaluation
from tfcluster.states import JobState, TaskState

DEADLINE = 600


def start(checkpoint_dir: str = "", **evaluator):
    """A running 2-worker job with an evaluator on a node of its own (host-local checkpoints by default)."""
    sim = Sim(info("n1", 1), info("n2", 1), info("n3", 0))
    spec = make_spec(gpus=1, worker=2, evaluator={"count": 1, "gpus": 0, **evaluator})
    job, actions = sim.submit(replace(spec, checkpoint_dir=checkpoint_dir))
    assert sim.running(job, actions) == []
    assert job.state == JobState.RUNNING
    return sim, job


def report(sim, job, checkpoint: str, step: int, attempt: int | None = None) -> list:
    """The evaluator's agent reports an evaluation of checkpoint (a name in the evaluator's checkpoint dir)."""
    evaluator = job.evaluator()
    path = checkpoint if checkpoint.startswith(("/", "step ")) else posixpath.join(evaluator.checkpoint_dir, checkpoint)
    result = Evaluation(checkpoint=path, step=step, metrics={"accuracy": 0.9}, time=sim.now)
    current = job.attempt_of(evaluator)
    if attempt is not None:
        current = replace(current, number=attempt)
    return sim.c.evaluation(evaluator.node, current, result, sim.now)


def finish_training(sim, job, final="ckpt-3") -> list:
    sim.exit(job, "worker:1", 0)
    return sim.exit(job, "worker:0", 0, final_checkpoint=final)


def tick(sim, seconds: float) -> list:
    """Time passes; the stops sent (the final checkpoint is told again meanwhile, which changes nothing)."""
    sim.now += seconds
    sim.heartbeat_all()
    return stops(sim.c.tick(sim.now))


def test_an_evaluator_that_never_exits_is_stopped_seconds_after_evaluating_the_final_checkpoint():
    sim, job = start()
    assert report(sim, job, "ckpt-1", 40) == []
    told = finish_training(sim, job)
    assert [(type(a), a.final_checkpoint) for a in told] == [(FinishTraining, "ckpt-3")]
    assert tick(sim, 30) == [] and job.state == JobState.RUNNING, "the final checkpoint is not evaluated yet"
    assert report(sim, job, "ckpt-3", 120) == []
    assert job.state == JobState.RUNNING and "ckpt-3 is evaluated" in job.message
    assert tick(sim, EVALUATOR_EXIT_SECONDS - 1) == [], "it may still exit by itself"
    stop = tick(sim, 2)
    assert keys(stop) == ["evaluator:0"] and stop[0].grace_seconds == job.spec.stop_grace_seconds
    sim.exit_stopped(job, stop)
    assert job.state == JobState.SUCCEEDED
    assert job.message == "final evaluation of ckpt-3 done; stopped the evaluator"
    assert [e.checkpoint.rsplit("/", 1)[1] for e in job.evaluations] == ["ckpt-1", "ckpt-3"]


def test_an_evaluator_that_exits_after_the_final_evaluation_is_not_stopped():
    sim, job = start()
    finish_training(sim, job)
    report(sim, job, "ckpt-3", 120)
    assert sim.exit(job, "evaluator:0", 0) == []
    assert job.state == JobState.SUCCEEDED and job.message == "final evaluation done"
    assert job.evaluator().state == TaskState.SUCCEEDED


def test_an_evaluator_that_exits_by_itself_as_its_stop_is_sent_is_not_said_to_be_stopped():
    sim, job = start()
    finish_training(sim, job)
    report(sim, job, "ckpt-3", 120)
    assert keys(tick(sim, EVALUATOR_EXIT_SECONDS + 1)) == ["evaluator:0"]
    sim.exit(job, "evaluator:0", 0)  # it was unloading TensorFlow: exit 0 before the SIGTERM arrived
    assert job.state == JobState.SUCCEEDED and job.message == "final evaluation done"
    assert job.evaluator().state == TaskState.SUCCEEDED


def test_a_final_checkpoint_evaluated_before_training_ended_counts():
    sim, job = start()
    report(sim, job, "ckpt-3", 120)  # the newest checkpoint, evaluated while the chief was still exiting
    finish_training(sim, job)
    trained_at = sim.now
    assert "ckpt-3 is evaluated" in job.message
    stop = tick(sim, EVALUATOR_EXIT_SECONDS + 0.5)
    assert keys(stop) == ["evaluator:0"]
    sim.exit_stopped(job, stop)
    assert job.state == JobState.SUCCEEDED and job.finished - trained_at < EVALUATOR_EXIT_SECONDS + 1


def test_a_checkpoint_of_the_same_name_elsewhere_or_a_step_label_is_not_the_final_one():
    sim, job = start()
    finish_training(sim, job)
    report(sim, job, "/elsewhere/ckpt-3", 120)
    report(sim, job, "step 120", 120)
    report(sim, job, "ckpt-2", 80)
    assert tick(sim, EVALUATOR_EXIT_SECONDS + 1) == [] and job.state == JobState.RUNNING


def test_with_shared_storage_the_final_checkpoint_is_the_chiefs_path():
    sim, job = start(checkpoint_dir="/shared/ckpt")
    finish_training(sim, job, final="ckpt-5")
    report(sim, job, "/shared/ckpt/ckpt-5", 200)
    assert keys(tick(sim, EVALUATOR_EXIT_SECONDS + 1)) == ["evaluator:0"]


def test_an_evaluation_from_an_old_attempt_is_ignored():
    sim, job = start()
    finish_training(sim, job)
    assert report(sim, job, "ckpt-3", 120, attempt=job.evaluator().attempt + 1) == []
    assert job.evaluations == [] and tick(sim, EVALUATOR_EXIT_SECONDS + 1) == []


def test_an_evaluator_that_never_evaluates_the_final_checkpoint_ends_at_the_deadline_saying_so():
    sim, job = start()
    finish_training(sim, job, final="ckpt-12")
    report(sim, job, "ckpt-11", 110)
    assert tick(sim, DEADLINE - 1) == []
    stop = tick(sim, 2)
    assert keys(stop) == ["evaluator:0"] and job.state == JobState.STOPPING
    sim.exit_stopped(job, stop)
    assert job.state == JobState.SUCCEEDED
    assert job.message == ("the evaluator did not evaluate the final checkpoint ckpt-12 within "
                           "evaluator_deadline_seconds = 600; stopped it")


def test_the_evaluator_is_told_where_its_summaries_go():
    _, job = start()
    env = launch(job, job.evaluator()).env
    assert env[layout.SUMMARY_DIR] == posixpath.join(env[layout.MODEL_DIR], "eval")
    assert layout.SUMMARY_DIR not in launch(job, job.task("worker", 0)).env
    _, job = start(summary_dir="/logs/sidecar")
    assert launch(job, job.evaluator()).env[layout.SUMMARY_DIR] == "/logs/sidecar"


def test_an_ended_jobs_late_evaluation_is_kept_and_written_again():
    """An agent back from a reconnect resends its evaluator's exit before the results it reported just before
    it: the job has ended by then, and the results are kept all the same (a sweep ranks its trials by them)."""
    from tfcluster.daemon.coordinator.core.model.changelog import EndedJobAmended

    sim, job = start()
    finish_training(sim, job)
    report(sim, job, "ckpt-3", 120)
    sim.exit(job, "evaluator:0", 0)
    assert job.state == JobState.SUCCEEDED
    sim.c.jobs.changes.drain()
    assert report(sim, job, "ckpt-4", 160) == [], "an ended job is told nothing more"
    assert [e.step for e in job.evaluations] == [120, 160]
    assert [type(c) for c in sim.c.jobs.changes.drain()] == [EndedJobAmended], "the store writes it again"
    stale = report(sim, job, "ckpt-5", 200, attempt=job.evaluator().attempt + 1)
    assert stale == [] and [e.step for e in job.evaluations] == [120, 160], "another attempt's result is not its"
