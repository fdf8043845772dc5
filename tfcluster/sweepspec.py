"""A sweep: one job spec run as many trials, each with its own values of named parameters (a spec's `[sweep]`
table). What a sweep asks for, the checks every source of one passes (a TOML file, the wire), the trials it
expands to, and the job spec of each trial. Pure: the CLI, the wire and the coordinator's core all read it.

Each trial gets each parameter as an environment variable NAME and as `{NAME}` replaced in its command (the
job's and each role's). A grid sweep runs every combination of the values, in the order the table lists them; a
random one draws `trials` combinations with its `seed`, so the same spec always gives the same trials.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace

from tfcluster.spec import ENV_NAME_RE, JobSpec, SpecError

METHODS = ("grid", "random")
GOALS = ("max", "min")
EARLY_STOPPING = ("", "median", "asha")  # "": none
DEFAULT_REDUCTION_FACTOR = 3  # ASHA keeps the best third of the trials at each rung
MAX_TRIALS = 1000      # a sweep is a few dozen trials; a thousand is a mistake in the spec, not a plan
MAX_VALUES = 1000      # values of one parameter
MAX_VALUE_LENGTH = 4096
DEFAULT_MIN_EVALUATIONS = 2


@dataclass(frozen=True)
class SweepSpec:
    method: str
    metric: str                                   # an evaluator result name ("accuracy")
    parameters: dict[str, tuple[str, ...]] = field(default_factory=dict)  # NAME -> its values, as text
    goal: str = "max"                             # which way of the metric is better
    max_concurrent: int = 1                       # trials live at once
    trials: int = 0                               # random: how many trials; grid: 0 (every combination)
    seed: int = 0                                 # random: the draws'
    early_stopping: str = ""                      # "median", "asha", or "" for none
    min_evaluations: int = DEFAULT_MIN_EVALUATIONS  # median: a trial's evaluations before the rule may stop it
    grace_steps: int = 0                          # asha: the step of the first rung (rungs at grace * factor**k)
    reduction_factor: int = DEFAULT_REDUCTION_FACTOR  # asha: 1 in this many trials goes on past each rung

    @property
    def trial_count(self) -> int:
        if self.method == "random":
            return self.trials
        count = 1
        for values in self.parameters.values():
            count *= len(values)
        return count


def validate_sweep(sweep: SweepSpec, source: str = "<spec>") -> SweepSpec:
    """The sweep, or SpecError naming the `sweep.` key that is wrong."""
    def fail(key: str, message: str) -> SpecError:
        return SpecError(source, f"sweep.{key}", message)
    if sweep.method not in METHODS:
        raise fail("method", f"expected one of: {', '.join(METHODS)}, got {sweep.method!r}")
    if not sweep.metric or len(sweep.metric) > 200 or not sweep.metric.isprintable():
        raise fail("metric", "expected the name of an evaluator result, such as \"accuracy\"")
    if sweep.goal not in GOALS:
        raise fail("goal", f"expected one of: {', '.join(GOALS)}, got {sweep.goal!r}")
    if sweep.early_stopping not in EARLY_STOPPING:
        raise fail("early_stopping", f"expected \"median\" or \"asha\" (or no key for none), got "
                                     f"{sweep.early_stopping!r}")
    if sweep.early_stopping == "asha" and not 1 <= sweep.grace_steps <= 10**12:
        raise fail("grace_steps", "early_stopping = \"asha\" needs the training step of its first rung, at least "
                                  f"1 (as grace_steps = 1000), got {sweep.grace_steps}")
    if not 2 <= sweep.reduction_factor <= 100:
        raise fail("reduction_factor", f"expected 2 to 100, got {sweep.reduction_factor}")
    if not 1 <= sweep.max_concurrent <= MAX_TRIALS:
        raise fail("max_concurrent", f"expected 1 to {MAX_TRIALS}, got {sweep.max_concurrent}")
    if not 1 <= sweep.min_evaluations <= 1000:
        raise fail("min_evaluations", f"expected 1 to 1000, got {sweep.min_evaluations}")
    if not sweep.parameters:
        raise fail("parameters", "expected at least one parameter: [sweep.parameters] NAME = [values]")
    for name, values in sweep.parameters.items():
        if not ENV_NAME_RE.fullmatch(name) or len(name) > 200:
            raise fail(f"parameters.{name}", "expected an environment variable name (letters, digits, _)")
        if not 1 <= len(values) <= MAX_VALUES:
            raise fail(f"parameters.{name}", f"expected a list of 1 to {MAX_VALUES} values, got {len(values)}")
        if any(len(v) > MAX_VALUE_LENGTH or "\0" in v for v in values):
            raise fail(f"parameters.{name}", f"expected values of at most {MAX_VALUE_LENGTH} characters, no NUL")
        if len(set(values)) != len(values):
            raise fail(f"parameters.{name}", "a value is listed twice")
    if sweep.method == "random" and not 1 <= sweep.trials <= MAX_TRIALS:
        raise fail("trials", f"expected 1 to {MAX_TRIALS} trials for a random sweep, got {sweep.trials}")
    if sweep.method == "grid" and sweep.trials:
        raise fail("trials", "a grid sweep runs every combination: trials is for method = \"random\"")
    if sweep.trial_count > MAX_TRIALS:
        raise fail("parameters", f"{sweep.trial_count} combinations: at most {MAX_TRIALS} trials")
    return sweep


def expand(sweep: SweepSpec) -> list[dict[str, str]]:
    """Each trial's parameters, in trial order."""
    names = list(sweep.parameters)
    if sweep.method == "grid":
        return [dict(zip(names, combination))
                for combination in itertools.product(*(sweep.parameters[n] for n in names))]
    draw = random.Random(sweep.seed)
    return [{n: draw.choice(sweep.parameters[n]) for n in names} for _ in range(sweep.trials)]


def trial_spec(spec: JobSpec, parameters: dict[str, str]) -> JobSpec:
    """The job spec of one trial: the parameters in its environment and in its commands."""
    def substitute(command: tuple[str, ...]) -> tuple[str, ...]:
        for name, value in parameters.items():
            command = tuple(arg.replace(f"{{{name}}}", value) for arg in command)
        return command
    roles = {t: replace(r, command=substitute(r.command)) for t, r in spec.roles.items()}
    return replace(spec, env={**spec.env, **parameters}, command=substitute(spec.command), roles=roles)
