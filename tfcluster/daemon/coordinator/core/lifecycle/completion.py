"""What the end of a job waits for once training is over: the evaluator's evaluation of the final checkpoint.
Pure; core/lifecycle/transitions.py acts on it.

The chief's agent names the final checkpoint relative to the checkpoint dir. The evaluator reports the
checkpoints it evaluated as paths in its own checkpoint dir (its agent ties TensorBoard summaries to them by
their step), so the two are compared inside the evaluator's checkpoint dir, whatever node it is on.
"""

from __future__ import annotations

import posixpath

from tfcluster.daemon.coordinator.core.model.job import Job

# Once the final checkpoint is evaluated, the evaluator has this long to exit by itself (the built-in
# evaluator and task.SidecarEvaluator do) before it is stopped: tf-keras's SidecarEvaluator never exits.
EVALUATOR_EXIT_SECONDS = 5.0


def final_checkpoint(job: Job) -> str:
    """The checkpoint training ended with, relative to the checkpoint dir ("" when it left none)."""
    decisive = job.decisive_task()
    return decisive.exit.final_checkpoint if decisive is not None and decisive.exit else ""


def final_evaluated(job: Job) -> bool:
    """An evaluation of the job's final checkpoint has been reported (by any attempt of the evaluator)."""
    final, evaluator = final_checkpoint(job), job.evaluator()
    if not final or evaluator is None:
        return False
    target = posixpath.normpath(posixpath.join(evaluator.checkpoint_dir, final))
    return any(e.checkpoint and posixpath.normpath(posixpath.join(evaluator.checkpoint_dir, e.checkpoint)) == target
               for e in job.evaluations)


def waiting_message(job: Job) -> str:
    """The job's message while the evaluator's end is awaited."""
    final = final_checkpoint(job)
    if final_evaluated(job):
        return f"training finished; the final checkpoint {final} is evaluated; waiting for the evaluator to exit"
    if final:
        return f"training finished; evaluating the final checkpoint {final}"
    return "training finished without a checkpoint; waiting for the evaluator to exit"


def deadline_message(job: Job) -> str:
    """Why the evaluator was stopped when its time ran out."""
    final, deadline = final_checkpoint(job), job.spec.evaluator_deadline_seconds
    if final_evaluated(job):
        return f"final evaluation of {final} done; stopped the evaluator"
    if final:
        return (f"the evaluator did not evaluate the final checkpoint {final} within evaluator_deadline_seconds = "
                f"{deadline:g}; stopped it")
    return (f"training left no checkpoint and the evaluator did not exit within evaluator_deadline_seconds = "
            f"{deadline:g}; stopped it")
