"""Every example job, real TensorFlow on CPU, through the CLI on one shared local cluster: each reaches
SUCCEEDED, its TF_CONFIGs are accepted by TensorFlow, the evaluator reported the final checkpoint and
wrote TensorBoard events, ps tasks were stopped, and nothing of the job is left running."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from harness import LocalCluster, ROOT, hand_on, job_processes, running_cluster

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("examples"), {"a": {}, "b": {}, "c": {}}) as cluster:
        yield cluster


def example_spec(name: str, tmp_path: Path, epochs: int | None = None) -> tuple[Path, Path]:
    """The example's spec with its checkpoints in tmp_path (and the example's folder as workdir)."""
    text = (EXAMPLES / f"{name}.toml").read_text()
    checkpoints = tmp_path / "ckpt"
    lines = []
    for line in text.splitlines():
        if line.startswith("checkpoint_dir"):
            line = f'checkpoint_dir = "{checkpoints}"'
        if epochs is not None and line.startswith("env"):
            line = f'env = {{ EPOCHS = "{epochs}" }}'
        lines.append(line)
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'workdir = "{EXAMPLES}"\n' + "\n".join(lines) + "\n")
    return spec, checkpoints


def epochs_of(spec: Path) -> int:
    import tomllib
    return int(tomllib.loads(spec.read_text())["env"]["EPOCHS"])


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


def test_mirrored_keras_fit_with_evaluator(cluster, tmp_path):
    spec, checkpoints = example_spec("mirrored_fit", tmp_path)
    job = run(cluster, spec)
    assert job["strategy"] == "mirrored"
    check_metrics(checkpoints, "mirrored")
    check_final_evaluation(job, checkpoints, epochs_of(spec))


def test_mirrored_custom_loop_resumes_from_its_checkpoints(cluster, tmp_path):
    spec, checkpoints = example_spec("mirrored_custom_loop", tmp_path, epochs=2)
    run(cluster, spec)
    assert (checkpoints / "ckpt-2.index").exists()
    hand_on(checkpoints)
    spec, _ = example_spec("mirrored_custom_loop", tmp_path, epochs=3)
    job = run(cluster, spec)
    log = cluster.cli("logs", job["id"], "worker:0", check=True).stdout
    assert "resumed from" in log and "ckpt-2" in log
    assert "epoch 1/3" not in log and "epoch 3/3" in log, "a resumed run trains only the epochs left"
    check_metrics(checkpoints, "mirrored")


def test_multi_worker_mirrored_keras_fit_with_evaluator(cluster, tmp_path):
    spec, checkpoints = example_spec("mwms_fit", tmp_path)
    job = run(cluster, spec)
    workers = [t for t in job["tasks"] if t["type"] == "worker"]
    assert len({t["node"] for t in workers}) == 2, "the two workers are spread over two nodes"
    assert check_metrics(checkpoints, "multi_worker_mirrored")["replicas"] == 2
    check_final_evaluation(job, checkpoints, epochs_of(spec))


def test_central_storage_keras_fit(cluster, tmp_path):
    spec, checkpoints = example_spec("central_storage_fit", tmp_path)
    job = run(cluster, spec)
    assert job["strategy"] == "central_storage"
    check_metrics(checkpoints, "central_storage")


def test_parameter_server_keras_fit_with_evaluator(cluster, tmp_path):
    spec, checkpoints = example_spec("parameter_server_fit", tmp_path)
    job = run(cluster, spec)
    check_metrics(checkpoints, "parameter_server")
    check_final_evaluation(job, checkpoints, epochs_of(spec))
    servers = [t for t in job["tasks"] if t["type"] in ("ps", "worker")]
    assert len(servers) == 3
    for task in servers:
        assert task["state"] in ("STOPPED", "SUCCEEDED"), task
        log = cluster.cli("logs", job["id"], f"{task['type']}:{task['index']}", check=True).stdout
        assert "serving on" in log
