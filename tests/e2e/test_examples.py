"""Every example job as shipped, real TensorFlow on CPU, through the CLI on one shared local cluster: each spec in
examples/ is started unchanged from this checkout (root's, its tasks under their job's own UID, their checkpoints
on their nodes), reaches SUCCEEDED, its TF_CONFIGs are accepted by TensorFlow, the evaluator reported the final
checkpoint and wrote TensorBoard events, ps tasks were stopped, and nothing of the job is left running."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from harness import LocalCluster, ROOT, hand_on, job_processes, running_cluster
from tfcluster.model import DATA_SERVICE_TYPES

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EXAMPLES = ROOT / "examples"
# Every job spec shipped (cluster.toml beside them is an inventory for `tfcluster up`: test_inventory.py reads it).
SPECS = sorted(p for p in EXAMPLES.glob("*.toml") if "strategy" in tomllib.loads(p.read_text()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("examples"), {"a": {}, "b": {}, "c": {}}) as cluster:
        yield cluster


def shared_spec(name: str, tmp_path: Path, epochs: int) -> tuple[Path, Path]:
    """The example's spec with a checkpoint dir in tmp_path that two jobs share (and the example's folder as
    workdir), as a user resuming one job's work in the next would write it."""
    checkpoints = tmp_path / "ckpt"
    lines = [f'workdir = "{EXAMPLES}"', f'checkpoint_dir = "{checkpoints}"']
    for line in (EXAMPLES / f"{name}.toml").read_text().splitlines():
        lines.append(f'env = {{ EPOCHS = "{epochs}" }}' if line.startswith("env") else line)
    spec = tmp_path / f"{name}.toml"
    spec.write_text("\n".join(lines) + "\n")
    return spec, checkpoints


def node_dir(cluster: LocalCluster, job: dict, task: str) -> Path:
    """The job's host-local checkpoint dir on the node where `task` (TYPE:INDEX) ran."""
    node = next(t["node"] for t in job["tasks"] if f"{t['type']}:{t['index']}" == task)
    return cluster.agent_state_dir(node) / "jobs" / job["id"] / "checkpoints"


def run(cluster: LocalCluster, spec: Path) -> dict:
    result = cluster.cli("start", str(spec), "--wait", timeout=420)
    job_id = result.stdout.strip()
    assert job_id, result.stderr
    job = cluster.job(job_id)
    if result.returncode != 0:
        logs = {f"{t['type']}:{t['index']}": cluster.cli("logs", job_id, f"{t['type']}:{t['index']}",
                                                         "--tail", "30").stdout for t in job["tasks"]}
        pytest.fail(f"{job_id} ended {job['state']}: {job['message']}\n" + json.dumps(logs, indent=1))
    assert job["state"] == "SUCCEEDED"
    assert job_processes(job_id) == [], "a process of the job outlived it"
    check_tf_configs(job)
    return job


def check_tf_configs(job: dict) -> None:
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.distribute.cluster_resolver.tfconfig_cluster_resolver import TFConfigClusterResolver

    saved = os.environ.get("TF_CONFIG")
    try:
        for task in job["tasks"]:
            if task["type"] in DATA_SERVICE_TYPES:  # TensorFlow refuses a cluster spec that names them: none
                assert task["tf_config"] == ""
                continue
            config = json.loads(task["tf_config"])
            assert "evaluator" not in config["cluster"]
            os.environ["TF_CONFIG"] = task["tf_config"]
            resolver = TFConfigClusterResolver()
            assert (resolver.task_type, resolver.task_id) == (task["type"], task["index"])
            assert resolver.cluster_spec().as_dict() == config["cluster"]
            multi_worker_util._validate_cluster_spec(config["cluster"], task["type"], task["index"])
    finally:
        if saved is None:
            os.environ.pop("TF_CONFIG", None)
        else:
            os.environ["TF_CONFIG"] = saved


def check_metrics(checkpoints: Path, strategy: str) -> dict:
    metrics = json.loads((checkpoints / "metrics.json").read_text())
    assert metrics["strategy"] == strategy
    assert metrics["accuracy"] > 0.8, metrics
    return metrics


def check_final_evaluation(job: dict, checkpoints: Path, epochs: int) -> None:
    final = f"ckpt-{epochs}"
    latest = job["evaluation"]["latest"]
    assert latest is not None, "the evaluator reported nothing"
    assert Path(latest["checkpoint"]).name == final, f"the last evaluation is not of the final checkpoint: {latest}"
    assert set(latest["metrics"]) >= {"loss", "accuracy"} and latest["metrics"]["accuracy"] > 0.8
    assert latest["step"] > 0
    history = [Path(e["checkpoint"]).name for e in job["evaluation"]["history"]]
    assert len(history) == len(set(history)) and history[-1] == final
    events = list((checkpoints / "eval").glob("events.out.tfevents.*"))
    assert events and any(e.stat().st_size > 0 for e in events), "no TensorBoard events under model_dir/eval"
    evaluator = next(t for t in job["tasks"] if t["type"] == "evaluator")
    assert evaluator["state"] == "SUCCEEDED" and evaluator["exit_code"] == 0, "the evaluator must finish by itself"


def chief_of(job: dict) -> str:
    return "chief:0" if any(t["type"] == "chief" for t in job["tasks"]) else "worker:0"


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_each_example_runs_as_shipped(cluster, spec):
    shipped = tomllib.loads(spec.read_text())
    assert "checkpoint_dir" not in shipped, "an example runs on any cluster: no shared storage assumed"
    job = run(cluster, spec)
    strategy = shipped["strategy"]
    assert job["strategy"] == strategy
    if "write_metrics" in (EXAMPLES / shipped["command"][-1]).read_text():
        metrics = check_metrics(node_dir(cluster, job, chief_of(job)), strategy)
        if strategy == "multi_worker_mirrored":
            assert metrics["replicas"] == 2
    if shipped.get("roles", {}).get("evaluator", {}).get("entrypoint"):
        check_final_evaluation(job, node_dir(cluster, job, "evaluator:0"), int(shipped["env"]["EPOCHS"]))
    if strategy == "multi_worker_mirrored":
        workers = [t for t in job["tasks"] if t["type"] == "worker"]
        assert len({t["node"] for t in workers}) == 2, "the two workers are spread over two nodes"
    if strategy == "parameter_server":
        servers = [t for t in job["tasks"] if t["type"] in ("ps", "worker")]
        assert len(servers) == 3
        for task in servers:
            assert task["state"] in ("STOPPED", "SUCCEEDED"), task
            log = cluster.cli("logs", job["id"], f"{task['type']}:{task['index']}", check=True).stdout
            assert "serving on" in log


def test_mirrored_custom_loop_resumes_from_its_checkpoints(cluster, tmp_path):
    spec, checkpoints = shared_spec("mirrored_custom_loop", tmp_path, epochs=2)
    run(cluster, spec)
    assert (checkpoints / "ckpt-2.index").exists()
    hand_on(checkpoints)
    spec, _ = shared_spec("mirrored_custom_loop", tmp_path, epochs=3)
    job = run(cluster, spec)
    log = cluster.cli("logs", job["id"], "worker:0", check=True).stdout
    assert "resumed from" in log and "ckpt-2" in log
    assert "epoch 1/3" not in log and "epoch 3/3" in log, "a resumed run trains only the epochs left"
    check_metrics(checkpoints, "mirrored")
