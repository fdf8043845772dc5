"""What a running sweep does next: which trials to submit, which to stop early, and whether it is over. Pure: it
reads a sweep's spec and a plain view of its trials (no jobs, no clock), and the core carries its answer out on
each pass (core/sweep_events.py).

Submission: trials go in trial order, as many at once as max_concurrent allows (a trial counts while its job has
not ended).

The median stopping rule (early_stopping = "median"): a live trial with at least min_evaluations results of the
metric is stopped when its best result up to its latest step is worse than the median of the ended trials' best
results up to that same step. Only ended trials that got to that step count, and at least MIN_OTHER_TRIALS of them,
so that a trial is never judged against one that had fewer steps to improve, nor against a single one; and trials
running side by side never stop one another (as in Vizier's and Ray Tune's rule, which compare with completed
trials).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tfcluster.sweepspec import SweepSpec

MIN_OTHER_TRIALS = 2


@dataclass(frozen=True)
class Trial:
    index: int
    job_id: str = ""     # "": not submitted yet
    live: bool = False   # submitted, and its job has not ended
    stopped: bool = False  # the rule stopped it already
    evaluations: tuple[tuple[int, float], ...] = ()  # (step, the metric's value), as the evaluator reported them


@dataclass(frozen=True)
class Decision:
    submit: tuple[int, ...] = ()  # trial indexes to submit now, in order
    stop: tuple[str, ...] = ()    # jobs the early-stopping rule stops now
    finished: bool = False        # every trial was submitted and has ended


def decide(sweep: SweepSpec, trials: list[Trial]) -> Decision:
    live = sum(1 for t in trials if t.live)
    waiting = [t.index for t in trials if not t.job_id]
    submit = tuple(waiting[:max(0, sweep.max_concurrent - live)])
    stop = tuple(t.job_id for t in trials if t.live and not t.stopped and _worse_than_median(sweep, t, trials)) \
        if sweep.early_stopping == "median" else ()
    return Decision(submit=submit, stop=stop, finished=not waiting and not live)


def best_up_to(sweep: SweepSpec, trial: Trial, step: int) -> float | None:
    """The trial's best value of the metric at steps up to `step` (None: none yet)."""
    values = [v for s, v in trial.evaluations if s <= step]
    if not values:
        return None
    return max(values) if sweep.goal == "max" else min(values)


def best(sweep: SweepSpec, trial: Trial) -> tuple[float, int] | None:
    """The trial's best value of the metric, and the step it was reached at (the first such step)."""
    if not trial.evaluations:
        return None
    better = (lambda a, b: a > b) if sweep.goal == "max" else (lambda a, b: a < b)
    found = trial.evaluations[0]
    for step, value in trial.evaluations[1:]:
        if better(value, found[1]) or (value == found[1] and step < found[0]):
            found = (step, value)
    return found[1], found[0]


def _worse_than_median(sweep: SweepSpec, trial: Trial, trials: list[Trial]) -> bool:
    if len(trial.evaluations) < sweep.min_evaluations:
        return False
    step = max(s for s, _ in trial.evaluations)
    reached = [o for o in trials if o.job_id and not o.live and any(s >= step for s, _ in o.evaluations)]
    others = [v for v in (best_up_to(sweep, o, step) for o in reached) if v is not None]
    if len(others) < MIN_OTHER_TRIALS:
        return False
    median = statistics.median(others)
    mine = best_up_to(sweep, trial, step)
    return mine < median if sweep.goal == "max" else mine > median
