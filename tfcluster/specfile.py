"""Reading a job spec: a TOML file, or the same plain data from `tfcluster start` flags, turned into a JobSpec
that spec.validate has checked. Reading checks types (a TOML file can hold anything) and names the key that
is wrong; paths in a file are taken from its folder, since a spec runs on other machines than the one it
was written on.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from tfcluster.model import CHIEF, EVALUATOR, PS, ROLE_TYPES, WORKER, EnvironmentSpec
from tfcluster.spec import (DEFAULT_EVALUATOR_DEADLINE_SECONDS, DEFAULT_MAX_RESTARTS, DEFAULT_RESIZE_INTERVAL_SECONDS,
                            DEFAULT_STOP_GRACE_SECONDS,
                            DEFAULT_STOP_SIGNAL, SIZE_RE, STRATEGIES, JobSpec, RestartPolicy, RoleSpec, SpecError, validate)
from tfcluster.sweepspec import DEFAULT_MIN_EVALUATIONS, DEFAULT_REDUCTION_FACTOR, SweepSpec, validate_sweep

JOB_KEYS = ("name", "strategy", "command", "workdir", "checkpoint_dir", "model_dir", "env", "gpus",
            "roles", "restart", "stop_grace_seconds", "evaluator_deadline_seconds", "priority", "memory",
            "shared_workdir", "environment", "preemption", "elastic")
ROLE_KEYS = ("count", "gpus", "command", "env", "nodes", "labels", "entrypoint", "summary_dir", "memory")
RESTART_KEYS = ("max_restarts", "backoff_seconds", "permanent_exit_codes", "hang_seconds")
ENVIRONMENT_KEYS = ("requirements", "isolated", "project")
PREEMPTION_KEYS = ("signal", "grace_seconds")
SWEEP_KEYS = ("method", "trials", "seed", "max_concurrent", "metric", "goal", "early_stopping", "min_evaluations",
              "grace_steps", "reduction_factor",
              "parameters")
ELASTIC_KEYS = ("resize_interval_seconds",)
RANGE_RE = re.compile(r"\s*(\d+)\s*\.\.\s*(\d+)\s*")  # an elastic count, "MIN..MAX"


class _Reader:
    """Type checks of plain data, with errors that name the key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str) -> SpecError:
        return SpecError(self.source, key, message)

    def table(self, value: Any, key: str, allowed: tuple[str, ...], what: str = "a table") -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected {what}, got {_describe(value)}")
        prefix = f"{key}." if key else ""
        for name in value:
            if name not in allowed:
                raise self.fail(f"{prefix}{name}", f"unknown key (expected one of: {', '.join(allowed)})")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_describe(value)}")
        return value

    def integer(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {_describe(value)}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_describe(value)}")
        return value

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number, got {_describe(value)}")
        return float(value)

    def size(self, value: Any, key: str) -> int:
        """Bytes, as an integer or a string such as "16G", "512MiB" or "1.5T" (K, M, G, T are powers of 1024)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        match = SIZE_RE.fullmatch(value.strip()) if isinstance(value, str) else None
        if not match:
            raise self.fail(key, f"expected a size such as \"16G\" or \"512M\" (or bytes), got {_describe(value)}")
        number, unit = match.groups()
        return int(float(number) * 1024 ** "BKMGT".index((unit or "B")[0].upper()))

    def command(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"expected a list of strings (the program and its arguments), got {_describe(value)}")
        if not value or not value[0]:
            raise self.fail(key, "expected a non-empty command")
        return tuple(value)

    def string_list(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, f"expected a list of non-empty strings, got {_describe(value)}")
        return tuple(value)

    def env(self, value: Any, key: str) -> dict[str, str]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table of NAME = \"value\", got {_describe(value)}")
        env = {}
        for name, val in value.items():
            if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                raise self.fail(f"{key}.{name}", f"expected a string, got {_describe(val)}")
            env[name] = str(val)
        return env


def _describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)
    shown = repr(value)
    return f"{kind} ({shown})" if len(shown) <= 40 and not isinstance(value, (dict, list)) else kind


def parse_spec(data: Any, source: str = "<spec>") -> JobSpec:
    """Reads a spec given as plain data (a parsed TOML document, or flags) and validates it."""
    r = _Reader(source)
    if isinstance(data, dict) and "sweep" in data:
        raise r.fail("sweep", "this spec is a sweep: start it with `tfcluster sweep start` (or Cluster.sweep)")
    data = r.table(data, "", JOB_KEYS, "a table at the top level")
    if "name" not in data:
        raise r.fail("name", "missing (a job name such as \"digits\")")
    if "strategy" not in data:
        raise r.fail("strategy", f"missing (one of: {', '.join(STRATEGIES)})")
    roles_raw = data.get("roles", {})
    if not isinstance(roles_raw, dict):
        raise r.fail("roles", f"expected a table of role tables ([roles.worker] ...), got {_describe(roles_raw)}")
    roles = {}
    for role_type, table in roles_raw.items():
        if role_type not in ROLE_TYPES:
            raise r.fail(f"roles.{role_type}", f"unknown role (expected one of: {', '.join(ROLE_TYPES)})")
        roles[role_type] = _read_role(r, role_type, table)
    if CHIEF not in roles and WORKER not in roles:
        roles[WORKER] = RoleSpec(count=1)  # the plain case: one training task
    restart = r.table(data.get("restart", {}), "restart", RESTART_KEYS)
    codes = restart.get("permanent_exit_codes", [])
    stop_signal, stop_grace = _read_preemption(r, data)
    if not isinstance(codes, list):
        raise r.fail("restart.permanent_exit_codes", f"expected a list of integers, got {_describe(codes)}")
    spec = JobSpec(
        name=r.string(data["name"], "name"),
        strategy=r.string(data["strategy"], "strategy"),
        command=r.command(data["command"], "command") if "command" in data else (),
        workdir=r.string(data.get("workdir", ""), "workdir"),
        checkpoint_dir=r.string(data.get("checkpoint_dir", ""), "checkpoint_dir"),
        model_dir=r.string(data.get("model_dir", ""), "model_dir"),
        env=r.env(data.get("env", {}), "env"),
        gpus=r.integer(data.get("gpus", 0), "gpus"),
        roles=roles,
        restart=RestartPolicy(
            max_restarts=r.integer(restart.get("max_restarts", DEFAULT_MAX_RESTARTS), "restart.max_restarts"),
            backoff_seconds=r.number(restart.get("backoff_seconds", 0.0), "restart.backoff_seconds"),
            permanent_exit_codes=tuple(r.integer(c, "restart.permanent_exit_codes") for c in codes),
            hang_seconds=r.number(restart.get("hang_seconds", 0.0), "restart.hang_seconds")),
        stop_grace_seconds=stop_grace,
        stop_signal=stop_signal,
        evaluator_deadline_seconds=r.number(data.get("evaluator_deadline_seconds",
                                                     DEFAULT_EVALUATOR_DEADLINE_SECONDS),
                                            "evaluator_deadline_seconds"),
        priority=r.string(data.get("priority", ""), "priority"),
        memory=r.size(data.get("memory", 0), "memory"),
        shared_workdir=r.boolean(data.get("shared_workdir", False), "shared_workdir"),
        environment=_read_environment(r, data.get("environment", {})),
        resize_interval_seconds=_read_elastic(r, data.get("elastic", {})),
    )
    return validate(spec, source)


def parse_sweep_spec(data: Any, source: str = "<spec>") -> tuple[JobSpec, SweepSpec]:
    """A sweep given as plain data: the job spec of every trial (without its [sweep] table) and the sweep."""
    r = _Reader(source)
    data = dict(r.table(data, "", (*JOB_KEYS, "sweep"), "a table at the top level"))
    if "sweep" not in data:
        raise r.fail("sweep", "missing: a sweep spec has a [sweep] table (see the sweeps page of the manual)")
    table = r.table(data.pop("sweep"), "sweep", SWEEP_KEYS)
    spec = parse_spec(data, source)
    raw = table.get("parameters", {})
    if not isinstance(raw, dict):
        raise r.fail("sweep.parameters", f"expected a table of NAME = [values], got {_describe(raw)}")
    parameters = {}
    for name, values in raw.items():
        key = f"sweep.parameters.{name}"
        if not isinstance(values, list) or not all(isinstance(v, (str, int, float)) for v in values):
            raise r.fail(key, f"expected a list of values (strings or numbers), got {_describe(values)}")
        parameters[name] = tuple(_value_text(v) for v in values)
    sweep = SweepSpec(
        method=r.string(table.get("method", "grid"), "sweep.method"),
        metric=r.string(table["metric"], "sweep.metric") if "metric" in table else "",
        parameters=parameters,
        goal=r.string(table.get("goal", "max"), "sweep.goal"),
        max_concurrent=r.integer(table.get("max_concurrent", 1), "sweep.max_concurrent"),
        trials=r.integer(table.get("trials", 0), "sweep.trials"),
        seed=r.integer(table.get("seed", 0), "sweep.seed"),
        early_stopping=r.string(table.get("early_stopping", ""), "sweep.early_stopping"),
        min_evaluations=r.integer(table.get("min_evaluations", DEFAULT_MIN_EVALUATIONS), "sweep.min_evaluations"),
        grace_steps=r.integer(table.get("grace_steps", 0), "sweep.grace_steps"),
        reduction_factor=r.integer(table.get("reduction_factor", DEFAULT_REDUCTION_FACTOR), "sweep.reduction_factor"))
    return spec, validate_sweep(sweep, source)


def _value_text(value: str | int | float) -> str:
    """A parameter's value as its environment variable holds it (true/false as TOML writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
