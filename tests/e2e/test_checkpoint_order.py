"""With real TensorFlow: the examples save the checkpoint the evaluator follows before BackupAndRestore backs the
epoch up, so a task killed between the two repeats that epoch when it resumes and saves its checkpoint again; the
job's final checkpoint is the last epoch's, as in an undisturbed run (tfcluster/demo/digits.py, SaveEveryEpoch)."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT
from tfcluster.daemon.agent.tasks.record import newest_checkpoint

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EPOCHS = 3
# The examples' callbacks, in their order; KILLED_AT_EPOCH makes the task die at that epoch's end once its
# checkpoint is saved, before its backup, as a SIGKILL landing between the two would.
PROGRAM = f"""
import os
from tfcluster import task
from tfcluster.demo import digits
import tf_keras as keras

class Backup(keras.callbacks.BackupAndRestore):
    def on_epoch_end(self, epoch, logs=None):
        if str(epoch + 1) == os.environ.get("KILLED_AT_EPOCH"):
            print("killed before the backup", flush=True)
            os._exit(137)
        super().on_epoch_end(epoch, logs)

model = digits.compile_model(digits.make_model())
model.fit(digits.train_dataset(digits.BATCH_PER_REPLICA), epochs={EPOCHS}, steps_per_epoch=3,
          callbacks=[digits.SaveEveryEpoch(model), Backup(os.path.join(task.checkpoint_dir, "backup"))], verbose=2)
print("trained to step", int(model.optimizer.iterations.numpy()), flush=True)
"""


def train(checkpoints: Path, killed_at: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "TFCLUSTER_CHECKPOINT_DIR": str(checkpoints), "PYTHONPATH": str(ROOT)}
    env.pop("TF_CONFIG", None)
    if killed_at:
        env["KILLED_AT_EPOCH"] = str(killed_at)
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)


def test_a_task_killed_between_its_checkpoint_and_its_backup_repeats_the_epoch_and_ends_at_the_last_one(tmp_path):
    checkpoints = tmp_path / "ckpt"
    killed = train(checkpoints, killed_at=EPOCHS)
    assert killed.returncode == 137 and "killed before the backup" in killed.stdout, killed.stdout + killed.stderr
    assert newest_checkpoint(str(checkpoints)) == f"ckpt-{EPOCHS}"

    resumed = train(checkpoints)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"Epoch {EPOCHS}/{EPOCHS}" in resumed.stdout and f"Epoch {EPOCHS - 1}/{EPOCHS}" not in resumed.stdout, \
        f"it should resume at the epoch whose backup was not taken:\n{resumed.stdout}"
    assert f"(epoch {EPOCHS})" in resumed.stdout and f"trained to step {EPOCHS * 3}" in resumed.stdout, resumed.stdout
    assert newest_checkpoint(str(checkpoints)) == f"ckpt-{EPOCHS}"


def callbacks_in_order(program: Path) -> list[str]:
    """The names of the callbacks a program passes to fit, in order."""
    for node in ast.walk(ast.parse(program.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "callbacks" and isinstance(node.value, ast.List):
            return [ast.unparse(item.func).rsplit(".", 1)[-1] for item in node.value.elts if isinstance(item, ast.Call)]
    return []


@pytest.mark.parametrize("program", ["examples/mwms_fit.py", "examples/mirrored_fit.py",
                                     "examples/parameter_server_fit.py", "tfcluster/demo/train_digits.py"])
def test_the_shipped_programs_save_their_checkpoint_before_the_backup(program):
    names = callbacks_in_order(ROOT / program)
    assert names.index("SaveEveryEpoch") < names.index("BackupAndRestore"), names
