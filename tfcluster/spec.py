"""The job spec: what a JobSpec holds, and `validate`, which checks its values once, the same for every
source: the CLI runs it on what it reads from a file or flags (specfile.py), the coordinator on what arrives
over the wire (wire/specs.py builds the JobSpec straight from the message). Errors name the source, the key and
what was expected. Pure: no sockets, no processes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tfcluster import layout, strategies
from tfcluster.labels import label_problem
from tfcluster.model import (CHIEF, DATA_SERVICE_TYPES, DATA_WORKER, DEFAULT_STOP_SIGNAL, DISPATCHER, EVALUATOR,
                             WORKER, NODE_NAME_RE, ROLE_TYPES, STOP_SIGNALS, EnvironmentSpec, control_character)

STRATEGIES = strategies.NAMES
ELASTIC_STRATEGY = "multi_worker_mirrored"  # the one strategy whose workers may be elastic
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
DEFAULT_RESIZE_INTERVAL_SECONDS = 300.0  # [elastic] resize_interval_seconds: a job grows at most this often
MAX_TASKS_PER_ROLE = 10_000
MAX_GPUS_PER_TASK = 64
MAX_MEMORY_BYTES = 1 << 50        # a petabyte: far above any node, far below a number that overflows
SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTkmgt](?:i?[Bb])?|[Bb])?")
CODE_SHA256_RE = re.compile(r"sha256:[0-9a-f]{64}")


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
    gpus: int | None = None  # None: the job's gpus (the tf.data service's roles: none)
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    entrypoint: str = ""
    labels: tuple[str, ...] = ()  # its tasks go only on nodes holding every one of these (tfcluster/labels.py)
    summary_dir: str = ""  # evaluator: where it writes TensorBoard summaries; "": <model dir>/eval
    memory: int | None = None  # bytes each task may use; None: the job's memory
    # Elastic (multi_worker_mirrored workers only, `count = "MIN..MAX"`): the sizes the role may run at; `count`
    # is then the size it runs at now (the coordinator changes it on each placement: core/scheduling/elastic.py).
    # 0: a fixed count.
    min_count: int = 0
    max_count: int = 0

    @property
    def elastic(self) -> bool:
        return self.max_count > 0


# A role the spec does not name: no tasks. One shared instance, since placement asks for absent roles on every
# try (a new one cost a dataclass's construction each time); frozen, and nothing writes into its env.
_NO_ROLE = RoleSpec()


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
    stop_signal: str = DEFAULT_STOP_SIGNAL  # sent first on a stop, preemption or drain; SIGKILL after the grace
    evaluator_deadline_seconds: float = DEFAULT_EVALUATOR_DEADLINE_SECONDS
    priority: str = ""  # a priority class of the coordinator's policy; "": the owner's default class
    memory: int = 0     # bytes each task may use, unless the role says otherwise; 0: not limited
    code_sha256: str = ""  # the packed workdir the client uploaded ("sha256:<hex>"); "": workdir on shared storage
    shared_workdir: bool = False  # the spec says its workdir is on storage every node shares: not packed
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    resize_interval_seconds: float = DEFAULT_RESIZE_INTERVAL_SECONDS  # [elastic]: at most one growth this often

    def role(self, role_type: str) -> RoleSpec:
        return self.roles.get(role_type, _NO_ROLE)

    def count(self, role_type: str) -> int:
        return self.role(role_type).count

    def gpus_for(self, role_type: str) -> int:
        role = self.role(role_type)
        if role.gpus is None:  # input pipelines run on CPUs: the tf.data service takes GPUs only when asked
            return 0 if role_type in DATA_SERVICE_TYPES else self.gpus
        return role.gpus

    def memory_for(self, role_type: str) -> int:
        role = self.role(role_type)
        return self.memory if role.memory is None else role.memory

    def command_for(self, role_type: str) -> tuple[str, ...]:
        """The role's own command, else the job's; the tf.data service's roles never run the job's (training)
        program: () means tfcluster's own (tfcluster/roles/data_service.py)."""
        if role_type in DATA_SERVICE_TYPES:
            return self.role(role_type).command
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
    if spec.stop_signal not in STOP_SIGNALS:
        raise fail("preemption.signal", f"expected one of: {', '.join(STOP_SIGNALS)}, got {spec.stop_signal!r}")
    _check_number(spec.evaluator_deadline_seconds, "evaluator_deadline_seconds", 1, fail)
    _check_number(spec.resize_interval_seconds, "elastic.resize_interval_seconds", 0, fail)
    _check_code(spec, fail)
    _check_roles(spec, fail)
    return spec


