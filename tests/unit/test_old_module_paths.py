"""The module paths processes of 0.7 and before were started with keep working after the relayout of 0.8: a shim
(`python -m tfcluster.daemon.agent.taskrunner DIR`) and the launcher (`python -m tfcluster.daemon.agent.launcher FD`)
still run, their names still import, and an upgraded agent still knows such a shim by its command line."""

from __future__ import annotations

import subprocess
import sys

from harness import old_style_shim
from tfcluster.daemon.agent import launcher, taskrunner
from tfcluster.daemon.agent.shim import runner
from tfcluster.daemon.agent.tasks import launcher as tasks_launcher
from tfcluster.daemon.agent.tasks import launcher_process
from tfcluster.daemon.agent.tasks.record import is_shim


def test_the_old_names_are_the_new_ones():
    assert taskrunner.Runner is runner.Runner and taskrunner.main is runner.main
    assert launcher.Launcher is tasks_launcher.Launcher and launcher.main is launcher_process.main


def test_the_old_module_paths_still_run_as_programs():
    for module, usage in (("tfcluster.daemon.agent.taskrunner", "ATTEMPT_DIR"),
                          ("tfcluster.daemon.agent.launcher", "SOCKET_FD")):
        done = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and usage in done.stderr, (module, done.stderr)


def test_a_shim_started_the_old_way_is_known_by_its_command_line(tmp_path):
    shim = old_style_shim(tmp_path, 30)
    try:
        assert is_shim(shim.pid, tmp_path) and not is_shim(shim.pid, tmp_path / "other")
    finally:
        shim.kill()
        shim.wait()
