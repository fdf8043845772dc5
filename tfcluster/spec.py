"""The job spec: TOML files and CLI flags turned into a validated JobSpec, with errors naming the key.

Pure: no sockets, no processes. Paths are made absolute by the caller (the CLI), since a spec runs on
other machines than the one it was written on.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STRATEGIES = ("mirrored", "central_storage", "multi_worker_mirrored", "parameter_server", "auto")
ROLE_TYPES = ("chief", "worker", "ps", "evaluator")
TRAINING_ROLES = ("chief", "worker")
# Exported by tfcluster itself; a spec that sets them would silently break the cluster.
RESERVED_ENV = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")
RESERVED_ENV_PREFIX = "TFCLUSTER_"

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

DEFAULT_MAX_RESTARTS = 3
DEFAULT_STOP_GRACE_SECONDS = 30.0
DEFAULT_EVALUATOR_DEADLINE_SECONDS = 600.0


class SpecError(ValueError):
    """A spec problem: where (file and key) and what was expected."""

    def __init__(self, source: str, key: str, message: str):
        self.source = source
        self.key = key
        self.message = message
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class RoleSpec:
    count: int = 0
    gpus: int | None = None
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    entrypoint: str = ""


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = DEFAULT_MAX_RESTARTS
    backoff_seconds: float = 0.0
    permanent_exit_codes: tuple[int, ...] = ()
    hang_seconds: float = 0.0


@dataclass(frozen=True)
class JobSpec:
    name: str
    strategy: str
    command: tuple[str, ...] = ()
    workdir: str = ""
    checkpoint_dir: str = ""
    model_dir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    roles: dict[str, RoleSpec] = field(default_factory=dict)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS
    evaluator_deadline_seconds: float = DEFAULT_EVALUATOR_DEADLINE_SECONDS

    def role(self, role_type: str) -> RoleSpec:
        return self.roles.get(role_type, RoleSpec())

    def count(self, role_type: str) -> int:
        return self.role(role_type).count

    def gpus_for(self, role_type: str) -> int:
        role = self.role(role_type)
        return self.gpus if role.gpus is None else role.gpus

    def command_for(self, role_type: str) -> tuple[str, ...]:
        return self.role(role_type).command or self.command

    def env_for(self, role_type: str) -> dict[str, str]:
        return {**self.env, **self.role(role_type).env}

    @property
    def training_task_count(self) -> int:
        return sum(self.count(r) for r in TRAINING_ROLES)


# ---------------------------------------------------------------------------------------------
# Reading raw values with errors that name the key.

class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str) -> SpecError:
        return SpecError(self.source, key, message)

    def check_keys(self, table: dict[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
        for key in table:
            if key not in allowed:
                raise self.fail(f"{prefix}{key}", f"unknown key (expected one of: {', '.join(allowed)})")

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_describe(value)}")
        return value

    def integer(self, value: Any, key: str, minimum: int, maximum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {_describe(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise self.fail(key, f"expected an integer {bound}, got {value}")
        return value

    def number(self, value: Any, key: str, minimum: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number, got {_describe(value)}")
        if value < minimum:
            raise self.fail(key, f"expected a number >= {minimum:g}, got {value}")
        return float(value)

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
            if not ENV_NAME_RE.match(name):
                raise self.fail(f"{key}.{name}", "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
                raise self.fail(f"{key}.{name}", "is set by tfcluster for every task and cannot be overridden")
            if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                raise self.fail(f"{key}.{name}", f"expected a string, got {_describe(val)}")
            env[name] = str(val)
        return env


def _describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)
    shown = repr(value)
    return f"{kind} ({shown})" if len(shown) <= 40 and not isinstance(value, (dict, list)) else kind


JOB_KEYS = ("name", "strategy", "command", "workdir", "checkpoint_dir", "model_dir", "env", "gpus",
            "roles", "restart", "stop_grace_seconds", "evaluator_deadline_seconds")
ROLE_KEYS = ("count", "gpus", "command", "env", "nodes", "entrypoint")
RESTART_KEYS = ("max_restarts", "backoff_seconds", "permanent_exit_codes", "hang_seconds")


def parse_spec(data: dict[str, Any], source: str = "<spec>") -> JobSpec:
    """Validates a spec given as plain data (a parsed TOML document) and returns a JobSpec."""
    r = _Reader(source)
    if not isinstance(data, dict):
        raise r.fail("", "expected a table at the top level")
    r.check_keys(data, JOB_KEYS, "")
    if "name" not in data:
        raise r.fail("name", "missing (a job name such as \"digits\")")
    name = r.string(data["name"], "name")
    if not NAME_RE.match(name):
        raise r.fail("name", f"expected lowercase letters, digits, '-' or '_' (at most 63, starting with a letter or digit), got {name!r}")
    if "strategy" not in data:
        raise r.fail("strategy", f"missing (one of: {', '.join(STRATEGIES)})")
    strategy = r.string(data["strategy"], "strategy")
    if strategy not in STRATEGIES:
        raise r.fail("strategy", f"expected one of: {', '.join(STRATEGIES)}, got {strategy!r}")

    command = r.command(data["command"], "command") if "command" in data else ()
    roles_raw = data.get("roles", {})
    if not isinstance(roles_raw, dict):
        raise r.fail("roles", f"expected a table of role tables ([roles.worker] ...), got {_describe(roles_raw)}")
    roles = {}
    for role_type, table in roles_raw.items():
        if role_type not in ROLE_TYPES:
            raise r.fail(f"roles.{role_type}", f"unknown role (expected one of: {', '.join(ROLE_TYPES)})")
        roles[role_type] = _parse_role(r, role_type, table)
    if "chief" not in roles and "worker" not in roles:
        roles["worker"] = RoleSpec(count=1)  # the plain case: one training task

    restart_raw = data.get("restart", {})
    if not isinstance(restart_raw, dict):
        raise r.fail("restart", f"expected a table, got {_describe(restart_raw)}")
    r.check_keys(restart_raw, RESTART_KEYS, "restart.")
    codes = restart_raw.get("permanent_exit_codes", [])
    if not isinstance(codes, list):
        raise r.fail("restart.permanent_exit_codes", f"expected a list of integers, got {_describe(codes)}")
    restart = RestartPolicy(
        max_restarts=r.integer(restart_raw.get("max_restarts", DEFAULT_MAX_RESTARTS), "restart.max_restarts", 0, 1000),
        backoff_seconds=r.number(restart_raw.get("backoff_seconds", 0.0), "restart.backoff_seconds", 0),
        permanent_exit_codes=tuple(r.integer(c, "restart.permanent_exit_codes", 1, 255) for c in codes),
        hang_seconds=r.number(restart_raw.get("hang_seconds", 0.0), "restart.hang_seconds", 0),
    )

    spec = JobSpec(
        name=name,
        strategy=strategy,
        command=command,
        workdir=r.string(data.get("workdir", ""), "workdir"),
        checkpoint_dir=r.string(data.get("checkpoint_dir", ""), "checkpoint_dir"),
        model_dir=r.string(data.get("model_dir", ""), "model_dir"),
        env=r.env(data.get("env", {}), "env"),
        gpus=r.integer(data.get("gpus", 0), "gpus", 0, 64),
        roles=roles,
        restart=restart,
        stop_grace_seconds=r.number(data.get("stop_grace_seconds", DEFAULT_STOP_GRACE_SECONDS), "stop_grace_seconds", 0),
        evaluator_deadline_seconds=r.number(
            data.get("evaluator_deadline_seconds", DEFAULT_EVALUATOR_DEADLINE_SECONDS), "evaluator_deadline_seconds", 1),
    )
    check_roles(spec, source)
    return spec


def _parse_role(r: _Reader, role_type: str, table: Any) -> RoleSpec:
    key = f"roles.{role_type}"
    if not isinstance(table, dict):
        raise r.fail(key, f"expected a table, got {_describe(table)}")
    r.check_keys(table, ROLE_KEYS, f"{key}.")
    count = r.integer(table.get("count", 1), f"{key}.count", 0, 10_000)
    entrypoint = r.string(table.get("entrypoint", ""), f"{key}.entrypoint")
    if entrypoint and role_type != "evaluator":
        raise r.fail(f"{key}.entrypoint", "only the evaluator takes an entrypoint")
    if entrypoint and not ENTRYPOINT_RE.match(entrypoint):
        raise r.fail(f"{key}.entrypoint", f"expected \"module:function\", got {entrypoint!r}")
    return RoleSpec(
        count=count,
        gpus=r.integer(table["gpus"], f"{key}.gpus", 0, 64) if "gpus" in table else None,
        command=r.command(table["command"], f"{key}.command") if "command" in table else (),
        env=r.env(table.get("env", {}), f"{key}.env"),
        nodes=r.string_list(table.get("nodes", []), f"{key}.nodes"),
        entrypoint=entrypoint,
    )


def check_roles(spec: JobSpec, source: str = "<spec>") -> None:
    """The rules that relate roles to the strategy (TF_FACTS.md, DESIGN.md's table)."""
    def fail(key: str, message: str) -> SpecError:
        return SpecError(source, key, message)

    chief, workers, ps, evaluators = (spec.count(r) for r in ROLE_TYPES)
    if chief > 1:
        raise fail("roles.chief.count", f"at most one chief, got {chief}")
    if evaluators > 1:
        raise fail("roles.evaluator.count", f"at most one evaluator, got {evaluators}")
    if chief + workers == 0:
        raise fail("roles", "expected at least one training task ([roles.worker] count >= 1, or a [roles.chief])")
    s = resolve_strategy(spec)  # `auto` is checked as the strategy it will run under
    if s == "parameter_server":
        if chief != 1:
            raise fail("roles.chief.count", "parameter_server needs exactly one chief (it runs the training program)")
        if workers < 1:
            raise fail("roles.worker.count", "parameter_server needs at least one worker")
        if ps < 1:
            raise fail("roles.ps.count", "parameter_server needs at least one ps")
    elif ps:
        raise fail("roles.ps", f"ps tasks only exist under strategy = \"parameter_server\" (this job is {s!r})")
    if s in ("mirrored", "central_storage") and chief + workers != 1:
        raise fail("roles", f"{s} runs one training task (all its GPUs on one node); got {chief} chief and {workers} workers")
    if s == "multi_worker_mirrored" and chief and spec.gpus_for("chief") != spec.gpus_for("worker"):
        raise fail("roles.chief.gpus", f"multi_worker_mirrored needs the same GPU count on every task; chief has "
                   f"{spec.gpus_for('chief')}, workers have {spec.gpus_for('worker')}")
    for role_type in ROLE_TYPES:
        if spec.count(role_type) == 0:
            continue
        runs_builtin = (s == "parameter_server" and role_type in ("worker", "ps")) or \
                       (role_type == "evaluator" and spec.role("evaluator").entrypoint)
        if not runs_builtin and not spec.command_for(role_type):
            raise fail(f"roles.{role_type}.command", "missing: no command for this role and none for the job")
        nodes = spec.role(role_type).nodes
        if len(set(nodes)) != len(nodes):
            raise fail(f"roles.{role_type}.nodes", "lists a node twice")


def load_spec_file(path: str | Path) -> JobSpec:
    """Reads and validates a TOML spec; relative paths in it are taken from the file's folder."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(source, "", f"cannot read: {e.strerror or e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, "", f"not valid TOML: {e}") from None
    return resolve_paths(parse_spec(data, source), path.resolve().parent)


def resolve_paths(spec: JobSpec, base: Path) -> JobSpec:
    """Makes workdir, checkpoint_dir and model_dir absolute (every node sees the same absolute path)."""
    def absolute(p: str) -> str:
        return str((base / p).resolve()) if p and not Path(p).is_absolute() else p
    return replace(spec, workdir=absolute(spec.workdir or "."), checkpoint_dir=absolute(spec.checkpoint_dir),
                   model_dir=absolute(spec.model_dir))


def spec_from_flags(*, name: str, strategy: str, workers: int, chief: bool, ps: int, evaluator: bool,
                    gpus_per_task: int, checkpoint_dir: str | None, command: list[str],
                    env: dict[str, str] | None = None, max_restarts: int | None = None) -> dict[str, Any]:
    """The same plain data a TOML file would give, from `tfcluster start` flags."""
    roles: dict[str, Any] = {}
    if workers:
        roles["worker"] = {"count": workers}
    if chief:
        roles["chief"] = {"count": 1}
    if ps:
        roles["ps"] = {"count": ps, "gpus": 0}
    if evaluator:
        roles["evaluator"] = {"count": 1, "gpus": 0}
    data: dict[str, Any] = {"name": name, "strategy": strategy, "roles": roles, "gpus": gpus_per_task}
    if command:
        data["command"] = list(command)
    if checkpoint_dir:
        data["checkpoint_dir"] = checkpoint_dir
    if env:
        data["env"] = env
    if max_restarts is not None:
        data["restart"] = {"max_restarts": max_restarts}
    return data


def resolve_strategy(spec: JobSpec) -> str:
    """The strategy a job runs under; `auto` picks from the roles asked for."""
    if spec.strategy != "auto":
        return spec.strategy
    if spec.count("ps"):
        return "parameter_server"
    if spec.training_task_count == 1:
        return "mirrored"
    return "multi_worker_mirrored"