def _read_elastic(r: _Reader, table: Any) -> float:
    """[elastic] resize_interval_seconds: how often at most an elastic job grows."""
    table = r.table(table, "elastic", ELASTIC_KEYS)
    return r.number(table.get("resize_interval_seconds", DEFAULT_RESIZE_INTERVAL_SECONDS),
                    "elastic.resize_interval_seconds")


def _read_count(r: _Reader, value: Any, key: str) -> tuple[int, int, int]:
    """count = N, or "MIN..MAX" (elastic): (count, min_count, max_count); an elastic role starts out asking for
    MAX, and runs at as many as fit."""
    if isinstance(value, str):
        match = RANGE_RE.fullmatch(value)
        if not match:
            raise r.fail(key, f"expected an integer, or \"MIN..MAX\" for an elastic worker count, got {_describe(value)}")
        low, high = int(match[1]), int(match[2])
        return high, low, high
    return r.integer(value, key), 0, 0


def _read_preemption(r: _Reader, data: dict[str, Any]) -> tuple[str, float]:
    """[preemption] signal and grace_seconds: what a stop, a preemption or a drain sends first, and how long
    the tasks have to save before SIGKILL. The grace may also be the older top-level stop_grace_seconds."""
    table = r.table(data.get("preemption", {}), "preemption", PREEMPTION_KEYS)
    if "grace_seconds" in table and "stop_grace_seconds" in data:
        raise r.fail("preemption.grace_seconds", "the same setting as stop_grace_seconds: give one of them")
    grace_key = "preemption.grace_seconds" if "grace_seconds" in table else "stop_grace_seconds"
    grace = table.get("grace_seconds", data.get("stop_grace_seconds", DEFAULT_STOP_GRACE_SECONDS))
    grace = r.number(grace, grace_key)
    if not grace >= 0 or grace == float("inf"):  # named here: validate knows only the older key
        raise r.fail(grace_key, f"expected a number >= 0, got {grace}")
    signal = r.string(table.get("signal", DEFAULT_STOP_SIGNAL), "preemption.signal").upper()
    return (signal if signal.startswith("SIG") else f"SIG{signal}"), grace


