"""tfcluster.task: the helpers user programs import (no TensorFlow needed for these)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tfcluster import task


def commit(directory, name: str) -> str:
    """Writes a checkpoint the way TensorFlow does: data files, then the state file, atomically."""
    prefix = os.path.join(directory, name)
    open(prefix + ".index", "w").close()
    open(prefix + ".data-00000-of-00001", "w").close()
    tmp = os.path.join(directory, "checkpoint.tmp")
    with open(tmp, "w") as f:
        f.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    os.replace(tmp, os.path.join(directory, "checkpoint"))
    return prefix


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("TFCLUSTER_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    monkeypatch.setenv("TFCLUSTER_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TFCLUSTER_CONTROL_FILE", str(tmp_path / "control.json"))
    monkeypatch.setenv("TFCLUSTER_EVENTS_FILE", str(tmp_path / "events.jsonl"))
    (tmp_path / "ckpt").mkdir()
    return monkeypatch


def finish(tmp_path, final: str) -> None:
    (tmp_path / "control.json").write_text(json.dumps({"training_finished": True, "final_checkpoint": final}))


def test_importing_has_no_side_effects_and_needs_no_tensorflow():
    code = "import sys, tfcluster.task; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("tf_config, expected", [
    ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}, True),
    ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}, False),
    ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}, False),
    ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, True),
    ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}, False),
])
def test_identity_follows_tf_config(env, tf_config, expected):
    env.setenv("TF_CONFIG", json.dumps(tf_config))
    assert task.type == tf_config["task"]["type"] and task.index == tf_config["task"]["index"]
    assert task.is_chief is expected


def test_environment_values(env, tmp_path):
    env.setenv("TFCLUSTER_STRATEGY", "multi_worker_mirrored")
    env.setenv("TFCLUSTER_NUM_WORKERS", "3")
    env.setenv("TFCLUSTER_ATTEMPT", "2")
    env.setenv("TFCLUSTER_MODEL_DIR", str(tmp_path / "model"))
    assert (task.strategy, task.num_workers, task.attempt) == ("multi_worker_mirrored", 3, 2)
    assert task.checkpoint_dir == str(tmp_path / "ckpt") and task.model_dir == str(tmp_path / "model")
    with pytest.raises(AttributeError):
        task.no_such_thing


def test_summary_dir_is_the_evaluators_or_eval_under_the_model_dir(env, tmp_path):
    assert task.summary_dir == str(tmp_path / "ckpt" / "eval")
    env.setenv("TFCLUSTER_MODEL_DIR", str(tmp_path / "model"))
    assert task.summary_dir == str(tmp_path / "model" / "eval")
    env.setenv("TFCLUSTER_SUMMARY_DIR", "/logs/eval")
    assert task.summary_dir == "/logs/eval"


def test_checkpoint_paths_lists_every_committed_checkpoint_oldest_first(env, tmp_path):
    ckpt = tmp_path / "ckpt"
    assert task.checkpoint_paths(str(ckpt)) == []
    for name in ("ckpt-1", "ckpt-2", "ckpt-3"):
        open(ckpt / f"{name}.index", "w").close()
    (ckpt / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-1"\n'
                                     f'all_model_checkpoint_paths: "{ckpt}/ckpt-2"\n')
    os.remove(ckpt / "ckpt-1.index")  # deleted (max_to_keep) after the state file named it
    assert task.checkpoint_paths(str(ckpt)) == [str(ckpt / "ckpt-2"), str(ckpt / "ckpt-3")]


def test_write_dir_is_the_path_on_the_chief_and_private_elsewhere(env, tmp_path):
    target = str(tmp_path / "out")
    env.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}))
    assert task.write_dir(target) == target and os.path.isdir(target)
    env.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}))
    private = task.write_dir(target)
    assert private != target and os.path.isdir(private) and not private.startswith(target)
    assert task.write_dir(target) == private, "the same private dir on every call"


def test_latest_checkpoint_follows_the_state_file_never_a_glob(env, tmp_path):
    ckpt = tmp_path / "ckpt"
    assert task.latest_checkpoint(str(ckpt)) is None
    open(ckpt / "ckpt-9.index", "w").close()  # written, but not committed by the state file
    assert task.latest_checkpoint(str(ckpt)) is None
    first = commit(ckpt, "ckpt-1")
    assert task.latest_checkpoint(str(ckpt)) == first
    os.remove(first + ".index")  # deleted (max_to_keep) after the state file named it
    assert task.latest_checkpoint(str(ckpt)) is None


def test_checkpoints_yields_new_ones_newest_first_and_ends_after_the_final(env, tmp_path):
    ckpt = tmp_path / "ckpt"
    seen: list[str] = []
    done = threading.Event()

    def follow():
        for path in task.checkpoints(poll_seconds=0.02):
            seen.append(os.path.basename(path))
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    commit(ckpt, "ckpt-1")
    _wait(lambda: seen == ["ckpt-1"])
    commit(ckpt, "ckpt-2")
    commit(ckpt, "ckpt-3")  # two arrive before the next poll: only the newest is yielded
    _wait(lambda: seen[-1] == "ckpt-3")
    assert "ckpt-2" not in seen or seen == ["ckpt-1", "ckpt-2", "ckpt-3"]
    commit(ckpt, "ckpt-4")
    finish(tmp_path, "ckpt-4")
    assert done.wait(5), "checkpoints() must end once training has finished"
    assert seen[-1] == "ckpt-4" and seen.count("ckpt-4") == 1


def test_checkpoints_never_skips_the_final_one(env, tmp_path):
    ckpt = tmp_path / "ckpt"
    commit(ckpt, "ckpt-1")
    gen = task.checkpoints(poll_seconds=0.02)
    assert os.path.basename(next(gen)) == "ckpt-1"
    commit(ckpt, "ckpt-2")
    finish(tmp_path, "ckpt-2")  # training ended before the follower looked again
    assert [os.path.basename(p) for p in gen] == ["ckpt-2"]


def test_checkpoints_ends_at_once_when_training_left_none(env, tmp_path):
    finish(tmp_path, "")
    assert list(task.checkpoints(poll_seconds=0.02)) == []


def test_report_evaluation_appends_one_json_line(env, tmp_path):
    task.report_evaluation("/x/ckpt-3", 30, {"loss": 0.5, "accuracy": 0.75})
    task.report_evaluation("/x/ckpt-4", 40, {"loss": 0.25})
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["checkpoint"], e["step"], e["metrics"]) for e in lines] == [
        ("/x/ckpt-3", 30, {"loss": 0.5, "accuracy": 0.75}), ("/x/ckpt-4", 40, {"loss": 0.25})]
    assert all(e["kind"] == "evaluation" and e["time"] > 0 for e in lines)


def test_checkpoint_step_from_the_name():
    assert task.checkpoint_step("/a/ckpt-12") == 12
    assert task.checkpoint_step("/a/model") == -1


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


@pytest.mark.parametrize("strategy, legacy, code", [("multi_worker_mirrored", "0", 78), ("parameter_server", None, 78),
                                                     ("multi_worker_mirrored", "1", 0), ("mirrored", "0", 0)])
def test_check_keras_exits_78_naming_the_fix_only_where_keras_3_would_run_under_mwms_or_ps(strategy, legacy, code):
    environment = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    environment["TFCLUSTER_STRATEGY"] = strategy
    if legacy is not None:
        environment["TF_USE_LEGACY_KERAS"] = legacy
    done = subprocess.run([sys.executable, "-c", "from tfcluster import task; task.check_keras()"],
                          env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    if code:
        assert f"TF_USE_LEGACY_KERAS={legacy or ''!r} makes tf.keras Keras 3, which does not work with {strategy}" \
            in done.stderr and "Fix: pip install tf-keras and keep TF_USE_LEGACY_KERAS=1" in done.stderr, done.stderr
