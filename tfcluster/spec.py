"""The job spec: a TOML file, `tfcluster start` flags or a wire message, turned into a validated JobSpec.

Reading checks types (a TOML file can hold anything); `validate` checks values, once, the same for every
source: the CLI runs it on what it reads, the coordinator on what arrives over the wire (wire.py builds
the JobSpec straight from the message). Errors name the source, the key and what was expected.
Pure: no sockets, no processes; paths are made absolute by the caller (the CLI), since a spec runs on
other machines than the one it was written on.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tfcluster import layout, strategies
from tfcluster.model import NODE_NAME_RE, ROLE_TYPES, control_character

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STRATEGIES = strategies.NAMES
TRAINING_ROLES = strategies.TRAINING_ROLES

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENTRYPOINT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,255}:[A-Za-z_][A-Za-z0-9_]{0,255}")
MAX_PATH = 4096                  # PATH_MAX
MAX_ARG = 128 * 1024             # Linux's limit on one argument or environment string
MAX_ARGS = 4096
MAX_ENV = 1024

DEFAULT_MAX_RESTARTS = 3
DEFAULT_STOP_GRACE_SECONDS = 30.0
DEFAULT_EVALUATOR_DEADLINE_SECONDS = 600.0
MAX_TASKS_PER_ROLE = 10_000
MAX_GPUS_PER_TASK = 64
MAX_MEMORY_BYTES = 1 << 50        # a petabyte: far above any node, far below a number that overflows
SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTkmgt](?:i?[Bb])?|[Bb])?")


class SpecError(ValueError):
    """A spec problem: where (file and key) and what was expected."""

    def __init__(self, source: str, key: str, message: str):
        self.source = source
        self.key = key if key.isprintable() and len(key) <= 80 else repr(key[:80])  # a key the user wrote: shown safe
        self.message = message
        where = f"{source}: {self.key}" if key else source
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class RoleSpec:
    count: int = 0
    gpus: int | None = None  # None: the job's gpus
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    entrypoint: str = ""
    summary_dir: str = ""  # evaluator: where it writes TensorBoard summaries; "": <model dir>/eval
    memory: int | None = None  # bytes each task may use; None: the job's memory


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
    priority: str = ""  # a priority class of the coordinator's policy; "": the owner's default class
    memory: int = 0     # bytes each task may use, unless the role says otherwise; 0: not limited
    code_sha256: str = ""  # the packed workdir the client uploaded ("sha256:<hex>"); "": workdir on shared storage

    def role(self, role_type: str) -> RoleSpec:
        return self.roles.get(role_type, RoleSpec())

    def count(self, role_type: str) -> int:
        return self.role(role_type).count

    def gpus_for(self, role_type: str) -> int:
        role = self.role(role_type)
        return self.gpus if role.gpus is None else role.gpus

    def memory_for(self, role_type: str) -> int:
        role = self.role(role_type)
        return self.memory if role.memory is None else role.memory

    def command_for(self, role_type: str) -> tuple[str, ...]:
        return self.role(role_type).command or self.command

    def env_for(self, role_type: str) -> dict[str, str]:
        return {**self.env, **self.role(role_type).env}

    @property
    def training_task_count(self) -> int:
        return sum(self.count(r) for r in TRAINING_ROLES)


# ---- values: one set of rules for every source -------------------------------------------------

def validate(spec: JobSpec, source: str = "<spec>", absolute_paths: bool = False) -> JobSpec:
    """Checks every value of a spec and the rules between its roles; returns it, or raises SpecError.

    absolute_paths: workdir must be set and paths absolute (a spec that reached the coordinator)."""
    def fail(key: str, message: str) -> SpecError:
        return SpecError(source, key, message)

    if not NAME_RE.fullmatch(spec.name):
        raise fail("name", f"expected lowercase letters, digits, '-' or '_' (at most 63, starting with a letter "
                           f"or digit), got {spec.name!r}")
    if spec.strategy not in STRATEGIES:
        raise fail("strategy", f"expected one of: {', '.join(STRATEGIES)}, got {spec.strategy!r}")
    if spec.command:
        _check_command(spec.command, "command", fail)
    for key in ("workdir", "checkpoint_dir", "model_dir"):
        _check_path(getattr(spec, key), key, fail, absolute_paths, required=key == "workdir")
    _check_env(spec.env, "env", fail)
    _check_int(spec.gpus, "gpus", 0, MAX_GPUS_PER_TASK, fail)
    _check_int(spec.memory, "memory", 0, MAX_MEMORY_BYTES, fail)
    if spec.priority and not NAME_RE.fullmatch(spec.priority):
        raise fail("priority", f"expected the name of a priority class (such as \"high\"), got {spec.priority!r}")
    for role_type, role in spec.roles.items():
        if role_type not in ROLE_TYPES:
            raise fail(f"roles.{role_type}", f"unknown role (expected one of: {', '.join(ROLE_TYPES)})")
        _check_role(role_type, role, fail, absolute_paths)
    r = spec.restart
    _check_int(r.max_restarts, "restart.max_restarts", 0, 1000, fail)
    _check_number(r.backoff_seconds, "restart.backoff_seconds", 0, fail)
    for code in r.permanent_exit_codes:
        _check_int(code, "restart.permanent_exit_codes", 1, 255, fail)
    _check_number(r.hang_seconds, "restart.hang_seconds", 0, fail)
    _check_number(spec.stop_grace_seconds, "stop_grace_seconds", 0, fail)
    _check_number(spec.evaluator_deadline_seconds, "evaluator_deadline_seconds", 1, fail)
    _check_roles(spec, fail)
    return spec


def _check_role(role_type: str, role: RoleSpec, fail, absolute_paths: bool) -> None:
    key = f"roles.{role_type}"
    _check_int(role.count, f"{key}.count", 0, MAX_TASKS_PER_ROLE, fail)
    if role.gpus is not None:
        _check_int(role.gpus, f"{key}.gpus", 0, MAX_GPUS_PER_TASK, fail)
    if role.memory is not None:
        _check_int(role.memory, f"{key}.memory", 0, MAX_MEMORY_BYTES, fail)
    if role.command:
        _check_command(role.command, f"{key}.command", fail)
    _check_env(role.env, f"{key}.env", fail)
    if len(role.nodes) > MAX_TASKS_PER_ROLE:
        raise fail(f"{key}.nodes", f"expected at most {MAX_TASKS_PER_ROLE} nodes, got {len(role.nodes)}")
    for node in role.nodes:
        if not NODE_NAME_RE.fullmatch(node):
            raise fail(f"{key}.nodes", f"expected node names (letters, digits, '.', '_' or '-'), got {node[:80]!r}")
    if len(set(role.nodes)) != len(role.nodes):
        raise fail(f"{key}.nodes", "lists a node twice")
    if role.entrypoint and role_type != "evaluator":
        raise fail(f"{key}.entrypoint", "only the evaluator takes an entrypoint")
    if role.entrypoint and not ENTRYPOINT_RE.fullmatch(role.entrypoint):
        raise fail(f"{key}.entrypoint", f"expected \"module:function\", got {role.entrypoint!r}")
    if role.summary_dir and role_type != "evaluator":
        raise fail(f"{key}.summary_dir", "only the evaluator takes a summary_dir")
    _check_path(role.summary_dir, f"{key}.summary_dir", fail, absolute_paths, required=False)


def _check_roles(spec: JobSpec, fail) -> None:
    """The rules that relate roles to the strategy (docs/tensorflow.md; the profiles in strategies.py)."""
    chief, evaluators = spec.count("chief"), spec.count("evaluator")
    if chief > 1:
        raise fail("roles.chief.count", f"at most one chief, got {chief}")
    if evaluators > 1:
        raise fail("roles.evaluator.count", f"at most one evaluator, got {evaluators}")
    if spec.training_task_count == 0:
        raise fail("roles", "expected at least one training task ([roles.worker] count >= 1, or a [roles.chief])")
    profile = strategies.profile(strategies.by_roles(spec))  # `auto` is checked as the strategy it becomes
    problem = profile.check_roles(spec)
    if problem:
        raise fail(*problem)
    for role_type in ROLE_TYPES:
        if spec.count(role_type) == 0:
            continue
        builtin = profile.runs_builtin_server(role_type, spec) or \
            (role_type == "evaluator" and spec.role("evaluator").entrypoint)
        if not builtin and not spec.command_for(role_type):
            raise fail(f"roles.{role_type}.command", "missing: no command for this role and none for the job")


def _check_int(value: int, key: str, minimum: int, maximum: int, fail) -> None:
    if not minimum <= value <= maximum:
        raise fail(key, f"expected an integer between {minimum} and {maximum}, got {value}")


def _check_number(value: float, key: str, minimum: float, fail) -> None:
    if not math.isfinite(value) or value < minimum:
        raise fail(key, f"expected a number >= {minimum:g}, got {value}")


def _check_text(value: str, key: str, fail, limit: int, multiline: bool = False) -> None:
    if len(value) > limit:
        raise fail(key, f"expected at most {limit} characters, got {len(value)}")
    bad = control_character(value, multiline)
    if bad:
        raise fail(key, f"must not contain control characters{' other than tab and line breaks' if multiline else ''}, "
                        f"found {bad} in {value[:40]!r}")


def _check_command(command: tuple[str, ...], key: str, fail) -> None:
    if not command or not command[0]:
        raise fail(key, "expected a non-empty command")
    if len(command) > MAX_ARGS:
        raise fail(key, f"expected at most {MAX_ARGS} arguments, got {len(command)}")
    for arg in command:
        _check_text(arg, key, fail, MAX_ARG, multiline=True)


def _check_path(path: str, key: str, fail, absolute: bool, required: bool) -> None:
    _check_text(path, key, fail, MAX_PATH)
    if absolute and (path or required) and not path.startswith("/"):
        raise fail(key, f"expected an absolute path, got {path!r}")


def _check_env(env: dict[str, str], key: str, fail) -> None:
    if len(env) > MAX_ENV:
        raise fail(key, f"expected at most {MAX_ENV} variables, got {len(env)}")
    for name, value in env.items():
        if len(name) > MAX_PATH or not ENV_NAME_RE.fullmatch(name):
            raise fail(f"{key}.{name[:80]}", "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name in layout.RESERVED_ENV or name.startswith(layout.RESERVED_ENV_PREFIX):
            raise fail(f"{key}.{name}", "is set by tfcluster for every task and cannot be overridden")
        _check_text(value, f"{key}.{name}", fail, MAX_ARG, multiline=True)


# ---- types: reading a TOML document (or the same plain data from flags) ------------------------

JOB_KEYS = ("name", "strategy", "command", "workdir", "checkpoint_dir", "model_dir", "env", "gpus",
            "roles", "restart", "stop_grace_seconds", "evaluator_deadline_seconds", "priority", "memory")
ROLE_KEYS = ("count", "gpus", "command", "env", "nodes", "entrypoint", "summary_dir", "memory")
RESTART_KEYS = ("max_restarts", "backoff_seconds", "permanent_exit_codes", "hang_seconds")


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
    if "chief" not in roles and "worker" not in roles:
        roles["worker"] = RoleSpec(count=1)  # the plain case: one training task
    restart = r.table(data.get("restart", {}), "restart", RESTART_KEYS)
    codes = restart.get("permanent_exit_codes", [])
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
        stop_grace_seconds=r.number(data.get("stop_grace_seconds", DEFAULT_STOP_GRACE_SECONDS),
                                    "stop_grace_seconds"),
        evaluator_deadline_seconds=r.number(data.get("evaluator_deadline_seconds",
                                                     DEFAULT_EVALUATOR_DEADLINE_SECONDS),
                                            "evaluator_deadline_seconds"),
        priority=r.string(data.get("priority", ""), "priority"),
        memory=r.size(data.get("memory", 0), "memory"),
    )
    return validate(spec, source)


def _read_role(r: _Reader, role_type: str, table: Any) -> RoleSpec:
    key = f"roles.{role_type}"
    table = r.table(table, key, ROLE_KEYS)
    return RoleSpec(
        count=r.integer(table.get("count", 1), f"{key}.count"),
        gpus=r.integer(table["gpus"], f"{key}.gpus") if "gpus" in table else None,
        command=r.command(table["command"], f"{key}.command") if "command" in table else (),
        env=r.env(table.get("env", {}), f"{key}.env"),
        nodes=r.string_list(table.get("nodes", []), f"{key}.nodes"),
        entrypoint=r.string(table.get("entrypoint", ""), f"{key}.entrypoint"),
        summary_dir=r.string(table.get("summary_dir", ""), f"{key}.summary_dir"),
        memory=r.size(table["memory"], f"{key}.memory") if "memory" in table else None,
    )


def load_spec_file(path: str | Path) -> JobSpec:
    """Reads and validates a TOML spec; relative paths in it are taken from the file's folder."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_bytes().decode()
    except OSError as e:
        raise SpecError(source, "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(source, "", f"not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, "", f"not valid TOML: {e}") from None
    return resolve_paths(parse_spec(data, source), path.resolve().parent)


def resolve_paths(spec: JobSpec, base: Path) -> JobSpec:
    """Makes workdir, checkpoint_dir, model_dir and the evaluator's summary_dir absolute (every node sees the
    same absolute path)."""
    def absolute(p: str) -> str:
        return str((base / p).resolve()) if p and not Path(p).is_absolute() else p
    roles = {t: replace(r, summary_dir=absolute(r.summary_dir)) for t, r in spec.roles.items()}
    return replace(spec, workdir=absolute(spec.workdir or "."), checkpoint_dir=absolute(spec.checkpoint_dir),
                   model_dir=absolute(spec.model_dir), roles=roles)


def spec_from_flags(*, name: str, strategy: str, workers: int, chief: bool, ps: int, evaluator: bool,
                    gpus_per_task: int, checkpoint_dir: str | None, command: list[str],
                    env: dict[str, str] | None = None, max_restarts: int | None = None,
                    memory: str | None = None) -> dict[str, Any]:
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
    if memory is not None:
        data["memory"] = memory
    return data
