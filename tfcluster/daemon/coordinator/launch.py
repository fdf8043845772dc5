"""What a task runs: its command (the user's, or a built-in role program) and its environment. Pure.

A launch is a function of the task's current attempt alone, so a resent launch is the same message and an
agent that already has the attempt just reports it again.
"""

from __future__ import annotations

import posixpath

from tfcluster import layout
from tfcluster.daemon.coordinator.job import Job, Task
from tfcluster.model import Launch
from tfcluster.roles.tfconfig import tf_config


def launch(job: Job, task: Task) -> Launch:
    return Launch(node=task.node, attempt=job.attempt_of(task), command=command_for(job, task),
                  env=task_env(job, task), workdir=job.spec.workdir, port=task.port,
                  stop_grace_seconds=job.spec.stop_grace_seconds,
                  report_listening=job.profile.must_listen(task.type), uid=job.uid, gid=job.uid, owner=job.owner,
                  memory_bytes=job.spec.memory_for(task.type), code_sha256=job.spec.code_sha256)


def command_for(job: Job, task: Task) -> tuple[str, ...]:
    spec = job.spec
    if job.profile.runs_builtin_server(task.type, spec):
        return (_python(job), "-m", "tfcluster.roles.server")
    role = spec.role(task.type)
    if task.type == "evaluator" and role.entrypoint and not role.command:
        return (_python(job), "-m", "tfcluster.roles.evaluator", role.entrypoint)
    return tuple(spec.command_for(task.type))


def _python(job: Job) -> str:
    """The interpreter of the job's own program (it has TensorFlow), for built-in role programs."""
    program = job.spec.command[0] if job.spec.command else ""
    return program if program.rsplit("/", 1)[-1].startswith("python") else "python3"


def task_env(job: Job, task: Task) -> dict[str, str]:
    spec = job.spec
    env = {"TF_USE_LEGACY_KERAS": "1", **job.profile.env(), **spec.env_for(task.type)}
    model_dir = spec.model_dir or task.checkpoint_dir
    env.update({
        layout.TF_CONFIG: tf_config(job.cluster_json, task.type, task.index),
        layout.CUDA_VISIBLE_DEVICES: ",".join(g.uuid or str(g.index) for g in task.gpus) or "-1",
        layout.JOB_ID: job.id,
        layout.JOB_NAME: spec.name,
        layout.STRATEGY: job.strategy,
        layout.TASK_TYPE: task.type,
        layout.TASK_INDEX: str(task.index),
        layout.ATTEMPT: str(task.attempt),
        layout.NUM_WORKERS: str(spec.count("worker")),
        layout.PORT: str(task.port),
        layout.CHECKPOINT_DIR: task.checkpoint_dir,
        layout.MODEL_DIR: model_dir,
    })
    if task.type == "evaluator":  # its agent reads the summaries it writes there
        env[layout.SUMMARY_DIR] = spec.role("evaluator").summary_dir or \
            posixpath.join(model_dir, layout.EVAL_SUMMARY_SUBDIR)
    return env
