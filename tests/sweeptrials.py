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
