"""One profile per strategy: everything that differs between training styles, in one place.

A profile says which roles a strategy takes, which tasks run tfcluster's built-in server, which must
accept connections before the next launch wave starts, what it adds to the environment, which tasks
serve until stopped, and what restarts when a task fails. `resolve` is the one place `auto` becomes a
strategy. Pure: the spec is read, never changed (resolve returns a new one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from tfcluster.model import CHIEF, DATA_SERVICE_TYPES, DATA_WORKER, DISPATCHER, EVALUATOR, PS, WORKER

NAMES = ("mirrored", "central_storage", "multi_worker_mirrored", "parameter_server", "auto")
TRAINING_ROLES = (CHIEF, WORKER)
# What restarts when a training task fails (restart_scope): the whole group, or the task alone.
GROUP = "group"
ALONE = "alone"

Problem = tuple[str, str]  # (spec key, what is wrong)
# Keras 3 (`import keras` since TF 2.16, and tf.keras unless TF_USE_LEGACY_KERAS is set) does not work with
# MultiWorkerMirroredStrategy or ParameterServerStrategy; Keras 2 (tf-keras) does. The guard's words, in one place.
LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
LEGACY_KERAS_ON = ("1", "true", "True")  # what TensorFlow takes as set
KERAS_FIX = ("pip install tf-keras and keep TF_USE_LEGACY_KERAS=1 (tfcluster sets it unless the spec overrides "
             "it), then use tf.keras, or `import tf_keras as keras`")


@dataclass(frozen=True)
class Strategy:
    """The rules shared by every strategy; subclasses change what differs."""
    name: str
    needs_tf_keras: ClassVar[bool] = False  # Keras 3 does not work with it: its tasks need tf-keras

    def check_roles(self, spec) -> Problem | None:
        chief, workers = spec.count(CHIEF), spec.count(WORKER)
        if spec.count(PS):
            return "roles.ps", f"ps tasks only exist under strategy = \"parameter_server\" (this job is {self.name!r})"
        if chief + workers != 1:
            return "roles", (f"{self.name} runs one training task (all its GPUs on one node); got {chief} chief "
                             f"and {workers} workers")
        return None

    def runs_builtin_server(self, task_type: str, spec) -> bool:
        """The task runs `python -m tfcluster.roles.server` instead of a user command."""
        return False

    def must_listen(self, task_type: str) -> bool:
        """The next launch wave waits until this task accepts connections on its port (the tf.data service's
        tasks, whatever the strategy: data workers register with the dispatcher, training reads from both)."""
        return task_type in DATA_SERVICE_TYPES

    def in_first_wave(self, task_type: str) -> bool:
        return True

    def launch_wave(self, task_type: str) -> int:
        """Tasks launch in waves, lowest first, each once every earlier task is up: the tf.data service's
        dispatcher, its data workers, then training's first wave and the rest."""
        if task_type == DISPATCHER:
            return 0
        if task_type == DATA_WORKER:
            return 1
        return 2 if self.in_first_wave(task_type) else 3

    def serves_until_stopped(self, task_type: str) -> bool:
        """The task never exits by itself: training is over without it, and it is stopped then."""
        return False

    def env(self) -> dict[str, str]:
        return {}

    def restart_scope(self, task_type: str) -> str | tuple[str, ...]:
        """GROUP, ALONE, or the task types restarted together when a task of this type fails."""
        return GROUP

    def check_keras(self, spec) -> Problem | None:
        """A spec that turns tf-keras off (TF_USE_LEGACY_KERAS other than 1) for a strategy that needs it."""
        if not self.needs_tf_keras:
            return None
        for role_type in spec.roles:
            value = spec.env_for(role_type).get(LEGACY_KERAS)
            if value is not None and value not in LEGACY_KERAS_ON:
                key = f"roles.{role_type}.env" if LEGACY_KERAS in spec.role(role_type).env else "env"
                return f"{key}.{LEGACY_KERAS}", (f"{value!r} selects Keras 3, which does not work with {self.name}; "
                                                 f"{KERAS_FIX}")
        return None


class Mirrored(Strategy):
    """MirroredStrategy and CentralStorageStrategy: one task with all its GPUs on one node."""


