"""TF_CONFIG for every task shape, each one checked by TensorFlow's own resolver and validator."""

from __future__ import annotations

import json
import os

import pytest

os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

tf = pytest.importorskip("tensorflow")

from tensorflow.python.distribute import multi_worker_util  # noqa: E402
from tensorflow.python.distribute.cluster_resolver.tfconfig_cluster_resolver import (  # noqa: E402
    TFConfigClusterResolver,
)

from tfcluster.roles.tfconfig import build_cluster, build_tf_configs  # noqa: E402


def addr(node: int, port: int) -> str:
    return f"10.0.0.{node}:{port}"


SHAPES = {
    "mirrored_single_task": [("worker", 0, addr(1, 20000))],
    "mirrored_single_chief": [("chief", 0, addr(1, 20000))],
    "mwms_workers_only": [("worker", 0, addr(1, 20000)), ("worker", 1, addr(2, 20000)),
                          ("worker", 2, addr(3, 20000))],
    "mwms_with_chief": [("chief", 0, addr(1, 20000)), ("worker", 0, addr(2, 20000)),
                        ("worker", 1, addr(3, 20000))],
    "mwms_with_evaluator": [("worker", 0, addr(1, 20000)), ("worker", 1, addr(2, 20000)),
                            ("evaluator", 0, addr(3, 20000))],
    "mwms_chief_and_evaluator": [("chief", 0, addr(1, 20000)), ("worker", 0, addr(1, 20001)),
                                 ("evaluator", 0, addr(2, 20000))],
    "parameter_server": [("chief", 0, addr(1, 20000)), ("worker", 0, addr(2, 20000)),
                         ("worker", 1, addr(3, 20000)), ("ps", 0, addr(2, 20001)), ("ps", 1, addr(3, 20001)),
                         ("evaluator", 0, addr(1, 20001))],
}


def expected_cluster(tasks):
    cluster = {}
    for task_type in ("chief", "worker", "ps"):
        entries = sorted((i, a) for t, i, a in tasks if t == task_type)
        if entries:
            cluster[task_type] = [a for _, a in entries]
    return cluster


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_tf_config_is_valid_for_tensorflow(shape, monkeypatch):
    tasks = SHAPES[shape]
    configs = build_tf_configs(tasks)
    assert set(configs) == {(t, i) for t, i, _ in tasks}
    cluster = expected_cluster(tasks)
    chiefs = []
    for (task_type, index), text in configs.items():
        data = json.loads(text)
        assert set(data) == {"cluster", "task"}, data  # no "environment" key, nothing else
        assert "evaluator" not in data["cluster"]
        assert data["cluster"] == cluster
        assert data["task"] == {"type": task_type, "index": index}

        monkeypatch.setenv("TF_CONFIG", text)
        resolver = TFConfigClusterResolver()
        spec = resolver.cluster_spec()
        assert spec.as_dict() == cluster
        assert resolver.task_type == task_type
        assert resolver.task_id == index
        cluster_dict = spec.as_dict()
        multi_worker_util._validate_cluster_spec(cluster_dict, resolver.task_type, resolver.task_id)
        if multi_worker_util.is_chief(cluster_dict, task_type, index) and task_type != "evaluator":
            chiefs.append((task_type, index))
    # Exactly one training task is the chief: the chief, else worker 0.
    assert chiefs == [("chief", 0)] if "chief" in cluster else chiefs == [("worker", 0)]


def test_all_tasks_share_one_cluster():
    configs = build_tf_configs(SHAPES["parameter_server"])
    clusters = {json.dumps(json.loads(c)["cluster"], sort_keys=True) for c in configs.values()}
    assert len(clusters) == 1
    assert json.loads(configs[("evaluator", 0)])["task"] == {"type": "evaluator", "index": 0}


def test_indices_are_ordered_whatever_the_input_order():
    tasks = [("worker", 2, "h:3"), ("worker", 0, "h:1"), ("worker", 1, "h:2")]
    assert build_cluster(tasks) == {"worker": ["h:1", "h:2", "h:3"]}


def test_gaps_in_indices_are_rejected():
    with pytest.raises(ValueError, match="worker indices"):
        build_cluster([("worker", 0, "h:1"), ("worker", 2, "h:2")])


def test_a_job_without_training_tasks_is_rejected():
    with pytest.raises(ValueError):
        build_tf_configs([("evaluator", 0, "h:1")])
    with pytest.raises(ValueError):
        build_tf_configs([("ps", 0, "h:1")])


def test_a_cluster_with_a_bad_task_is_refused_by_tensorflow(monkeypatch):
    # The check itself can fail: TF refuses a cluster with two chiefs.
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["a:1", "b:1"]},
                                                "task": {"type": "chief", "index": 0}}))
    resolver = TFConfigClusterResolver()
    with pytest.raises(ValueError):
        multi_worker_util._validate_cluster_spec(resolver.cluster_spec().as_dict(), "chief", 0)
