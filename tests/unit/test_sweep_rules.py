"""Sweeps: the [sweep] table as the spec parser reads it, the trials it expands to, and the pure decision of what a
sweep does next (core/scheduling/sweeps.py): max_concurrent, the median stopping rule, the goal."""

from __future__ import annotations

import pytest

from tfcluster.daemon.coordinator.core.scheduling.sweeps import Trial, best, decide
from tfcluster.spec import SpecError
from tfcluster.specfile import parse_spec, parse_sweep_spec
from tfcluster.sweepspec import SweepSpec, expand, trial_spec

BASE = {"name": "lr", "strategy": "multi_worker_mirrored", "command": ["python", "train.py", "--lr={LR}"],
        "workdir": "/w"}


def sweep_data(**table):
    params = table.pop("parameters", {"LR": [0.1, 0.01], "BATCH": [32, 64]})
    return {**BASE, "sweep": {"metric": "accuracy", **table, "parameters": params}}


def test_a_grid_sweep_expands_to_every_combination_in_table_order():
    spec, sweep = parse_sweep_spec(sweep_data(max_concurrent=2))
    assert sweep.method == "grid" and sweep.max_concurrent == 2 and sweep.goal == "max"
    assert expand(sweep) == [{"LR": "0.1", "BATCH": "32"}, {"LR": "0.1", "BATCH": "64"},
                             {"LR": "0.01", "BATCH": "32"}, {"LR": "0.01", "BATCH": "64"}]


def test_a_random_sweep_draws_its_trials_with_its_seed():
    _, sweep = parse_sweep_spec(sweep_data(method="random", trials=5, seed=7,
                                           parameters={"LR": [0.1, 0.01, 0.001], "DROP": ["a", "b"]}))
    first = expand(sweep)
    assert len(first) == 5 and first == expand(sweep)
    assert all(t["LR"] in ("0.1", "0.01", "0.001") and t["DROP"] in ("a", "b") for t in first)
    _, other = parse_sweep_spec(sweep_data(method="random", trials=5, seed=8,
                                           parameters={"LR": [0.1, 0.01, 0.001], "DROP": ["a", "b"]}))
    assert expand(other) != first  # these two seeds draw different trials


def test_each_trial_gets_its_parameters_as_env_and_in_its_commands():
    data = sweep_data()
    data["roles"] = {"chief": {"count": 1, "command": ["python", "chief.py", "--batch={BATCH}"]}}
    spec, sweep = parse_sweep_spec(data)
    trial = trial_spec(spec, expand(sweep)[3])
    assert trial.env == {"LR": "0.01", "BATCH": "64"}
    assert trial.command == ("python", "train.py", "--lr=0.01")
    assert trial.roles["chief"].command == ("python", "chief.py", "--batch=64")


@pytest.mark.parametrize("table, key, words", [
    ({"method": "bayes"}, "sweep.method", "grid, random"),
    ({"goal": "up"}, "sweep.goal", "max, min"),
    ({"early_stopping": "hyperband"}, "sweep.early_stopping", "\"median\" or \"asha\""),
    ({"early_stopping": "asha"}, "sweep.grace_steps", "training step of its first rung"),
    ({"early_stopping": "asha", "grace_steps": 100, "reduction_factor": 1}, "sweep.reduction_factor", "2 to 100"),
    ({"max_concurrent": 0}, "sweep.max_concurrent", "1 to"),
    ({"max_concurrent": "2"}, "sweep.max_concurrent", "expected an integer"),
    ({"method": "random"}, "sweep.trials", "random sweep"),
    ({"trials": 3}, "sweep.trials", "grid sweep runs every combination"),
    ({"parameters": {}}, "sweep.parameters", "at least one parameter"),
    ({"parameters": {"LR": []}}, "sweep.parameters.LR", "1 to"),
    ({"parameters": {"LR": 0.1}}, "sweep.parameters.LR", "expected a list"),
    ({"parameters": {"LR": [1, 1]}}, "sweep.parameters.LR", "listed twice"),
    ({"parameters": {"no-dash": [1]}}, "sweep.parameters.no-dash", "environment variable name"),
    ({"shape": "x"}, "sweep.shape", "unknown key"),
    ({"parameters": {"A": list(range(40)), "B": list(range(40))}}, "sweep.parameters", "1600 combinations"),
])
def test_a_bad_sweep_table_is_refused_naming_its_key(table, key, words):
    with pytest.raises(SpecError) as e:
        parse_sweep_spec(sweep_data(**table))
    assert e.value.key == key and words in e.value.message


def test_a_sweep_needs_a_metric_and_a_job_spec_refuses_a_sweep_table():
    data = sweep_data()
    del data["sweep"]["metric"]
    with pytest.raises(SpecError, match="sweep.metric"):
        parse_sweep_spec(data)
    with pytest.raises(SpecError, match="tfcluster sweep start"):
        parse_spec(sweep_data())


SPEC = SweepSpec(method="grid", metric="accuracy", parameters={"X": ("1", "2", "3", "4", "5")}, max_concurrent=2,
                 early_stopping="median", min_evaluations=2)


