"""What a task runs: its command (the user's, or a built-in role program) and its environment. Pure.

A launch is a function of the task's current attempt alone, so a resent launch is the same message and an
agent that already has the attempt just reports it again. Each node a launch names as a source of the job's
code is told to serve it to the task's node (ServeCode): a peer port serves a job's code to no other node.
"""

from __future__ import annotations

import posixpath

from tfcluster import layout
from tfcluster.commands import Command, Launch, ServeCode
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.model import DATA_SERVICE_TYPES, DISPATCHER, EVALUATOR, MAX_CODE_SOURCES, WORKER, has_tf_config
from tfcluster.roles.tfconfig import tf_config
from tfcluster.states import TaskState

# Nodes a node (or the coordinator) relays a job's code to on its first launch: more makes the tree shallower
# but has each sender's link carry more copies at once.
CODE_FANOUT = 2


def launch(job: Job, task: Task) -> Launch:
    return Launch(node=task.node, attempt=job.attempt_of(task), command=command_for(job, task),
                  env=task_env(job, task), workdir=job.spec.workdir, port=task.port,
                  stop_grace_seconds=job.spec.stop_grace_seconds,
                  report_listening=job.profile.must_listen(task.type), uid=job.uid, gid=job.uid, owner=job.owner,
                  memory_bytes=job.spec.memory_for(task.type), code_sha256=job.spec.code_sha256,
                  code_sources=code_sources(job, task), environment=job.spec.environment,
                  stop_signal=job.spec.stop_signal)


def launch_commands(job: Job, task: Task) -> list[Command]:
    """The task's launch, after a word to each node it names as a source of the job's code: serve it to the
    task's node."""
    order = launch(job, task)
    node_at = {t.peer: t.node for t in job.tasks if t.peer}
    return [*(ServeCode(node_at[source], job.id, task.node) for source in order.code_sources if source in node_at),
            order]


def code_sources(job: Job, task: Task) -> tuple[str, ...]:
    """Where the task's node fetches the job's code from, before the coordinator (which it asks last).

    Once some of the job's tasks run (or ran to the end) elsewhere, their nodes hold the archive: all of them.
    Before that (a job's first launch), the nodes being launched fetch in a tree rooted at the coordinator:
    the first CODE_FANOUT from it, each other node from one node earlier in the tree, which passes on the
    bytes it has received so far. The coordinator then sends the archive CODE_FANOUT times, not once per
    node, and no node sends it more than CODE_FANOUT times."""
    if not job.spec.code_sha256:
        return ()
    peers = dict.fromkeys(t.peer for t in job.tasks if t.node != task.node and t.peer and
                          t.state in (TaskState.RUNNING, TaskState.SUCCEEDED))
    if peers:
        return tuple(peers)[:MAX_CODE_SOURCES]
    # The launches go out in job.tasks order and each is LAUNCHING once sent: a node's parent comes before it.
    launching = list(dict.fromkeys((t.node, t.peer) for t in job.tasks if t.peer and t.state == TaskState.LAUNCHING))
    nodes = [node for node, _ in launching]
    if task.node not in nodes:
        return ()
    parent = relay_parent(nodes.index(task.node))
    return () if parent is None else (launching[parent][1],)


def relay_parent(position: int, fanout: int = CODE_FANOUT) -> int | None:
    """The position of the node that relays the code to the node at `position` of a first launch (None: the
    coordinator): a tree with `fanout` children per node, the coordinator at its root."""
    return None if position < fanout else position // fanout - 1


def command_for(job: Job, task: Task) -> tuple[str, ...]:
    spec = job.spec
    if job.profile.runs_builtin_server(task.type, spec):
        return (_python(job), "-m", "tfcluster.roles.server")
    role = spec.role(task.type)
    if task.type == EVALUATOR and role.entrypoint and not role.command:
        return (_python(job), "-m", "tfcluster.roles.evaluator", role.entrypoint)
    if task.type in DATA_SERVICE_TYPES and not role.command:
        return (_python(job), "-m", "tfcluster.roles.data_service", task.type)
    return tuple(spec.command_for(task.type))


def _python(job: Job) -> str:
    """The interpreter of the job's own program (it has TensorFlow), for built-in role programs."""
    program = job.spec.command[0] if job.spec.command else ""
    return program if program.rsplit("/", 1)[-1].startswith("python") else "python3"


def task_env(job: Job, task: Task) -> dict[str, str]:
    spec = job.spec
    env = {"TF_USE_LEGACY_KERAS": "1", **job.profile.env(), **spec.env_for(task.type)}
    model_dir = spec.model_dir or task.checkpoint_dir
    if has_tf_config(task.type):
        env[layout.TF_CONFIG] = tf_config(job.cluster_json, task.type, task.index)
    env.update({
        layout.CUDA_VISIBLE_DEVICES: ",".join(g.uuid or str(g.index) for g in task.gpus) or "-1",
        layout.JOB_ID: job.id,
        layout.JOB_NAME: spec.name,
        layout.STRATEGY: job.strategy,
        layout.TASK_TYPE: task.type,
        layout.TASK_INDEX: str(task.index),
        layout.ATTEMPT: str(task.attempt),
        layout.NUM_WORKERS: str(spec.count(WORKER)),
        layout.PORT: str(task.port),
        layout.ADDRESS: f"{task.host}:{task.port}",
        layout.CHECKPOINT_DIR: task.checkpoint_dir,
        layout.MODEL_DIR: model_dir,
        layout.STOP_SIGNAL: spec.stop_signal,  # tfcluster.task's TerminationConfig watches this one
        layout.STOP_GRACE: f"{spec.stop_grace_seconds:g}",
    })
    dispatcher = job.task(DISPATCHER, 0)
    if dispatcher is not None:  # the address is the dispatcher's placement: the same for every attempt it makes
        env[layout.DATA_SERVICE] = f"grpc://{dispatcher.host}:{dispatcher.port}"
    if task.type == EVALUATOR:  # its agent reads the summaries it writes there
        env[layout.SUMMARY_DIR] = spec.role(EVALUATOR).summary_dir or \
            posixpath.join(model_dir, layout.EVAL_SUMMARY_SUBDIR)
    return env
