"""The built-in evaluator sidecar: `python -m tfcluster.roles.evaluator module:function`.

`function()` returns (compiled tf-keras model, evaluation dataset). The sidecar follows the `checkpoint`
state file in the task's checkpoint dir, restores each newly committed checkpoint into the model
(`tf.train.Checkpoint(model=...)`, the key training programs save the model under), evaluates it,
writes TensorBoard summaries in its summary dir (task.summary_dir: <model_dir>/eval unless the role sets
summary_dir) and reports {checkpoint, step, metrics} so
`tfcluster status` shows them. When tfcluster says training has finished it evaluates the final
checkpoint (unless already done) and exits 0.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfcluster import task  # noqa: E402

RESTORE_TRIES = 3


def load_entrypoint(spec: str):
    module_name, _, function_name = spec.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"tfcluster evaluator: cannot load entrypoint {spec!r}: {e}") from None
    result = function()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise SystemExit(f"tfcluster evaluator: {spec} must return (compiled model, evaluation dataset), "
                         f"got {type(result).__name__}")
    return result


def checkpoint_step(tf, path: str) -> int:
    """The training step saved with the checkpoint: a `step` variable, the optimizer's iterations, or the
    number in the checkpoint's name."""
    try:
        names = {name for name, _ in tf.train.list_variables(path)}
        for candidate in task.STEP_VARIABLES:
            if candidate in names:
                return int(tf.train.load_variable(path, candidate))
    except (tf.errors.OpError, ValueError):
        pass
    return task.checkpoint_step(path)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m tfcluster.roles.evaluator module:function", file=sys.stderr)
        return 2
    import tensorflow as tf

    model, dataset = load_entrypoint(sys.argv[1])
    eval_dir = task.summary_dir
    writer = tf.summary.create_file_writer(eval_dir)
    print(f"tfcluster evaluator: following {task.checkpoint_dir}, summaries in {eval_dir}", flush=True)
    evaluated = 0
    for path in task.checkpoints():
        for attempt in range(RESTORE_TRIES):
            try:
                tf.train.Checkpoint(model=model).restore(path).expect_partial()
                step = checkpoint_step(tf, path)
                break
            except (tf.errors.OpError, ValueError) as e:
                # An old checkpoint can be deleted while it is read (max_to_keep): a newer one follows.
                print(f"tfcluster evaluator: cannot read {path} ({type(e).__name__}); "
                      f"{'retrying' if attempt + 1 < RESTORE_TRIES else 'skipping it'}", flush=True)
                time.sleep(0.2)
        else:
            continue
        started = time.time()
        metrics = {k: float(v) for k, v in model.evaluate(dataset, verbose=0, return_dict=True).items()}
        with writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar(name, value, step=step)
        writer.flush()
        task.report_evaluation(path, step, metrics)
        evaluated += 1
        shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
        print(f"tfcluster evaluator: {os.path.basename(path)} (step {step}): {shown} "
              f"[{time.time() - started:.2f} s]", flush=True)
    writer.close()
    print(f"tfcluster evaluator: training finished; {evaluated} checkpoints evaluated", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