def _check_code(spec: JobSpec, fail) -> None:
    if spec.code_sha256 and not CODE_SHA256_RE.fullmatch(spec.code_sha256):
        raise fail("code_sha256", f"expected \"sha256:\" and 64 lowercase hex digits, got {spec.code_sha256[:80]!r}")
    if spec.code_sha256 and spec.shared_workdir:
        raise fail("shared_workdir", "a job whose workdir is on shared storage ships no code archive")
    for key in ("requirements", "project"):
        path = getattr(spec.environment, key)
        _check_text(path, f"environment.{key}", fail, MAX_PATH)
        if path.startswith("/") or ".." in path.split("/"):
            raise fail(f"environment.{key}", f"expected a path inside the workdir (relative, without ..), got {path!r}")


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
    problem = label_problem(role.labels)
    if problem:
        raise fail(f"{key}.labels", problem)
    if role.entrypoint and role_type != EVALUATOR:
        raise fail(f"{key}.entrypoint", "only the evaluator takes an entrypoint")
    if role.entrypoint and not ENTRYPOINT_RE.fullmatch(role.entrypoint):
        raise fail(f"{key}.entrypoint", f"expected \"module:function\", got {role.entrypoint!r}")
    if role.elastic or role.min_count:
        _check_elastic(role_type, role, fail)
    if role.summary_dir and role_type != EVALUATOR:
        raise fail(f"{key}.summary_dir", "only the evaluator takes a summary_dir")
    _check_path(role.summary_dir, f"{key}.summary_dir", fail, absolute_paths, required=False)


def _check_elastic(role_type: str, role: RoleSpec, fail) -> None:
    """An elastic role's range (the strategy is checked in _check_roles, once `auto` is known)."""
    key = f"roles.{role_type}.count"
    if role_type != WORKER:
        raise fail(key, f"only the worker role of a multi_worker_mirrored job may be elastic (\"MIN..MAX\"), not "
                        f"the {role_type} role")
    if not 1 <= role.min_count <= role.max_count <= MAX_TASKS_PER_ROLE:
        raise fail(key, f"expected \"MIN..MAX\" with 1 <= MIN <= MAX <= {MAX_TASKS_PER_ROLE}, got "
                        f"\"{role.min_count}..{role.max_count}\"")
    if not role.min_count <= role.count <= role.max_count:
        raise fail(key, f"the size it runs at ({role.count}) must lie within \"{role.min_count}..{role.max_count}\"")


def _check_roles(spec: JobSpec, fail) -> None:
    """The rules that relate roles to the strategy (docs/tensorflow.md; the profiles in strategies.py)."""
    chief, evaluators = spec.count(CHIEF), spec.count(EVALUATOR)
    if chief > 1:
        raise fail("roles.chief.count", f"at most one chief, got {chief}")
    if evaluators > 1:
        raise fail("roles.evaluator.count", f"at most one evaluator, got {evaluators}")
    if spec.training_task_count == 0:
        raise fail("roles", "expected at least one training task ([roles.worker] count >= 1, or a [roles.chief])")
    if spec.role(WORKER).elastic and spec.strategy != ELASTIC_STRATEGY:
        raise fail("roles.worker.count", f"an elastic worker count (\"MIN..MAX\") needs strategy = "
                                         f"\"{ELASTIC_STRATEGY}\", got {spec.strategy!r}")
    profile = strategies.profile(strategies.by_roles(spec))  # `auto` is checked as the strategy it becomes
    problem = profile.check_roles(spec) or profile.check_keras(spec)
    if problem:
        raise fail(*problem)
    _check_data_service(spec, fail)
    for role_type in ROLE_TYPES:
        if spec.count(role_type) == 0:
            continue
        builtin = profile.runs_builtin_server(role_type, spec) or role_type in DATA_SERVICE_TYPES or \
            (role_type == EVALUATOR and spec.role(EVALUATOR).entrypoint)
        if not builtin and not spec.command_for(role_type):
            raise fail(f"roles.{role_type}.command", "missing: no command for this role and none for the job")


def _check_data_service(spec: JobSpec, fail) -> None:
    """The tf.data service's roles: one dispatcher and at least one data worker, or neither. Every strategy's
    training program reads its own input, so any of them may read it through the service."""
    dispatchers, data_workers = spec.count(DISPATCHER), spec.count(DATA_WORKER)
    if dispatchers > 1:
        raise fail("roles.dispatcher.count", f"the tf.data service has exactly one dispatcher, got {dispatchers}")
    if DISPATCHER in spec.roles and dispatchers == 0 and data_workers:
        raise fail("roles.dispatcher.count", "the tf.data service has exactly one dispatcher, got 0")
    if data_workers and not dispatchers:
        raise fail("roles.dispatcher", "data workers need a dispatcher: add [roles.dispatcher] (count 1)")
    if dispatchers and not data_workers:
        raise fail("roles.data_worker", "a dispatcher needs data workers to run the input pipelines: add "
                                        "[roles.data_worker] with count >= 1")


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
