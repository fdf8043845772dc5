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

ASHA (early_stopping = "asha", asynchronous successive halving as in Li et al. 2020 and Ray Tune's ASHAScheduler):
rungs at grace_steps * reduction_factor**k training steps. A trial reaches a rung with its first evaluation at or
past the rung's step, its value there being its best up to that evaluation; while that evaluation is its latest,
it is stopped unless its value is within the best 1/reduction_factor of the values every trial (ended, stopped or
live) had on reaching that rung. A trial first to reach a rung always goes on: nobody is there to judge it
against, and no trial waits for others (the "asynchronous" of ASHA), so a slow trial never holds the sweep up.
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
    why: tuple[str, ...] = ()     # for each job in stop, what its message says


def decide(sweep: SweepSpec, trials: list[Trial]) -> Decision:
    live = sum(1 for t in trials if t.live)
    waiting = [t.index for t in trials if not t.job_id]
    submit = tuple(waiting[:max(0, sweep.max_concurrent - live)])
    rule = _RULES.get(sweep.early_stopping)
    stopped = [(t.job_id, why) for t in trials if t.live and not t.stopped and rule
               for why in [rule(sweep, t, trials)] if why]
    return Decision(submit=submit, stop=tuple(j for j, _ in stopped), finished=not waiting and not live,
                    why=tuple(w for _, w in stopped))


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


def _worse_than_median(sweep: SweepSpec, trial: Trial, trials: list[Trial]) -> str:
    """Why the median rule stops the trial; "" when it goes on."""
    if len(trial.evaluations) < sweep.min_evaluations:
        return ""
    step = max(s for s, _ in trial.evaluations)
    reached = [o for o in trials if o.job_id and not o.live and any(s >= step for s, _ in o.evaluations)]
    others = [v for v in (best_up_to(sweep, o, step) for o in reached) if v is not None]
    if len(others) < MIN_OTHER_TRIALS:
        return ""
    median = statistics.median(others)
    mine = best_up_to(sweep, trial, step)
    if not (mine < median if sweep.goal == "max" else mine > median):
        return ""
    worse = "below" if sweep.goal == "max" else "above"
    return f"stopped early: its best {sweep.metric} was {worse} the median of the other trials' at the same step"


def _rung_value(sweep: SweepSpec, trial: Trial, rung: int) -> tuple[float, bool] | None:
    """(its best value on reaching the rung's step, whether that evaluation is its latest); None: not reached."""
    arrival = next((i for i, (s, _) in enumerate(trial.evaluations) if s >= rung), None)
    if arrival is None:
        return None
    return best_up_to(sweep, trial, trial.evaluations[arrival][0]), arrival == len(trial.evaluations) - 1


def _below_the_rung(sweep: SweepSpec, trial: Trial, trials: list[Trial]) -> str:
    """Why ASHA stops the trial at the rung it just reached; "" when it goes on."""
    if not trial.evaluations:
        return ""
    latest, rung = trial.evaluations[-1][0], sweep.grace_steps
    if latest < rung:
        return ""
    while rung * sweep.reduction_factor <= latest:
        rung *= sweep.reduction_factor
    mine = _rung_value(sweep, trial, rung)
    if mine is None or not mine[1]:  # it was judged at this rung when it reached it, and went on
        return ""
    sign = 1 if sweep.goal == "max" else -1
    values = sorted(sign * v for v in (_rung_value(sweep, o, rung) for o in trials if o.job_id) if v is not None
                    for v in [v[0]])
    cutoff = _percentile(values, 1 - 1 / sweep.reduction_factor)
    if sign * mine[0] >= cutoff:
        return ""
    return (f"stopped early: its best {sweep.metric} at step {rung} was not in the best 1/{sweep.reduction_factor} "
            f"of the {len(values)} trials that reached that step")


def _percentile(ordered: list[float], fraction: float) -> float:
    """The value at that fraction of the sorted values, interpolated between neighbours (numpy's default)."""
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


_RULES = {"median": _worse_than_median, "asha": _below_the_rung}