def _read_environment(r: _Reader, table: Any) -> EnvironmentSpec:
    table = r.table(table, "environment", ENVIRONMENT_KEYS)
    return EnvironmentSpec(requirements=r.string(table.get("requirements", ""), "environment.requirements"),
                           isolated=r.boolean(table.get("isolated", False), "environment.isolated"),
                           project=r.string(table.get("project", ""), "environment.project"))


def _read_role(r: _Reader, role_type: str, table: Any) -> RoleSpec:
    key = f"roles.{role_type}"
    table = r.table(table, key, ROLE_KEYS)
    count, min_count, max_count = _read_count(r, table.get("count", 1), f"{key}.count")
    return RoleSpec(
        count=count, min_count=min_count, max_count=max_count,
        gpus=r.integer(table["gpus"], f"{key}.gpus") if "gpus" in table else None,
        command=r.command(table["command"], f"{key}.command") if "command" in table else (),
        env=r.env(table.get("env", {}), f"{key}.env"),
        nodes=r.string_list(table.get("nodes", []), f"{key}.nodes"),
        labels=r.string_list(table.get("labels", []), f"{key}.labels"),
        entrypoint=r.string(table.get("entrypoint", ""), f"{key}.entrypoint"),
        summary_dir=r.string(table.get("summary_dir", ""), f"{key}.summary_dir"),
        memory=r.size(table["memory"], f"{key}.memory") if "memory" in table else None,
    )


