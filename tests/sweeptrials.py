"""What the sweep tests share: a trial program that reports one evaluation of `accuracy` = A * B / 100 (A from its
command, B from its environment) and then lingers, so that trials overlap; and a grid sweep of it (A in [1, 2],
B in the values given, max_concurrent = 2)."""

from __future__ import annotations

from pathlib import Path

# Lingering lets trials outlive a coordinator's restart or a failover: results an agent sends again after it
# registers anew are taken only for jobs that have not ended.
TRIAL = ('import json, os, sys, time\n'
         'a = float(sys.argv[1].split("=")[1]); b = float(os.environ["B"])\n'
         'with open(os.environ["TFCLUSTER_EVENTS_FILE"], "a") as f:\n'
         '    f.write(json.dumps({"kind": "evaluation", "checkpoint": "ckpt-1", "step": 1, "time": time.time(),\n'
         '                        "metrics": {"accuracy": a * b / 100}}) + "\\n")\n'
         'time.sleep(float(os.environ["LINGER"]))\n')


def sweep_file(tmp_path: Path, name: str, linger: float, b_values: str) -> Path:
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / "trial.py").write_text(TRIAL)
    spec = workdir / "sweep.toml"
    spec.write_text(f'name = "{name}"\nstrategy = "mirrored"\ncommand = ["python3", "trial.py", "--a={{A}}"]\n'
                    f'env = {{ LINGER = "{linger}" }}\n'
                    f'[sweep]\nmethod = "grid"\nmax_concurrent = 2\nmetric = "accuracy"\ngoal = "max"\n'
                    f'[sweep.parameters]\nA = [1, 2]\nB = {b_values}\n')
    return spec


# A trial that trains for a while: accuracy Q * step / 6000 at steps 100, 200, ... 600, one every PACE seconds.
CURVE = ('import json, os, time\n'
         'q = float(os.environ["Q"])\n'
         'for step in range(100, 700, 100):\n'
         '    with open(os.environ["TFCLUSTER_EVENTS_FILE"], "a") as f:\n'
         '        f.write(json.dumps({"kind": "evaluation", "checkpoint": f"ckpt-{step}", "step": step,\n'
         '                            "time": time.time(), "metrics": {"accuracy": q * step / 6000}}) + "\\n")\n'
         '    time.sleep(float(os.environ["PACE"]))\n')


def early_stopping_file(tmp_path: Path, name: str, rule: str, qualities: str, pace: float = 0.5) -> Path:
    """A grid sweep of CURVE over Q (its values in table order), two at a time, with that early-stopping table."""
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / "curve.py").write_text(CURVE)
    spec = workdir / "sweep.toml"
    spec.write_text(f'name = "{name}"\nstrategy = "mirrored"\ncommand = ["python3", "curve.py"]\n'
                    f'env = {{ PACE = "{pace}" }}\n'
                    f'[sweep]\nmethod = "grid"\nmax_concurrent = 2\nmetric = "accuracy"\ngoal = "max"\n{rule}\n'
                    f'[sweep.parameters]\nQ = {qualities}\n')
    return spec
