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
    return _write(tmp_path / name, TRIAL, '"--a={A}"', f'LINGER = "{linger}"', "", f"A = [1, 2]\nB = {b_values}")


def _write(workdir: Path, program: str, args: str, env: str, rules: str, parameters: str) -> Path:
    """A grid sweep of the program (saved in workdir, the trials' command), two at a time, maximising accuracy."""
    workdir.mkdir()
    (workdir / "trial.py").write_text(program)
    spec = workdir / "sweep.toml"
    spec.write_text(f'name = "{workdir.name}"\nstrategy = "mirrored"\ncommand = ["python3", "trial.py"'
                    f'{", " + args if args else ""}]\nenv = {{ {env} }}\n'
                    f'[sweep]\nmethod = "grid"\nmax_concurrent = 2\nmetric = "accuracy"\ngoal = "max"\n{rules}\n'
                    f'[sweep.parameters]\n{parameters}\n')
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
    return _write(tmp_path / name, CURVE, "", f'PACE = "{pace}"', rule, f"Q = {qualities}")
