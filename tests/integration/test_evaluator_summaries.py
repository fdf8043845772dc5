"""The agent's side of evaluators that only write TensorBoard summaries, on files TensorFlow itself wrote:
the training step read out of real checkpoints without TensorFlow, and tf-keras's SidecarEvaluator's
summaries turned into evaluations tied to the checkpoint they are about."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tfcluster.daemon.agent.hooks.checkpoint_steps import read_steps
from tfcluster.daemon.agent.hooks.summaries import EvaluatorSummaries, SummaryReader
from tfcluster.model import Attempt
from tfcluster.task import STEP_VARIABLES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")

# Trains a tiny tf-keras model for two epochs, saving checkpoints three ways, then runs tf-keras's
# SidecarEvaluator over the first kind as its documentation shows; prints what TensorFlow itself reads back.
WRITER = """
import glob, json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf, tf_keras as keras
root, step_variables = sys.argv[1], json.loads(sys.argv[2])
x = np.random.default_rng(0).random((64, 4)).astype("float32"); y = (x.sum(1) > 2).astype("int64")
def build():
    model = keras.Sequential([keras.layers.Input(shape=(4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
model = build()
manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=model.optimizer),
                                     os.path.join(root, "ckpt"), max_to_keep=5)
for epoch in range(2):
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    manager.save()
model.save_weights(os.path.join(root, "weights", "ckpt-2"))
tf.train.Checkpoint(model=model, step=tf.Variable(7, dtype=tf.int64)).write(os.path.join(root, "stepped", "ckpt-7"))
keras.utils.SidecarEvaluator(build(), tf.data.Dataset.from_tensor_slices((x, y)).batch(16),
                             os.path.join(root, "ckpt"), max_evaluations=2,
                             callbacks=[keras.callbacks.TensorBoard(log_dir=os.path.join(root, "tb"))]).start()
steps = {}
for prefix in [manager.checkpoints[0], manager.checkpoints[1], os.path.join(root, "weights", "ckpt-2"),
               os.path.join(root, "stepped", "ckpt-7")]:
    names = {name for name, _ in tf.train.list_variables(prefix)}
    steps[prefix] = {n: int(tf.train.load_variable(prefix, n)) for n in step_variables if n in names}
scalars = {}
for path in glob.glob(os.path.join(root, "tb", "*", "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
            if value.tensor.dtype == tf.float32.as_datatype_enum:
                scalars.setdefault(str(event.step), {})[value.tag] = float(tf.make_ndarray(value.tensor))
print(json.dumps({"steps": steps, "scalars": scalars, "ckpt_2": manager.checkpoints[1]}))
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf-files")
    result = subprocess.run([sys.executable, "-c", WRITER, str(root), json.dumps(STEP_VARIABLES)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, json.loads(result.stdout.strip().splitlines()[-1])


def test_the_step_is_read_from_real_checkpoints_as_tensorflow_reads_it(written):
    _, expected = written
    for prefix, variables in expected["steps"].items():
        assert read_steps(prefix, STEP_VARIABLES) == variables, prefix
    manager_1, manager_2, weights, stepped = expected["steps"].values()
    iterations = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
    assert 0 < manager_1[iterations] < manager_2[iterations] == weights[iterations]
    assert stepped["step/.ATTRIBUTES/VARIABLE_VALUE"] == 7
    assert stepped["model/optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"] == manager_2[iterations]


def test_sidecar_evaluator_summaries_become_an_evaluation_of_the_checkpoint(written):
    root, expected = written
    iterations = expected["steps"][expected["ckpt_2"]]["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]
    tags = expected["scalars"][str(iterations)]
    assert set(tags) == {"evaluation_loss_vs_iterations", "evaluation_accuracy_vs_iterations"}, \
        "tf-keras's TensorBoard callback labels an evaluation with the optimizer's iterations"
    reader = SummaryReader(str(root / "tb"), str(root / "ckpt"), since=0.0)
    [evaluation] = reader.poll()
    assert evaluation.checkpoint == expected["ckpt_2"] and evaluation.step == iterations
    assert evaluation.metrics == pytest.approx({"loss": tags["evaluation_loss_vs_iterations"],
                                                "accuracy": tags["evaluation_accuracy_vs_iterations"]})
    assert abs(evaluation.time - time.time()) < 600
    assert reader.poll() == [], "each result is reported once"


def test_summaries_from_before_the_attempt_started_are_not_its_own(written):
    root, _ = written
    assert SummaryReader(str(root / "tb"), str(root / "ckpt"), since=time.time() + 1).poll() == []


def test_a_record_still_being_written_is_read_once_complete(written, tmp_path):
    root, expected = written
    [source] = (root / "tb" / "validation").glob("events.out.tfevents.*")
    data = source.read_bytes()
    target = tmp_path / "tb" / "validation" / source.name
    target.parent.mkdir(parents=True)
    target.write_bytes(data[:-7])  # the last scalar's record is cut short
    reader = SummaryReader(str(tmp_path / "tb"), str(root / "ckpt"), since=0.0)
    [first] = reader.poll()
    assert list(first.metrics) == ["loss"]
    with open(target, "ab") as f:
        f.write(data[-7:])
    [second] = reader.poll()
    assert set(second.metrics) == {"loss", "accuracy"} and second.checkpoint == expected["ckpt_2"]


def test_without_a_checkpoint_of_that_step_the_evaluation_is_labelled_by_its_step(written, tmp_path):
    root, _ = written
    [evaluation] = SummaryReader(str(root / "tb"), str(tmp_path / "no-checkpoints"), since=0.0).poll()
    assert evaluation.checkpoint == f"step {evaluation.step}"


def evaluator_record(root: Path, number: int = 1) -> SimpleNamespace:
    """What EvaluatorSummaries needs of a supervisor TaskRecord."""
    return SimpleNamespace(attempt=Attempt("job-1", "evaluator", 0, number), summary_dir=str(root / "tb"),
                           checkpoint_dir=str(root / "ckpt"), started_at=0.0, exited=threading.Event(), uid=None)


def test_per_attempt_reading_the_last_look_and_reading_again(written):
    root, _ = written
    summaries = EvaluatorSummaries()
    record = evaluator_record(root)
    assert len(summaries.poll(record)) == 1 and summaries.poll(record) == []
    record.exited.set()
    assert summaries.poll(record) == [] and record.attempt in summaries.finished
    summaries.read_again()  # after a registration everything is sent again, ended attempts' results too
    assert len(summaries.poll(record)) == 1 and summaries.poll(record) == []
    worker = evaluator_record(root, 2)
    worker.attempt = Attempt("job-1", "worker", 0, 1)
    assert summaries.poll(worker) == [], "only evaluators"


def test_an_attempt_that_reports_through_its_events_file_is_not_read(written):
    root, _ = written
    summaries = EvaluatorSummaries()
    record = evaluator_record(root)
    summaries.reports_itself(record.attempt)
    assert summaries.poll(record) == []


def test_the_reader_does_not_import_tensorflow(written, tmp_path):
    root, expected = written
    shutil.copytree(root / "tb", tmp_path / "tb")
    code = textwrap.dedent(f"""
        import sys
        from tfcluster.daemon.agent.hooks.summaries import SummaryReader
        [evaluation] = SummaryReader({str(tmp_path / 'tb')!r}, {str(root / 'ckpt')!r}, 0.0).poll()
        assert evaluation.checkpoint == {expected['ckpt_2']!r}, evaluation
        print(sorted(m for m in ("tensorflow", "tf_keras", "keras") if m in sys.modules))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