def load_spec_file(path: str | Path) -> JobSpec:
    """Reads and validates a TOML spec; relative paths in it are taken from the file's folder."""
    path = Path(path)
    return parse_spec_text(_read_text(path), str(path), path.resolve().parent)


def load_sweep_file(path: str | Path) -> tuple[JobSpec, SweepSpec]:
    """Reads and validates a TOML sweep spec (a job spec with a [sweep] table); paths as load_spec_file takes them."""
    path = Path(path)
    return parse_sweep_text(_read_text(path), str(path), path.resolve().parent)


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode()
    except OSError as e:
        raise SpecError(str(path), "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(str(path), "", f"not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})") from None


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, "", f"not valid TOML: {e}") from None


def parse_spec_text(text: str, source: str, base: Path) -> JobSpec:
    """A TOML spec given as text; relative paths in it are taken from base."""
    return resolve_paths(parse_spec(_toml(text, source), source), base)


def parse_sweep_text(text: str, source: str, base: Path) -> tuple[JobSpec, SweepSpec]:
    """A TOML sweep spec given as text; relative paths in it are taken from base."""
    spec, sweep = parse_sweep_spec(_toml(text, source), source)
    return resolve_paths(spec, base), sweep


def resolve_paths(spec: JobSpec, base: Path) -> JobSpec:
    """Makes workdir, checkpoint_dir, model_dir and the evaluator's summary_dir absolute (every node sees the
    same absolute path). A workdir of / is a whole filesystem, never one to pack: it is taken as shared."""
    def absolute(p: str) -> str:
        return str((base / p).resolve()) if p and not Path(p).is_absolute() else p
    roles = {t: replace(r, summary_dir=absolute(r.summary_dir)) for t, r in spec.roles.items()}
    workdir = absolute(spec.workdir or ".")
    return replace(spec, workdir=workdir, checkpoint_dir=absolute(spec.checkpoint_dir),
                   model_dir=absolute(spec.model_dir), roles=roles,
                   shared_workdir=spec.shared_workdir or workdir == "/")


def spec_from_flags(*, name: str, strategy: str, workers: int, chief: bool, ps: int, evaluator: bool,
                    gpus_per_task: int, checkpoint_dir: str | None, command: list[str],
                    env: dict[str, str] | None = None, max_restarts: int | None = None,
                    memory: str | None = None) -> dict[str, Any]:
    """The same plain data a TOML file would give, from `tfcluster start` flags."""
    roles: dict[str, Any] = {}
    if workers:
        roles[WORKER] = {"count": workers}
    if chief:
        roles[CHIEF] = {"count": 1}
    if ps:
        roles[PS] = {"count": ps, "gpus": 0}
    if evaluator:
        roles[EVALUATOR] = {"count": 1, "gpus": 0}
    # No file says what the job's code is: the command runs in the current folder's path on every node, as
    # it always has (that folder must be on shared storage); a spec file ships its workdir instead.
    data: dict[str, Any] = {"name": name, "strategy": strategy, "roles": roles, "gpus": gpus_per_task,
                            "shared_workdir": True}
    if command:
        data["command"] = list(command)
    if checkpoint_dir:
        data["checkpoint_dir"] = checkpoint_dir
    if env:
        data["env"] = env
    if max_restarts is not None:
        data["restart"] = {"max_restarts": max_restarts}
    if memory is not None:
        data["memory"] = memory
    return data
