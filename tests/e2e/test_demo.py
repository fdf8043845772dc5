"""`make demo` works on its first run: `tfcluster demo` trains its job to SUCCEEDED and leaves nothing behind. As
root, run from a virtualenv behind a directory no other user may pass (as a Python installed under /root is), it
opens that directory for traversal while it runs, says so, and closes it again."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

DEMO_TIMEOUT = 300


def run_demo(python: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TFCLUSTER_")}
    return subprocess.run([python, "-m", "tfcluster.cli", "demo", "--epochs", "2"], capture_output=True, text=True,
                          timeout=DEMO_TIMEOUT, cwd=ROOT, env={**env, "COLUMNS": "200"})


def venv_behind(locked: Path) -> Path:
    """This test's virtualenv, as seen from inside `locked`: its interpreter and packages, under a path that
    passes through `locked` (pyvenv.cfg beside bin/, as `python -m venv` lays it out)."""
    venv = locked / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (venv / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
    return venv / "bin" / "python"


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="runs the demo from a virtualenv, as make demo does")
@pytest.mark.skipif(os.geteuid() != 0, reason="tasks run as other users only under root")
def test_the_demo_opens_what_keeps_its_tasks_from_python_and_closes_it_again(tmp_path):
    locked = tmp_path / "root-home"
    python = venv_behind(locked)
    locked.chmod(0o700)
    result = run_demo(str(python))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"opened {locked} for traversal (chmod o+x" in " ".join(result.stdout.split())
    assert "SUCCEEDED" in result.stdout and "held-out accuracy" in result.stdout
    assert stat.S_IMODE(locked.stat().st_mode) == 0o700, "put back as it was"
    assert not list(Path("/var/tmp").glob("tfcluster-demo-*")), "the demo removes its state"