class MultiWorkerMirrored(Strategy):
    """An optional chief and N workers running the same program; one dies, all must restart."""
    needs_tf_keras = True

    def check_roles(self, spec) -> Problem | None:
        if spec.count(PS):
            return super().check_roles(spec)
        if spec.count(CHIEF) and spec.gpus_for(CHIEF) != spec.gpus_for(WORKER):
            return "roles.chief.gpus", (f"multi_worker_mirrored needs the same GPU count on every task; chief has "
                                        f"{spec.gpus_for('chief')}, workers have {spec.gpus_for('worker')}")
        return None


class ParameterServer(Strategy):
    """The chief runs the program; workers and ps serve it (docs/tensorflow.md: ParameterServerStrategy)."""
    needs_tf_keras = True

    def check_roles(self, spec) -> Problem | None:
        if spec.count(CHIEF) != 1:
            return "roles.chief.count", "parameter_server needs exactly one chief (it runs the training program)"
        if spec.count(WORKER) < 1:
            return "roles.worker.count", "parameter_server needs at least one worker"
        if spec.count(PS) < 1:
            return "roles.ps.count", "parameter_server needs at least one ps"
        return None

    def runs_builtin_server(self, task_type: str, spec) -> bool:
        return task_type in (WORKER, PS) and not spec.role(task_type).command

    def must_listen(self, task_type: str) -> bool:
        return task_type in (WORKER, PS) or super().must_listen(task_type)

    def in_first_wave(self, task_type: str) -> bool:
        # The chief fails at connect unless every ps and worker already listens.
        return task_type != CHIEF

    def serves_until_stopped(self, task_type: str) -> bool:
        return task_type in (WORKER, PS)

    def env(self) -> dict[str, str]:
        return {"GRPC_FAIL_FAST": "use_caller"}

    def restart_scope(self, task_type: str) -> str | tuple[str, ...]:
        # The chief hands a dead worker's work to the others and takes it back once it listens again;
        # a dead ps loses variables: the chief restores them from its checkpoint with fresh ps.
        return ALONE if task_type == WORKER else (PS, CHIEF)


PROFILES: dict[str, Strategy] = {
    "mirrored": Mirrored("mirrored"),
    "central_storage": Mirrored("central_storage"),
    "multi_worker_mirrored": MultiWorkerMirrored("multi_worker_mirrored"),
    "parameter_server": ParameterServer("parameter_server"),
}


def profile(name: str) -> Strategy:
    """The profile of a resolved strategy (never `auto`)."""
    return PROFILES[name]


def by_roles(spec) -> str:
    """The strategy a spec runs under, from its roles alone: `auto` becomes parameter_server when ps are asked
    for, mirrored for one training task, multi_worker_mirrored otherwise."""
    if spec.strategy != "auto":
        return spec.strategy
    if spec.count(PS):
        return "parameter_server"
    if sum(spec.count(r) for r in TRAINING_ROLES) == 1:
        return "mirrored"
    return "multi_worker_mirrored"


def resolve(spec, free_gpus: Mapping[str, int] | None = None):
    """The spec with `auto` replaced by a strategy, once, when the job is submitted.

    By the roles (by_roles); and when the training tasks ask for GPUs and one node (one the workers may use)
    has that many free (free_gpus: node -> free GPUs), one mirrored worker with all of them, which runs the
    worker role's command and env; the evaluator and the tf.data service's roles are kept."""
    if spec.strategy != "auto":
        return spec
    chosen = by_roles(spec)
    if chosen == "multi_worker_mirrored" and free_gpus:
        total = sum(spec.gpus_for(r) * spec.count(r) for r in TRAINING_ROLES)
        allowed = set(spec.role(WORKER).nodes) or set(free_gpus)
        if total and any(free_gpus.get(name, 0) >= total for name in allowed):
            roles = {WORKER: replace(spec.role(WORKER), count=1, gpus=total)}
            for kept in (EVALUATOR, *DATA_SERVICE_TYPES):
                if spec.count(kept):
                    roles[kept] = spec.role(kept)
            return replace(spec, strategy="mirrored", roles=roles)
    return replace(spec, strategy=chosen)
