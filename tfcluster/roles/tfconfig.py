"""TF_CONFIG for every task of a job (docs/tensorflow.md: TF_CONFIG). Pure.

The tf.data service's dispatcher and data workers get no TF_CONFIG at all (TensorFlow refuses their job names).
The evaluator is never inside the training tasks' cluster: under parameter_server an evaluator entry
makes the chief hang at connect, and TensorFlow accepts an evaluator that is absent from the cluster.
Every task's TF_CONFIG holds the same cluster, so it is encoded once per job (`cluster_json`) and each
task's string is composed from it: a job of thousands of tasks does not encode its cluster per task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tfcluster.model import CHIEF, TRAINING_TYPES, WORKER, has_tf_config



def build_cluster(tasks: Iterable[tuple[str, int, str]]) -> dict[str, list[str]]:
    """{job name: [host:port by index]} for the training tasks among (type, index, address)."""
    by_type: dict[str, dict[int, str]] = {}
    for task_type, index, address in tasks:
        if task_type in TRAINING_TYPES:
            by_type.setdefault(task_type, {})[index] = address
    cluster = {}
    for task_type in TRAINING_TYPES:
        indexed = by_type.get(task_type)
        if not indexed:
            continue
        if sorted(indexed) != list(range(len(indexed))):
            raise ValueError(f"{task_type} indices must be 0..{len(indexed) - 1}, got {sorted(indexed)}")
        cluster[task_type] = [indexed[i] for i in range(len(indexed))]
    if CHIEF not in cluster and WORKER not in cluster:
        raise ValueError("a job needs at least one chief or worker")
    return cluster


def cluster_json(tasks: Iterable[tuple[str, int, str]]) -> str:
    return json.dumps(build_cluster(tasks), sort_keys=True)


def tf_config(cluster: str, task_type: str, index: int) -> str:
    """One task's TF_CONFIG: exactly json.dumps({"cluster": ..., "task": ...}, sort_keys=True)."""
    return f'{{"cluster": {cluster}, "task": {{"index": {int(index)}, "type": {json.dumps(task_type)}}}}}'


def build_tf_configs(tasks: list[tuple[str, int, str]]) -> dict[tuple[str, int], str]:
    """One TF_CONFIG JSON string per (type, index) of the tasks that get one (not the tf.data service's)."""
    cluster = cluster_json(tasks)
    return {(task_type, index): tf_config(cluster, task_type, index) for task_type, index, _ in tasks
            if has_tf_config(task_type)}
