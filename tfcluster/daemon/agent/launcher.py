"""The launcher's module path before 0.8 (`python -m tfcluster.daemon.agent.launcher SOCKET_FD`), kept for the
command lines of earlier releases: the launcher itself is tasks/launcher_process.py (its agent's side
tasks/launcher.py)."""

import sys

from tfcluster.daemon.agent.tasks.launcher import ForkedShim, Launcher  # noqa: F401
from tfcluster.daemon.agent.tasks.launcher_process import main, serve  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
