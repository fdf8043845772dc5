"""The shim's module path before 0.8 (`python -m tfcluster.daemon.agent.taskrunner ATTEMPT_DIR`), kept for the
processes and command lines of earlier releases: the shim itself is shim/runner.py."""

import sys

from tfcluster.daemon.agent.shim.runner import Runner, group_alive, kill_group, main, process_start  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