def test_trials_are_submitted_in_order_never_more_than_max_concurrent_live():
    trials = [Trial(i) for i in range(5)]
    assert decide(SPEC, trials).submit == (0, 1)
    trials[:2] = [Trial(0, "j0", live=True), Trial(1, "j1", live=True)]
    assert decide(SPEC, trials).submit == ()
    trials[0] = Trial(0, "j0", live=False)
    assert decide(SPEC, trials).submit == (2,)
    done = [Trial(i, f"j{i}") for i in range(5)]
    assert decide(SPEC, done).finished and not decide(SPEC, trials).finished


def curve(*values, start=100):
    return tuple((start * (n + 1), v) for n, v in enumerate(values))


def test_the_median_rule_stops_a_trial_worse_than_the_median_of_the_others_at_the_same_step():
    ended = [Trial(0, "a", evaluations=curve(0.5, 0.7, 0.8)), Trial(1, "b", evaluations=curve(0.6, 0.8, 0.9))]
    bad = Trial(2, "c", live=True, evaluations=curve(0.3, 0.4))       # at step 200: 0.4 < median(0.7, 0.8)
    good = Trial(3, "d", live=True, evaluations=curve(0.6, 0.9))      # 0.9 is above it
    assert decide(SPEC, [*ended, bad, good]).stop == ("c",)


def test_the_median_rule_waits_for_min_evaluations_and_two_other_trials_at_that_step():
    ended = [Trial(0, "a", evaluations=curve(0.5, 0.7)), Trial(1, "b", evaluations=curve(0.6, 0.8))]
    assert decide(SPEC, [*ended, Trial(2, "c", live=True, evaluations=curve(0.1))]).stop == ()  # one evaluation
    short = [Trial(0, "a", evaluations=curve(0.5, 0.7)), Trial(1, "b", evaluations=curve(0.6))]  # b stopped at 100
    assert decide(SPEC, [*short, Trial(2, "c", live=True, evaluations=curve(0.1, 0.2))]).stop == ()
    stopped = Trial(2, "c", live=True, stopped=True, evaluations=curve(0.1, 0.2))  # asked to stop already
    assert decide(SPEC, [*ended, stopped]).stop == ()
    from dataclasses import replace
    assert decide(replace(SPEC, early_stopping=""), [*ended, Trial(2, "c", live=True,
                                                                   evaluations=curve(0.1, 0.2))]).stop == ()


def test_with_goal_min_lower_is_better_for_the_rule_and_for_the_best_value():
    from dataclasses import replace
    spec = replace(SPEC, goal="min", metric="loss")
    ended = [Trial(0, "a", evaluations=curve(0.9, 0.5)), Trial(1, "b", evaluations=curve(0.8, 0.4))]
    high = Trial(2, "c", live=True, evaluations=curve(1.0, 0.9))
    low = Trial(3, "d", live=True, evaluations=curve(0.5, 0.3))
    assert decide(spec, [*ended, high, low]).stop == ("c",)
    assert best(spec, low) == (0.3, 200) and best(SPEC, low) == (0.5, 100)
    assert best(spec, Trial(4)) is None




def asha(**changes):
    from dataclasses import replace
    return replace(SPEC, early_stopping="asha", grace_steps=100, reduction_factor=3, **changes)


def test_asha_stops_a_trial_reaching_a_rung_outside_the_best_third_of_those_that_reached_it():
    others = [Trial(0, "a", evaluations=curve(0.5, 0.6, 0.7)), Trial(1, "b", live=True, evaluations=curve(0.8)),
              Trial(2, "c", evaluations=curve(0.6))]
    low = Trial(3, "d", live=True, evaluations=curve(0.55))   # rung 100: 0.55 is not in the best third of 4
    high = Trial(4, "e", live=True, evaluations=curve(0.9))    # the best at rung 100
    decision = decide(asha(), [*others, low, high])
    assert decision.stop == ("d",)
    assert decision.why == ("stopped early: its best accuracy at step 100 was not in the best 1/3 of the 5 trials "
                            "that reached that step",)


def test_asha_judges_a_trial_only_as_it_reaches_a_rung_and_lets_the_first_there_go_on():
    assert decide(asha(), [Trial(0, "a", live=True, evaluations=curve(0.1))]).stop == (), "first at its rung"
    passed = Trial(0, "a", live=True, evaluations=curve(0.5, 0.5))  # step 200: past rung 100, before rung 300
    better = [Trial(i, f"o{i}", evaluations=curve(0.9)) for i in range(1, 4)]
    assert decide(asha(), [passed, *better]).stop == (), "judged at rung 100 when it got there, not again"
    early = Trial(0, "a", live=True, evaluations=((50, 0.0),))
    assert decide(asha(), [early, *better]).stop == (), "before the first rung nothing is judged"
    at_300 = Trial(0, "a", live=True, evaluations=curve(0.95, 0.95, 0.2))  # its best up to 300 is still 0.95
    rivals = [Trial(i, f"o{i}", evaluations=curve(0.1, 0.1, 0.9)) for i in range(1, 3)]
    assert decide(asha(), [at_300, *rivals]).stop == (), "its best up to the rung counts, not its latest value"


def test_asha_with_goal_min_keeps_the_lowest():
    spec = asha(goal="min", metric="loss")
    trials = [Trial(0, "a", evaluations=curve(0.2)), Trial(1, "b", evaluations=curve(0.3)),
              Trial(2, "c", live=True, evaluations=curve(0.9)), Trial(3, "d", live=True, evaluations=curve(0.1))]
    assert decide(spec, trials).stop == ("c",)
